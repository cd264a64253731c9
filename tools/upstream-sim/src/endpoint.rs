//! One simulated endpoint: the fate of each request, and its routes (completions, health, deep health, raw TCP).

use crate::behaviour::*;
use axum::body::Body;
use axum::extract::State;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use bytes::Bytes;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::time::Instant;

/// What happens to one request.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Fate {
    Ok,
    ServerError,
    RateLimited(Option<u64>),
    ClientError,
    Drop,
    Hang,
}

pub(crate) struct Endpoint {
    pub(crate) name: String,
    pub(crate) port: u16,
    pub(crate) seed: u64,
    pub(crate) requests: AtomicU64,
    /// The behaviour and when it was set (ramps and periods count from there).
    pub(crate) behaviour: watch::Sender<(Behaviour, Instant)>,
}

pub(crate) fn splitmix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

pub(crate) fn fnv(s: &str) -> u64 {
    vitals_contracts::hash::fnv64(s.as_bytes())
}

impl Endpoint {
    /// The fate of the next request: the k-th request's draw depends only on seed, name and k.
    fn fate(&self, completion: bool) -> (Fate, Behaviour, Duration) {
        let k = self.requests.fetch_add(1, Ordering::Relaxed);
        let u = (splitmix(self.seed ^ splitmix(k)) >> 11) as f64 / (1u64 << 53) as f64;
        let (b, since) = self.behaviour.borrow().clone();
        let elapsed = since.elapsed();
        if !b.bad_at(elapsed) {
            return (Fate::Ok, b, elapsed);
        }
        if b.hang {
            return (Fate::Hang, b, elapsed);
        }
        // Cumulative shares: [0, 5xx) [.., +429) [.., +400) [.., +drops) [.., 1) healthy.
        let edges = [
            b.server_errors,
            b.server_errors + b.rate_limited,
            b.server_errors + b.rate_limited + b.client_errors,
            b.server_errors + b.rate_limited + b.client_errors + b.drops,
        ];
        let fate = match edges.iter().position(|e| u < *e) {
            Some(0) => Fate::ServerError,
            Some(1) if completion => Fate::RateLimited(b.retry_after_s),
            Some(2) if completion => Fate::ClientError,
            Some(3) => Fate::Drop,
            _ => Fate::Ok,
        };
        (fate, b, elapsed)
    }
}

pub(crate) fn error(status: StatusCode, kind: &str, message: &str) -> Response {
    let body = serde_json::json!({"error": {"type": kind, "message": message}});
    (status, Json(body)).into_response()
}

/// A body that sends `first` and then breaks the connection.
pub(crate) fn broken(first: Bytes) -> Body {
    let chunks: Vec<Result<Bytes, std::io::Error>> = vec![
        Ok(first),
        Err(std::io::Error::new(
            std::io::ErrorKind::ConnectionReset,
            "dropped by the simulator",
        )),
    ];
    Body::from_stream(futures::stream::iter(chunks))
}

/// Answers that do not depend on the route: the faults every route shares.
pub(crate) async fn common(fate: Fate) -> Option<Response> {
    match fate {
        Fate::Hang => {
            tokio::time::sleep(HANG).await;
            Some(error(StatusCode::GATEWAY_TIMEOUT, "hang", "hung"))
        }
        Fate::ServerError => Some(error(StatusCode::SERVICE_UNAVAILABLE, "server_error", "injected 503")),
        Fate::RateLimited(retry) => {
            let mut r = error(StatusCode::TOO_MANY_REQUESTS, "rate_limit", "injected 429");
            if let Some(s) = retry {
                r.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(s));
            }
            Some(r)
        }
        Fate::ClientError => Some(error(StatusCode::BAD_REQUEST, "invalid_request", "injected 400")),
        Fate::Ok | Fate::Drop => None,
    }
}

pub(crate) async fn health(State(ep): State<Arc<Endpoint>>) -> Response {
    let (fate, _, _) = ep.fate(false);
    if let Some(r) = common(fate).await {
        return r;
    }
    if fate == Fate::Drop {
        return Response::new(broken(Bytes::from_static(b"{\"sta")));
    }
    Json(serde_json::json!({"status": "ok", "endpoint": ep.name})).into_response()
}

pub(crate) async fn deep_health(State(ep): State<Arc<Endpoint>>) -> Response {
    let (fate, b, _) = ep.fate(false);
    if let Some(r) = common(fate).await {
        return r;
    }
    if fate == Fate::Drop {
        return Response::new(broken(Bytes::from_static(b"{\"sta")));
    }
    let critical_down = b
        .dependencies
        .iter()
        .any(|d| d.critical && d.status == DependencyStatus::Down);
    let status = if critical_down {
        StatusCode::SERVICE_UNAVAILABLE
    } else {
        StatusCode::OK
    };
    let body = serde_json::json!({
        "status": if critical_down { "down" } else { "up" },
        "dependencies": b.dependencies,
    });
    (status, Json(body)).into_response()
}

pub(crate) fn chunk(id: &str, delta: serde_json::Value, finish: Option<&str>) -> Bytes {
    let v = serde_json::json!({
        "id": id,
        "object": "chat.completion.chunk",
        "created": 0,
        "model": "sim",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    });
    Bytes::from(format!("data: {v}\n\n"))
}

