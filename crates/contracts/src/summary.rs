//! Call summaries (`schemas/call_summary.avsc`): the calls one gateway made to one endpoint over
//! an interval, summed at the gateway, and the [`Summarizer`] that makes them.
//!
//! A gateway at millions of calls a second cannot send one record per call: the signals topic,
//! the broker and the processor would scale with its traffic, and a hot pool (one partition)
//! with one thread. The summarizer sums the successes of each endpoint per interval (250 ms by
//! default) and still sends failures one by one, up to a cap per endpoint per interval, so that a
//! dead endpoint is seen at once; beyond the cap, failures are summed too. A summary is sent
//! before a failure that follows the calls it sums, so the engine sees outcomes in the order they
//! happened. Memory is bounded by the number of endpoints with an open summary.

use crate::hash::Fnv64;
use crate::types::{CallOutcome, Micros, OutcomeClass, Signal};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;

/// The histogram's relative error: a bucket's value is within 1 % of every value in it.
pub const HISTOGRAM_RELATIVE_ERROR: f64 = 0.01;
/// The ratio of a bucket's upper bound to its lower bound: (1 + α) / (1 − α).
pub const HISTOGRAM_GAMMA: f64 = (1.0 + HISTOGRAM_RELATIVE_ERROR) / (1.0 - HISTOGRAM_RELATIVE_ERROR);
/// Most models one summary lists.
pub const MAX_SUMMARY_MODELS: usize = 16;

/// Calls per outcome class.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
// A misspelt class (`server_errror`) must be refused, not read as 0 calls of the right one.
#[serde(deny_unknown_fields)]
pub struct OutcomeCounts {
    #[serde(default)]
    pub success: i64,
    #[serde(default)]
    pub timeout: i64,
    #[serde(default)]
    pub connect_error: i64,
    #[serde(default)]
    pub connection_dropped: i64,
    #[serde(default)]
    pub rate_limited: i64,
    #[serde(default)]
    pub server_error: i64,
    #[serde(default)]
    pub client_error: i64,
    #[serde(default)]
    pub invalid_response: i64,
    #[serde(default)]
    pub cancelled: i64,
}

impl OutcomeCounts {
    fn slot(&mut self, c: OutcomeClass) -> &mut i64 {
        match c {
            OutcomeClass::Success => &mut self.success,
            OutcomeClass::Timeout => &mut self.timeout,
            OutcomeClass::ConnectError => &mut self.connect_error,
            OutcomeClass::ConnectionDropped => &mut self.connection_dropped,
            OutcomeClass::RateLimited => &mut self.rate_limited,
            OutcomeClass::ServerError => &mut self.server_error,
            OutcomeClass::ClientError => &mut self.client_error,
            OutcomeClass::InvalidResponse => &mut self.invalid_response,
            OutcomeClass::Cancelled => &mut self.cancelled,
        }
    }

    pub fn get(&self, c: OutcomeClass) -> i64 {
        match c {
            OutcomeClass::Success => self.success,
            OutcomeClass::Timeout => self.timeout,
            OutcomeClass::ConnectError => self.connect_error,
            OutcomeClass::ConnectionDropped => self.connection_dropped,
            OutcomeClass::RateLimited => self.rate_limited,
            OutcomeClass::ServerError => self.server_error,
            OutcomeClass::ClientError => self.client_error,
            OutcomeClass::InvalidResponse => self.invalid_response,
            OutcomeClass::Cancelled => self.cancelled,
        }
    }

    pub fn add(&mut self, c: OutcomeClass, n: i64) {
        let s = self.slot(c);
        *s = s.saturating_add(n);
    }

    /// Every call counted.
    pub fn total(&self) -> i64 {
        OutcomeClass::ALL
            .iter()
            .map(|c| self.get(*c))
            .fold(0, i64::saturating_add)
    }

    /// (class, calls) for the classes with calls, in the schema's order.
    pub fn iter(&self) -> impl Iterator<Item = (OutcomeClass, i64)> + '_ {
        OutcomeClass::ALL
            .into_iter()
            .map(|c| (c, self.get(c)))
            .filter(|(_, n)| *n > 0)
    }
}

