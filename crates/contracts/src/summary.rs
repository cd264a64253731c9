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
pub use crate::types::{
    CallSummary, Histogram, HistogramBucket, HistogramSum, OutcomeCounts, ReporterCounts, HISTOGRAM_GAMMA,
    HISTOGRAM_RELATIVE_ERROR, MAX_SUMMARY_MODELS, MAX_SUMMARY_REPORTERS,
};
use rustc_hash::FxHashMap;

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
    /// A merging summarizer's: the watched reporters' calls in `summary`.
    reporters: Vec<ReporterCounts>,
    /// A merging summarizer's: the histograms of the summaries appended to `summary`, added
    /// to its own when it is taken.
    latency: HistogramSum,
    ttft: HistogramSum,
}

/// The longest a summary spans (from its first call's end to its last's), a gateway's or a
/// merged one: half of what the processor accepts ([`crate::validate::MAX_SUMMARY_SPAN_US`]),
/// so that a gateway whose clock is off, a backlog read at once, or late spans among fresh ones
/// (an OTLP exporter's retry queue) make more summaries, never one too long. Before this cut
/// applied to a gateway's own summaries, 100 successes ended 70 s before the fresh ones beside
/// them made a 70 s summary the processor dead-lettered whole, while the failures among them,
/// sent one by one, counted: an endpoint failing 10 % of its calls was ejected as failing 100 %.
pub const MAX_MERGED_SPAN_US: Micros = crate::validate::MAX_SUMMARY_SPAN_US / 2;

/// Reporters a merging summarizer watches per endpoint at most: those that failed, until a
/// merged summary shows their run of failures over.
const MAX_WATCHED: usize = 4 * MAX_SUMMARY_REPORTERS;

/// Take the open summary of an interval. A merging summarizer's lists the watched reporters
/// whose calls it holds (at most [`MAX_SUMMARY_REPORTERS`], those with the most failures); a
/// reporter listed with no failure at the end is watched no more (the engine has seen its run
/// end).
fn take_summary(
    o: &mut Open,
    merging: bool,
    watched: &mut FxHashMap<u64, Vec<Vec<String>>>,
    key: u64,
) -> Option<CallSummary> {
    let mut summary = o.summary.take()?;
    o.latency.take_into(&mut summary.latency);
    o.ttft.take_into(&mut summary.ttft);
    if merging {
        let mut listed = std::mem::take(&mut o.reporters);
        listed.retain(|r| r.calls > 0);
        listed.sort_by(|a, b| {
            (b.failures, b.calls)
                .cmp(&(a.failures, a.calls))
                .then_with(|| a.scopes.cmp(&b.scopes))
        });
        listed.truncate(MAX_SUMMARY_REPORTERS);
        if let Some(w) = watched.get_mut(&key) {
            w.retain(|scopes| !listed.iter().any(|r| &r.scopes == scopes && r.trailing_failures == 0));
            if w.is_empty() {
                watched.remove(&key);
            }
        }
        summary.reporters = Some(listed);
    }
    Some(summary)
}

/// The hash an endpoint's interval is kept under (a merging summarizer's: without the gateway).
fn key_of(pool: &str, endpoint: &str, gateway: Option<&str>) -> u64 {
    match gateway {
        Some(g) => Fnv64::new().parts(&[pool.as_bytes(), endpoint.as_bytes(), g.as_bytes()]),
        None => Fnv64::new().parts(&[pool.as_bytes(), endpoint.as_bytes()]),
    }
    .finish()
}

/// A reporter's scopes as a summary names them, compared with those kept without building
/// them (a gateway's summary names its gateway only: `gateway=g1`).
#[derive(Clone, Copy)]
enum Scopes<'a> {
    /// A merged summary's reporter.
    Listed(&'a [String]),
    /// A gateway's own summary: its gateway.
    Gateway(&'a str),
}

impl Scopes<'_> {
    fn are(self, kept: &[String]) -> bool {
        match self {
            Scopes::Listed(listed) => listed == kept,
            Scopes::Gateway(g) => matches!(kept, [only] if crate::scope::is_named(only, "gateway", g)),
        }
    }

    fn to_vec(self) -> Vec<String> {
        match self {
            Scopes::Listed(listed) => listed.to_vec(),
            Scopes::Gateway(g) => vec![crate::scope::name("gateway", g)],
        }
    }
}

