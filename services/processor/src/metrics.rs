//! Prometheus metrics of the processor, registered in one place (names, help), rendered by
//! `prometheus-client`. Per-partition figures come from the write path's progress at scrape time.

use crate::progress::PartitionFigures;
use std::sync::atomic::AtomicU64;
use vitals_runtime::metrics::{self as m, Counter, Family, Gauge, Histogram, Labels, Registry};

pub struct Metrics {
    pub signals: Counter,
    pub dead_lettered: Counter,
    pub pools_refused: Counter,
    pub repeats: Counter,
    pub stamped_ahead: Counter,
    /// Calls set aside as late (the engine's late rule).
    pub late: Counter,
    /// Reporters whose clocks a pool named off: their offset in seconds (positive: behind).
    pub clock_offsets: Family<Labels, Gauge>,
    pub transitions: Counter,
    pub pool_events: Counter,
    pub batches: Counter,
    pub batch_seconds: Histogram,
    pub db_retries: Counter,
    pub not_ours: Counter,
    pub permanent_errors: Counter,
    pub outbox_backlog: Gauge,
    pub published: Counter,
    /// Audit rows of months that retention no longer keeps, not written.
    pub audit_rows_expired: Counter,
    /// Events that could not be encoded, dead-lettered instead (a bug: alert on it).
    pub encode_failures: Counter,
    /// Partitions this processor was assigned but cannot restore (a permanent error).
    pub unrestorable: Gauge,
    /// Seconds spent, by phase of the work (the breakdown of where the processor's time goes).
    time: Family<Labels, Counter<f64, AtomicU64>>,
    consumer_lag: Gauge,
    group_lag: Gauge,
    assigned: Gauge,
    partition_lag: Family<Labels, Gauge>,
    commit_age: Family<Labels, Gauge<f64, AtomicU64>>,
    registry: Registry,
}

