//! `vitals-router`: a small OpenAI-compatible reverse proxy that routes every request with the
//! vitals health view, streams the answer through (SSE, no buffering), measures each call and
//! reports it with the reporter, and retries once on another endpoint when a connection is
//! refused. A starting point for teams without a gateway, and the proof that the loop closes.

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use futures::Stream;
use serde::Deserialize;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use vitals_contracts::clock::now_us;
use vitals_healthview::{Freshness, HealthView};
use vitals_reporter::{CallResult, CallTimer, Reporter};

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Upstream {
    pub name: String,
    /// Base URL: requests go to `{url}/v1/chat/completions`.
    pub url: String,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PoolConfig {
    pub name: String,
    /// Models this pool serves (the request's `model`); default: the pool's name.
    #[serde(default)]
    pub models: Vec<String>,
    /// A first token later than this is reported as a timeout the moment the deadline passes
    /// (the call itself goes on); without it, a slow call is reported when it ends.
    #[serde(default)]
    pub ttft_deadline_ms: Option<u64>,
    #[serde(rename = "upstream")]
    pub upstreams: Vec<Upstream>,
}

/// The routes file (TOML).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Routes {
    #[serde(default = "default_listen")]
    pub listen: SocketAddr,
    /// The gateway name in every reported call.
    #[serde(default = "default_gateway")]
    pub gateway: String,
    /// Where this router runs (a region or zone): it follows the decisions vitals makes for
    /// its location as well as for its gateway (docs/decisions.md, "Scoped health").
    #[serde(default)]
    pub location: Option<String>,
    /// The ids of the credentials its upstream calls use (opaque ids, never the secrets): it
    /// follows the decisions vitals makes for them too.
    #[serde(default)]
    pub key_ids: Vec<String>,
    #[serde(rename = "pool")]
    pub pools: Vec<PoolConfig>,
}

fn default_listen() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 8081))
}

fn default_gateway() -> String {
    "vitals-router".into()
}

impl Routes {
    /// The scopes this router is in.
    pub fn identity(&self) -> vitals_healthview::Identity {
        vitals_healthview::Identity::new(Some(&self.gateway), self.location.as_deref(), &self.key_ids)
    }

    pub fn parse(text: &str) -> anyhow::Result<Routes> {
        let r: Routes = toml::from_str(text).map_err(|e| anyhow::anyhow!("{e}"))?;
        let mut models = HashMap::new();
        for p in &r.pools {
            vitals_contracts::validate_name("pool", &p.name)
                .map_err(|e| anyhow::anyhow!("pool {:?}: {}", p.name, e.message))?;
            if p.upstreams.is_empty() {
                anyhow::bail!("pool {:?} has no upstream", p.name);
            }
            for u in &p.upstreams {
                reqwest::Url::parse(&u.url)
                    .map_err(|e| anyhow::anyhow!("pool {:?} upstream {:?}: url: {e}", p.name, u.name))?;
            }
            for m in p.models.iter().chain(std::iter::once(&p.name)) {
                if let Some(other) = models.insert(m.clone(), p.name.clone()) {
                    if other != p.name {
                        anyhow::bail!("model {m:?} is served by pools {other:?} and {:?}", p.name);
                    }
                }
            }
        }
        Ok(r)
    }
}

/// The router's shared state.
pub struct Proxy {
    routes: Routes,
    by_model: HashMap<String, usize>,
    view: Arc<HealthView>,
    reporter: Arc<Reporter>,
    client: reqwest::Client,
    ids: AtomicU64,
    boot: u64,
}

impl Proxy {
    pub fn new(routes: Routes, view: Arc<HealthView>, reporter: Arc<Reporter>) -> anyhow::Result<Proxy> {
        let mut by_model = HashMap::new();
        for (i, p) in routes.pools.iter().enumerate() {
            by_model.insert(p.name.clone(), i);
            for m in &p.models {
                by_model.insert(m.clone(), i);
            }
        }
        Ok(Proxy {
            routes,
            by_model,
            view,
            reporter,
            client: reqwest::Client::builder()
                .connect_timeout(Duration::from_secs(2))
                .tcp_nodelay(true)
                .build()?,
            ids: AtomicU64::new(0),
            boot: now_us() as u64,
        })
    }

