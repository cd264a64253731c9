//! The vitals HTTP API. `build(config)` connects and binds; `App::run(cancel)` serves until the
//! token fires. `router(state)` is testable without a socket.

pub mod auth;
pub mod config;
pub mod error;
pub mod extract;
pub mod health;
pub mod history;
pub mod ingest;
pub mod limit;
pub mod live;
pub mod metrics;
pub mod openapi;
pub mod ops;
pub mod params;
pub mod probes;
pub mod serve;
pub mod uptime;

use anyhow::Context;
use axum::extract::DefaultBodyLimit;
use axum::routing::{get, post, put};
use axum::{Json, Router};
use config::Config;
use error::ApiError;
use rdkafka::producer::{FutureProducer, Producer};
use sqlx::PgPool;
use std::sync::Arc;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use utoipa::OpenApi;

#[derive(Clone)]
pub struct AppState {
    pub cfg: Arc<Config>,
    pub tokens: Arc<vitals_runtime::tokens::Watched>,
    pub db: PgPool,
    pub producer: FutureProducer,
    pub metrics: Arc<metrics::Metrics>,
    /// The places of live streams: in all, for anonymous clients, per client.
    pub streams: Arc<live::slot::Places>,
    /// The places of streams served from Kafka (resuming from before the hub's ring).
    pub kafka_streams: Arc<live::slot::Places>,
    /// The one reader of the changes topic that feeds every live stream.
    pub hub: Arc<live::Hub>,
    /// Concurrency of each route, by route template.
    pub route_limits: Arc<std::sync::Mutex<std::collections::HashMap<String, Arc<Semaphore>>>>,
    pub cancel: CancellationToken,
}

impl AppState {
    pub fn producer_in_flight(&self) -> usize {
        self.producer.in_flight_count().max(0) as usize
    }
}

pub fn router(state: AppState) -> Router {
    let api = Router::new()
        .route("/", get(dashboard))
        .route("/favicon.ico", get(favicon))
        .route("/v1/transitions", get(history::history))
        .route("/v1/pools", get(health::pools))
        .route("/v1/pools/{pool}", get(health::pool))
        .route("/v1/pools/{pool}/endpoints/{endpoint}", get(health::endpoint))
        .route(
            "/v1/pools/{pool}/endpoints/{endpoint}/override",
            post(ops::override_endpoint),
        )
        .route("/v1/pools/{pool}/policy", put(ops::put_policy).get(ops::get_policy))
        .route("/v1/pools/{pool}/uptime", get(uptime::uptime))
        .route("/v1/incidents", get(uptime::incidents))
        .route("/v1/stream", get(live::stream))
        .route("/v1/signals", post(ingest::ingest))
        .route("/v1/openapi.json", get(|| async { Json(openapi::ApiDoc::openapi()) }))
        .route("/healthz", get(probes::healthz))
        .route("/readyz", get(probes::readyz))
        .route("/metrics", get(probes::metrics))
        .route_layer(axum::middleware::map_response(method_not_allowed))
        .route_layer(axum::middleware::from_fn_with_state(state.clone(), limit::per_route))
        .route_layer(axum::middleware::from_fn_with_state(state.clone(), metrics::track));
    api.fallback(|| async { ApiError::NotFound("no such route".into()) })
        .layer(DefaultBodyLimit::max(state.cfg.max_body_bytes))
        .layer(axum::middleware::map_response(nosniff))
        .with_state(state)
}

/// Every answer says what it is: a browser must not sniff a JSON error into HTML.
async fn nosniff(mut r: axum::response::Response) -> axum::response::Response {
    r.headers_mut().insert(
        axum::http::header::X_CONTENT_TYPE_OPTIONS,
        axum::http::HeaderValue::from_static("nosniff"),
    );
    r
}

pub struct App {
    pub listener: tokio::net::TcpListener,
    pub state: AppState,
}

impl App {
    pub fn port(&self) -> u16 {
        self.listener.local_addr().map(|a| a.port()).unwrap_or(0)
    }

    pub async fn run(self) -> anyhow::Result<()> {
        let cancel = self.state.cancel.clone();
        let limits = serve::Limits {
            max_connections: self.state.cfg.max_connections,
            header_read_timeout: std::time::Duration::from_millis(self.state.cfg.header_read_timeout_ms),
        };
        let state = self.state.clone();
        let takeover: serve::Takeover =
            Arc::new(move |sock, peer| Box::pin(live::takeover(state.clone(), sock, peer, limits.header_read_timeout)));
        let app = router(self.state);
        serve::serve(self.listener, app, limits, cancel, Some(takeover)).await;
        Ok(())
    }
}

const DASHBOARD: &str = include_str!("../assets/dashboard.html");

/// The dashboard's Content-Security-Policy: nothing but its own inline script and style (by
/// their hashes), requests to this API, and no framing.
static DASHBOARD_CSP: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| dashboard_csp(DASHBOARD));

