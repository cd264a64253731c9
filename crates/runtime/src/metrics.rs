//! Prometheus metrics: a registry from `prometheus-client`, rendered in the OpenMetrics text
//! format, and the HTTP handler that serves it. Each service registers its own metrics at start.

use axum::http::header::{HeaderName, CONTENT_TYPE};
pub use prometheus_client::metrics::counter::Counter;
pub use prometheus_client::metrics::family::Family;
pub use prometheus_client::metrics::gauge::Gauge;
pub use prometheus_client::metrics::histogram::Histogram;
pub use prometheus_client::registry::Registry;

const CONTENT_TYPE_VALUE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Labels of a series, as (name, value) pairs.
pub type Labels = Vec<(&'static str, String)>;

/// The registry as text.
pub fn render(registry: &Registry) -> String {
    let mut s = String::new();
    prometheus_client::encoding::text::encode(&mut s, registry).expect("writing to a String cannot fail");
    s
}

/// A `/metrics` response.
pub fn response(registry: &Registry) -> ([(HeaderName, &'static str); 1], String) {
    ([(CONTENT_TYPE, CONTENT_TYPE_VALUE)], render(registry))
}

/// A histogram with these bucket bounds (seconds).
pub fn histogram(buckets: &[f64]) -> Histogram {
    Histogram::new(buckets.iter().copied())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_gauges_families_and_histograms_render() {
        let mut r = Registry::default();
        let c: Counter = Counter::default();
        let g: Gauge = Gauge::default();
        let f: Family<Labels, Gauge> = Family::default();
        let h = histogram(&[0.1, 1.0]);
        r.register("x_signals", "Signals.", c.clone());
        r.register("x_lag", "Lag.", g.clone());
        r.register("x_partition_lag", "Lag per partition.", f.clone());
        r.register("x_batch_seconds", "Batch time.", h.clone());
        c.inc_by(3);
        g.set(-2);
        f.get_or_create(&vec![("partition", "7".to_string())]).set(5);
        h.observe(0.5);
        let text = render(&r);
        assert!(text.contains("x_signals_total 3"), "{text}");
        assert!(text.contains("x_lag -2"), "{text}");
        assert!(text.contains("x_partition_lag{partition=\"7\"} 5"), "{text}");
        assert!(text.contains("x_batch_seconds_bucket{le=\"1.0\"} 1"), "{text}");
    }
}
