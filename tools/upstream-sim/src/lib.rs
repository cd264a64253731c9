//! Simulated upstream endpoints with injectable faults: the ground that the prober, the router
//! and the demo are tested on.
//!
//! One process serves many endpoints, one port each on 127.0.0.1. Each speaks an
//! OpenAI-compatible `POST /v1/chat/completions` (streaming SSE and not), a plain health route
//! (`GET /health`), a deep-health route listing dependencies (`GET /health/deep`), and accepts raw
//! TCP. What each endpoint does is a [`Behaviour`], set at start and replaced live through the
//! admin API (`GET /endpoints`, `GET`/`PUT /endpoints/{name}`) or [`Sim::set`].
//!
//! Determinism: the fate of an endpoint's k-th request is a function of the seed, the endpoint's
//! name and k, so a run with the same seed and the same requests sees the same faults.

use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use bytes::Bytes;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// Longest first token, ramp, period or Retry-After a behaviour may ask for: an hour.
const MAX_MS: u64 = 3_600_000;
/// How long a hanging request hangs (a client times out long before).
const HANG: Duration = Duration::from_secs(3_600);

/// What one endpoint does. Every field has a default (a healthy endpoint answering its first
/// token in 250 ms); unknown fields are an error.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Behaviour {
    /// Time to the first content token, ms.
    pub ttft_ms: u64,
    /// Ramp the first token from `ttft_ms` to this over `ramp_ms`, from when the behaviour was set.
    pub ttft_to_ms: Option<u64>,
    pub ramp_ms: u64,
    /// Content tokens a completion streams (at most the request's `max_tokens`).
    pub tokens: u32,
    /// Time between content tokens, ms.
    pub token_ms: u64,
    /// Share of requests answered 503.
    pub server_errors: f64,
    /// Share of completions answered 429, with `Retry-After: retry_after_s` when set.
    pub rate_limited: f64,
    pub retry_after_s: Option<u64>,
    /// Share of completions answered 400.
    pub client_errors: f64,
    /// Share of requests whose connection drops mid-response.
    pub drops: f64,
    /// The listener is closed: connections are refused.
    pub refuse: bool,
    /// Requests are never answered.
    pub hang: bool,
    /// A stream's role chunk comes with its first content token instead of at once (some
    /// upstreams send nothing before the first token; a gateway that times the first chunk sees
    /// a slow first token only then).
    pub role_chunk_with_first_token: bool,
    /// The faults above apply only in the bad part of each period (healthy in the good part).
    pub period: Option<Period>,
    /// What the deep-health route reports; a critical one down makes it answer 503.
    pub dependencies: Vec<Dependency>,
}

