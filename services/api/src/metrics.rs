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
use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Instant;

pub const REQUESTS: &str = "vitals_api_requests_total";
pub const LATENCY: &str = "vitals_api_request_seconds";
pub const INGESTED: &str = "vitals_api_ingested_total";
pub const STREAM_UNDECODABLE: &str = "vitals_api_stream_undecodable_total";

const BUCKETS: [f64; 9] = [0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.5, 2.0];

#[derive(Default, Clone)]
struct Series {
    count: u64,
    sum: f64,
    buckets: [u64; BUCKETS.len()],
}

#[derive(Default)]
pub struct Metrics {
    series: Mutex<BTreeMap<(String, String, u16), Series>>,
    ingested: AtomicU64,
    stream_undecodable: AtomicU64,
}

impl Metrics {
    pub fn observe(&self, route: &str, method: &str, status: u16, seconds: f64) {
        let method = method_label(method);
        let mut m = self.series.lock().unwrap_or_else(|p| p.into_inner());
        let key = (route.to_owned(), method.to_owned(), status);
        let s = match m.get_mut(&key) {
            Some(s) => s,
            None => m.entry(key).or_default(),
        };
        s.count += 1;
        s.sum += seconds;
        for (b, le) in s.buckets.iter_mut().zip(BUCKETS) {
            if seconds <= le {
                *b += 1;
            }
        }
    }

    pub fn stream_undecodable(&self) {
        self.stream_undecodable.fetch_add(1, Ordering::Relaxed);
    }

    pub fn ingested(&self, n: u64) {
        self.ingested.fetch_add(n, Ordering::Relaxed);
    }

    pub fn render(&self) -> String {
        let mut out = String::new();
        let m: Vec<((String, String, u16), Series)> = self
            .series
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let _ = writeln!(
            out,
            "# HELP {REQUESTS} HTTP requests by route, method and status.\n# TYPE {REQUESTS} counter"
        );
        for ((route, method, status), s) in m.iter() {
            let _ = writeln!(
                out,
                "{REQUESTS}{{route=\"{route}\",method=\"{method}\",status=\"{status}\"}} {}",
                s.count
            );
        }
        let _ = writeln!(
            out,
            "# HELP {LATENCY} HTTP request latency.\n# TYPE {LATENCY} histogram"
        );
        for ((route, method, status), s) in m.iter() {
            let labels = format!("route=\"{route}\",method=\"{method}\",status=\"{status}\"");
            for (b, le) in s.buckets.iter().zip(BUCKETS) {
                let _ = writeln!(out, "{LATENCY}_bucket{{{labels},le=\"{le}\"}} {b}");
            }
            let _ = writeln!(out, "{LATENCY}_bucket{{{labels},le=\"+Inf\"}} {}", s.count);
            let _ = writeln!(out, "{LATENCY}_sum{{{labels}}} {}", s.sum);
            let _ = writeln!(out, "{LATENCY}_count{{{labels}}} {}", s.count);
        }
        let _ = writeln!(
            out,
            "# HELP {INGESTED} Ingested items confirmed by the broker.\n# TYPE {INGESTED} counter\n{INGESTED} {}",
            self.ingested.load(Ordering::Relaxed)
        );
        let _ = writeln!(
            out,
            "# HELP {STREAM_UNDECODABLE} Records on the changes topic the live stream skipped as undecodable.\n# TYPE {STREAM_UNDECODABLE} counter\n{STREAM_UNDECODABLE} {}",
            self.stream_undecodable.load(Ordering::Relaxed)
        );
        out
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
