//! Liveness, readiness, metrics, and the heartbeat route: an endpoint that pushes heartbeats
//! (the push model of a heartbeat) posts them here and they become `ProbeResult`s of kind heartbeat.
//! A heartbeat keeps an endpoint alive in vitals' eyes, so it needs a token that may report for
//! its endpoint and pool (`--tokens-file`); without tokens, only a prober listening on loopback
//! takes them.

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
    /// Who may push heartbeats; `None`: anyone, if `loopback`, else no one.
    pub tokens: Option<Arc<vitals_runtime::tokens::Watched>>,
    pub loopback: bool,
}

/// Whether `headers` may push a heartbeat for `endpoint` of `pool`; the answer refusing it.
fn may_push(
    tokens: Option<&vitals_runtime::tokens::Watched>,
    loopback: bool,
    headers: &axum::http::HeaderMap,
    pool: &str,
    endpoint: &str,
) -> Result<(), (StatusCode, String)> {
    use vitals_runtime::tokens::{Denied, Need};
    let refuse = |code: StatusCode, message: String| Err((code, message));
    let Some(tokens) = tokens else {
        return if loopback {
            Ok(())
        } else {
            refuse(
                StatusCode::UNAUTHORIZED,
                "heartbeats need a token: this prober has no --tokens-file".into(),
            )
        };
    };
    let tokens = tokens.get();
    let values = headers
        .get_all(axum::http::header::AUTHORIZATION)
        .iter()
        .map(|v| v.as_bytes());
    match tokens.authorize(values, Need::Report) {
        Ok(t) => match t.binding.check(&t.name, "endpoint", endpoint, pool) {
            Ok(()) => Ok(()),
            Err(e) => refuse(StatusCode::FORBIDDEN, e.message),
        },
        Err(Denied::Forbidden) => refuse(StatusCode::FORBIDDEN, "this token may not report".into()),
        Err(Denied::Ambiguous) => refuse(StatusCode::BAD_REQUEST, "more than one Authorization header".into()),
        Err(Denied::Unauthenticated) => refuse(
            StatusCode::UNAUTHORIZED,
            "a bearer token that may report is needed".into(),
        ),
    }
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

async fn heartbeat(State(s): State<Shared>, headers: axum::http::HeaderMap, body: axum::body::Bytes) -> Response {
    let h: Heartbeat = match serde_json::from_slice(&body) {
        Ok(h) => h,
        Err(e) => return bad("body", e.to_string()),
    };
    if let Err((code, message)) = may_push(s.tokens.as_deref(), s.loopback, &headers, &h.pool, &h.endpoint) {
        s.metrics.heartbeats_refused.inc();
        return (
            code,
            Json(serde_json::json!({"error": message, "field": "Authorization"})),
        )
            .into_response();
    }
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

#[cfg(test)]
mod tests {
    use super::may_push;
    use axum::http::{HeaderMap, StatusCode};
    use vitals_runtime::tokens::Watched;

    #[test]
    fn a_heartbeat_needs_a_token_for_its_endpoint_and_pool_unless_the_prober_is_on_loopback_without_tokens() {
        let h = |v: Option<&str>| {
            let mut m = HeaderMap::new();
            if let Some(v) = v {
                m.insert("authorization", v.parse().unwrap());
            }
            m
        };
        assert!(may_push(None, true, &h(None), "p", "w1").is_ok());
        assert_eq!(
            may_push(None, false, &h(None), "p", "w1").unwrap_err().0,
            StatusCode::UNAUTHORIZED
        );
        let w = Watched::open(
            None,
            &[
                "workers:reporter;gateways=worker-*;pools=jobs:workers-secret-000001".into(),
                "viewer:reader:viewer-secret-0000001".into(),
            ],
        )
        .unwrap();
        let code = |auth: Option<&str>, pool: &str, ep: &str| match may_push(Some(&w), true, &h(auth), pool, ep) {
            Ok(()) => StatusCode::ACCEPTED,
            Err((c, _)) => c,
        };
        assert_eq!(
            code(Some("Bearer workers-secret-000001"), "jobs", "worker-1"),
            StatusCode::ACCEPTED
        );
        assert_eq!(
            code(None, "jobs", "worker-1"),
            StatusCode::UNAUTHORIZED,
            "tokens given: even on loopback"
        );
        assert_eq!(
            code(Some("Bearer workers-secret-000001"), "jobs", "db-1"),
            StatusCode::FORBIDDEN
        );
        assert_eq!(
            code(Some("Bearer workers-secret-000001"), "web", "worker-1"),
            StatusCode::FORBIDDEN
        );
        assert_eq!(
            code(Some("Bearer viewer-secret-0000001"), "jobs", "worker-1"),
            StatusCode::FORBIDDEN
        );
    }
}
