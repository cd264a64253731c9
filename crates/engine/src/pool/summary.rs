//! A call summary (`vitals_contracts::summary`): the calls a gateway summed, applied as runs.
//!
//! A summary holds the calls between two failures reported one by one (or every call beyond the
//! reporter's failure cap), so it is applied as at most six runs in the order the calls came:
//! 429s (a storm of them first, those in a row at the end last, a few scattered among many
//! calls to the window only), the leading failures (which continue a run begun
//! before), successes, the failures in the middle (between successes, at most the longest run
//! long), successes, the trailing failures. Each run moves the window, the counters and the score as
//! its calls would have one by one (the score in closed form, from the run's mean), then the
//! rules run once — at the summary's stream time, so a transition a call inside the run would
//! have made comes up to one summary interval later. Where the decisions can differ from the
//! calls' one by one:
//! - the order inside a run of failures of several classes, and where the longest run lay
//!   (its length counts, as if it came first);
//! - the score's path inside a run (a mean, not each call's TTFT): a score that crosses a
//!   threshold and comes back within one run crosses it one by one, not summed;
//! - first tokens: the ring of recent samples takes 16 values spread over the run's
//!   distribution (1 % error), not the last 16 in order;
//! - an endpoint out of rotation is decided by single calls: up to [`EXPAND_MAX`] of a run are
//!   applied one by one (with the run's mean latency and spread first tokens), the rest only
//!   recorded — of a run of failures, no more than were in a row (the middle failures lay among
//!   successes: the longest run the summary counts);
//! - beyond the reporter's failure cap (8 an interval, 32 a second at 250 ms), the order of
//!   failures among successes is lost but for the runs the summary counts (leading, longest,
//!   trailing): a rule that counts failures in a row while the endpoint is out of rotation (10 on
//!   probation) may fire where the calls one by one did not, or the other way. An endpoint out
//!   of rotation gets few calls (weight 0, or 0.01 on probation), so its failures seldom pass
//!   the cap; the property test (`tests/summaries.rs`) keeps a failing endpoint's under it;
//! - a transition made on a summary is made at its stream time, up to an interval after the
//!   call that decided it: a call that began before that time is stale evidence to the state
//!   it entered (begun before it), where one by one it may have been fresh, so a decision that
//!   follows (a failure while recovering) may wait for the next such call;
//! - a state held for less than one interval call by call may be passed over (the summary
//!   shows the interval at once): degraded on the way to an ejection that comes 100 ms later.
//!
//! Hung streams (a success whose first token came after `slow_call_ms`) are failures to the
//! summarizer: sent one by one up to the cap, and summed beyond it as timeouts in their place in
//! the runs, so that three in a row eject as they do one by one (before, a summary held them as
//! successes in its first-token histogram, applied here as a middle run of one timeout, and an
//! endpoint hanging 30 % of its streams stayed in rotation, degraded). The summarizer's threshold
//! is its `slow_call_us`, 10 s like the policy's default; a pool with another `slow_call_ms` still
//! has its summed first tokens over it taken for timeouts here, but not in the runs.
//!
//! Several gateways reporting one endpoint (the property test runs 1 and 4, at 250 ms and 2 s
//! intervals): each sends its failures at once and its successes up to an interval late.
//! - Failures of different gateways can look consecutive while the successes between them are
//!   on their way. The hard break and the consecutive-failure rule ask for a run that noise does
//!   not make at the endpoint's traffic (`endpoint::noise_run`: 4 from ~12 calls a second, 5
//!   from ~1,157), so that healthy endpoints failing 1 % are not ejected by such runs. A run
//!   that one gateway made (its own calls all failing, other gateways' successes between them
//!   held) reaches the engine as a run: real to that gateway, and made by noise as often as
//!   the fleet's own. The property test holds that every run-rule ejection of a noisy healthy
//!   endpoint on summaries is made one by one too, or is a run in one gateway's calls.
//! - The other way, a gateway's first failure of an outage follows its summary of the successes
//!   before it, which breaks the run the other gateways' failures began: a dead endpoint's run
//!   counts from the failures after the last of those summaries, a few calls later (tens of ms
//!   with 4 gateways at 100 calls a second; fleet-bench measures it at 500).
//! - A summary that reaches back past a state change holds calls from before it: its failures'
//!   place in time is taken from the gateway's own clock (the leading ones as old as the
//!   summary's first call, the middle ones half as old, the trailing ones new; a success as old
//!   as its place and the summary's longest call), so a call that began before an ejection or
//!   a readmission is stale evidence to it — a run of successes reaching back past it is no
//!   evidence at all, its first tokens being spread by rank and not by time — and a failure
//!   from before a readmission is not recorded in the fresh window of slow start.
//! - Failures of calls begun before a readmission arrive after it for as long as the fault's
//!   calls took (hung streams: 13 s), from every gateway at once and back to back while the
//!   successes between them wait: they are stale evidence, kept out of slow start's window and
//!   runs whether they come one by one or summed (before, ten of them in a row took a healed
//!   endpoint out again on probation, and a few next to its noise in slow start). A summed
//!   timeout carries no latency: it is taken to have begun `slow_call_ms` before it ended (the
//!   summarizer sums hung streams as timeouts), so in a slow start's first 10 s only the
//!   timeouts sent one by one (up to the cap, with their latency) can be fresh
//!   (`tests/gateways.rs`: 20 gateways, 30 % of streams hung for 20 s).
//! - Rules over the window (failure rate, peer comparison) read bucketed counts: where their
//!   statistic grazes its threshold, the failure that crosses it may be one a bucket (3 s)
//!   later in the other engine; runs at a fault that fails a share of calls are chance events
//!   read in different orders, so such an endpoint may be ejected first on a run by either
//!   engine, the other following on a run or on the window rules within 10 s.
//!
//! Latency: the order of a summary's calls is lost, and the latency EWMA's path through them is
//! what the outlier rule judges — one by one, at a few calls a second, one call 10× as slow
//! moves it past 3× the peers' median at once, and at hundreds the EWMA (~0.3 s of calls)
//! crosses by chance runs of slow calls. So a run of successes walks its latencies one by one
//! in an order of chance drawn from the summary's id (the same on every replay), the flag
//! judged at every step against the peers' median (which a summary does not move); beyond
//! 64 calls, in 64 steps each standing for several, with the mean and spread of theirs. Before, the
//! EWMA moved to the summary's mean: a 15 % tail at 10× (2.35× on average) stayed under 3×
//! at 2 s intervals and was never degraded, where one by one it is within seconds. Both are
//! chance now, each its own: the property test holds each degradation within 15 s of the
//! other's (the time within which the decisions degrade a tail), up to 200 calls a second —
//! busier, a 15 % tail grazes the threshold in both engines.

