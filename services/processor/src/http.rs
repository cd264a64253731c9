//! Liveness, readiness and Prometheus metrics over HTTP.

use crate::metrics::Metrics;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use axum::Router;
use sqlx::PgPool;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

#[derive(Clone)]
pub struct Health {
    pub metrics: Arc<Metrics>,
    pub pool: PgPool,
    /// The consumer has joined its group and restored every partition it was assigned.
    pub ready: Arc<AtomicBool>,
}

pub fn router(state: Health) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(ready))
        .route("/metrics", get(metrics))
        .with_state(state)
}

async fn ready(State(h): State<Health>) -> (StatusCode, &'static str) {
    if !h.ready.load(Ordering::Relaxed) {
        return (StatusCode::SERVICE_UNAVAILABLE, "partitions not assigned and restored");
    }
    match sqlx::query("SELECT 1").execute(&h.pool).await {
        Ok(_) => (StatusCode::OK, "ready"),
        Err(_) => (StatusCode::SERVICE_UNAVAILABLE, "database unreachable"),
    }
}

async fn metrics(State(h): State<Health>) -> ([(axum::http::header::HeaderName, &'static str); 1], String) {
    (
        [(axum::http::header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        h.metrics.render(),
    )
}