    fn id(&self) -> String {
        format!(
            "{}-{:x}-{}",
            self.routes.gateway,
            self.boot,
            self.ids.fetch_add(1, Ordering::Relaxed)
        )
    }

    /// An upstream of `pool` by the view's weights (an endpoint the view does not know yet
    /// weighs 1); in panic mode any, uniformly; never `exclude`.
    fn choose<'a>(&self, pool: &'a PoolConfig, exclude: Option<&str>) -> Option<&'a Upstream> {
        let candidates: Vec<&Upstream> = pool
            .upstreams
            .iter()
            .filter(|u| Some(u.name.as_str()) != exclude)
            .collect();
        let names: Vec<&str> = candidates.iter().map(|u| u.name.as_str()).collect();
        let i = self.view.choose(&pool.name, &names, now_us())?;
        Some(candidates[i])
    }
}

fn error(status: StatusCode, message: impl Into<String>) -> Response {
    (
        status,
        Json(serde_json::json!({"error": {"message": message.into(), "type": "vitals_router"}})),
    )
        .into_response()
}

/// A streamed answer passed through while it is measured: the first content token, the end, a
/// broken stream, or a client that went away (dropped before the end) — reported once.
struct Metered {
    inner: Pin<Box<dyn Stream<Item = reqwest::Result<Bytes>> + Send>>,
    timer: Option<CallTimer>,
    status: u16,
    id: String,
    proxy: Arc<Proxy>,
    retry_after_ms: Option<i64>,
}

impl Metered {
    fn report(&mut self, result: CallResult) {
        if let Some(t) = self.timer.take() {
            self.proxy.reporter.finish(
                t,
                &self.proxy.routes.gateway,
                std::mem::take(&mut self.id),
                result,
                self.retry_after_ms,
            );
        }
    }
}

/// Whether an SSE chunk carries a non-empty `content` delta.
fn has_content(chunk: &[u8]) -> bool {
    let needle = b"\"content\":\"";
    chunk
        .windows(needle.len() + 1)
        .any(|w| &w[..needle.len()] == needle && w[needle.len()] != b'"')
}

impl Stream for Metered {
    type Item = reqwest::Result<Bytes>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let next = self.inner.as_mut().poll_next(cx);
        match &next {
            Poll::Ready(Some(Ok(chunk))) => {
                if has_content(chunk) {
                    if let Some(t) = self.timer.as_mut() {
                        t.first_token();
                    }
                }
            }
            Poll::Ready(Some(Err(_))) => self.report(CallResult::Dropped),
            Poll::Ready(None) => {
                let status = self.status;
                self.report(CallResult::Status(status));
            }
            Poll::Pending => {}
        }
        next
    }
}

impl Drop for Metered {
    fn drop(&mut self) {
        self.report(CallResult::Cancelled);
    }
}