use super::{Checks, Outcome, PoolState, Source};
use crate::endpoint::{ttft_score, us, Run, RunKind, TTFT_SAMPLES};
use crate::window::counts_as_failure;
use crate::Decision;
use vitals_contracts::hash::fnv64;
use vitals_contracts::{CallSummary, HealthState, Histogram, OutcomeClass, Policy};

/// Calls of a run applied one by one while the endpoint is out of rotation: more than any
/// readmission rule counts (20 passes on probation), few enough to bound a summary's cost.
pub(crate) const EXPAND_MAX: u64 = 64;

/// A run planned from a summary.
struct Planned {
    kind: RunKind,
    /// How long before the summary's last call its first and last calls ended (the gateway's
    /// clock, a difference only): where a failure of the run lies in time, for the rules that
    /// take only fresh evidence (begun after the state it would change began).
    ages: (i64, i64),
    counts: Vec<(OutcomeClass, u64)>,
    failures: u32,
    successes: u32,
    hard: u32,
    rate_limited: u16,
}

impl Planned {
    fn calls(&self) -> u64 {
        self.counts.iter().map(|(_, n)| n).sum()
    }
}

fn sat32(n: u64) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

/// Take the first `n` calls of `counts` (in their order) out into a new list.
fn split_off_front(counts: &mut Vec<(OutcomeClass, u64)>, mut n: u64) -> Vec<(OutcomeClass, u64)> {
    let mut front = Vec::new();
    for (c, k) in counts.iter_mut() {
        if n == 0 {
            break;
        }
        let take = (*k).min(n);
        front.push((*c, take));
        *k -= take;
        n -= take;
    }
    counts.retain(|(_, k)| *k > 0);
    front
}

/// The endpoint's runs before a summary: where the summary's own runs continue from.
#[derive(Clone, Copy)]
struct Before {
    failures: u32,
    successes: u32,
    hard: u32,
    limited: u16,
}

