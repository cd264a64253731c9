//! Request metrics by route, method and status, rendered for Prometheus; and the request
//! timeout, in the same middleware.
//!
//! Labels are bounded: the route is the matched route template (or `unmatched`), the method one
//! of the standard ones (or `other`), so no client can add series. Rendering copies the series
//! under the lock and formats outside it, so a scrape never holds up requests.

use crate::error::ApiError;
use crate::AppState;
use axum::extract::{MatchedPath, Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use std::time::Instant;
use vitals_runtime::metrics::{self as m, Counter, Family, Histogram, Labels, Registry};

const BUCKETS: [f64; 9] = [0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.5, 2.0];

fn latency_histogram() -> Histogram {
    m::histogram(&BUCKETS)
}

pub struct Metrics {
    requests: Family<Labels, Counter>,
    latency: Family<Labels, Histogram, fn() -> Histogram>,
    ingested: Counter,
    unbound: Family<Labels, Counter>,
    stream_undecodable: Counter,
    registry: Registry,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::default();
        let requests = Family::<Labels, Counter>::default();
        registry.register(
            "vitals_api_requests",
            "HTTP requests by route, method and status.",
            requests.clone(),
        );
        let latency = Family::<Labels, Histogram, fn() -> Histogram>::new_with_constructor(latency_histogram);
        registry.register("vitals_api_request_seconds", "HTTP request latency.", latency.clone());
        let ingested = Counter::default();
        registry.register(
            "vitals_api_ingested",
            "Ingested items confirmed by the broker.",
            ingested.clone(),
        );
        let unbound = Family::<Labels, Counter>::default();
        registry.register(
            "vitals_api_ingest_unbound",
            "Ingested items refused because the token may not report for their gateway (or prober) or pool, by token name.",
            unbound.clone(),
        );
        let stream_undecodable = Counter::default();
        registry.register(
            "vitals_api_stream_undecodable",
            "Records on the changes topic the live stream skipped as undecodable.",
            stream_undecodable.clone(),
        );
        Metrics {
            requests,
            latency,
            ingested,
            unbound,
            stream_undecodable,
            registry,
        }
    }
}

impl Metrics {
    pub fn observe(&self, route: &str, method: &str, status: u16, seconds: f64) {
        let labels = vec![
            ("route", route.to_owned()),
            ("method", method_label(method).to_owned()),
            ("status", status.to_string()),
        ];
        self.requests.get_or_create(&labels).inc();
        self.latency.get_or_create(&labels).observe(seconds);
    }

    pub fn stream_undecodable(&self) {
        self.stream_undecodable.inc();
    }

    pub fn ingested(&self, n: u64) {
        self.ingested.inc_by(n);
    }

    /// An item refused by the token's binding: counted per token (names come from the tokens
    /// file, so the series are bounded).
    pub fn refused_unbound(&self, token: &str) {
        self.unbound.get_or_create(&vec![("token", token.to_owned())]).inc();
    }

    pub fn response(&self) -> impl IntoResponse {
        m::response(&self.registry)
    }
}

/// The method as a label: one of the standard methods, or `other`.
pub fn method_label(method: &str) -> &'static str {
    const KNOWN: [&str; 9] = [
        "GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS", "CONNECT", "TRACE",
    ];
    KNOWN.iter().find(|m| **m == method).copied().unwrap_or("other")
}

/// Count, time and bound every routed request. The timeout covers producing the response head;
/// a live stream's body runs on.
pub async fn track(State(app): State<AppState>, req: Request, next: Next) -> Response {
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map_or("unmatched", |m| m.as_str())
        .to_owned();
    let method = req.method().as_str().to_owned();
    let start = Instant::now();
    let resp = match tokio::time::timeout(app.cfg.request_timeout(), next.run(req)).await {
        Ok(r) => r,
        Err(_) => ApiError::Timeout.into_response(),
    };
    app.metrics
        .observe(&route, &method, resp.status().as_u16(), start.elapsed().as_secs_f64());
    resp
}