pub(crate) async fn completions(State(ep): State<Arc<Endpoint>>, body: Bytes) -> Response {
    let started = Instant::now();
    let (fate, b, elapsed) = ep.fate(true);
    let Ok(request) = serde_json::from_slice::<serde_json::Value>(&body) else {
        return error(StatusCode::BAD_REQUEST, "invalid_request", "body is not JSON");
    };
    if let Some(r) = common(fate).await {
        return r;
    }
    let stream = request["stream"].as_bool().unwrap_or(false);
    let max_tokens = request["max_tokens"].as_u64().unwrap_or(u64::MAX);
    let tokens = u64::from(b.tokens).min(max_tokens).max(1);
    let ttft = b.ttft(elapsed);
    // What the simulator decided, for tests that must not measure how long a busy machine took.
    let decided = [
        (DECIDED_TTFT, HeaderValue::from(ttft.as_millis() as u64)),
        (DECIDED_AT, HeaderValue::from(elapsed.as_millis() as u64)),
    ];
    let token = Duration::from_millis(b.token_ms);
    let n = ep.requests.load(Ordering::Relaxed);
    let id = format!("chatcmpl-{}-{n}", ep.name);
    if !stream {
        tokio::time::sleep_until(started + ttft + token * (tokens as u32 - 1)).await;
        if fate == Fate::Drop {
            return Response::new(broken(Bytes::from_static(b"{\"id\"")));
        }
        let text: Vec<&str> = (0..tokens).map(|_| "tok").collect();
        let body = serde_json::json!({
            "id": id,
            "object": "chat.completion",
            "created": 0,
            "model": "sim",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text.join(" ")}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 8, "completion_tokens": tokens, "total_tokens": 8 + tokens},
        });
        let mut r = Json(body).into_response();
        r.headers_mut().extend(decided);
        return r;
    }
    // The role chunk at once (as OpenAI does), then the content tokens: the first content token
    // arrives at `ttft` after the request, the rest `token_ms` apart; a dropped stream breaks
    // after the first token.
    let drop_after = (fate == Fate::Drop).then_some(1u64);
    let role_late = b.role_chunk_with_first_token;
    let state = (0u64, id);
    let s = futures::stream::unfold(state, move |(step, id)| async move {
        let item: Result<Bytes, std::io::Error> = match step {
            0 => {
                if role_late {
                    tokio::time::sleep_until(started + ttft).await;
                }
                Ok(chunk(
                    &id,
                    serde_json::json!({"role": "assistant", "content": ""}),
                    None,
                ))
            }
            k if drop_after.is_some_and(|d| k == d + 1) => Err(std::io::Error::new(
                std::io::ErrorKind::ConnectionReset,
                "dropped by the simulator",
            )),
            k if k <= tokens => {
                tokio::time::sleep_until(started + ttft + token * (k as u32 - 1)).await;
                Ok(chunk(&id, serde_json::json!({"content": "tok "}), None))
            }
            k if k == tokens + 1 => Ok(chunk(&id, serde_json::json!({}), Some("stop"))),
            k if k == tokens + 2 => Ok(Bytes::from_static(b"data: [DONE]\n\n")),
            _ => return None,
        };
        let stop = item.is_err();
        Some((item, (if stop { u64::MAX - 1 } else { step + 1 }, id)))
    });
    let mut r = Response::new(Body::from_stream(s));
    r.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
    r.headers_mut().extend(decided);
    r
}

/// The first token the simulator chose for a completion, in ms (a response header).
pub const DECIDED_TTFT: header::HeaderName = header::HeaderName::from_static("x-sim-ttft-ms");
/// How far into its behaviour (ramps and periods count from there) the endpoint was when it
/// chose, in ms (a response header).
pub const DECIDED_AT: header::HeaderName = header::HeaderName::from_static("x-sim-at-ms");

pub(crate) fn endpoint_router(ep: Arc<Endpoint>) -> Router {
    Router::new()
        .route("/v1/chat/completions", post(completions))
        .route("/health", get(health))
        .route("/health/deep", get(deep_health))
        .with_state(ep)
}

/// Serve one endpoint: listen while it is not refusing, close the listener while it is (a
/// period switches between the two at its phase changes).
pub(crate) async fn serve_endpoint(ep: Arc<Endpoint>, first: Option<TcpListener>, mut stop: watch::Receiver<bool>) {
    let mut changes = ep.behaviour.subscribe();
    let mut listener = first;
    loop {
        if *stop.borrow() {
            return;
        }
        let (b, since) = changes.borrow_and_update().clone();
        let elapsed = since.elapsed();
        let refusing = b.refuse && b.bad_at(elapsed);
        let phase_change = b
            .next_phase_change(elapsed)
            .filter(|_| b.refuse)
            .map(|d| Instant::now() + d);
        let wake = async move {
            match phase_change {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        if refusing {
            drop(listener.take());
            tokio::select! {
                _ = changes.changed() => {}
                _ = wake => {}
                _ = stop.changed() => {}
            }
            continue;
        }
        let l = match listener.take() {
            Some(l) => l,
            None => match bind(ep.port).await {
                Ok(l) => l,
                Err(e) => {
                    tracing::error!(endpoint = %ep.name, port = ep.port, error = %e, "cannot listen again");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        let app = endpoint_router(ep.clone());
        tokio::select! {
            r = axum::serve(l, app) => {
                if let Err(e) = r {
                    tracing::error!(endpoint = %ep.name, error = %e, "endpoint server failed");
                }
                return;
            }
            _ = changes.changed() => {}
            _ = wake => {}
            _ = stop.changed() => {}
        }
    }
}

/// Bind 127.0.0.1:`port`, retrying briefly: a port just closed may take a moment to rebind.
pub(crate) async fn bind(port: u16) -> std::io::Result<TcpListener> {
    let mut last = None;
    for _ in 0..50 {
        match TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], port))).await {
            Ok(l) => return Ok(l),
            Err(e) => last = Some(e),
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Err(last.expect("tried at least once"))
}