/// A summary's calls as runs in the order they came (as well as a summary can tell), and the
/// 429s scattered among them, which go to the window only.
struct Plan {
    runs: Vec<Planned>,
    scattered: u64,
}

/// A summary's successes, and its failures by class: a success whose first token took longer
/// than slow_call_ms is a timeout, as one alone.
fn outcomes(s: &CallSummary, policy: &Policy) -> (u64, Vec<(OutcomeClass, u64)>) {
    let slow_us = us(policy.slow_call_ms) as f64;
    let slow: u64 = s
        .ttft
        .buckets
        .iter()
        .filter(|b| Histogram::value(b.index) > slow_us)
        .map(|b| b.count.max(0) as u64)
        .sum();
    let successes = (s.calls.success.max(0) as u64).saturating_sub(slow);
    let mut failures: Vec<(OutcomeClass, u64)> = s
        .calls
        .iter()
        .filter(|(c, _)| counts_as_failure(*c))
        .map(|(c, n)| (c, n.max(0) as u64))
        .collect();
    if slow > 0 {
        match failures.iter_mut().find(|(c, _)| *c == OutcomeClass::Timeout) {
            Some((_, n)) => *n += slow,
            None => failures.push((OutcomeClass::Timeout, slow)),
        }
    }
    (successes, failures)
}

fn limited_run(n: u64, consecutive: u64, ages: (i64, i64)) -> Planned {
    Planned {
        kind: RunKind::RateLimited,
        ages,
        counts: vec![(OutcomeClass::RateLimited, n)],
        failures: 0,
        successes: 0,
        hard: 0,
        rate_limited: u16::try_from(consecutive).unwrap_or(u16::MAX),
    }
}

fn failures_run(counts: Vec<(OutcomeClass, u64)>, run: u64, hard: u64, ages: (i64, i64)) -> Planned {
    Planned {
        kind: RunKind::Failures,
        ages,
        counts,
        failures: sat32(run),
        successes: 0,
        hard: sat32(hard),
        rate_limited: 0,
    }
}

fn successes_run(n: u64, run: u64, ages: (i64, i64)) -> Planned {
    Planned {
        kind: RunKind::Successes,
        ages,
        counts: vec![(OutcomeClass::Success, n)],
        failures: 0,
        successes: sat32(run),
        hard: 0,
        rate_limited: 0,
    }
}

/// The runs of a summary (pure: the summary, the policy and the runs before it).
fn plan(s: &CallSummary, policy: &Policy, before: Before) -> Plan {
    let (successes, mut failures) = outcomes(s, policy);
    let f: u64 = failures.iter().map(|(_, n)| n).sum();
    let limited = s.calls.rate_limited.max(0) as u64;
    let trailing = (s.trailing_failures.max(0) as u64).min(f);
    let others = successes + f;
    // The summary's calls ended over `span`: the first at its start, the last at its end.
    let span = s.ended_at.saturating_sub(s.started_at).max(0);
    let mut runs = Vec::new();
    // 429s: those in a row at the end are a run there; a summary of 429s alone is one run,
    // continuing the last. The others came among the other calls: a storm when they make
    // half the cooldown's share of the summary or more (a rate at which the cooldown's
    // share of the last outcomes comes often, one by one), applied as a run before the rest
    // for the cooldown to judge; fewer are scattered (0.5 % of a busy endpoint's calls) and
    // go to the window only — as a block they made runs and shares the calls never had.
    let trailing_limited = if others == 0 {
        0
    } else {
        (s.trailing_rate_limited.max(0) as u64).min(limited)
    };
    let among = limited - trailing_limited;
    let mut scattered = 0;
    if among > 0 {
        if others == 0 {
            runs.push(limited_run(among, u64::from(before.limited) + among, (span, 0)));
        } else if among as f64 >= policy.rate_limited_share / 2.0 * (limited + others) as f64 {
            runs.push(limited_run(among, among, (span, span)));
        } else {
            scattered = among;
        }
    }
    if successes == 0 {
        if f > 0 {
            let hard = if s.trailing_hard.max(0) as u64 == f {
                u64::from(before.hard) + f
            } else {
                s.longest_hard_run.max(s.trailing_hard).max(0) as u64
            };
            runs.push(failures_run(failures, u64::from(before.failures) + f, hard, (span, 0)));
        }
    } else {
        runs.extend(among_successes(s, &mut failures, successes, f, trailing, before, span));
    }
    if trailing_limited > 0 {
        runs.push(limited_run(trailing_limited, trailing_limited, (0, 0)));
    }
    Plan { runs, scattered }
}

