//! Liveness, readiness and Prometheus metrics over HTTP.

use crate::metrics::Metrics;
use crate::progress::Progress;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use axum::Router;
use sqlx::PgPool;
use std::sync::Arc;

#[derive(Clone)]
pub struct Health {
    pub metrics: Arc<Metrics>,
    pub pool: PgPool,
    /// Every lane's consumer has joined the group and restored every partition it was assigned.
    pub ready: Arc<crate::lanes::Readiness>,
    pub progress: Arc<Progress>,
    pub restore: Arc<crate::receiver::RestoreStatus>,
}

pub fn router(state: Health) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(ready))
        .route("/metrics", get(metrics))
        .with_state(state)
}

async fn ready(State(h): State<Health>) -> (StatusCode, String) {
    let unavailable = |why: &str| (StatusCode::SERVICE_UNAVAILABLE, why.to_owned());
    if let Some(problem) = h.restore.problem() {
        return unavailable(&problem);
    }
    if !h.ready.all() {
        return unavailable("partitions not assigned and restored");
    }
    if sqlx::query("SELECT 1").execute(&h.pool).await.is_err() {
        return unavailable("database unreachable");
    }
    let stalled = h.progress.stalled();
    if !stalled.is_empty() {
        return unavailable(&format!("partitions {stalled:?} have lag and made no progress"));
    }
    (StatusCode::OK, "ready".to_owned())
}

async fn metrics(State(h): State<Health>) -> impl axum::response::IntoResponse {
    h.metrics.response(&h.progress.figures(), h.progress.group_lag())
}