/// One bucket of a [`Histogram`].
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HistogramBucket {
    pub index: i32,
    pub count: i64,
}

/// A mergeable distribution of durations (µs), log-linear with 1 % relative error (the buckets
/// of DDSketch): bucket `i` holds the values `v` with γ^(i−1) < v ≤ γ^i, bucket 0 those ≤ 1 µs.
/// An hour needs 1,106 buckets at most; a summary of calls that took similar times needs a few.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Histogram {
    pub sum_us: i64,
    /// Ascending by index; counts above 0.
    pub buckets: Vec<HistogramBucket>,
}

impl Histogram {
    /// The bucket of a value.
    pub fn index(v_us: i64) -> i32 {
        if v_us <= 1 {
            return 0;
        }
        ((v_us as f64).ln() / HISTOGRAM_GAMMA.ln()).ceil() as i32
    }

    /// The value a bucket stands for: within 1 % of every value in it.
    pub fn value(index: i32) -> f64 {
        if index <= 0 {
            return 1.0;
        }
        2.0 * HISTOGRAM_GAMMA.powi(index) / (HISTOGRAM_GAMMA + 1.0)
    }

    pub fn record(&mut self, v_us: i64) {
        self.record_times(v_us, 1);
    }

    /// Record the same value `n` times.
    pub fn record_times(&mut self, v_us: i64, n: i64) {
        self.record_n(Histogram::index(v_us), n);
        self.sum_us = self.sum_us.saturating_add(v_us.max(0).saturating_mul(n));
    }

    fn record_n(&mut self, index: i32, n: i64) {
        match self.buckets.binary_search_by_key(&index, |b| b.index) {
            Ok(i) => self.buckets[i].count = self.buckets[i].count.saturating_add(n),
            Err(i) => self.buckets.insert(i, HistogramBucket { index, count: n }),
        }
    }

    /// Add another histogram's counts.
    pub fn merge(&mut self, other: &Histogram) {
        for b in &other.buckets {
            self.record_n(b.index, b.count);
        }
        self.sum_us = self.sum_us.saturating_add(other.sum_us);
    }

    pub fn count(&self) -> i64 {
        self.buckets.iter().map(|b| b.count).fold(0, i64::saturating_add)
    }

    pub fn is_empty(&self) -> bool {
        self.buckets.is_empty()
    }

    /// The mean (µs), from the exact sum.
    pub fn mean_us(&self) -> Option<f64> {
        match self.count() {
            0 => None,
            n => Some(self.sum_us as f64 / n as f64),
        }
    }

    /// The value at rank `r` (0-based, in ascending order).
    fn at_rank(&self, r: i64) -> Option<f64> {
        let mut seen = 0;
        for b in &self.buckets {
            seen += b.count;
            if r < seen {
                return Some(Histogram::value(b.index));
            }
        }
        None
    }

    /// The `q` quantile (nearest rank), within 1 %.
    pub fn quantile(&self, q: f64) -> Option<f64> {
        let n = self.count();
        if n == 0 {
            return None;
        }
        self.at_rank(((n - 1) as f64 * q.clamp(0.0, 1.0)).round() as i64)
    }

    /// `k` values spread evenly over the distribution by rank (all of them, ascending, when
    /// there are at most `k`): what stands for the calls in a ring of recent samples.
    pub fn spread(&self, k: usize) -> Vec<f64> {
        let n = self.count();
        if n <= 0 || k == 0 {
            return Vec::new();
        }
        let k = (k as i64).min(n);
        (0..k)
            .filter_map(|j| self.at_rank(if k == n { j } else { (j * 2 + 1) * n / (2 * k) }))
            .collect()
    }

    /// (value, calls) per bucket, ascending.
    pub fn iter(&self) -> impl Iterator<Item = (f64, i64)> + '_ {
        self.buckets.iter().map(|b| (Histogram::value(b.index), b.count))
    }
}