/// The runs of a summary with successes: leading failures continue a run begun before the
/// summary; a success follows them, and the failures in the middle lie between successes; the
/// trailing run ends it.
fn among_successes(
    s: &CallSummary,
    failures: &mut Vec<(OutcomeClass, u64)>,
    successes: u64,
    f: u64,
    trailing: u64,
    before: Before,
    span: i64,
) -> Vec<Planned> {
    let mut runs = Vec::new();
    let longest = s.longest_failure_run.max(0) as u64;
    let leading = (s.leading_failures.max(0) as u64).min(f - trailing);
    let middle = f - trailing - leading;
    let longest_hard = s.longest_hard_run.max(0) as u64;
    if leading > 0 {
        let front = split_off_front(failures, leading);
        // At the summary's start: as old as its first call (a summary that reaches back past a
        // readmission holds failures from before it).
        runs.push(failures_run(
            front,
            u64::from(before.failures) + leading,
            u64::from(before.hard) + leading.min(longest_hard),
            (span, span),
        ));
    }
    // The successes after the middle failures: those at the end, or half.
    let after = match (middle, trailing) {
        (0, _) => successes,
        (_, 0) => (s.trailing_successes.max(1) as u64).min(successes),
        _ => (successes / 2).max(1),
    };
    if middle > 0 && successes > after {
        runs.push(successes_run(successes - after, successes - after, (span, span / 2)));
    }
    if middle > 0 {
        let front = split_off_front(failures, middle);
        runs.push(failures_run(
            front,
            middle.min(longest.max(1)),
            middle.min(longest_hard),
            (span / 2, span / 2),
        ));
    }
    let run = match (f, trailing) {
        (0, _) => u64::from(before.successes) + successes,
        _ => after,
    };
    let (n, ages) = if middle > 0 && successes > after {
        (after, (span / 2, 0))
    } else {
        (successes, (span, 0))
    };
    runs.push(successes_run(n, run, ages));
    if trailing > 0 {
        let hard = (s.trailing_hard.max(0) as u64).min(trailing);
        runs.push(failures_run(std::mem::take(failures), trailing, hard, (0, 0)));
    }
    runs
}

impl PoolState {
    pub(super) fn summary(&mut self, s: &CallSummary, out: &mut Vec<Decision>) {
        let now = self.now;
        if !self.endpoints.contains_key(&s.endpoint) {
            self.tracker(&s.endpoint);
        }
        let policy = &self.policy;
        let t = self.endpoints.get_mut(&s.endpoint).expect("created above");
        // 4xx and cancelled calls: the window only, as one by one.
        for c in [OutcomeClass::ClientError, OutcomeClass::Cancelled] {
            t.record_neutral(now, policy, c, s.calls.get(c).max(0) as u64);
        }
        let before = Before {
            failures: t.consecutive_failures(),
            successes: t.consecutive_successes(),
            hard: t.consecutive_hard(),
            limited: t.consecutive_rate_limited(),
        };
        let Plan { runs, scattered } = plan(s, policy, before);
        if scattered > 0 {
            t.record_neutral(now, policy, OutcomeClass::RateLimited, scattered);
            if let Some(ms) = s.max_retry_after_ms {
                t.note_retry_after(ms);
            }
        }
        for run in runs {
            self.apply_run(s, run, out);
        }
    }

    fn in_rotation(&self, endpoint: &str) -> bool {
        matches!(
            self.endpoints[endpoint].state(),
            HealthState::Healthy | HealthState::Suspect | HealthState::Degraded
        )
    }

    /// Apply one run: one by one while the endpoint is out of rotation (up to [`EXPAND_MAX`]
    /// calls), then the rest at once and the rules once.
    fn apply_run(&mut self, s: &CallSummary, mut run: Planned, out: &mut Vec<Decision>) {
        if self.stale_run(s, &run) {
            return;
        }
        self.run_one_by_one(s, &mut run, out);
        if run.calls() > 0 {
            self.record_run_whole(s, run, out);
        }
    }

