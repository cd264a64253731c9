//! Prometheus metrics of the prober.

use vitals_runtime::metrics::{self as m, Counter, Family, Gauge, Histogram, Labels, Registry};

pub struct Metrics {
    pub probes: Family<Labels, Counter>,
    /// Seconds between a probe's scheduled time and its start.
    pub lateness: Histogram,
    pub in_flight: Gauge,
    pub owned_targets: Gauge,
    pub configured_targets: Gauge,
    pub fast_endpoints: Gauge,
    pub budget_skipped: Counter,
    pub covered_skipped: Counter,
    pub budget_left: Gauge,
    pub reloads: Family<Labels, Counter>,
    pub heartbeats: Counter,
    pub heartbeats_refused: Counter,
    pub published: Counter,
    pub publish_failed: Counter,
    /// Whether results reach the broker (what `/readyz` reads).
    pub deliveries: crate::readiness::Deliveries,
    registry: Registry,
}

impl Default for Metrics {
    fn default() -> Metrics {
        let mut r = Registry::default();
        let probes = Family::<Labels, Counter>::default();
        r.register(
            "vitals_prober_probes",
            "Probes run, by kind and outcome class.",
            probes.clone(),
        );
        let lateness = m::histogram(&[
            0.0005, 0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.05, 0.1, 0.5, 1.0,
        ]);
        r.register(
            "vitals_prober_start_lateness_seconds",
            "Time between a probe's scheduled start and its start.",
            lateness.clone(),
        );
        let gauge = |r: &mut Registry, name: &str, help: &str| {
            let g = Gauge::default();
            r.register(name, help, g.clone());
            g
        };
        let counter = |r: &mut Registry, name: &str, help: &str| {
            let c = Counter::default();
            r.register(name, help, c.clone());
            c
        };
        let in_flight = gauge(&mut r, "vitals_prober_in_flight", "Probes running now.");
        let owned_targets = gauge(
            &mut r,
            "vitals_prober_owned_targets",
            "Targets this instance probes (its shards of the configured targets).",
        );
        let configured_targets = gauge(
            &mut r,
            "vitals_prober_configured_targets",
            "Targets in the configuration.",
        );
        let fast_endpoints = gauge(
            &mut r,
            "vitals_prober_fast_endpoints",
            "Endpoints probed at their fast interval (suspect, unhealthy or recovering).",
        );
        let budget_skipped = counter(
            &mut r,
            "vitals_prober_budget_skipped",
            "Synthetic completions skipped because their target's daily token budget was spent.",
        );
        let covered_skipped = counter(
            &mut r,
            "vitals_prober_covered_skipped",
            "Synthetic completions skipped because recent gateway calls brought first-token times.",
        );
        let budget_left = gauge(
            &mut r,
            "vitals_prober_budget_tokens_left",
            "Tokens left today, summed over the targets with a budget.",
        );
        let reloads = Family::<Labels, Counter>::default();
        r.register(
            "vitals_prober_config_reloads",
            "Configuration reloads, by result.",
            reloads.clone(),
        );
        let heartbeats = counter(&mut r, "vitals_prober_heartbeats", "Heartbeats received and published.");
        let heartbeats_refused = counter(
            &mut r,
            "vitals_prober_heartbeats_refused",
            "Heartbeats refused: no token, or one that may not report for their endpoint or pool.",
        );
        let published = counter(&mut r, "vitals_prober_published", "Probe results the broker confirmed.");
        let publish_failed = counter(
            &mut r,
            "vitals_prober_publish_failed",
            "Probe results that could not be encoded, queued or delivered.",
        );
        Metrics {
            probes,
            lateness,
            in_flight,
            owned_targets,
            configured_targets,
            fast_endpoints,
            budget_skipped,
            covered_skipped,
            budget_left,
            reloads,
            heartbeats,
            heartbeats_refused,
            published,
            publish_failed,
            deliveries: Default::default(),
            registry: r,
        }
    }
}

impl Metrics {
    pub fn render(&self) -> ([(axum::http::HeaderName, &'static str); 1], String) {
        m::response(&self.registry)
    }
}