async fn completions(State(p): State<Arc<Proxy>>, headers: HeaderMap, body: Bytes) -> Response {
    let model = serde_json::from_slice::<serde_json::Value>(&body)
        .ok()
        .and_then(|v| v["model"].as_str().map(str::to_owned));
    let Some(model) = model else {
        return error(StatusCode::BAD_REQUEST, "the body must be JSON with a model");
    };
    let Some(&i) = p.by_model.get(&model) else {
        return error(StatusCode::NOT_FOUND, format!("no pool serves model {model:?}"));
    };
    let pool = &p.routes.pools[i];
    let mut refused: Option<String> = None;
    for _ in 0..2 {
        let Some(up) = p.choose(pool, refused.as_deref()) else {
            break;
        };
        let id = p.id();
        let mut timer = match pool.ttft_deadline_ms {
            Some(ms) => p.reporter.start_call(
                pool.name.clone(),
                up.name.clone(),
                &p.routes.gateway,
                id.clone(),
                Duration::from_millis(ms),
            ),
            None => CallTimer::start(pool.name.clone(), up.name.clone()),
        };
        let mut req = p
            .client
            .post(format!("{}/v1/chat/completions", up.url.trim_end_matches('/')))
            .header(header::CONTENT_TYPE, "application/json")
            .body(body.clone());
        if let Some(auth) = headers.get(header::AUTHORIZATION) {
            req = req.header(header::AUTHORIZATION, auth);
        }
        let resp = match req.send().await {
            Ok(r) => r,
            Err(e) => {
                let result = if e.is_connect() {
                    CallResult::ConnectError
                } else if e.is_timeout() {
                    CallResult::Timeout
                } else {
                    CallResult::Dropped
                };
                p.reporter.finish(timer, &p.routes.gateway, id, result, None);
                if result == CallResult::ConnectError {
                    // Nothing was sent: one more try on another endpoint.
                    refused = Some(up.name.clone());
                    continue;
                }
                return error(StatusCode::BAD_GATEWAY, format!("upstream {}: {e}", up.name));
            }
        };
        let status = resp.status().as_u16();
        let retry_after_ms = retry_after_of(status, resp.headers());
        let content_type = resp.headers().get(header::CONTENT_TYPE).cloned();
        let streaming = content_type
            .as_ref()
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.starts_with("text/event-stream"));
        let mut out = if streaming {
            let metered = Metered {
                inner: Box::pin(resp.bytes_stream()),
                timer: Some(timer),
                status,
                id,
                proxy: p.clone(),
                retry_after_ms,
            };
            Response::new(Body::from_stream(metered))
        } else {
            let bytes = resp.bytes().await;
            let result = match &bytes {
                Ok(_) => {
                    timer.first_token();
                    CallResult::Status(status)
                }
                Err(_) => CallResult::Dropped,
            };
            p.reporter.finish(timer, &p.routes.gateway, id, result, retry_after_ms);
            match bytes {
                Ok(b) => Response::new(Body::from(b)),
                Err(e) => return error(StatusCode::BAD_GATEWAY, format!("upstream {}: {e}", up.name)),
            }
        };
        *out.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_GATEWAY);
        if let Some(ct) = content_type {
            out.headers_mut().insert(header::CONTENT_TYPE, ct);
        }
        out.headers_mut().insert(
            "x-vitals-endpoint",
            up.name.parse().unwrap_or(header::HeaderValue::from_static("?")),
        );
        return out;
    }
    error(
        StatusCode::SERVICE_UNAVAILABLE,
        format!("no endpoint of pool {} can take the call", pool.name),
    )
}

pub fn router(p: Arc<Proxy>) -> Router {
    Router::new()
        .route("/v1/chat/completions", post(completions))
        .route("/healthz", axum::routing::get(|| async { "ok" }))
        .route("/metrics", axum::routing::get(metrics))
        .with_state(p)
}

/// The reporter's counters and the health view's, in the Prometheus text format.
async fn metrics(State(p): State<Arc<Proxy>>) -> Response {
    let mut out = p.reporter.counters().prometheus();
    let c = &p.view.counters;
    out.push_str("# HELP vitals_healthview_events_total Health changes by what the view did with them.\n");
    out.push_str("# TYPE vitals_healthview_events_total counter\n");
    for (kind, v) in [("applied", &c.applied), ("duplicate", &c.duplicates), ("gap", &c.gaps)] {
        out.push_str(&format!(
            "vitals_healthview_events_total{{kind=\"{kind}\"}} {}\n",
            v.load(Ordering::Relaxed)
        ));
    }
    let fresh = p.view.freshness(now_us());
    out.push_str("# HELP vitals_healthview_freshness 1 for the view's current freshness (fresh: the processor was heard from; stale: routing as last known; open: routing to every endpoint).\n# TYPE vitals_healthview_freshness gauge\n");
    for f in [Freshness::Fresh, Freshness::Stale, Freshness::Open] {
        out.push_str(&format!(
            "vitals_healthview_freshness{{state=\"{}\"}} {}\n",
            f.as_str(),
            u8::from(f == fresh)
        ));
    }
    out.push_str(&format!(
        "# HELP vitals_healthview_rereads_total State topic re-reads after gaps.\n# TYPE vitals_healthview_rereads_total counter\nvitals_healthview_rereads_total {}\n",
        c.rereads.load(Ordering::Relaxed)
    ));
    out.push_str(&format!(
        "# HELP vitals_healthview_endpoints Endpoints the view knows.\n# TYPE vitals_healthview_endpoints gauge\nvitals_healthview_endpoints {}\n",
        p.view.len()
    ));
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], out).into_response()
}