impl Default for Behaviour {
    fn default() -> Self {
        Behaviour {
            ttft_ms: 250,
            ttft_to_ms: None,
            ramp_ms: 0,
            tokens: 8,
            token_ms: 10,
            server_errors: 0.0,
            rate_limited: 0.0,
            retry_after_s: None,
            client_errors: 0.0,
            drops: 0.0,
            refuse: false,
            hang: false,
            role_chunk_with_first_token: false,
            period: None,
            dependencies: Vec::new(),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Period {
    pub bad_ms: u64,
    pub good_ms: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Dependency {
    pub name: String,
    pub critical: bool,
    pub status: DependencyStatus,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DependencyStatus {
    Up,
    Degraded,
    Down,
}

/// A behaviour that cannot be served, with the field at fault.
#[derive(Debug, Clone, PartialEq)]
pub struct Invalid {
    pub field: &'static str,
    pub message: String,
}

impl std::fmt::Display for Invalid {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.field, self.message)
    }
}

impl std::error::Error for Invalid {}

fn invalid(field: &'static str, message: impl Into<String>) -> Invalid {
    Invalid {
        field,
        message: message.into(),
    }
}

impl Behaviour {
    pub fn validate(&self) -> Result<(), Invalid> {
        let ms = |field, v: u64| {
            if v > MAX_MS {
                Err(invalid(field, format!("{v} ms is more than an hour")))
            } else {
                Ok(())
            }
        };
        ms("ttft_ms", self.ttft_ms)?;
        ms("ttft_to_ms", self.ttft_to_ms.unwrap_or(0))?;
        ms("ramp_ms", self.ramp_ms)?;
        ms("token_ms", self.token_ms)?;
        ms("retry_after_s", self.retry_after_s.unwrap_or(0).saturating_mul(1000))?;
        if self.tokens > 10_000 {
            return Err(invalid("tokens", "at most 10000"));
        }
        let mut sum = 0.0;
        for (field, v) in [
            ("server_errors", self.server_errors),
            ("rate_limited", self.rate_limited),
            ("client_errors", self.client_errors),
            ("drops", self.drops),
        ] {
            if !(0.0..=1.0).contains(&v) {
                return Err(invalid(field, format!("{v} is not a share within 0..=1")));
            }
            sum += v;
        }
        if sum > 1.0 + 1e-9 {
            return Err(invalid(
                "drops",
                format!("server_errors + rate_limited + client_errors + drops is {sum}, more than 1"),
            ));
        }
        if let Some(p) = self.period {
            if p.bad_ms == 0 || p.good_ms == 0 || p.bad_ms > MAX_MS || p.good_ms > MAX_MS {
                return Err(invalid("period", "bad_ms and good_ms must be within 1..=3600000"));
            }
        }
        if self.dependencies.iter().any(|d| d.name.is_empty()) {
            return Err(invalid("dependencies", "a dependency needs a name"));
        }
        Ok(())
    }

    /// Whether the faults apply `elapsed` after the behaviour was set.
    fn bad_at(&self, elapsed: Duration) -> bool {
        match self.period {
            None => true,
            Some(p) => (elapsed.as_millis() as u64) % (p.bad_ms + p.good_ms) < p.bad_ms,
        }
    }

    /// When the phase changes next, `elapsed` after the behaviour was set.
    fn next_phase_change(&self, elapsed: Duration) -> Option<Duration> {
        let p = self.period?;
        let cycle = p.bad_ms + p.good_ms;
        let pos = elapsed.as_millis() as u64 % cycle;
        let left = if pos < p.bad_ms { p.bad_ms - pos } else { cycle - pos };
        Some(Duration::from_millis(left))
    }

    fn ttft(&self, elapsed: Duration) -> Duration {
        let from = self.ttft_ms as f64;
        let ms = match self.ttft_to_ms {
            Some(to) if self.ramp_ms > 0 => {
                let done = (elapsed.as_millis() as f64 / self.ramp_ms as f64).min(1.0);
                from + (to as f64 - from) * done
            }
            Some(to) => to as f64,
            None => from,
        };
        Duration::from_micros((ms * 1000.0) as u64)
    }
}

/// One endpoint of the configuration.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EndpointConfig {
    pub name: String,
    /// 0: any free port.
    #[serde(default)]
    pub port: u16,
    #[serde(default)]
    pub behaviour: Behaviour,
}

/// The simulator's configuration (a TOML file, or built by flags or by a test).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SimConfig {
    #[serde(default)]
    pub seed: u64,
    /// The admin API's address; port 0 picks a free one.
    #[serde(default = "default_admin")]
    pub admin: SocketAddr,
    #[serde(default, rename = "endpoint")]
    pub endpoints: Vec<EndpointConfig>,
}

fn default_admin() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 0))
}

impl SimConfig {
    /// `n` healthy endpoints `e0`…, on free ports.
    pub fn healthy(n: usize, seed: u64) -> SimConfig {
        SimConfig {
            seed,
            admin: default_admin(),
            endpoints: (0..n)
                .map(|i| EndpointConfig {
                    name: format!("e{i}"),
                    port: 0,
                    behaviour: Behaviour::default(),
                })
                .collect(),
        }
    }

    /// Parse and check a TOML configuration; errors name the line and the field.
    pub fn from_toml(text: &str) -> anyhow::Result<SimConfig> {
        let config: SimConfig = toml::from_str(text).map_err(|e| anyhow::anyhow!("{e}"))?;
        config.validate()?;
        Ok(config)
    }