fn dashboard_csp(page: &str) -> String {
    use base64::Engine as _;
    use sha2::Digest as _;
    let hashes = |tag: &str| -> String {
        let (open, close) = (format!("<{tag}>"), format!("</{tag}>"));
        page.split(open.as_str())
            .skip(1)
            .filter_map(|rest| rest.split_once(close.as_str()).map(|(body, _)| body))
            .map(|body| {
                let digest = sha2::Sha256::digest(body.as_bytes());
                format!(" 'sha256-{}'", base64::engine::general_purpose::STANDARD.encode(digest))
            })
            .collect()
    };
    format!(
        "default-src 'none'; script-src{}; style-src{}; connect-src 'self'; img-src 'self' data:; \
         base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
        hashes("script"),
        hashes("style")
    )
}

/// The dashboard: one page, embedded in the binary, that reads this API; it may not be framed,
/// sniffed as another type, or run anything but its own script.
async fn dashboard() -> impl axum::response::IntoResponse {
    use axum::http::header;
    (
        [
            (header::CONTENT_SECURITY_POLICY, DASHBOARD_CSP.as_str()),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
            (header::X_FRAME_OPTIONS, "DENY"),
            (header::REFERRER_POLICY, "no-referrer"),
        ],
        axum::response::Html(DASHBOARD),
    )
}

/// Browsers ask for it on every page: no icon, and no 404 for it.
async fn favicon() -> impl axum::response::IntoResponse {
    (
        axum::http::StatusCode::NO_CONTENT,
        [(axum::http::header::CACHE_CONTROL, "public, max-age=86400")],
    )
}

/// A route's 405 (empty from the router) gets the API's error body, keeping its `Allow`
/// header; inside the routes' layers, so that it is counted like any answer.
async fn method_not_allowed(r: axum::response::Response) -> axum::response::Response {
    use axum::response::IntoResponse;
    if r.status() != axum::http::StatusCode::METHOD_NOT_ALLOWED {
        return r;
    }
    let mut answer = ApiError::MethodNotAllowed.into_response();
    if let Some(allow) = r.headers().get(axum::http::header::ALLOW) {
        answer.headers_mut().insert(axum::http::header::ALLOW, allow.clone());
    }
    answer
}

/// Connect to Postgres (read-only) and Kafka, and bind the listener.
pub async fn build(mut cfg: Config, cancel: CancellationToken) -> anyhow::Result<App> {
    cfg.validate()?;
    // Connections beyond the open-file limit would fail on accept ("Too many open files") and
    // starve every other socket: fit them to it, or refuse a number it cannot hold.
    cfg.max_connections = cfg.fit_connections()?;
    tracing::info!(config = ?cfg, "starting vitals-api");
    let tokens = Arc::new(cfg.tokens()?);
    tokio::spawn(tokens.clone().watch(std::time::Duration::from_secs(2), cancel.clone()));
    if tokens.get().is_empty() {
        tracing::warn!("no tokens configured: every write route will answer 401");
    }
    // Read-only: the processor owns and migrates the schema; the API only checks that it is at
    // the version it was built for. Its role needs only SELECT on the schema's tables.
    let db = vitals_store::connect_reader(&cfg.db.database_url, &cfg.db.db_schema, cfg.db_max_connections)
        .await
        .with_context(|| format!("connecting to {}", cfg.db.shown()))?;
    let (timeout, queue) = (cfg.produce_timeout_ms.to_string(), cfg.producer_queue.to_string());
    let producer: FutureProducer = vitals_runtime::kafka::producer(
        &cfg.kafka,
        &[
            ("message.timeout.ms", timeout.as_str()),
            ("queue.buffering.max.messages", queue.as_str()),
        ],
    )
    .create()
    .context("creating the Kafka producer")?;
    let listener = tokio::net::TcpListener::bind(cfg.http_addr)
        .await
        .with_context(|| format!("binding {}", cfg.http_addr))?;
    tracing::info!(addr = %listener.local_addr()?, "listening");
    let hub = live::Hub::new(cfg.stream_ring, cfg.stream_client_buffer, cfg.stream_writers);
    let metrics: Arc<metrics::Metrics> = Arc::default();
    tokio::spawn(hub.clone().run(
        cfg.kafka.clone(),
        cfg.topics.changes_topic.clone(),
        metrics.clone(),
        cancel.clone(),
    ));
    let state = AppState {
        streams: Arc::new(live::slot::Places::new(
            cfg.max_streams,
            cfg.max_streams_per_client,
            "live streams",
        )),
        kafka_streams: Arc::new(live::slot::Places::new(
            cfg.max_kafka_streams,
            cfg.max_kafka_streams_per_client,
            "live streams resuming from far back",
        )),
        hub,
        route_limits: Arc::default(),
        cfg: Arc::new(cfg),
        tokens,
        db,
        producer,
        metrics,
        cancel,
    };
    Ok(App { listener, state })
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_dashboards_policy_allows_exactly_its_own_inline_script_and_style() {
        let csp = super::dashboard_csp("<style>a{}</style><script>go()</script><script>x()</script>");
        assert_eq!(csp.matches("'sha256-").count(), 3, "{csp}");
        assert!(
            csp.contains("frame-ancestors 'none'") && csp.contains("default-src 'none'"),
            "{csp}"
        );
        assert!(!super::DASHBOARD_CSP.contains("unsafe"), "{}", *super::DASHBOARD_CSP);
    }
}