/// When the upstream says to try again, in ms. For a 429 what every bridge reads
/// (`vitals_contracts::limits::limit_lifts_in_ms`: `retry-after-ms`, Retry-After, else the
/// `x-ratelimit-reset-*` of the limit that ran out); for another status its Retry-After alone
/// (a 200 carries `x-ratelimit-reset-*` too, of limits that did not run out).
fn retry_after_of(status: u16, headers: &HeaderMap) -> Option<i64> {
    let text = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    if status == 429 {
        vitals_contracts::limits::limit_lifts_in_ms(text)
    } else {
        text(header::RETRY_AFTER.as_str()).and_then(vitals_contracts::limits::retry_after_ms)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_429_says_when_its_limit_lifts_by_any_header_an_upstream_uses() {
        let headers = |pairs: &[(&'static str, &'static str)]| {
            let mut h = HeaderMap::new();
            for (k, v) in pairs {
                h.insert(*k, v.parse().unwrap());
            }
            h
        };
        assert_eq!(retry_after_of(429, &headers(&[("retry-after", "7")])), Some(7000));
        assert_eq!(
            retry_after_of(429, &headers(&[("retry-after-ms", "1500"), ("retry-after", "7")])),
            Some(1500)
        );
        let openai = headers(&[
            ("x-ratelimit-remaining-requests", "0"),
            ("x-ratelimit-reset-requests", "2s"),
            ("x-ratelimit-reset-tokens", "6m0s"),
        ]);
        assert_eq!(retry_after_of(429, &openai), Some(2000), "the limit that ran out");
        assert_eq!(retry_after_of(200, &openai), None, "not a limit on a 200");
        assert_eq!(retry_after_of(503, &headers(&[("retry-after", "30")])), Some(30_000));
        assert_eq!(retry_after_of(429, &headers(&[("retry-after", "soon")])), None);
    }

    #[test]
    fn content_is_seen_in_a_chunk_only_when_it_is_not_empty() {
        assert!(!has_content(
            br#"data: {"choices":[{"delta":{"role":"assistant","content":""}}]}"#
        ));
        assert!(has_content(br#"data: {"choices":[{"delta":{"content":"tok "}}]}"#));
        assert!(!has_content(b"data: [DONE]"));
    }

    #[test]
    fn routes_are_checked() {
        let ok = "[[pool]]\nname = \"llm\"\nmodels = [\"gpt\"]\n[[pool.upstream]]\nname = \"a\"\nurl = \"http://127.0.0.1:9101\"\n";
        assert_eq!(Routes::parse(ok).unwrap().pools[0].upstreams.len(), 1);
        assert!(Routes::parse("[[pool]]\nname = \"llm\"\nupstream = []\n")
            .unwrap_err()
            .to_string()
            .contains("no upstream"));
        let twice = format!(
            "{ok}[[pool]]\nname = \"other\"\nmodels = [\"gpt\"]\n[[pool.upstream]]\nname = \"b\"\nurl = \"http://x\"\n"
        );
        assert!(Routes::parse(&twice)
            .unwrap_err()
            .to_string()
            .contains("served by pools"));
    }
}