    pub fn validate(&self) -> anyhow::Result<()> {
        let mut names = std::collections::BTreeSet::new();
        for e in &self.endpoints {
            if e.name.is_empty() || e.name.len() > 200 || e.name.contains('/') {
                anyhow::bail!("endpoint name {:?}: 1..=200 bytes, no '/'", e.name);
            }
            if !names.insert(e.name.as_str()) {
                anyhow::bail!("endpoint {:?} is configured twice", e.name);
            }
            e.behaviour
                .validate()
                .map_err(|err| anyhow::anyhow!("endpoint {:?}: behaviour.{err}", e.name))?;
        }
        Ok(())
    }
}

/// What happens to one request.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Fate {
    Ok,
    ServerError,
    RateLimited(Option<u64>),
    ClientError,
    Drop,
    Hang,
}

struct Endpoint {
    name: String,
    port: u16,
    seed: u64,
    requests: AtomicU64,
    /// The behaviour and when it was set (ramps and periods count from there).
    behaviour: watch::Sender<(Behaviour, Instant)>,
}

fn splitmix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

fn fnv(s: &str) -> u64 {
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

fn error(status: StatusCode, kind: &str, message: &str) -> Response {
    let body = serde_json::json!({"error": {"type": kind, "message": message}});
    (status, Json(body)).into_response()
}

/// A body that sends `first` and then breaks the connection.
fn broken(first: Bytes) -> Body {
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
async fn common(fate: Fate) -> Option<Response> {
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

async fn health(State(ep): State<Arc<Endpoint>>) -> Response {
    let (fate, _, _) = ep.fate(false);
    if let Some(r) = common(fate).await {
        return r;
    }
    if fate == Fate::Drop {
        return Response::new(broken(Bytes::from_static(b"{\"sta")));
    }
    Json(serde_json::json!({"status": "ok", "endpoint": ep.name})).into_response()
}

async fn deep_health(State(ep): State<Arc<Endpoint>>) -> Response {
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

fn chunk(id: &str, delta: serde_json::Value, finish: Option<&str>) -> Bytes {
    let v = serde_json::json!({
        "id": id,
        "object": "chat.completion.chunk",
        "created": 0,
        "model": "sim",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    });
    Bytes::from(format!("data: {v}\n\n"))
}

async fn completions(State(ep): State<Arc<Endpoint>>, body: Bytes) -> Response {
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

fn endpoint_router(ep: Arc<Endpoint>) -> Router {
    Router::new()
        .route("/v1/chat/completions", post(completions))
        .route("/health", get(health))
        .route("/health/deep", get(deep_health))
        .with_state(ep)
}

/// Serve one endpoint: listen while it is not refusing, close the listener while it is (a
/// period switches between the two at its phase changes).
async fn serve_endpoint(ep: Arc<Endpoint>, first: Option<TcpListener>, mut stop: watch::Receiver<bool>) {
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
async fn bind(port: u16) -> std::io::Result<TcpListener> {
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

type Endpoints = Arc<BTreeMap<String, Arc<Endpoint>>>;

#[derive(Serialize)]
struct EndpointView {
    name: String,
    address: String,
    requests: u64,
    behaviour: Behaviour,
}

fn view(ep: &Endpoint) -> EndpointView {
    EndpointView {
        name: ep.name.clone(),
        address: format!("127.0.0.1:{}", ep.port),
        requests: ep.requests.load(Ordering::Relaxed),
        behaviour: ep.behaviour.borrow().0.clone(),
    }
}

async fn admin_list(State(eps): State<Endpoints>) -> Json<Vec<EndpointView>> {
    Json(eps.values().map(|e| view(e)).collect())
}

async fn admin_get(State(eps): State<Endpoints>, Path(name): Path<String>) -> Response {
    match eps.get(&name) {
        Some(e) => Json(view(e)).into_response(),
        None => admin_error(StatusCode::NOT_FOUND, None, format!("no endpoint {name:?}")),
    }
}

async fn admin_put(State(eps): State<Endpoints>, Path(name): Path<String>, body: Bytes) -> Response {
    let Some(ep) = eps.get(&name) else {
        return admin_error(StatusCode::NOT_FOUND, None, format!("no endpoint {name:?}"));
    };
    let b: Behaviour = match serde_json::from_slice(&body) {
        Ok(b) => b,
        Err(e) => return admin_error(StatusCode::BAD_REQUEST, None, format!("behaviour: {e}")),
    };
    if let Err(e) = b.validate() {
        return admin_error(StatusCode::BAD_REQUEST, Some(e.field), e.message);
    }
    ep.behaviour.send_replace((b, Instant::now()));
    tracing::info!(endpoint = %name, "behaviour replaced");
    Json(view(ep)).into_response()
}

fn admin_error(status: StatusCode, field: Option<&str>, message: String) -> Response {
    (status, Json(serde_json::json!({"error": message, "field": field}))).into_response()
}

/// A running simulator.
pub struct Sim {
    admin: SocketAddr,
    endpoints: Endpoints,
    stop: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
}

impl Sim {
    /// Bind every endpoint and the admin API, then serve them in the background.
    pub async fn start(config: SimConfig) -> anyhow::Result<Sim> {
        config.validate()?;
        let (stop, _) = watch::channel(false);
        let mut endpoints = BTreeMap::new();
        let mut tasks = Vec::new();
        for e in config.endpoints {
            let listener = TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], e.port)))
                .await
                .map_err(|err| anyhow::anyhow!("endpoint {:?}: cannot listen on port {}: {err}", e.name, e.port))?;
            let port = listener.local_addr()?.port();
            let ep = Arc::new(Endpoint {
                seed: config.seed ^ fnv(&e.name),
                name: e.name.clone(),
                port,
                requests: AtomicU64::new(0),
                behaviour: watch::channel((e.behaviour, Instant::now())).0,
            });
            tasks.push(tokio::spawn(serve_endpoint(
                ep.clone(),
                Some(listener),
                stop.subscribe(),
            )));
            endpoints.insert(e.name, ep);
        }
        let endpoints: Endpoints = Arc::new(endpoints);
        let admin_listener = TcpListener::bind(config.admin)
            .await
            .map_err(|e| anyhow::anyhow!("admin API: cannot listen on {}: {e}", config.admin))?;
        let admin = admin_listener.local_addr()?;
        let app = Router::new()
            .route("/endpoints", get(admin_list))
            .route("/endpoints/{name}", get(admin_get).put(admin_put))
            .with_state(endpoints.clone());
        let mut admin_stop = stop.subscribe();
        tasks.push(tokio::spawn(async move {
            let shutdown = async move {
                let _ = admin_stop.changed().await;
            };
            if let Err(e) = axum::serve(admin_listener, app).with_graceful_shutdown(shutdown).await {
                tracing::error!(error = %e, "admin API failed");
            }
        }));
        Ok(Sim {
            admin,
            endpoints,
            stop,
            tasks,
        })
    }

    pub fn admin_addr(&self) -> SocketAddr {
        self.admin
    }

    /// The address of an endpoint.
    pub fn addr(&self, name: &str) -> Option<SocketAddr> {
        self.endpoints
            .get(name)
            .map(|e| SocketAddr::from(([127, 0, 0, 1], e.port)))
    }

    /// Every endpoint's name and address, in name order.
    pub fn endpoints(&self) -> Vec<(String, SocketAddr)> {
        self.endpoints
            .values()
            .map(|e| (e.name.clone(), SocketAddr::from(([127, 0, 0, 1], e.port))))
            .collect()
    }

    /// Replace an endpoint's behaviour (ramps and periods start again now).
    pub fn set(&self, name: &str, behaviour: Behaviour) -> anyhow::Result<()> {
        behaviour.validate()?;
        let ep = self
            .endpoints
            .get(name)
            .ok_or_else(|| anyhow::anyhow!("no endpoint {name:?}"))?;
        ep.behaviour.send_replace((behaviour, Instant::now()));
        Ok(())
    }

    /// Requests an endpoint has served.
    pub fn requests(&self, name: &str) -> u64 {
        self.endpoints
            .get(name)
            .map_or(0, |e| e.requests.load(Ordering::Relaxed))
    }

    /// Stop listening and end every task.
    pub async fn shutdown(self) {
        self.stop.send_replace(true);
        for t in self.tasks {
            t.abort();
            let _ = t.await;
        }
    }
}
