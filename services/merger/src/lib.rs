//! `vitals-merger`: the merge stage between a fleet of gateways and the processor
//! (docs/fleet.md).
//!
//! Gateways report to the gateway-signals topic keyed by endpoint
//! (`vitals_reporter::Config::through_merger`), so every gateway's calls and summaries of one
//! endpoint reach one merger. A merger sums them with a merging `Summarizer`: failures go on one
//! by one up to a cap per endpoint per interval *for the whole fleet*, everything else becomes
//! one summary per endpoint per interval, onto the signals topic keyed by pool. What reaches a
//! pool's partition then grows with its endpoints and their faults, not with the number of
//! gateways.
//!
//! Exactly once: each interval is one Kafka transaction — the merged records and the input
//! offsets they consumed commit together (KIP-447: the consumer's group metadata fences a
//! merger that lost its partitions), and nothing is held across a commit (every open summary is
//! flushed into the transaction that consumed its calls). A merger that dies mid-interval
//! leaves an open transaction, which its successor's `init_transactions` (same transactional id)
//! or the transaction timeout aborts; the successor reads from the committed offsets. The
//! processor reads `read_committed` and replays the signals topic as before: the engine is
//! unchanged and replay stays deterministic (the merge's own cut points depend on arrival, and
//! are what the log records).

pub mod run;

use vitals_contracts::{Micros, Signal, Summarizer, SummaryConfig};
use vitals_runtime::metrics::{Counter, Gauge, Registry};

/// One merger's sums for one transaction.
pub struct Merge {
    summarizer: Summarizer,
}

impl Merge {
    /// `instance` keeps the merged summaries' ids apart from every other merger's (and run's);
    /// `gateway` is the name the merged summaries carry.
    pub fn new(failure_cap: u32, max_open: usize, instance: &str, gateway: &str) -> Merge {
        let cfg = SummaryConfig {
            // One interval per transaction: `flush` ends it.
            interval_us: Micros::MAX / 4,
            failure_cap,
            max_open,
            ..SummaryConfig::default()
        };
        Merge {
            summarizer: Summarizer::merging(cfg, instance, gateway),
        }
    }

    /// One record read from the gateway-signals topic; what to send goes to `out`, in order.
    /// Calls and summaries are merged; anything else (a probe, an override, a policy change
    /// sent there by mistake) goes on as it came.
    pub fn take(&mut self, signal: Signal, now: Micros, out: &mut Vec<Signal>) {
        match signal {
            Signal::Call(c) => self.summarizer.add(c, now, out),
            Signal::Summary(s) => self.summarizer.add_summary(s, now, out),
            other => out.push(other),
        }
    }

    /// End the interval: every open summary to `out`.
    pub fn flush(&mut self, out: &mut Vec<Signal>) {
        self.summarizer.flush_all(out);
    }

    /// Endpoints with an open summary.
    pub fn open(&self) -> usize {
        self.summarizer.open()
    }
}

/// Calls a record stands for: 1 for a call, its calls for a summary, 0 for anything else.
pub fn calls_in(s: &Signal) -> u64 {
    match s {
        Signal::Call(_) => 1,
        Signal::Summary(x) => u64::try_from(x.calls.total()).unwrap_or(0),
        _ => 0,
    }
}

/// What a merger has done, for `/metrics` (the project's registry, as the other services).
pub struct Counters {
    pub records_in: Counter,
    pub calls_in: Counter,
    /// Records that are not a signal of the contracts (dead-lettered).
    pub undecodable: Counter,
    /// Signals the processor would refuse (dead-lettered).
    pub invalid: Counter,
    pub records_out: Counter,
    pub calls_out: Counter,
    pub summaries_out: Counter,
    pub transactions: Counter,
    pub aborted: Counter,
    pub open_endpoints: Gauge,
    /// The last committed transaction's wall time (seconds since the epoch), 0 before the first.
    pub last_commit_seconds: Gauge,
    registry: Registry,
}

impl Default for Counters {
    fn default() -> Counters {
        let mut r = Registry::default();
        let mut counter = |name: &str, help: &str| {
            let c = Counter::default();
            r.register(name, help, c.clone());
            c
        };
        let records_in = counter(
            "vitals_merger_records_in",
            "Records read from the gateway-signals topic.",
        );
        let calls_in = counter("vitals_merger_calls_in", "Calls those records stand for.");
        let undecodable = counter(
            "vitals_merger_undecodable",
            "Records read that are no signal of the contracts (dead-lettered).",
        );
        let invalid = counter(
            "vitals_merger_invalid",
            "Signals read that the processor would refuse (dead-lettered, not merged).",
        );
        let records_out = counter(
            "vitals_merger_records_out",
            "Records written to the signals topic (committed or not).",
        );
        let calls_out = counter("vitals_merger_calls_out", "Calls those records stand for.");
        let summaries_out = counter("vitals_merger_summaries_out", "Merged summaries written.");
        let transactions = counter("vitals_merger_transactions", "Transactions committed.");
        let aborted = counter(
            "vitals_merger_transactions_aborted",
            "Transactions aborted (a rebalance, a broker error); their input is read again.",
        );
        let mut gauge = |name: &str, help: &str| {
            let g = Gauge::default();
            r.register(name, help, g.clone());
            g
        };
        let open_endpoints = gauge(
            "vitals_merger_open_endpoints",
            "Endpoints with an open summary in the last interval.",
        );
        let last_commit_seconds = gauge(
            "vitals_merger_last_commit_seconds",
            "When the last transaction committed (Unix time).",
        );
        Counters {
            records_in,
            calls_in,
            undecodable,
            invalid,
            records_out,
            calls_out,
            summaries_out,
            transactions,
            aborted,
            open_endpoints,
            last_commit_seconds,
            registry: r,
        }
    }
}

impl Counters {
    pub fn registry(&self) -> &Registry {
        &self.registry
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vitals_contracts::{CallOutcome, CallSummary, OutcomeClass};

    #[test]
    fn a_fleets_records_become_one_summary_per_endpoint_and_lose_no_call() {
        let mut m = Merge::new(8, 1000, "t", "merger");
        let mut out = Vec::new();
        let mut calls = 0;
        for g in 0..50 {
            let gw = format!("gw-{g}");
            for ep in ["a", "b"] {
                let mut s = CallSummary::new(format!("s-{g}-{ep}"), "p", ep, &gw, 0);
                let ok = CallOutcome::new("x", "p", ep, &gw, 0, OutcomeClass::Success);
                s.add_times(&ok, 40);
                calls += 40;
                m.take(Signal::Summary(s), 1, &mut out);
            }
        }
        m.flush(&mut out);
        assert_eq!(out.len(), 2, "one summary per endpoint, not per gateway");
        assert_eq!(out.iter().map(calls_in).sum::<u64>(), calls);
        assert!(out
            .iter()
            .all(|s| matches!(s, Signal::Summary(x) if x.gateway == "merger")));
        let tick = Signal::Tick(vitals_contracts::Tick {
            ticker: "t".into(),
            emitted_at: 5,
        });
        out.clear();
        m.take(tick.clone(), 2, &mut out);
        assert_eq!(out, [tick]);
    }
}