/// The calls one gateway made to one endpoint over an interval, summed (see the module docs).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CallSummary {
    pub summary_id: String,
    pub pool: String,
    pub endpoint: String,
    pub gateway: String,
    /// When the first call summed here ended.
    pub started_at: Micros,
    /// When the last call summed here ended.
    pub ended_at: Micros,
    pub calls: OutcomeCounts,
    /// Latency of the successful calls.
    pub latency: Histogram,
    /// First-token times of the successful calls that streamed.
    pub ttft: Histogram,
    /// Failures before the first success (429s, 4xx and cancelled calls neither count nor break
    /// a run).
    pub leading_failures: i32,
    pub longest_failure_run: i32,
    pub trailing_failures: i32,
    pub trailing_successes: i32,
    /// Runs of 5xx and timeouts (the hard break).
    pub longest_hard_run: i32,
    pub trailing_hard: i32,
    /// 429s in a row at the end (4xx and cancelled calls aside).
    pub trailing_rate_limited: i32,
    #[serde(default)]
    pub max_retry_after_ms: Option<i64>,
    #[serde(default)]
    pub models: Vec<String>,
}

impl CallSummary {
    /// An empty summary: no calls yet.
    pub fn new(summary_id: String, pool: &str, endpoint: &str, gateway: &str, at: Micros) -> CallSummary {
        CallSummary {
            summary_id,
            pool: pool.to_owned(),
            endpoint: endpoint.to_owned(),
            gateway: gateway.to_owned(),
            started_at: at,
            ended_at: at,
            calls: OutcomeCounts::default(),
            latency: Histogram::default(),
            ttft: Histogram::default(),
            leading_failures: 0,
            longest_failure_run: 0,
            trailing_failures: 0,
            trailing_successes: 0,
            longest_hard_run: 0,
            trailing_hard: 0,
            trailing_rate_limited: 0,
            max_retry_after_ms: None,
            models: Vec::new(),
        }
    }

    /// Add one call (ended at `call.occurred_at` + its latency, or at `at` if later).
    pub fn add(&mut self, call: &CallOutcome) {
        self.add_times(call, 1);
    }

    /// Add `n` calls alike, in a row: the same outcome, latency and first token.
    pub fn add_times(&mut self, call: &CallOutcome, n: u32) {
        if n == 0 {
            return;
        }
        let (n64, n32) = (i64::from(n), i32::try_from(n).unwrap_or(i32::MAX));
        let c = call.outcome;
        let first = self.calls.total() == 0;
        let end = call.occurred_at.saturating_add(call.latency_us.max(0));
        if first {
            self.started_at = end;
        }
        self.started_at = self.started_at.min(end);
        self.ended_at = self.ended_at.max(end);
        self.calls.add(c, n64);
        if c == OutcomeClass::Success {
            self.latency.record_times(call.latency_us, n64);
            if let Some(t) = call.ttft_us {
                self.ttft.record_times(t, n64);
            }
        }
        if let Some(r) = call.retry_after_ms {
            self.max_retry_after_ms = Some(self.max_retry_after_ms.map_or(r, |m| m.max(r)));
        }
        if let Some(m) = &call.model {
            if self.models.len() < MAX_SUMMARY_MODELS && !self.models.contains(m) {
                self.models.push(m.clone());
            }
        }
        // Runs, as the engine counts them: 4xx and cancelled calls are neutral; a 429 is
        // neither a failure nor a success.
        if c.is_neutral() {
            return;
        }
        if c == OutcomeClass::RateLimited {
            self.trailing_rate_limited = self.trailing_rate_limited.saturating_add(n32);
            return;
        }
        self.trailing_rate_limited = 0;
        if c.counts_as_failure() {
            if self.calls.success == 0 {
                self.leading_failures = self.leading_failures.saturating_add(n32);
            }
            self.trailing_failures = self.trailing_failures.saturating_add(n32);
            self.trailing_successes = 0;
            self.longest_failure_run = self.longest_failure_run.max(self.trailing_failures);
            self.trailing_hard = if c.is_hard() {
                self.trailing_hard.saturating_add(n32)
            } else {
                0
            };
            self.longest_hard_run = self.longest_hard_run.max(self.trailing_hard);
        } else {
            self.trailing_successes = self.trailing_successes.saturating_add(n32);
            self.trailing_failures = 0;
            self.trailing_hard = 0;
        }
    }

