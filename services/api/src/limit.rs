//! Concurrency per route: each route template serves at most `--max-concurrent-per-route`
//! requests at once, so one expensive or popular route cannot take every database connection
//! from the others. A request waits up to [`WAIT`] for a slot, then gets 503 `busy` with
//! Retry-After. The live stream (its own limits) and the service probes are not counted.

use crate::error::ApiError;
use crate::AppState;
use axum::extract::{MatchedPath, Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Semaphore;

pub const WAIT: Duration = Duration::from_secs(1);

const UNLIMITED: [&str; 4] = ["/v1/stream", "/healthz", "/readyz", "/metrics"];

pub async fn per_route(State(app): State<AppState>, req: Request, next: Next) -> Response {
    let Some(route) = req.extensions().get::<MatchedPath>().map(|m| m.as_str().to_owned()) else {
        return next.run(req).await;
    };
    if UNLIMITED.contains(&route.as_str()) {
        return next.run(req).await;
    }
    let slots = {
        let mut limits = app.route_limits.lock().unwrap_or_else(|p| p.into_inner());
        limits
            .entry(route)
            .or_insert_with(|| Arc::new(Semaphore::new(app.cfg.max_concurrent_per_route)))
            .clone()
    };
    match tokio::time::timeout(WAIT, slots.acquire_owned()).await {
        Ok(Ok(_permit)) => next.run(req).await,
        _ => ApiError::Busy("this route is busy; retry shortly".into()).into_response(),
    }
}
