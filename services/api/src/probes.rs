//! Liveness, readiness (Postgres and Kafka reachable) and metrics.

use crate::AppState;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use rdkafka::producer::Producer;
use std::time::Duration;

#[utoipa::path(get, path = "/healthz", tag = "service",
    responses((status = 200, description = "The process is alive", body = String, content_type = "text/plain")))]
pub async fn healthz() -> &'static str {
    "ok"
}

#[utoipa::path(get, path = "/readyz", tag = "service",
    responses((status = 200, description = "Postgres and Kafka are reachable", body = String, content_type = "text/plain"),
              (status = 503, description = "Postgres or Kafka is not", body = String, content_type = "text/plain")))]
pub async fn readyz(State(app): State<AppState>) -> (StatusCode, &'static str) {
    if sqlx::query("SELECT 1").execute(&app.db).await.is_err() {
        return (StatusCode::SERVICE_UNAVAILABLE, "database unreachable");
    }
    let producer = app.producer.clone();
    let topic = app.cfg.topics.signals_topic.clone();
    let kafka = tokio::task::spawn_blocking(move || {
        producer
            .client()
            .fetch_metadata(Some(&topic), Duration::from_secs(2))
            .is_ok()
    })
    .await
    .unwrap_or(false);
    if !kafka {
        return (StatusCode::SERVICE_UNAVAILABLE, "kafka unreachable");
    }
    (StatusCode::OK, "ready")
}

#[utoipa::path(get, path = "/metrics", tag = "service",
    responses((status = 200, description = "Prometheus metrics (OpenMetrics text)", body = String, content_type = "application/openmetrics-text")))]
pub async fn metrics(State(app): State<AppState>) -> impl IntoResponse {
    app.metrics.response()
}