    /// Calls that count as failures of the endpoint (not 429s, 4xx or cancelled calls).
    pub fn failures(&self) -> i64 {
        self.calls
            .iter()
            .filter(|(c, _)| c.counts_as_failure())
            .map(|(_, n)| n)
            .sum()
    }
}

/// How a [`Summarizer`] sums.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SummaryConfig {
    /// The interval a summary covers at most (µs); 250 ms by default.
    pub interval_us: i64,
    /// Failures of one endpoint per interval reported one by one; the rest are summed.
    pub failure_cap: u32,
    /// Most endpoints with an open summary; calls to more are reported one by one (and
    /// counted), so memory stays bounded whatever the fleet.
    pub max_open: usize,
    /// A success whose first token came later than this (µs) is a hung stream, a hard timeout
    /// to the engine (the policy's `slow_call_ms`, 10 s by default): it goes as a failure does —
    /// one by one up to the cap, and summed beyond it as a timeout, in its place in the runs.
    pub slow_call_us: i64,
}

impl Default for SummaryConfig {
    fn default() -> Self {
        SummaryConfig {
            interval_us: 250_000,
            failure_cap: 8,
            max_open: 100_000,
            slow_call_us: 10_000_000,
        }
    }
}

/// One endpoint's interval: its open summary and the failures sent one by one so far.
struct Open {
    /// (pool, endpoint, gateway): the map is keyed by their hash, so a call is looked up
    /// without copying its names; these tell a hash collision.
    names: [String; 3],
    interval_start: Micros,
    failures_sent: u32,
    summary: Option<CallSummary>,
}

/// The hash an endpoint's interval is kept under.
fn key_of(call: &CallOutcome) -> u64 {
    Fnv64::new()
        .parts(&[call.pool.as_bytes(), call.endpoint.as_bytes(), call.gateway.as_bytes()])
        .finish()
}

/// Sums calls into [`CallSummary`] records (see the module docs). Pure: the caller gives the
/// time and sends what comes out, in order.
pub struct Summarizer {
    cfg: SummaryConfig,
    /// A prefix that keeps this summarizer's ids apart from every other's.
    instance: String,
    next: u64,
    open: HashMap<u64, Open>,
    /// The earliest end of an open interval: `flush_due` looks at the endpoints only then (the
    /// reporter calls it on every turn of its thread).
    next_due: Micros,
    /// Calls reported one by one (or, added together, in a summary of their own) because
    /// `max_open` endpoints were open, or because two endpoints' names hashed alike.
    pub overflowed: u64,
}

impl Summarizer {
    /// `instance` tells this summarizer's summary ids from others' (e.g. a random number per
    /// process); ids are `s-{instance}-{n}`.
    pub fn new(cfg: SummaryConfig, instance: &str) -> Summarizer {
        Summarizer {
            cfg,
            instance: instance.to_owned(),
            next: 0,
            open: HashMap::new(),
            next_due: Micros::MAX,
            overflowed: 0,
        }
    }

    pub fn config(&self) -> SummaryConfig {
        self.cfg
    }

    /// Endpoints with an open interval.
    pub fn open(&self) -> usize {
        self.open.len()
    }

    /// Take one call, ended at `now`; what to send goes to `out` in order (a summary of the
    /// calls before a failure, then the failure).
    pub fn add(&mut self, call: CallOutcome, now: Micros, out: &mut Vec<Signal>) {
        self.add_times(call, 1, now, out);
    }