/// Sums calls into [`CallSummary`] records (see the module docs). Pure: the caller gives the
/// time and sends what comes out, in order.
pub struct Summarizer {
    cfg: SummaryConfig,
    /// A prefix that keeps this summarizer's ids apart from every other's.
    instance: String,
    next: u64,
    /// Keyed by an FNV hash of the names: hashed again by Fx, not SipHash (hashing the key was
    /// 5 % of a merger's instructions).
    open: FxHashMap<u64, Open>,
    /// The earliest end of an open interval: `flush_due` looks at the endpoints only then (the
    /// reporter calls it on every turn of its thread).
    next_due: Micros,
    /// Calls reported one by one (or, added together, in a summary of their own) because
    /// `max_open` endpoints were open, or because two endpoints' names hashed alike.
    pub overflowed: u64,
    /// A merge stage's summarizer: the gateway its summaries carry. It keeps one interval per
    /// endpoint whatever gateway a call or a summary came from.
    merged_as: Option<String>,
    /// A merge stage's: per endpoint, the reporters (their scopes) whose calls its summaries
    /// list — those that failed, until a summary lists them with no failure at the end.
    /// Kept across intervals, at most [`MAX_WATCHED`] per endpoint.
    watched: FxHashMap<u64, Vec<Vec<String>>>,
}

