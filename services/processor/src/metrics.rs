//! Prometheus metrics, kept in atomics and rendered as text. The names live here, in one place.

use crate::progress::PartitionFigures;
use std::fmt::Write;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};

pub const SIGNALS: &str = "vitals_processor_signals_total";
pub const DEAD_LETTERED: &str = "vitals_processor_dead_lettered_total";
pub const TRANSITIONS: &str = "vitals_processor_transitions_total";
pub const POOL_EVENTS: &str = "vitals_processor_pool_events_total";
pub const BATCHES: &str = "vitals_processor_batches_total";
pub const BATCH_SECONDS: &str = "vitals_processor_batch_seconds";
pub const DB_RETRIES: &str = "vitals_processor_db_retries_total";
pub const CONSUMER_LAG: &str = "vitals_processor_consumer_lag";
pub const OUTBOX_BACKLOG: &str = "vitals_processor_outbox_backlog";
pub const PUBLISHED: &str = "vitals_processor_published_total";
pub const ASSIGNED: &str = "vitals_processor_assigned_partitions";
pub const PARTITION_LAG: &str = "vitals_processor_partition_lag";
pub const COMMIT_AGE: &str = "vitals_processor_partition_commit_age_seconds";
pub const NOT_OURS: &str = "vitals_processor_records_not_owned_total";
pub const PERMANENT_ERRORS: &str = "vitals_processor_permanent_db_errors_total";

const BUCKETS: [f64; 10] = [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0];

#[derive(Default)]
pub struct Histogram {
    buckets: [AtomicU64; BUCKETS.len()],
    count: AtomicU64,
    sum_micros: AtomicU64,
}

impl Histogram {
    pub fn observe(&self, seconds: f64) {
        for (b, le) in self.buckets.iter().zip(BUCKETS) {
            if seconds <= le {
                b.fetch_add(1, Ordering::Relaxed);
            }
        }
        self.count.fetch_add(1, Ordering::Relaxed);
        self.sum_micros.fetch_add((seconds * 1e6) as u64, Ordering::Relaxed);
    }
}

#[derive(Default)]
pub struct Metrics {
    pub signals: AtomicU64,
    pub dead_lettered: AtomicU64,
    pub transitions: AtomicU64,
    pub pool_events: AtomicU64,
    pub batches: AtomicU64,
    pub batch_seconds: Histogram,
    pub db_retries: AtomicU64,
    pub not_ours: AtomicU64,
    pub permanent_errors: AtomicU64,
    pub outbox_backlog: AtomicI64,
    pub published: AtomicU64,
}

impl Metrics {
    /// The text exposition; `parts` are the per-partition figures of the write path.
    pub fn render(&self, parts: &PartitionFigures) -> String {
        let mut s = String::new();
        let mut counter = |name: &str, help: &str, v: u64| {
            let _ = writeln!(s, "# HELP {name} {help}\n# TYPE {name} counter\n{name} {v}");
        };
        counter(
            SIGNALS,
            "Records consumed from the signals topic.",
            self.signals.load(Ordering::Relaxed),
        );
        counter(
            DEAD_LETTERED,
            "Records sent to the dead-letter topic.",
            self.dead_lettered.load(Ordering::Relaxed),
        );
        counter(
            TRANSITIONS,
            "Endpoint transitions recorded.",
            self.transitions.load(Ordering::Relaxed),
        );
        counter(
            POOL_EVENTS,
            "Pool decisions recorded.",
            self.pool_events.load(Ordering::Relaxed),
        );
        counter(
            BATCHES,
            "Batches committed to Postgres.",
            self.batches.load(Ordering::Relaxed),
        );
        counter(
            DB_RETRIES,
            "Batch transactions retried after a database error.",
            self.db_retries.load(Ordering::Relaxed),
        );
        counter(
            NOT_OURS,
            "Records fetched for a partition this processor does not own (dropped; the owner reads them).",
            self.not_ours.load(Ordering::Relaxed),
        );
        counter(
            PERMANENT_ERRORS,
            "Batches that failed with a database error retrying cannot fix (the processor stops).",
            self.permanent_errors.load(Ordering::Relaxed),
        );
        counter(
            PUBLISHED,
            "Outbox rows published to Kafka.",
            self.published.load(Ordering::Relaxed),
        );
        let mut gauge = |name: &str, help: &str, v: i64| {
            let _ = writeln!(s, "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {v}");
        };
        gauge(
            CONSUMER_LAG,
            "Records behind the end of the assigned partitions: high watermark minus the offset committed to Postgres.",
            parts.values().filter_map(|(lag, _)| *lag).sum(),
        );
        gauge(
            OUTBOX_BACKLOG,
            "Outbox rows not yet published.",
            self.outbox_backlog.load(Ordering::Relaxed),
        );
        gauge(
            ASSIGNED,
            "Signals partitions assigned and restored.",
            parts.len() as i64,
        );
        let _ = writeln!(
            s,
            "# HELP {PARTITION_LAG} High watermark minus the offset committed to Postgres, per assigned partition.\n# TYPE {PARTITION_LAG} gauge"
        );
        for (p, (lag, _)) in parts {
            if let Some(lag) = lag {
                let _ = writeln!(s, "{PARTITION_LAG}{{partition=\"{p}\"}} {lag}");
            }
        }
        let _ = writeln!(
            s,
            "# HELP {COMMIT_AGE} Seconds since the partition's last commit (or since it had nothing to do).\n# TYPE {COMMIT_AGE} gauge"
        );
        for (p, (_, age)) in parts {
            let _ = writeln!(s, "{COMMIT_AGE}{{partition=\"{p}\"}} {age:.3}");
        }
        let h = &self.batch_seconds;
        let _ = writeln!(
            s,
            "# HELP {BATCH_SECONDS} Time from a batch's first record to its commit."
        );
        let _ = writeln!(s, "# TYPE {BATCH_SECONDS} histogram");
        for (b, le) in h.buckets.iter().zip(BUCKETS) {
            let _ = writeln!(s, "{BATCH_SECONDS}_bucket{{le=\"{le}\"}} {}", b.load(Ordering::Relaxed));
        }
        let count = h.count.load(Ordering::Relaxed);
        let _ = writeln!(s, "{BATCH_SECONDS}_bucket{{le=\"+Inf\"}} {count}");
        let _ = writeln!(
            s,
            "{BATCH_SECONDS}_sum {}",
            h.sum_micros.load(Ordering::Relaxed) as f64 / 1e6
        );
        let _ = writeln!(s, "{BATCH_SECONDS}_count {count}");
        s
    }
}
