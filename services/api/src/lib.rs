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
pub mod metrics;
pub mod openapi;
pub mod ops;
pub mod probes;
pub mod serve;
pub mod stream;

use anyhow::Context;
use auth::{Principal, Role, Token};
use axum::extract::DefaultBodyLimit;
use axum::routing::{get, post, put};
use axum::{Json, Router};
use config::Config;
use error::ApiError;
use rdkafka::producer::{FutureProducer, Producer};
use rdkafka::ClientConfig;
use sqlx::PgPool;
use std::sync::Arc;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use utoipa::OpenApi;

#[derive(Clone)]
pub struct AppState {
    pub cfg: Arc<Config>,
    pub tokens: Arc<Vec<Token>>,
    pub db: PgPool,
    pub producer: FutureProducer,
    pub metrics: Arc<metrics::Metrics>,
    pub streams: Arc<Semaphore>,
    /// The stream slots anonymous clients may take (the rest are kept for token holders).
    pub anonymous_streams: Arc<Semaphore>,
    /// Live streams per client (token name or IP address).
    pub stream_clients: Arc<std::sync::Mutex<std::collections::HashMap<String, usize>>>,
    /// Concurrency of each route, by route template.
    pub route_limits: Arc<std::sync::Mutex<std::collections::HashMap<String, Arc<Semaphore>>>>,
    pub cancel: CancellationToken,
}

impl AppState {
    pub fn authorize(&self, headers: &axum::http::HeaderMap, need: Role) -> Result<Principal, ApiError> {
        auth::authorize(headers, &self.tokens, need)
    }

    /// Reads are open unless `--read-requires-token`.
    pub fn authorize_read(&self, headers: &axum::http::HeaderMap) -> Result<(), ApiError> {
        if self.cfg.read_requires_token {
            self.authorize(headers, Role::Reader)?;
        }
        Ok(())
    }

    pub fn producer_in_flight(&self) -> usize {
        self.producer.in_flight_count().max(0) as usize
    }
}

pub fn router(state: AppState) -> Router {
    let api = Router::new()
        .route("/v1/transitions", get(history::history))
        .route("/v1/pools", get(health::pools))
        .route("/v1/pools/{pool}", get(health::pool))
        .route("/v1/pools/{pool}/endpoints/{endpoint}", get(health::endpoint))
        .route(
            "/v1/pools/{pool}/endpoints/{endpoint}/override",
            post(ops::override_endpoint),
        )
        .route("/v1/pools/{pool}/policy", put(ops::put_policy))
        .route("/v1/stream", get(stream::stream))
        .route("/v1/signals", post(ingest::ingest))
        .route("/v1/openapi.json", get(|| async { Json(openapi::ApiDoc::openapi()) }))
        .route("/healthz", get(probes::healthz))
        .route("/readyz", get(probes::readyz))
        .route("/metrics", get(probes::metrics))
        .route_layer(axum::middleware::from_fn_with_state(state.clone(), limit::per_route))
        .route_layer(axum::middleware::from_fn_with_state(state.clone(), metrics::track));
    api.fallback(|| async { ApiError::NotFound("no such route".into()) })
        .layer(DefaultBodyLimit::max(state.cfg.max_body_bytes))
        .with_state(state)
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
        let app = router(self.state);
        serve::serve(self.listener, app, limits, cancel).await;
        Ok(())
    }
}

/// Connect to Postgres read-only (the processor owns and migrates the schema; the API only
/// checks that the schema is at the version it was built for) and Kafka, and bind the listener.
pub async fn build(cfg: Config, cancel: CancellationToken) -> anyhow::Result<App> {
    cfg.validate()?;
    tracing::info!(config = ?cfg, "starting vitals-api");
    let tokens = cfg.tokens()?;
    if tokens.is_empty() {
        tracing::warn!("no tokens configured: every write route will answer 401");
    }
    let db = connect_read_only(&cfg).await.with_context(|| {
        format!(
            "connecting to {}",
            vitals_processor::config::redact_url(&cfg.database_url)
        )
    })?;
    let mut pc = ClientConfig::new();
    pc.set("bootstrap.servers", &cfg.brokers)
        .set("enable.idempotence", "true")
        .set("acks", "all")
        .set("linger.ms", "2")
        .set("message.timeout.ms", cfg.produce_timeout_ms.to_string())
        .set("queue.buffering.max.messages", cfg.producer_queue.to_string());
    for (k, v) in cfg.kafka_pairs() {
        pc.set(k, v);
    }
    let producer: FutureProducer = pc.create().context("creating the Kafka producer")?;
    let listener = tokio::net::TcpListener::bind(cfg.http_addr)
        .await
        .with_context(|| format!("binding {}", cfg.http_addr))?;
    tracing::info!(addr = %listener.local_addr()?, "listening");
    let state = AppState {
        streams: Arc::new(Semaphore::new(cfg.max_streams)),
        anonymous_streams: Arc::new(Semaphore::new(cfg.anonymous_streams())),
        stream_clients: Arc::default(),
        route_limits: Arc::default(),
        cfg: Arc::new(cfg),
        tokens: Arc::new(tokens),
        db,
        producer,
        metrics: Arc::default(),
        cancel,
    };
    Ok(App { listener, state })
}

/// A pool of read-only sessions (`default_transaction_read_only`, bounded statements) on the
/// configured schema, after checking that the schema exists and is migrated to the version this
/// build expects. The API's role needs only `SELECT` on the schema's tables (README, "Roles").
pub async fn connect_read_only(cfg: &Config) -> anyhow::Result<PgPool> {
    use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
    use std::str::FromStr;
    let opts = PgConnectOptions::from_str(&cfg.database_url)?.options([
        ("search_path", cfg.db_schema.as_str()),
        ("default_transaction_read_only", "on"),
        ("statement_timeout", "10s"),
        ("idle_in_transaction_session_timeout", "10s"),
    ]);
    let db = PgPoolOptions::new()
        .max_connections(cfg.db_max_connections)
        .acquire_timeout(std::time::Duration::from_secs(2))
        .connect_with(opts)
        .await?;
    let want = vitals_processor::db::MIGRATOR
        .iter()
        .map(|m| m.version)
        .max()
        .unwrap_or(0);
    let have: Option<i64> = sqlx::query_scalar("SELECT max(version) FROM _sqlx_migrations WHERE success")
        .fetch_one(&db)
        .await
        .map_err(|e| {
            anyhow::anyhow!(
                "schema {:?} is not migrated or not readable by this role ({e}); the processor creates and \
             migrates it (start vitals-processor first), and the API's role needs USAGE on the schema and \
             SELECT on its tables",
                cfg.db_schema
            )
        })?;
    match have {
        Some(v) if v >= want => {
            if v > want {
                tracing::warn!(
                    schema_version = v,
                    built_for = want,
                    "the schema is newer than this API"
                );
            }
            Ok(db)
        }
        v => anyhow::bail!(
            "schema {:?} is at migration {:?}, this API needs {want}: upgrade the processor first",
            cfg.db_schema,
            v
        ),
    }
}