    /// Take `n` calls alike (the same outcome and timings, in a row, ended at `now`): what a
    /// caller that counts its calls itself hands over (a simulated fleet, a sidecar that
    /// aggregates). Failures among them are sent one by one as long as the endpoint's cap
    /// allows (the call's id, then `{id}-1`, `{id}-2`, …), the rest are summed.
    pub fn add_times(&mut self, call: CallOutcome, n: u32, now: Micros, out: &mut Vec<Signal>) {
        if n == 0 {
            return;
        }
        let key = key_of(&call);
        let fits = match self.open.get(&key) {
            Some(o) => o.names[0] == call.pool && o.names[1] == call.endpoint && o.names[2] == call.gateway,
            None => self.open.len() < self.cfg.max_open,
        };
        if !fits {
            self.overflowed += u64::from(n);
            if n == 1 {
                out.push(Signal::Call(call));
            } else {
                let id = self.summary_id(&call);
                let mut alone = CallSummary::new(id, &call.pool, &call.endpoint, &call.gateway, now);
                alone.add_times(&call, n);
                out.push(Signal::Summary(alone));
            }
            return;
        }
        let interval = self.cfg.interval_us;
        let cap = self.cfg.failure_cap;
        let o = self.open.entry(key).or_insert_with(|| Open {
            names: [call.pool.clone(), call.endpoint.clone(), call.gateway.clone()],
            interval_start: now,
            failures_sent: 0,
            summary: None,
        });
        if now >= o.interval_start.saturating_add(interval) {
            // A new interval: what is open goes first.
            out.extend(o.summary.take().map(Signal::Summary));
            o.interval_start = now;
            o.failures_sent = 0;
        }
        self.next_due = self.next_due.min(o.interval_start.saturating_add(interval));
        let mut n = n;
        let hung = call.outcome == OutcomeClass::Success && call.ttft_us.is_some_and(|t| t > self.cfg.slow_call_us);
        if (call.outcome.is_failure() || hung) && o.failures_sent < cap {
            out.extend(o.summary.take().map(Signal::Summary));
            let one_by_one = n.min(cap - o.failures_sent);
            o.failures_sent += one_by_one;
            n -= one_by_one;
            out.push(Signal::Call(call.clone()));
            for i in 1..one_by_one {
                out.push(Signal::Call(CallOutcome {
                    event_id: format!("{}-{i}", call.event_id),
                    ..call.clone()
                }));
            }
            if n == 0 {
                return;
            }
        }
        if o.summary.is_none() {
            let id = Summarizer::next_id(&mut self.next, &self.instance, key);
            o.summary = Some(CallSummary::new(id, &call.pool, &call.endpoint, &call.gateway, now));
        }
        if let Some(summary) = o.summary.as_mut() {
            if hung {
                // Beyond the cap: counted as the timeout the engine takes it for (its latency
                // and first token are not a success's).
                let timeout = CallOutcome {
                    outcome: OutcomeClass::Timeout,
                    ttft_us: None,
                    http_status: None,
                    ..call
                };
                summary.add_times(&timeout, n);
            } else {
                summary.add_times(&call, n);
            }
        }
    }

    fn summary_id(&mut self, call: &CallOutcome) -> String {
        Summarizer::next_id(&mut self.next, &self.instance, key_of(call))
    }

    fn next_id(next: &mut u64, instance: &str, key: u64) -> String {
        *next += 1;
        format!("s-{instance}-{key:016x}-{next}")
    }

    /// Send the summaries whose interval has ended by `now`, and forget endpoints whose interval
    /// ended with nothing open.
    pub fn flush_due(&mut self, now: Micros, out: &mut Vec<Signal>) {
        if now < self.next_due {
            return;
        }
        let interval = self.cfg.interval_us;
        let mut due: Vec<CallSummary> = Vec::new();
        let mut next_due = Micros::MAX;
        self.open.retain(|_, o| {
            let end = o.interval_start.saturating_add(interval);
            if now < end {
                next_due = next_due.min(end);
                return true;
            }
            due.extend(o.summary.take());
            false
        });
        self.next_due = next_due;
        // In the order the calls came (the ids count up): the same order in every run.
        due.sort_by(|a, b| {
            (a.started_at, a.summary_id.len())
                .cmp(&(b.started_at, b.summary_id.len()))
                .then_with(|| a.summary_id.cmp(&b.summary_id))
        });
        out.extend(due.into_iter().map(Signal::Summary));
    }