    /// Whether a run of failures is stale: it ended before the endpoint was readmitted.
    fn stale_run(&self, s: &CallSummary, run: &Planned) -> bool {
        // Failures that ended before the endpoint was readmitted (a summary reaching back past
        // it, from a gateway that sent it later than the one whose calls readmitted it): one by
        // one they would have come before the readmission, whose fresh start forgot them.
        // A summed timeout began at least `slow_call_ms` before it ended: the summarizer sums
        // hung streams as timeouts (13 s long, say), which go on ending for that long after a
        // fault of them ended; a gateway's own timeout took long too.
        // A run is stale as soon as it reaches back before the readmission (its first call
        // does): its ages count from the summary's last call, and the summary is sent up to an
        // interval after that (when its interval ends), so the newest of a run of failures
        // may have ended before a readmission that came before the summary (a gateway's summed
        // connect errors of a fault arriving after another's call had readmitted it). Fresh
        // failures are not lost: the summed ones of an interval are those beyond the first
        // eight, which the gateway sent one by one as they came.
        let timeout_us = us(self.policy.slow_call_ms);
        let took = |c: OutcomeClass| if c == OutcomeClass::Timeout { timeout_us } else { 0 };
        let t = &self.endpoints[&s.endpoint];
        let began = |ages: i64, c: OutcomeClass| self.now.saturating_sub(ages.saturating_add(took(c)));
        run.kind != RunKind::Successes
            && t.state() == HealthState::Recovering
            && run.counts.iter().all(|(c, _)| began(run.ages.0, *c) < t.since())
    }

    /// The first calls of a run one by one, as far as they go so (see below); the rest stay in
    /// `run`.
    fn run_one_by_one(&mut self, s: &CallSummary, run: &mut Planned, out: &mut Vec<Decision>) {
        let ep = s.endpoint.as_str();
        let success = run.kind == RunKind::Successes;
        let timeout_us = us(self.policy.slow_call_ms);
        let took = |c: OutcomeClass| if c == OutcomeClass::Timeout { timeout_us } else { 0 };
        // Out of rotation a call of a run is fresh evidence only if it began after the ejection
        // or the readmission: it began as long before the summary's stream time as its place
        // in the summary and (a success) the summary's longest call say — its first tokens are
        // spread by rank, not time, and the slow ones of a fault may be the last spread, so a
        // run that reaches back past the state change is no evidence (the next summary's is).
        let longest = if success {
            s.latency.quantile(1.0).unwrap_or(0.0).round() as i64
        } else {
            0
        };
        let spread: Vec<i64> = if success {
            s.ttft
                .spread(TTFT_SAMPLES)
                .into_iter()
                .map(|v| v.round() as i64)
                .collect()
        } else {
            Vec::new()
        };
        let mean_latency = s.latency.mean_us().unwrap_or(0.0);
        let mut expanded = 0u64;
        // A failure's age in the summary, from the first call's to the last's: its start on
        // the engine's clock is the summary's stream time less it.
        let total = run.calls().max(1);
        let age = |k: u64| run.ages.0 + (run.ages.1 - run.ages.0) * k.min(total - 1) as i64 / (total - 1).max(1) as i64;
        // The first call of a run comes alone, as do those of an endpoint out of rotation: a
        // rule that resets the endpoint on the first success after failures (the end of a
        // suspected shared outage, say) then sees the rest of the run after its reset.
        // A run of failures goes one by one only as far as its failures were in a row: those in
        // the middle of a summary lay among its successes, the longest run of them as long as
        // the summary counts (in a row, 27 failures summed among 2,359 successes took a healed
        // endpoint out again on probation).
        let one_by_one = match run.kind {
            RunKind::Failures => u64::from(run.failures).clamp(1, EXPAND_MAX),
            _ => EXPAND_MAX,
        };
        while run.calls() > 0 && (expanded == 0 || !self.in_rotation(ep)) && expanded < one_by_one {
            let class = split_off_front(&mut run.counts, 1)[0].0;
            let o = Outcome {
                id: &s.summary_id,
                endpoint: ep,
                source: Source::Call,
                class,
                latency_us: if success { mean_latency.round() as i64 } else { 0 },
                ttft_us: match expanded {
                    0 => s.ttft.quantile(0.5).map(|v| v.round() as i64),
                    k => (!spread.is_empty()).then(|| spread[k as usize % spread.len()]),
                },
                retry_after_ms: s.max_retry_after_ms.filter(|_| class == OutcomeClass::RateLimited),
                reports_dependencies: false,
                timed: true,
                began_before: Some(age(expanded).saturating_add(longest).saturating_add(took(class))),
            };
            self.outcome(o, out);
            expanded += 1;
        }
    }

