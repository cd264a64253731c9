//! The call summary record (`schemas/call_summary.avsc`): the calls one gateway made to one
//! endpoint over an interval, summed — counts per outcome class, latency and first-token
//! histograms, the runs of failures. What makes them is the [`crate::summary::Summarizer`].

use super::{CallOutcome, Micros, OutcomeClass};
use serde::{Deserialize, Serialize};

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

    /// Add another histogram's counts. A merger merges every gateway's summary of an endpoint
    /// into one, so this is on its every record: buckets both have are added where they are
    /// (the common case once an endpoint's latencies are known), and the others are merged in
    /// from the back in one pass, each bucket moved once.
    pub fn merge(&mut self, other: &Histogram) {
        self.sum_us = self.sum_us.saturating_add(other.sum_us);
        let mut missing = 0;
        for b in &other.buckets {
            match self.buckets.binary_search_by_key(&b.index, |x| x.index) {
                Ok(i) => self.buckets[i].count = self.buckets[i].count.saturating_add(b.count),
                Err(_) => missing += 1,
            }
        }
        if missing == 0 {
            return;
        }
        let held = self.buckets.len();
        self.buckets
            .resize(held + missing, HistogramBucket { index: 0, count: 0 });
        // i: buckets of ours not yet placed; j: of the other's; k: the slot to fill.
        let (mut i, mut j, mut k) = (held, other.buckets.len(), held + missing);
        while j > 0 {
            let theirs = other.buckets[j - 1];
            if i > 0 && self.buckets[i - 1].index == theirs.index {
                // Added above.
                j -= 1;
            } else if i > 0 && self.buckets[i - 1].index > theirs.index {
                k -= 1;
                self.buckets[k] = self.buckets[i - 1];
                i -= 1;
            } else {
                k -= 1;
                self.buckets[k] = theirs;
                j -= 1;
            }
        }
        debug_assert_eq!(i, k, "our first buckets stay where they are");
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

/// Histograms being added up, as counts by bucket over the span of indexes seen: adding one
/// takes a step per bucket, where [`Histogram::merge`] searches for each and moves every bucket
/// above a new one (a merge stage adds a fleet's histograms into each open summary; the merge
/// was 7 % of its instructions).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct HistogramSum {
    /// The index of `counts[0]`.
    first: i32,
    counts: Vec<i64>,
    sum_us: i64,
}

/// The widest span of indexes a [`HistogramSum`] keeps (an hour's histogram spans 1,107);
/// buckets beyond it are merged into the histogram the sum goes to.
const MAX_SUM_SPAN: i64 = 4096;

impl HistogramSum {
    /// Add `h`, or merge it into `overflow` when its buckets are beyond the span a sum keeps.
    pub fn add(&mut self, h: &Histogram, overflow: &mut Histogram) {
        let (Some(lo), Some(hi)) = (h.buckets.first(), h.buckets.last()) else {
            self.sum_us = self.sum_us.saturating_add(h.sum_us);
            return;
        };
        let (lo, hi) = (i64::from(lo.index), i64::from(hi.index));
        // The span kept now, [held, held_end), and the one that holds `h` too.
        let (held, held_end) = (i64::from(self.first), i64::from(self.first) + self.counts.len() as i64);
        let (first, end) = if self.counts.is_empty() {
            (lo, hi + 1)
        } else {
            (held.min(lo), held_end.max(hi + 1))
        };
        if end - first > MAX_SUM_SPAN {
            overflow.merge(h);
            return;
        }
        if !self.counts.is_empty() && first < held {
            self.counts
                .splice(0..0, std::iter::repeat_n(0, (held - first) as usize));
        }
        self.first = first as i32;
        self.counts.resize((end - first) as usize, 0);
        self.sum_us = self.sum_us.saturating_add(h.sum_us);
        for b in &h.buckets {
            let c = &mut self.counts[(b.index - self.first) as usize];
            *c = c.saturating_add(b.count);
        }
    }

    /// Merge what was added into `h`, and start again from nothing.
    pub fn take_into(&mut self, h: &mut Histogram) {
        let sum = std::mem::take(self);
        let added = Histogram {
            sum_us: sum.sum_us,
            buckets: (sum.first..)
                .zip(sum.counts)
                .filter(|(_, count)| *count != 0)
                .map(|(index, count)| HistogramBucket { index, count })
                .collect(),
        };
        if h.buckets.is_empty() && h.sum_us == 0 {
            *h = added;
        } else {
            h.merge(&added);
        }
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
    /// `None` in a gateway's own summary (its gateway is its reporter); in a merged one
    /// (vitals-merger), the reporters that failed in it or were in a run of failures, at most
    /// [`MAX_SUMMARY_REPORTERS`]: the calls of the others are the summary's, whose reporter is not
    /// known. Not in the JSON ingest: only a merge stage on the gateway-signals topic says whose
    /// calls another's were.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reporters: Option<Vec<ReporterCounts>>,
}

/// Most reporters a merged summary lists.
pub const MAX_SUMMARY_REPORTERS: usize = 8;

/// One reporter's calls within a merged summary: what the engine's attribution needs of them.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct ReporterCounts {
    /// The reporter's scopes, narrowest first (`gateway=g1`, `key=k1`, `location=eu`).
    pub scopes: Vec<String>,
    /// Its calls that count for or against the endpoint (successes and failures).
    pub calls: i64,
    pub failures: i64,
    /// Its failures in a row at the end.
    pub trailing_failures: i64,
}

impl ReporterCounts {
    /// Add `calls` of which `failures` failed, `trailing` of them in a row at the end (after
    /// any success among them).
    pub fn add(&mut self, calls: i64, failures: i64, trailing: i64) {
        let passed = calls > failures;
        self.calls = self.calls.saturating_add(calls);
        self.failures = self.failures.saturating_add(failures);
        self.trailing_failures = if passed {
            trailing
        } else {
            self.trailing_failures.saturating_add(trailing)
        };
    }
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
            reporters: None,
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
            // The summary spans its calls, not the moment it was opened: a first call that
            // ended long before (a late span) must not stretch it to now.
            self.started_at = end;
            self.ended_at = end;
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
        if self.append_all_but_histograms(other) {
            self.latency.merge(&other.latency);
            self.ttft.merge(&other.ttft);
        }
    }

    /// [`CallSummary::append`] but for the histograms, for a caller that sums them apart
    /// ([`HistogramSum`]); false when `other` holds no call (and nothing is to be added).
    pub fn append_all_but_histograms(&mut self, other: &CallSummary) -> bool {
        if other.calls.total() == 0 {
            return false;
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
        if let Some(r) = other.max_retry_after_ms {
            self.max_retry_after_ms = Some(self.max_retry_after_ms.map_or(r, |m| m.max(r)));
        }
        for m in &other.models {
            if self.models.len() < MAX_SUMMARY_MODELS && !self.models.contains(m) {
                self.models.push(m.clone());
            }
        }
        true
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
