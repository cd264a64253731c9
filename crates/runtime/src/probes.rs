//! The probes every service answers on its HTTP port: `/healthz` (the process answers) and
//! `/readyz` (200 `ready` while the service says so, else 503 with what it waits for).

use axum::http::StatusCode;
use axum::routing::get;
use axum::Router;

/// A router with `/healthz` and `/readyz`; the service adds `/metrics` and its own routes.
/// `ready` is asked on every `/readyz`; `waiting` is the 503's body.
pub fn router<S>(ready: impl Fn() -> bool + Clone + Send + Sync + 'static, waiting: &'static str) -> Router<S>
where
    S: Clone + Send + Sync + 'static,
{
    Router::new().route("/healthz", get(|| async { "ok" })).route(
        "/readyz",
        get(move || {
            std::future::ready(if ready() {
                (StatusCode::OK, "ready")
            } else {
                (StatusCode::SERVICE_UNAVAILABLE, waiting)
            })
        }),
    )
}