    /// The rest of a run, recorded as one: the window, the score, the latencies walked, the
    /// peers compared; then the rules decide on it.
    fn record_run_whole(&mut self, s: &CallSummary, run: Planned, out: &mut Vec<Decision>) {
        let ep = s.endpoint.as_str();
        let success = run.kind == RunKind::Successes;
        let n = run.calls();
        let now = self.now;
        let policy = &self.policy;
        let ttft_score = (success && !s.ttft.is_empty()).then(|| {
            let streamed = s.ttft.count().max(1) as f64;
            let scored: f64 = s
                .ttft
                .iter()
                .map(|(v, k)| ttft_score(v / 1000.0, policy) * k as f64)
                .sum();
            // Successes that did not stream score 100, as one alone.
            let plain = (s.calls.success as f64 - streamed).max(0.0);
            (scored + 100.0 * plain) / (streamed + plain)
        });
        let ttft: Vec<i64> = if success {
            s.ttft
                .spread(TTFT_SAMPLES.min(n as usize))
                .into_iter()
                .map(|v| v.round() as i64)
                .collect()
        } else {
            Vec::new()
        };
        // The run's latencies one by one, in an order of chance that replays the same (see
        // `in_some_order`), judged against the peers as the calls' would be.
        let latency_median = (success && !s.latency.is_empty())
            .then(|| self.peer_median(ep, true, self.policy.latency_outlier_min_peers as usize))
            .flatten();
        let mut latencies = std::mem::take(&mut self.scratch.0);
        let mut calls_per_latency = 1;
        if success {
            calls_per_latency = in_some_order(&s.latency, n, fnv64(s.summary_id.as_bytes()) ^ n, &mut latencies);
        }
        let policy = &self.policy;
        let t = self.endpoints.get_mut(ep).expect("known endpoint");
        let totals = t.record_run(
            now,
            policy,
            &Run {
                kind: run.kind,
                counts: &run.counts,
                failures: run.failures,
                successes: run.successes,
                hard: run.hard,
                rate_limited: run.rate_limited,
                ttft: &ttft,
                ttft_score,
            },
            &s.summary_id,
        );
        let mut check_ttft = None;
        let class = match run.kind {
            RunKind::Successes => {
                if let Some(flag) = t.walk_latencies(&latencies, calls_per_latency, latency_median, policy) {
                    t.set_latency_outlier(flag, now);
                }
                check_ttft = s
                    .ttft
                    .quantile(0.5)
                    .filter(|v| t.ttft_outlier() || *v > policy.ttft_max_ms * 1000.0)
                    .map(|v| v.round() as i64);
                OutcomeClass::Success
            }
            RunKind::RateLimited => {
                if let Some(ms) = s.max_retry_after_ms {
                    t.note_retry_after(ms);
                }
                OutcomeClass::RateLimited
            }
            RunKind::Failures => run.counts[0].0,
        };
        self.scratch.0 = latencies;
        // Out of rotation the rest of a run is recorded and compared with the peers (an outlier
        // flag must not outlive the fault), but only single calls decide (`decide` without one).
        let checks = Checks {
            latency: false,
            ttft: check_ttft,
            failures: run.kind == RunKind::Failures || t.failure_outlier(),
        };
        self.decide(ep, &s.summary_id, None, class, false, checks, totals, out);
    }
}

/// The most steps a run's latencies are walked in (`in_some_order`): a summary costs at most
/// this many however many calls it sums. At 250 ms intervals an endpoint's summary holds about
/// one memory of the EWMA (~0.3 s of calls at any traffic beyond ~11 calls a second), at 2 s
/// about seven: 64 steps put 9 to 70 in each, enough for its path.
const WALK_MAX: u64 = 64;