impl Summarizer {
    /// `instance` tells this summarizer's summary ids from others' (e.g. a random number per
    /// process); ids are `s-{instance}-{n}`.
    pub fn new(cfg: SummaryConfig, instance: &str) -> Summarizer {
        Summarizer {
            cfg,
            instance: instance.to_owned(),
            next: 0,
            open: FxHashMap::default(),
            next_due: Micros::MAX,
            overflowed: 0,
            merged_as: None,
            watched: FxHashMap::default(),
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
    /// held goes to `out` first). Its open summary is also sent first when calls that ended in
    /// `[from, to]` would stretch it beyond [`MAX_MERGED_SPAN_US`].
    fn slot(
        &mut self,
        key: u64,
        names: [&str; 3],
        (from, to): (Micros, Micros),
        now: Micros,
        out: &mut Vec<Signal>,
    ) -> &mut Open {
        let interval = self.cfg.interval_us;
        let gateway = self.merged_as.as_deref().unwrap_or(names[2]);
        let merging = self.merged_as.is_some();
        let o = self.open.entry(key).or_insert_with(|| Open {
            names: [names[0].to_owned(), names[1].to_owned(), gateway.to_owned()],
            interval_start: now,
            failures_sent: 0,
            summary: None,
            reporters: Vec::new(),
            latency: HistogramSum::default(),
            ttft: HistogramSum::default(),
        });
        if now >= o.interval_start.saturating_add(interval) {
            // A new interval: what is open goes first.
            out.extend(take_summary(o, merging, &mut self.watched, key).map(Signal::Summary));
            o.interval_start = now;
            o.failures_sent = 0;
        }
        let too_long = |s: &CallSummary| {
            s.calls.total() > 0 && s.ended_at.max(to).saturating_sub(s.started_at.min(from)) > MAX_MERGED_SPAN_US
        };
        if o.summary.as_ref().is_some_and(too_long) {
            out.extend(take_summary(o, merging, &mut self.watched, key).map(Signal::Summary));
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
        let span = (summary.started_at, summary.ended_at);
        let o = match self.slot(key, names, span, now, out) {
            o if o.summary.is_some() => o,
            _ => self.start_summary(key, now),
        };
        if let Some(open) = o.summary.as_mut() {
            if open.append_all_but_histograms(&summary) {
                o.latency.add(&summary.latency, &mut open.latency);
                o.ttft.add(&summary.ttft, &mut open.ttft);
            }
        }
        // Whose calls they were: the gateway of a gateway's summary, the reporters of a merged one.
        let count = |n: i64| n.max(0);
        match &summary.reporters {
            Some(listed) => {
                for r in listed {
                    let (calls, failures, trailing) = (count(r.calls), count(r.failures), count(r.trailing_failures));
                    self.reported(key, Scopes::Listed(&r.scopes), calls, failures, trailing);
                }
            }
            None if summary.gateway.is_empty() => {}
            // Nothing to list (no failure, nobody watched at this endpoint): what `reported`
            // would conclude.
            None if summary.failures() <= 0 && !self.watched.contains_key(&key) => {}
            None => {
                let failures = count(summary.failures());
                self.reported(
                    key,
                    Scopes::Gateway(&summary.gateway),
                    failures.saturating_add(count(summary.calls.success)),
                    failures,
                    i64::from(summary.trailing_failures.max(0)),
                );
            }
        }
    }

    /// A merging summarizer's: `calls` of a reporter of `scopes` summed into the endpoint's open
    /// summary, `failures` of them failing, `trailing` in a row at the end. A reporter that fails
    /// is watched; a watched reporter's calls are listed.
    fn reported(&mut self, key: u64, scopes: Scopes<'_>, calls: i64, failures: i64, trailing: i64) {
        let watched = self.watched.entry(key).or_default();
        let is_watched = watched.iter().any(|w| scopes.are(w));
        if !is_watched && failures > 0 && watched.len() < MAX_WATCHED {
            watched.push(scopes.to_vec());
        } else if !is_watched {
            if watched.is_empty() {
                self.watched.remove(&key);
            }
            return;
        }
        let Some(o) = self.open.get_mut(&key) else {
            return;
        };
        match o.reporters.iter_mut().find(|r| scopes.are(&r.scopes)) {
            Some(r) => r.add(calls, failures, trailing),
            None => {
                let mut r = ReporterCounts {
                    scopes: scopes.to_vec(),
                    ..ReporterCounts::default()
                };
                r.add(calls, failures, trailing);
                o.reporters.push(r);
            }
        }
    }

    /// A merging summarizer's: a failure of a reporter sent one by one (it carries its scopes):
    /// the reporter is watched, so that its calls after it are listed.
    fn watch(&mut self, key: u64, scopes: Vec<String>) {
        let watched = self.watched.entry(key).or_default();
        if !watched.contains(&scopes) && watched.len() < MAX_WATCHED {
            watched.push(scopes);
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
        let merging = self.merged_as.is_some();
        let hung = call.outcome == OutcomeClass::Success && call.ttft_us.is_some_and(|t| t > slow_call_us);
        // What the engine's scope book makes of the call (a 401 or 403 fails its credential).
        let failed = call.outcome.counts_as_failure() || hung || crate::scope::credential_refused(&call);
        let counted = failed || !call.outcome.is_neutral();
        let scopes = if merging {
            crate::scope::of_call(&call)
        } else {
            Vec::new()
        };
        let names = [call.pool.as_str(), call.endpoint.as_str(), call.gateway.as_str()];
        let end = call.occurred_at.saturating_add(call.latency_us.max(0));
        self.slot(key, names, (end, end), now, out);
        let o = self.open.get_mut(&key).expect("slot opened it");
        let mut n = n;
        if (call.outcome.is_failure() || hung) && o.failures_sent < cap {
            out.extend(take_summary(o, merging, &mut self.watched, key).map(Signal::Summary));
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
            if merging && failed && !scopes.is_empty() {
                // Sent with its scopes; the reporter's calls after it are listed.
                self.watch(key, scopes.clone());
            }
            if n == 0 {
                return;
            }
        }
        let o = self.open.get_mut(&key).expect("slot opened it");
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
        if merging && counted && !scopes.is_empty() {
            let n = i64::from(n);
            let f = if failed { n } else { 0 };
            self.reported(key, Scopes::Listed(&scopes), n, f, f);
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
        let merging = self.merged_as.is_some();
        let mut due: Vec<CallSummary> = Vec::new();
        let mut next_due = Micros::MAX;
        let watched = &mut self.watched;
        self.open.retain(|key, o| {
            let end = o.interval_start.saturating_add(interval);
            if now < end {
                next_due = next_due.min(end);
                return true;
            }
            due.extend(take_summary(o, merging, watched, *key));
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

    /// Histograms of random buckets, now and then far apart.
    fn random_histograms() -> impl proptest::strategy::Strategy<Value = Vec<Histogram>> {
        use proptest::prelude::*;
        let index = prop_oneof![8 => 0i32..1_200, 1 => 0i32..20_000];
        let histogram = proptest::collection::btree_map(index, 1i64..1_000, 0..40).prop_map(|b| Histogram {
            sum_us: b.values().sum::<i64>() * 7,
            buckets: b
                .into_iter()
                .map(|(index, count)| HistogramBucket { index, count })
                .collect(),
        });
        proptest::collection::vec(histogram, 0..30)
    }

    proptest::proptest! {
        /// Histograms added up in a sum and then merged into one are what merging them one by
        /// one into it gives, whatever their spans (those beyond a sum's go to it at once).
        #[test]
        fn a_histogram_sum_merges_as_merging_one_by_one(hs in random_histograms(), start in random_histograms()) {
            let start = start.into_iter().next().unwrap_or_default();
            let mut one_by_one = start.clone();
            for h in &hs {
                one_by_one.merge(h);
            }
            let (mut summed, mut sum) = (start, HistogramSum::default());
            for h in &hs {
                sum.add(h, &mut summed);
            }
            sum.take_into(&mut summed);
            proptest::prop_assert_eq!(&summed, &one_by_one);
            proptest::prop_assert_eq!(sum, HistogramSum::default());
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
        // Whose calls they were: every gateway failed, so each is listed with its calls in the
        // summary (not those sent one by one), most failures first; their runs ended.
        let listed = |s: &CallSummary| -> Vec<(String, i64, i64, i64)> {
            let r = s.reporters.as_ref().expect("a merged summary lists reporters");
            r.iter()
                .map(|r| (r.scopes.join(","), r.calls, r.failures, r.trailing_failures))
                .collect()
        };
        assert_eq!(listed(summaries[0]), [("gateway=gw-0".to_owned(), 100, 0, 0)]);
        assert_eq!(listed(summaries[1]), [("gateway=gw-1".to_owned(), 100, 0, 0)]);
        assert_eq!(
            listed(summaries[2]),
            [
                ("gateway=gw-3".to_owned(), 103, 3, 0),
                ("gateway=gw-2".to_owned(), 101, 1, 0)
            ]
        );
        assert!(merge.watched.is_empty(), "every run is over");
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

    /// A merging summarizer lists a reporter from its first failure until a summary shows its
    /// run over — across intervals (each merger transaction is one) — and no more than it may:
    /// 8 listed, 32 watched per endpoint, whatever the fleet.
    #[test]
    fn a_merging_summarizer_lists_a_failing_reporter_until_its_run_ends_and_stays_bounded() {
        let cfg = SummaryConfig {
            failure_cap: 0,
            ..SummaryConfig::default()
        };
        let mut merge = Summarizer::merging(cfg, "m", "merger");
        let mut out = Vec::new();
        let at = |g: &str, c: OutcomeClass, id: &str| {
            let mut call = CallOutcome::new(id.to_owned(), "p", "a", g, 1_000, c);
            call.attributes.insert("location".into(), "eu".into());
            call
        };
        let listed = |out: &[Signal]| -> Vec<(String, i64, i64, i64)> {
            let Some(Signal::Summary(s)) = out.last() else {
                panic!("{out:?}")
            };
            let r = s.reporters.as_ref().expect("a merged summary lists reporters");
            r.iter()
                .map(|r| (r.scopes.join(","), r.calls, r.failures, r.trailing_failures))
                .collect()
        };
        for i in 0..10 {
            merge.add(at("g2", OutcomeClass::Success, &format!("s{i}")), 1, &mut out);
        }
        merge.add(at("g1", OutcomeClass::Success, "a0"), 1, &mut out);
        merge.add(at("g1", OutcomeClass::Timeout, "a1"), 1, &mut out);
        merge.add(at("g1", OutcomeClass::Timeout, "a2"), 1, &mut out);
        merge.flush_all(&mut out);
        assert_eq!(out.len(), 1);
        // g1's success before its first failure is the summary's, not listed as g1's.
        assert_eq!(listed(&out), [("gateway=g1,location=eu".to_owned(), 2, 2, 2)]);
        // The next interval: g1's calls are listed until one passes; g2's are not.
        out.clear();
        merge.add(at("g2", OutcomeClass::Success, "s10"), 2, &mut out);
        merge.add(at("g1", OutcomeClass::Success, "a3"), 2, &mut out);
        merge.flush_all(&mut out);
        assert_eq!(listed(&out), [("gateway=g1,location=eu".to_owned(), 1, 0, 0)]);
        out.clear();
        merge.add(at("g1", OutcomeClass::Success, "a4"), 3, &mut out);
        merge.flush_all(&mut out);
        assert_eq!(listed(&out), [], "its run is over: g1 is not listed");
        // A 401 is its credential's failure (the engine's scope book counts it so).
        out.clear();
        let mut refused = at("g3", OutcomeClass::ClientError, "r1");
        refused.http_status = Some(401);
        merge.add(refused, 4, &mut out);
        merge.flush_all(&mut out);
        assert_eq!(listed(&out), [("gateway=g3,location=eu".to_owned(), 1, 1, 1)]);
        // A gateway's own summary is listed under its gateway.
        out.clear();
        let mut own = CallSummary::new("s-g4".into(), "p", "a", "g4", 5);
        own.add(&CallOutcome::new("x", "p", "a", "g4", 5, OutcomeClass::Timeout));
        own.add_times(&CallOutcome::new("y", "p", "a", "g4", 5, OutcomeClass::Success), 7);
        merge.add_summary(own, 5, &mut out);
        merge.flush_all(&mut out);
        assert_eq!(listed(&out), [("gateway=g4".to_owned(), 8, 1, 0)]);
        // Bounded: 100 gateways failing at once.
        out.clear();
        for g in 0..100 {
            for i in 0..=g % 3 {
                merge.add(
                    at(&format!("f{g}"), OutcomeClass::ServerError, &format!("x{g}-{i}")),
                    6,
                    &mut out,
                );
            }
        }
        merge.flush_all(&mut out);
        let l = listed(&out);
        assert_eq!(l.len(), MAX_SUMMARY_REPORTERS);
        assert!(l.iter().all(|(_, _, f, _)| *f == 3), "the most failures first: {l:?}");
        let key = key_of("p", "a", None);
        assert_eq!(merge.watched[&key].len(), MAX_WATCHED);
        for sig in &out {
            assert_eq!(crate::validate_signal(sig, Some(0)), Ok(()));
        }
    }

    /// A gateway whose clock is 90 s behind, and a backlog of ten minutes read at once: the
    /// merged summaries are cut by time, so none spans more than the bound (every one passes the
    /// processor's validation) and every call is still counted once.
    #[test]
    fn a_merging_summarizer_cuts_its_summaries_by_time() {
        let mut merge = Summarizer::merging(
            SummaryConfig {
                interval_us: Micros::MAX / 4,
                ..SummaryConfig::default()
            },
            "m",
            "merger",
        );
        let mut out = Vec::new();
        let t0 = 1_700_000_000_000_000;
        let mut calls = 0;
        // Six gateways send a summary of 40 calls every 250 ms for ten minutes; g6's clock is
        // 90 s behind. The merger reads it all in one interval (a backlog).
        for tick in 0..2_400i64 {
            for g in 1..=6 {
                let skew = if g == 6 { -90_000_000 } else { 0 };
                let at = t0 + tick * 250_000 + skew;
                let gw = format!("g{g}");
                let mut x = CallSummary::new(format!("s{g}-{tick}"), "p", "a", &gw, at);
                x.add_times(&CallOutcome::new("c", "p", "a", &gw, at, OutcomeClass::Success), 40);
                calls += 40;
                merge.add_summary(x, t0, &mut out);
            }
        }
        merge.flush_all(&mut out);
        let mut counted = 0;
        for sig in &out {
            let Signal::Summary(x) = sig else { panic!("{sig:?}") };
            assert!(
                x.ended_at - x.started_at <= MAX_MERGED_SPAN_US,
                "{} µs",
                x.ended_at - x.started_at
            );
            assert_eq!(crate::validate_signal(sig, Some(t0 + 600_000_000)), Ok(()));
            counted += x.calls.total();
        }
        assert_eq!(counted, calls);
        // Cut where a gateway's time jumps: about twice per round of the six, not per call.
        eprintln!("{} merged summaries for {} gateway summaries", out.len(), 2_400 * 6);
        assert!(out.len() <= 2 * 2_400 + 2, "{} summaries", out.len());
    }

    /// Late successes among fresh calls and failures (an exporter's retry queue, a clock
    /// behind): every summary a gateway's summarizer makes is one the processor takes, so late
    /// successes and late failures count alike.
    #[test]
    fn late_calls_among_fresh_ones_make_more_summaries_never_one_the_processor_refuses() {
        let mut sum = Summarizer::new(SummaryConfig::default(), "g");
        let mut out = Vec::new();
        let t0 = 1_700_000_000_000_000i64;
        let (mut ok, mut failed) = (0, 0);
        // 200 calls within 5 s, 1 in 10 failing; every third ended 70 s earlier (late).
        for i in 0..200i64 {
            let now = t0 + i * 25_000;
            let ended = if i % 3 == 0 { now - 70_000_000 } else { now };
            let class = if i % 10 == 0 {
                OutcomeClass::ServerError
            } else {
                OutcomeClass::Success
            };
            if class == OutcomeClass::Success {
                ok += 1;
            } else {
                failed += 1;
            }
            sum.add(
                CallOutcome::new(format!("c{i}"), "p", "a", "g", ended, class),
                now,
                &mut out,
            );
        }
        sum.flush_all(&mut out);
        let (mut got_ok, mut got_failed) = (0, 0);
        for sig in &out {
            assert_eq!(crate::validate_signal(sig, Some(t0 + 5_000_000)), Ok(()), "{sig:?}");
            match sig {
                Signal::Summary(x) => {
                    assert!(x.ended_at - x.started_at <= MAX_MERGED_SPAN_US);
                    got_ok += x.calls.success;
                    got_failed += x.calls.total() - x.calls.success;
                }
                Signal::Call(_) => got_failed += 1,
                other => panic!("{other:?}"),
            }
        }
        assert_eq!((got_ok, got_failed), (ok, failed), "every call counted once");
    }
}
