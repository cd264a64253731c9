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

    /// Add the calls of `other` (the same endpoint's, from another gateway or a later interval)
    /// as if they came after this summary's: what a merge stage does with the summaries of a
    /// fleet. Counts and histograms add up exactly; runs join where one summary's end meets the
    /// other's start (a hard run joins only when `other` held hard failures and nothing that
    /// breaks a run, as a summary does not keep its leading hard run).
    pub fn append(&mut self, other: &CallSummary) {
        if other.calls.total() == 0 {
            return;
        }
        if self.calls.total() == 0 {
            self.started_at = other.started_at;
            self.ended_at = other.ended_at;
        }
        self.started_at = self.started_at.min(other.started_at);
        self.ended_at = self.ended_at.max(other.ended_at);
        let (b_failures, b_successes) = (other.failures(), other.calls.success);
        if self.calls.success == 0 {
            self.leading_failures = self.leading_failures.saturating_add(other.leading_failures);
        }
        let joined = self.trailing_failures.saturating_add(other.leading_failures);
        self.longest_failure_run = self.longest_failure_run.max(other.longest_failure_run).max(joined);
        let all_hard = b_successes == 0 && i64::from(other.trailing_hard) == b_failures;
        self.trailing_hard = if all_hard {
            self.trailing_hard.saturating_add(other.trailing_hard)
        } else {
            other.trailing_hard
        };
        self.longest_hard_run = self
            .longest_hard_run
            .max(other.longest_hard_run)
            .max(self.trailing_hard);
        self.trailing_failures = if b_successes > 0 {
            other.trailing_failures
        } else {
            self.trailing_failures.saturating_add(other.trailing_failures)
        };
        self.trailing_successes = if b_failures > 0 {
            other.trailing_successes
        } else {
            self.trailing_successes.saturating_add(other.trailing_successes)
        };
        self.trailing_rate_limited = if b_failures + b_successes == 0 {
            self.trailing_rate_limited.saturating_add(other.trailing_rate_limited)
        } else {
            other.trailing_rate_limited
        };
        for (c, n) in other.calls.iter() {
            self.calls.add(c, n);
        }
        self.latency.merge(&other.latency);
        self.ttft.merge(&other.ttft);
        if let Some(r) = other.max_retry_after_ms {
            self.max_retry_after_ms = Some(self.max_retry_after_ms.map_or(r, |m| m.max(r)));
        }
        for m in &other.models {
            if self.models.len() < MAX_SUMMARY_MODELS && !self.models.contains(m) {
                self.models.push(m.clone());
            }
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

/// The hash an endpoint's interval is kept under (a merging summarizer's: without the gateway).
fn key_of(pool: &str, endpoint: &str, gateway: Option<&str>) -> u64 {
    match gateway {
        Some(g) => Fnv64::new().parts(&[pool.as_bytes(), endpoint.as_bytes(), g.as_bytes()]),
        None => Fnv64::new().parts(&[pool.as_bytes(), endpoint.as_bytes()]),
    }
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
    /// A merge stage's summarizer: the gateway its summaries carry. It keeps one interval per
    /// endpoint whatever gateway a call or a summary came from.
    merged_as: Option<String>,
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
            merged_as: None,
        }
    }

    /// A merge stage's summarizer: the calls and summaries of every gateway that reports an
    /// endpoint go into one interval of that endpoint ([`Summarizer::add_summary`] for
    /// summaries), its summaries carry `gateway`, and the failure cap holds per endpoint for the
    /// whole fleet. Failures sent one by one keep the gateway that reported them.
    pub fn merging(cfg: SummaryConfig, instance: &str, gateway: &str) -> Summarizer {
        Summarizer {
            merged_as: Some(gateway.to_owned()),
            ..Summarizer::new(cfg, instance)
        }
    }

    /// The key of an endpoint's interval, and its names as kept (a merging summarizer keeps no
    /// gateway).
    fn key(&self, pool: &str, endpoint: &str, gateway: &str) -> u64 {
        key_of(pool, endpoint, self.merged_as.is_none().then_some(gateway))
    }

    fn fits(&self, key: u64, pool: &str, endpoint: &str, gateway: &str) -> bool {
        match self.open.get(&key) {
            Some(o) => {
                o.names[0] == pool && o.names[1] == endpoint && (self.merged_as.is_some() || o.names[2] == gateway)
            }
            None => self.open.len() < self.cfg.max_open,
        }
    }

    /// The endpoint's open interval, begun at `now` if none is or the last has ended (what it
    /// held goes to `out` first).
    fn slot(&mut self, key: u64, names: [&str; 3], now: Micros, out: &mut Vec<Signal>) -> &mut Open {
        let interval = self.cfg.interval_us;
        let gateway = self.merged_as.as_deref().unwrap_or(names[2]);
        let o = self.open.entry(key).or_insert_with(|| Open {
            names: [names[0].to_owned(), names[1].to_owned(), gateway.to_owned()],
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
        o
    }

    /// Take a summary a gateway made (a merging summarizer): its calls join the endpoint's open
    /// interval, after the calls already in it. Without room for the endpoint it goes on as it
    /// came.
    pub fn add_summary(&mut self, summary: CallSummary, now: Micros, out: &mut Vec<Signal>) {
        let key = self.key(&summary.pool, &summary.endpoint, &summary.gateway);
        if !self.fits(key, &summary.pool, &summary.endpoint, &summary.gateway) {
            self.overflowed += u64::try_from(summary.calls.total()).unwrap_or(0);
            out.push(Signal::Summary(summary));
            return;
        }
        let names = [
            summary.pool.as_str(),
            summary.endpoint.as_str(),
            summary.gateway.as_str(),
        ];
        let o = match self.slot(key, names, now, out) {
            o if o.summary.is_some() => o,
            _ => self.start_summary(key, now),
        };
        if let Some(open) = o.summary.as_mut() {
            open.append(&summary);
        }
    }

    /// Open a new summary in the endpoint's interval (opened by `slot`): once an interval.
    fn start_summary(&mut self, key: u64, now: Micros) -> &mut Open {
        let id = Summarizer::next_id(&mut self.next, &self.instance, key);
        let o = self.open.get_mut(&key).expect("the interval is open");
        o.summary = Some(CallSummary::new(id, &o.names[0], &o.names[1], &o.names[2], now));
        o
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
        let key = self.key(&call.pool, &call.endpoint, &call.gateway);
        if !self.fits(key, &call.pool, &call.endpoint, &call.gateway) {
            self.overflowed += u64::from(n);
            if n == 1 {
                out.push(Signal::Call(call));
            } else {
                let id = Summarizer::next_id(&mut self.next, &self.instance, key);
                let mut alone = CallSummary::new(id, &call.pool, &call.endpoint, &call.gateway, now);
                alone.add_times(&call, n);
                out.push(Signal::Summary(alone));
            }
            return;
        }
        let (cap, slow_call_us) = (self.cfg.failure_cap, self.cfg.slow_call_us);
        let names = [call.pool.as_str(), call.endpoint.as_str(), call.gateway.as_str()];
        let o = self.slot(key, names, now, out);
        let mut n = n;
        let hung = call.outcome == OutcomeClass::Success && call.ttft_us.is_some_and(|t| t > slow_call_us);
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
        let o = match o {
            o if o.summary.is_some() => o,
            _ => self.start_summary(key, now),
        };
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

    /// Calls of random classes and timings.
    fn random_calls() -> impl proptest::strategy::Strategy<Value = Vec<(OutcomeClass, i64)>> {
        use proptest::prelude::*;
        let class = prop_oneof![
            6 => Just(OutcomeClass::Success),
            2 => Just(OutcomeClass::ServerError),
            1 => Just(OutcomeClass::Timeout),
            1 => Just(OutcomeClass::ConnectionDropped),
            1 => Just(OutcomeClass::RateLimited),
            1 => Just(OutcomeClass::ClientError),
        ];
        proptest::collection::vec((class, 1i64..5_000_000), 0..60)
    }

    /// The calls summed, the first of them the `first`-th of the stream (it sets their times).
    fn summed(calls: &[(OutcomeClass, i64)], first: usize) -> CallSummary {
        let mut s = CallSummary::new("s".into(), "p", "a", "gw", 0);
        for (i, (c, t)) in calls.iter().enumerate().map(|(i, c)| (i + first, c)) {
            s.add(&CallOutcome {
                latency_us: *t,
                ttft_us: (*c == OutcomeClass::Success).then_some(t / 2),
                retry_after_ms: (*c == OutcomeClass::RateLimited).then_some(t / 1000),
                ..CallOutcome::new(format!("c{i}"), "p", "a", "gw", i as Micros * 1000, *c)
            });
        }
        s
    }

    proptest::proptest! {
        /// Two summaries appended are the summary of their calls in a row: counts, histograms
        /// and every run the engine reads (a hard run that `other` begins with joins only when
        /// `other` holds nothing else, so it may be shorter, never longer).
        #[test]
        fn appended_summaries_are_the_summary_of_the_calls_in_a_row(calls in random_calls(), cut in 0usize..60) {
            let cut = cut.min(calls.len());
            let whole = summed(&calls, 0);
            let mut a = summed(&calls[..cut], 0);
            a.append(&summed(&calls[cut..], cut));
            proptest::prop_assert_eq!(a.longest_hard_run.min(whole.longest_hard_run), a.longest_hard_run);
            proptest::prop_assert!(a.trailing_hard <= whole.trailing_hard);
            let runs_aside = |s: &CallSummary| CallSummary {
                summary_id: String::new(),
                longest_hard_run: 0,
                trailing_hard: 0,
                ..s.clone()
            };
            proptest::prop_assert_eq!(runs_aside(&a), runs_aside(&whole));
            if calls[cut..].iter().all(|(c, _)| c.is_hard() || c.is_neutral() || *c == OutcomeClass::RateLimited) {
                proptest::prop_assert_eq!((a.longest_hard_run, a.trailing_hard), (whole.longest_hard_run, whole.trailing_hard));
            }
        }
    }

    #[test]
    fn a_merging_summarizer_sends_one_summary_per_endpoint_and_caps_failures_for_the_fleet() {
        let cfg = SummaryConfig::default();
        let mut merge = Summarizer::merging(cfg, "m1", "merge-1");
        let mut out = Vec::new();
        // Four gateways: each sends its own summary of 100 successes and 3 failures one by one.
        for g in 0..4 {
            let gw = format!("gw-{g}");
            for i in 0..3 {
                let f = CallOutcome::new(format!("f{g}-{i}"), "p", "a", &gw, 1_000, OutcomeClass::ServerError);
                merge.add(f, 10_000 + g * 10 + i, &mut out);
            }
            let mut s = CallSummary::new(format!("s-{g}"), "p", "a", &gw, 1_000);
            s.add_times(
                &CallOutcome {
                    latency_us: 20_000,
                    ..CallOutcome::new("x", "p", "a", &gw, 1_000, OutcomeClass::Success)
                },
                100,
            );
            merge.add_summary(s, 20_000 + g, &mut out);
        }
        merge.flush_all(&mut out);
        let calls: Vec<&CallOutcome> = out
            .iter()
            .filter_map(|s| match s {
                Signal::Call(c) => Some(c),
                _ => None,
            })
            .collect();
        let summaries: Vec<&CallSummary> = out
            .iter()
            .filter_map(|s| match s {
                Signal::Summary(x) => Some(x),
                _ => None,
            })
            .collect();
        // The cap (8) holds for the endpoint, not per gateway; failures keep their gateway.
        assert_eq!(calls.len(), 8);
        assert_eq!(calls[3].gateway, "gw-1");
        // The 4 over the cap and the 400 successes: in the summaries, which carry the merger.
        let total: i64 = summaries.iter().map(|s| s.calls.total()).sum();
        assert_eq!(total, 404);
        assert!(summaries.iter().all(|s| s.gateway == "merge-1"));
        // Cut where a failure goes one by one (the order of calls holds): gw-0's, gw-1's, then
        // the rest (gw-2's and gw-3's failures over the cap among them).
        let successes: Vec<i64> = summaries.iter().map(|s| s.calls.success).collect();
        assert_eq!(successes, [100, 100, 200], "{summaries:#?}");
        assert_eq!(summaries[2].latency.count(), 200);
        assert_eq!(summaries[2].calls.server_error, 4);
        // A summary from an endpoint beyond max_open goes on as it came.
        let mut small = Summarizer::merging(SummaryConfig { max_open: 1, ..cfg }, "m2", "merge-2");
        let mut out = Vec::new();
        small.add_summary(CallSummary::new("s-x".into(), "p", "a", "gw", 0), 0, &mut out);
        let mut other = CallSummary::new("s-y".into(), "p", "b", "gw", 0);
        other.add(&CallOutcome::new("y", "p", "b", "gw", 0, OutcomeClass::Success));
        small.add_summary(other, 0, &mut out);
        assert!(matches!(&out[..], [Signal::Summary(s)] if s.summary_id == "s-y"));
        assert_eq!(small.overflowed, 1);
    }
}