/// `n` of the values in `h`, in an order of chance drawn from `seed` (splitmix64), into `into`;
/// returns how many calls each stands for. The order in which a summary's calls came is lost,
/// and the latency EWMA's path through them — what the outlier rule judges, a 10× call moving
/// it at once where calls are few — is that of calls in random order. A summary of up to
/// [`WALK_MAX`] calls is walked call by call (a partial Fisher–Yates shuffle of them); beyond,
/// each of up to `WALK_MAX` steps stands for `m` calls, and its value is the mean of `m` calls
/// drawn at random — one value drawn (with replacement), its distance from the mean shrunk by
/// √m, which gives the mean and the spread of such a mean. The same summary gives the same
/// order on every replay.
fn in_some_order(h: &Histogram, n: u64, seed: u64, into: &mut Vec<f64>) -> u64 {
    into.clear();
    let mut state = seed;
    let mut next = || {
        state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    };
    let count = u64::try_from(h.count()).unwrap_or(0);
    if count == 0 || n == 0 {
        return 1;
    }
    if count <= WALK_MAX {
        for (v, k) in h.iter() {
            into.extend(std::iter::repeat_n(v, usize::try_from(k).unwrap_or(0)));
        }
        let len = into.len();
        let take = usize::try_from(n).unwrap_or(usize::MAX).min(len);
        for i in 0..take {
            let j = i + (next() % (len - i) as u64) as usize;
            into.swap(i, j);
        }
        into.truncate(take);
        return 1;
    }
    let m = n.div_ceil(WALK_MAX);
    let mean = h.mean_us().unwrap_or(0.0);
    let shrink = 1.0 / (m as f64).sqrt();
    for _ in 0..n / m {
        let mut rank = next() % count;
        let v = h
            .iter()
            .find(|(_, k)| {
                let k = u64::try_from(*k).unwrap_or(0);
                let here = rank < k;
                rank = rank.saturating_sub(k);
                here
            })
            .map_or(mean, |(v, _)| v);
        into.push(mean + (v - mean) * shrink);
    }
    m
}

#[cfg(test)]
mod tests {
    use super::*;

    fn histogram(values: &[(i64, i64)]) -> Histogram {
        let mut h = Histogram::default();
        for (v, n) in values {
            h.record_times(*v, *n);
        }
        h
    }

    #[test]
    fn a_few_calls_are_walked_one_by_one_in_an_order_that_replays() {
        let h = histogram(&[(100_000, 50), (1_000_000, 10)]);
        let mut a = Vec::new();
        assert_eq!(in_some_order(&h, 60, 7, &mut a), 1);
        // Every call once, in an order that is not the histogram's...
        let mut sorted = a.clone();
        sorted.sort_by(f64::total_cmp);
        let all: Vec<f64> = h.iter().flat_map(|(v, k)| std::iter::repeat_n(v, k as usize)).collect();
        assert_eq!(sorted, all);
        assert_ne!(a, all);
        // ...the same from the same summary, another from another.
        let mut b = Vec::new();
        in_some_order(&h, 60, 7, &mut b);
        assert_eq!(a, b);
        in_some_order(&h, 60, 8, &mut b);
        assert_ne!(a, b);
        // A run of part of the summary's successes takes that many of them.
        assert_eq!(in_some_order(&h, 30, 7, &mut b), 1);
        assert_eq!(b.len(), 30);
    }

    #[test]
    fn many_calls_are_walked_in_steps_with_the_mean_and_spread_of_theirs() {
        let h = histogram(&[(100_000, 85_000), (1_000_000, 15_000)]);
        let mut all = Vec::new();
        let mut v = Vec::new();
        for seed in 0..32 {
            assert_eq!(in_some_order(&h, 100_000, seed, &mut v), 1_563);
            assert_eq!(v.len(), 63);
            all.extend_from_slice(&v);
        }
        let mean = all.iter().sum::<f64>() / all.len() as f64;
        let want = h.mean_us().unwrap();
        // The mean of ~2,000 steps is the calls' to ~1 %; the spread of a step is that of a
        // mean of 1,563 calls (σ/√1563: ~8 ms here), not a call's (~321 ms).
        assert!((mean - want).abs() < 0.01 * want, "{mean} vs {want}");
        let sd = (all.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / all.len() as f64).sqrt();
        let want_sd = (0.85f64 * 0.15).sqrt() * 900_000.0 / 1_563f64.sqrt();
        assert!((sd - want_sd).abs() < 0.1 * want_sd, "{sd} vs {want_sd}");
    }
}