impl Default for Metrics {
    fn default() -> Metrics {
        let mut r = Registry::default();
        let counter = |r: &mut Registry, name: &str, help: &str| {
            let c = Counter::default();
            r.register(name, help, c.clone());
            c
        };
        let gauge = |r: &mut Registry, name: &str, help: &str| {
            let g = Gauge::default();
            r.register(name, help, g.clone());
            g
        };
        let signals = counter(
            &mut r,
            "vitals_processor_signals",
            "Records consumed from the signals topic.",
        );
        let dead_lettered = counter(
            &mut r,
            "vitals_processor_dead_lettered",
            "Records sent to the dead-letter topic.",
        );
        let pools_refused = counter(
            &mut r,
            "vitals_processor_pools_refused",
            "Signals of a new pool dead-lettered because their partition held --max-pools-per-partition pools.",
        );
        let repeats = counter(
            &mut r,
            "vitals_processor_repeats",
            "Reports passed over because their pool applied one with the same id in the last five minutes (a retried export, a batch sent again).",
        );
        let stamped_ahead = counter(
            &mut r,
            "vitals_processor_stamped_ahead",
            "Records dead-lettered because they were stamped more than --create-time-max-ahead-secs ahead of their partition's time (a topic stamped by its producers).",
        );
        let late = counter(
            &mut r,
            "vitals_processor_late",
            "Calls set aside as late: reported later than the pool's window after their reporter's clock offset, successes and failures alike.",
        );
        let clock_offsets = Family::<Labels, Gauge>::default();
        r.register(
            "vitals_processor_reporter_clock_offset_seconds",
            "Reporters whose clocks a pool named off, by pool and reporter (gateway=g1, prober=p1): how far behind stream time (negative: ahead); their reports are shifted by it. Gone when the clock is in time again.",
            clock_offsets.clone(),
        );
        let transitions = counter(&mut r, "vitals_processor_transitions", "Endpoint transitions recorded.");
        let pool_events = counter(&mut r, "vitals_processor_pool_events", "Pool decisions recorded.");
        let batches = counter(&mut r, "vitals_processor_batches", "Batches committed to Postgres.");
        let db_retries = counter(
            &mut r,
            "vitals_processor_db_retries",
            "Batch transactions retried after a database error.",
        );
        let not_ours = counter(
            &mut r,
            "vitals_processor_records_not_owned",
            "Records fetched for a partition this processor does not own (dropped; the owner reads them).",
        );
        let permanent_errors = counter(
            &mut r,
            "vitals_processor_permanent_db_errors",
            "Batches that failed with a database error retrying cannot fix (the processor stops).",
        );
        let published = counter(
            &mut r,
            "vitals_processor_published",
            "Outbox events published to Kafka.",
        );
        let audit_rows_expired = counter(
            &mut r,
            "vitals_processor_audit_rows_expired",
            "Transitions and pool events not written to the audit log because their month ended before the \
             retention (--audit-retention-days); their events are still published.",
        );
        let encode_failures = counter(
            &mut r,
            "vitals_processor_encode_failures",
            "Events the processor could not encode (a bug): sent to the dead-letter topic as JSON, with \
             vitals-error-code=encode_failed, instead of the changes or state topic.",
        );
        let unrestorable = gauge(
            &mut r,
            "vitals_processor_unrestorable_partitions",
            "Assigned partitions that cannot be restored (an error retrying cannot fix, e.g. an unreadable \
             snapshot): not consumed; /readyz names them and the error.",
        );
        let consumer_lag = gauge(
            &mut r,
            "vitals_processor_consumer_lag",
            "Records behind the end of the assigned partitions: high watermark minus the offset committed to Postgres.",
        );
        let group_lag = gauge(
            &mut r,
            "vitals_processor_group_lag",
            "Records of the whole signals topic the group has not committed to Postgres, as far as this \
             processor can tell: every partition's high watermark less the latest offset known committed \
             (its own commits and the group's rows in Postgres). It counts partitions no one holds, so it \
             does not read 0 while a rebalance or an outage keeps them unassigned; it errs high, never low. \
             Alert on its max over the group's processors.",
        );
        let outbox_backlog = gauge(
            &mut r,
            "vitals_processor_outbox_backlog",
            "Outbox events not yet published (every 5 s).",
        );
        let assigned = gauge(
            &mut r,
            "vitals_processor_assigned_partitions",
            "Signals partitions assigned and restored.",
        );
        let time = Family::<Labels, Counter<f64, AtomicU64>>::default();
        r.register(
            "vitals_processor_time_seconds",
            "Seconds spent by phase: recv (the loop waiting for records from the receiver thread), step \
             (decode, validate, engine, batch rows), close (offsets and \
             snapshot serialisation), wait_write (the loop waiting for the previous batch), db_<statement> \
             (each statement of the batch transaction, round trip included), relay_<step> (outbox relay: fetch, publish, delete).",
            time.clone(),
        );
        let partition_lag = Family::<Labels, Gauge>::default();
        r.register(
            "vitals_processor_partition_lag",
            "High watermark minus the offset committed to Postgres, per assigned partition.",
            partition_lag.clone(),
        );
        let commit_age = Family::<Labels, Gauge<f64, AtomicU64>>::default();
        r.register(
            "vitals_processor_partition_commit_age_seconds",
            "Seconds since the partition's last commit (or since it had nothing to do).",
            commit_age.clone(),
        );
        let batch_seconds = m::histogram(&[0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0]);
        r.register(
            "vitals_processor_batch_seconds",
            "Time from a batch's first record to its commit.",
            batch_seconds.clone(),
        );
        Metrics {
            signals,
            dead_lettered,
            pools_refused,
            repeats,
            stamped_ahead,
            late,
            clock_offsets,
            transitions,
            pool_events,
            batches,
            batch_seconds,
            db_retries,
            not_ours,
            permanent_errors,
            outbox_backlog,
            published,
            audit_rows_expired,
            encode_failures,
            unrestorable,
            time,
            consumer_lag,
            group_lag,
            assigned,
            partition_lag,
            commit_age,
            registry: r,
        }
    }
}

impl Metrics {
    /// Count `d` as time spent in `phase`.
    pub fn spent(&self, phase: &str, d: std::time::Duration) {
        self.time
            .get_or_create(&vec![("phase", phase.to_string())])
            .inc_by(d.as_secs_f64());
    }

    /// The `/metrics` response; `parts` are the per-partition figures of the write path
    /// (revoked partitions leave the per-partition series).
    pub fn response(&self, parts: &PartitionFigures, group_lag: Option<i64>) -> impl axum::response::IntoResponse {
        self.consumer_lag.set(parts.values().filter_map(|(lag, _)| *lag).sum());
        if let Some(lag) = group_lag {
            self.group_lag.set(lag);
        }
        self.assigned.set(parts.len() as i64);
        self.partition_lag.clear();
        self.commit_age.clear();
        for (p, (lag, age)) in parts {
            let labels = vec![("partition", p.to_string())];
            if let Some(lag) = lag {
                self.partition_lag.get_or_create(&labels).set(*lag);
            }
            self.commit_age.get_or_create(&labels).set(*age);
        }
        m::response(&self.registry)
    }
}
