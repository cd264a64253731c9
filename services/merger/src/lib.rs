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

use vitals_contracts::lateness::{ClockChange, Clocks, Kind};
use vitals_contracts::{Micros, Signal, Summarizer, SummaryConfig};
use vitals_runtime::metrics::{Counter, Family, Gauge, Labels, Registry};

/// A gateway's record measured against the merger's clock (`now`, when it is read): a gateway
/// whose clock is named off ([`vitals_contracts::lateness`]: its fastest records 10 s or more
/// off for 30 s, agreeing) has its record's times shifted by its offset before it is merged, so
/// that its calls are merged with the fleet's of the same moment, not cut into summaries of
/// their own that the processor would find late. Returns the gateway's clock named off or back.
pub fn in_time(clocks: &mut Clocks, signal: &mut Signal, now: Micros) -> Option<ClockChange> {
    let (gateway, ended) = match &*signal {
        Signal::Call(c) => (c.gateway.as_str(), c.occurred_at.saturating_add(c.latency_us.max(0))),
        Signal::Summary(s) => (s.gateway.as_str(), s.ended_at),
        _ => return None,
    };
    let (_, offset, change) = clocks.judge_offset(Kind::Gateway, gateway, ended, now);
    if offset != 0 {
        match signal {
            Signal::Call(c) => c.occurred_at = c.occurred_at.saturating_add(offset),
            Signal::Summary(s) => {
                s.started_at = s.started_at.saturating_add(offset);
                s.ended_at = s.ended_at.saturating_add(offset);
            }
            _ => {}
        }
    }
    change
}

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
    /// Runs started over after a fatal error (fenced, the broker gone).
    pub restarts: Counter,
    pub open_endpoints: Gauge,
    /// The last committed transaction's wall time (seconds since the epoch), 0 before the first.
    pub last_commit_seconds: Gauge,
    /// Gateways whose clocks are named off: their offset in seconds (positive: behind).
    pub clock_offsets: Family<Labels, Gauge>,
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
        let restarts = counter(
            "vitals_merger_restarts",
            "Times the merger started over after a fatal error (fenced after being stopped past the transaction timeout, the broker gone), as a restart would.",
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
        let clock_offsets = Family::<Labels, Gauge>::default();
        r.register(
            "vitals_merger_gateway_clock_offset_seconds",
            "Gateways whose clocks the merger found off against its own, by gateway: how far behind (negative: ahead); their records are shifted by it before they are merged. Gone when the clock is in time again.",
            clock_offsets.clone(),
        );
        Counters {
            clock_offsets,
            records_in,
            calls_in,
            undecodable,
            invalid,
            records_out,
            calls_out,
            summaries_out,
            transactions,
            aborted,
            restarts,
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

    /// A gateway's clock named off or back: logged, and its gauge set or removed.
    pub fn clock(&self, change: &ClockChange) {
        match change {
            ClockChange::Off { reporter, offset } => {
                tracing::warn!(reporter, offset_s = offset / 1_000_000, "{}", change.reason());
                let labels = vec![("reporter", reporter.clone())];
                self.clock_offsets.get_or_create(&labels).set(offset / 1_000_000);
            }
            ClockChange::Back { reporter } => {
                tracing::info!(reporter, "{}", change.reason());
                self.clock_offsets.remove(&vec![("reporter", reporter.clone())]);
            }
        }
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

    /// Six gateways summing a busy endpoint every second, one with its clock 90 s behind the
    /// merger's: after 30 s its summaries are shifted, so each merged summary (one per second)
    /// spans a second, not 91 s, and holds every gateway's calls of that second.
    #[test]
    fn a_gateway_whose_clock_is_behind_is_shifted_before_it_is_merged() {
        const S: Micros = 1_000_000;
        let t0 = 1_700_000_000 * S;
        let counters = Counters::default();
        let mut clocks = Clocks::default();
        let mut spans = Vec::new();
        for k in 0..60 {
            let now = t0 + k * S;
            let mut m = Merge::new(8, 1000, "t", "merger");
            let mut out = Vec::new();
            for g in 0..6 {
                let stamp = if g == 5 { now - 90 * S } else { now };
                let mut s = CallSummary::new(format!("s-{g}-{k}"), "p", "a", &format!("gw-{g}"), stamp - S);
                s.add_times(
                    &CallOutcome::new("x", "p", "a", format!("gw-{g}"), stamp - S, OutcomeClass::Success),
                    10,
                );
                s.ended_at = stamp;
                let mut sig = Signal::Summary(s);
                if let Some(c) = in_time(&mut clocks, &mut sig, now) {
                    counters.clock(&c);
                }
                m.take(sig, now, &mut out);
            }
            m.flush(&mut out);
            let longest = out
                .iter()
                .map(|s| match s {
                    Signal::Summary(x) => x.ended_at - x.started_at,
                    _ => 0,
                })
                .max()
                .unwrap();
            spans.push((out.len(), longest));
        }
        // Before the clock is measured, its summaries are cut apart (30 s of them); after, one
        // merged summary a second.
        assert!(spans[..30].iter().all(|(n, _)| *n == 2), "{spans:?}");
        assert!(spans[31..].iter().all(|&(n, l)| n == 1 && l <= S), "{spans:?}");
        assert_eq!(clocks.offset(Kind::Gateway, "gw-5"), 90 * S);
        let text = vitals_runtime::metrics::render(counters.registry());
        assert!(
            text.contains("vitals_merger_gateway_clock_offset_seconds{reporter=\"gateway=gw-5\"} 90"),
            "{text}"
        );
    }
}