    /// Send every open summary (at shutdown).
    pub fn flush_all(&mut self, out: &mut Vec<Signal>) {
        self.flush_due(Micros::MAX, out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(ep: &str, t: Micros, c: OutcomeClass) -> CallOutcome {
        CallOutcome {
            latency_us: 0,
            ttft_us: (c == OutcomeClass::Success).then_some(200_000),
            ..CallOutcome::new(format!("{ep}-{t}"), "p", ep, "gw", t, c)
        }
    }

    #[test]
    fn a_histogram_is_within_one_percent_and_merges() {
        let mut h = Histogram::default();
        for v in [1, 2, 10, 999, 1_000, 250_000, 3_600_000_000] {
            h.record(v);
            let got = Histogram::value(Histogram::index(v));
            assert!(
                (got - v as f64).abs() <= v as f64 * HISTOGRAM_RELATIVE_ERROR + 1e-9,
                "{v}: {got}"
            );
        }
        assert!(Histogram::index(3_600_000_000) < 1_200);
        let mut other = Histogram::default();
        other.record(1_000);
        h.merge(&other);
        assert_eq!(h.count(), 8);
        assert_eq!(
            h.buckets
                .iter()
                .find(|b| b.index == Histogram::index(1_000))
                .unwrap()
                .count,
            3
        );
        assert!(h.buckets.windows(2).all(|w| w[0].index < w[1].index));
        let q = h.quantile(0.5).unwrap();
        assert!((q - 1_000.0).abs() < 10.0, "{q}");
        assert_eq!(h.spread(3).len(), 3);
        assert_eq!(h.spread(100).len(), 8);
    }

    #[test]
    fn successes_are_summed_and_failures_sent_one_by_one_up_to_the_cap() {
        let cfg = SummaryConfig {
            interval_us: 250_000,
            failure_cap: 2,
            max_open: 10,
            ..SummaryConfig::default()
        };
        let mut s = Summarizer::new(cfg, "t");
        let mut out = Vec::new();
        for i in 0..5 {
            s.add(call("a", 1_000 + i, OutcomeClass::Success), 1_000 + i, &mut out);
        }
        assert!(out.is_empty(), "successes wait for the interval's end");
        // A failure: the successes before it go first, then the failure itself.
        s.add(call("a", 2_000, OutcomeClass::ServerError), 2_000, &mut out);
        assert!(matches!(&out[0], Signal::Summary(x) if x.calls.success == 5 && x.trailing_successes == 5));
        assert!(matches!(&out[1], Signal::Call(c) if c.outcome == OutcomeClass::ServerError));
        s.add(call("a", 2_001, OutcomeClass::Timeout), 2_001, &mut out);
        assert_eq!(out.len(), 3, "the second failure is sent alone (no summary open)");
        // Beyond the cap, failures are summed with the runs kept.
        for (i, c) in [
            OutcomeClass::ServerError,
            OutcomeClass::Timeout,
            OutcomeClass::Success,
            OutcomeClass::ConnectError,
            OutcomeClass::ServerError,
            OutcomeClass::ServerError,
            OutcomeClass::ClientError,
            OutcomeClass::RateLimited,
        ]
        .into_iter()
        .enumerate()
        {
            s.add(call("a", 3_000 + i as i64, c), 3_000 + i as i64, &mut out);
        }
        assert_eq!(out.len(), 3);
        s.flush_due(1_000 + 249_999, &mut out);
        assert_eq!(out.len(), 3, "the interval has not ended");
        s.flush_due(1_000 + 250_000, &mut out);
        let Signal::Summary(x) = &out[3] else {
            panic!("{:?}", out[3])
        };
        assert_eq!(
            (
                x.calls.total(),
                x.calls.server_error,
                x.failures(),
                x.calls.rate_limited
            ),
            (8, 3, 5, 1)
        );
        assert_eq!(
            (
                x.leading_failures,
                x.longest_failure_run,
                x.trailing_failures,
                x.trailing_successes,
                x.longest_hard_run,
                x.trailing_hard,
                x.trailing_rate_limited
            ),
            (2, 3, 3, 0, 2, 2, 1)
        );
        assert_eq!(s.open(), 0, "a closed interval is forgotten");
        // A new interval reports failures one by one again.
        s.add(call("a", 400_000, OutcomeClass::Timeout), 400_000, &mut out);
        assert!(matches!(out.last(), Some(Signal::Call(_))));
    }

    #[test]
    fn hung_streams_go_as_failures_and_are_summed_as_timeouts_beyond_the_cap() {
        let cfg = SummaryConfig {
            failure_cap: 2,
            ..SummaryConfig::default()
        };
        let mut s = Summarizer::new(cfg, "t");
        let mut out = Vec::new();
        s.add(call("a", 1_000, OutcomeClass::Success), 1_000, &mut out);
        for i in 1..=5 {
            let hung = CallOutcome {
                ttft_us: Some(12_000_000),
                ..call("a", 1_000 + i, OutcomeClass::Success)
            };
            s.add(hung, 1_000 + i, &mut out);
        }
        s.flush_all(&mut out);
        // The success summed before the first hung stream, two hung streams one by one, three
        // summed as timeouts: a hard run of three, as the engine counts them one by one.
        let kinds: Vec<&str> = out
            .iter()
            .map(|o| match o {
                Signal::Call(_) => "call",
                _ => "summary",
            })
            .collect();
        assert_eq!(kinds, ["summary", "call", "call", "summary"]);
        let Signal::Summary(last) = &out[3] else { unreachable!() };
        assert_eq!((last.calls.timeout, last.calls.success), (3, 0));
        assert_eq!(
            (last.leading_failures, last.longest_hard_run, last.trailing_hard),
            (3, 3, 3)
        );
        assert!(last.ttft.is_empty() && last.latency.is_empty());
    }

    #[test]
    fn memory_is_bounded_by_open_endpoints() {
        let cfg = SummaryConfig {
            max_open: 2,
            ..SummaryConfig::default()
        };
        let mut s = Summarizer::new(cfg, "t");
        let mut out = Vec::new();
        for ep in ["a", "b", "c"] {
            s.add(call(ep, 1, OutcomeClass::Success), 1, &mut out);
        }
        assert_eq!((s.open(), s.overflowed, out.len()), (2, 1, 1));
        let mut ids = std::collections::HashSet::new();
        s.flush_all(&mut out);
        for sig in &out {
            assert!(ids.insert(sig.id().to_owned()), "ids are unique");
        }
    }

    #[test]
    fn calls_handed_over_counted_are_summed_as_if_added_one_by_one() {
        use OutcomeClass::*;
        let runs = [
            (Success, 40),
            (Timeout, 3),
            (Success, 1),
            (ServerError, 30),
            (RateLimited, 4),
            (Success, 7),
            (ConnectError, 2),
        ];
        let (mut one, mut counted) = (
            Summarizer::new(SummaryConfig::default(), "t"),
            Summarizer::new(SummaryConfig::default(), "t"),
        );
        let (mut by_one, mut by_count) = (Vec::new(), Vec::new());
        for (k, (class, n)) in runs.into_iter().enumerate() {
            let t = k as Micros * 100_000;
            for i in 0..n {
                let c = CallOutcome {
                    event_id: if i == 0 { format!("c{k}") } else { format!("c{k}-{i}") },
                    ..call("a", t, class)
                };
                one.add(c, t, &mut by_one);
            }
            counted.add_times(
                CallOutcome {
                    event_id: format!("c{k}"),
                    ..call("a", t, class)
                },
                n,
                t,
                &mut by_count,
            );
        }
        one.flush_all(&mut by_one);
        counted.flush_all(&mut by_count);
        // The same records, failures one by one up to the cap, ids aside.
        let shape = |v: &[Signal]| -> Vec<String> {
            v.iter()
                .map(|s| match s {
                    Signal::Call(c) => format!("call {} {:?}", c.event_id, c.outcome),
                    Signal::Summary(x) => format!(
                        "{:?}",
                        CallSummary {
                            summary_id: String::new(),
                            ..x.clone()
                        }
                    ),
                    other => format!("{other:?}"),
                })
                .collect()
        };
        assert_eq!(shape(&by_count), shape(&by_one));
        assert!(by_count.len() < 30, "{} records", by_count.len());
    }
}
