//! Liveness, readiness, metrics, and the heartbeat route: an endpoint that pushes heartbeats
//! (the push model of a heartbeat) posts them here and they become `ProbeResult`s of kind heartbeat.

use crate::metrics::Metrics;
use crate::schedule::Context;
use crate::shard::Ownership;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Deserialize;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};
use tokio::sync::watch;
use vitals_contracts::{validate_signal, OutcomeClass, ProbeKind, ProbeResult, Signal};

#[derive(Clone)]
pub struct Shared {
    pub ctx: Arc<Context>,
    pub metrics: Arc<Metrics>,
    pub ownership: watch::Receiver<Ownership>,
}

pub fn router(s: Shared) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(ready))
        .route(
            "/metrics",
            get(|State(s): State<Shared>| async move { s.metrics.render() }),
        )
        .route("/v1/heartbeats", post(heartbeat))
        .with_state(s)
}

async fn ready(State(s): State<Shared>) -> (StatusCode, &'static str) {
    if !s.ownership.borrow().assigned {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            "waiting for the shard group to assign shards",
        );
    }
    match s.metrics.deliveries.problem() {
        Some(why) => (StatusCode::SERVICE_UNAVAILABLE, why),
        None => (StatusCode::OK, "ready"),
    }
}

/// A heartbeat: the endpoint says it is alive and how often it will say so.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Heartbeat {
    pool: String,
    endpoint: String,
    interval_ms: Option<i64>,
    #[serde(default)]
    detail: String,
}

fn bad(field: &str, message: String) -> Response {
    (
        StatusCode::BAD_REQUEST,
        Json(serde_json::json!({"error": message, "field": field})),
    )
        .into_response()
}

async fn heartbeat(State(s): State<Shared>, body: axum::body::Bytes) -> Response {
    let h: Heartbeat = match serde_json::from_slice(&body) {
        Ok(h) => h,
        Err(e) => return bad("body", e.to_string()),
    };
    let at = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as i64);
    let r = ProbeResult {
        probe_id: format!("{}/heartbeat/{}/{}/{at}", s.ctx.prober, h.pool, h.endpoint),
        pool: h.pool,
        endpoint: h.endpoint,
        prober: s.ctx.prober.clone(),
        occurred_at: at,
        kind: ProbeKind::Heartbeat,
        outcome: OutcomeClass::Success,
        latency_us: 0,
        ttft_us: None,
        http_status: None,
        interval_ms: h.interval_ms,
        dependencies: vec![],
        detail: h.detail,
    };
    let signal = Signal::Probe(r);
    if let Err(e) = validate_signal(&signal, Some(at)) {
        return bad(e.field, e.message);
    }
    let Signal::Probe(r) = signal else { unreachable!() };
    s.metrics.heartbeats.inc();
    s.ctx.sink.publish(r);
    (StatusCode::ACCEPTED, Json(serde_json::json!({"accepted": true}))).into_response()
}
