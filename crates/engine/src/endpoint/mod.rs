//! Per-endpoint state: the window, the EWMA score, consecutive counters, isolation and the
//! conditions that the pool's rules turn into transitions.

mod phase;
mod stored;

use crate::window::{counts_as_failure, Rate, Totals, Window};
use phase::{Cooldown, Isolation, Phase, Probation, SlowStart};
pub(crate) use phase::{Hold, InRotation};
use serde::{Deserialize, Serialize};
use vitals_contracts::hash::Fnv64;
use vitals_contracts::{Evidence, HealthState, Micros, OutcomeClass, OverrideAction, Policy};

/// Number of recent TTFT samples kept for the percentiles in the evidence.
pub const TTFT_SAMPLES: usize = 16;
/// Most failing-signal ids kept as the trigger of a transition.
pub const MAX_TRIGGERS: usize = 5;
/// Latency samples an endpoint needs before it is compared with its peers.
pub const LATENCY_MIN_SAMPLES: u32 = 5;
/// Passing outcomes in a row that end a first probation for errors: a fault that fails 15 % of
/// calls passes 20 in a row 4 % of the time. Each probation after an ejection that followed a
/// probation needs 20 more. (Slow first tokens are not a matter of chance: the policy's
/// `consecutive_successes` fast ones end a probation for first tokens.)
pub const PROBATION_PASSES: u16 = 20;

/// Passing outcomes in a row on probation after which its weight starts to grow (× 2 for each
/// time it grew and fell back in this probation, up to × 8). A fault that fails 15 % of calls
/// passes 20 in a row 3.9 % of the time and 40 0.15 %. The evidence on probation is mostly the
/// prober's, at its fast interval (1 s): a healed endpoint starts to grow ~19 s after its fault
/// and is at full weight ~10 s later. Tuned on the scorecard with the prober's cadence in the
/// loop (20 seeds): 8 passes and × 4 (tuned when probes came every 5 s) grew it at every other
/// run of luck during a fault and then asked 32 passes of a healed endpoint (full weight 42 s
/// after 15 % drops); 12 or 16 grew a five-minute fault's weight more often (8 transitions in
/// the worst run); 24 gave less back. Without a prober, calls alone at the probation weight
/// (0.07 a second into a pool of four at 5 each) take ~5 minutes to pass 20.
pub const PROBATION_GROW_PASSES: u16 = 20;
/// How long the weight of an endpoint on probation takes to grow from the probation weight to
/// full, while its outcomes go on passing (the router's ramp, as in slow start): shorter than
/// slow start's, as 20 passes in a row are the evidence a ramp's calls would bring (20 s gave
/// back 5 endpoint-seconds less after each fault, for nothing the tables showed).
pub const PROBATION_RAMP_MS: i64 = 10000;

/// Passes in a row on probation that grow its weight however fast they came, when they span
/// [`PROBATION_SLOW_SPAN_MS`]: evidence that comes slowly (calls alone at the probation weight,
/// no prober: 0.07 a second into a pool of four at 5 each) gives a fault few runs to be lucky
/// in, so a shorter run suffices — 8 over a minute, ~2 minutes of such calls, not the ~5 that
/// 20 take. At a prober's 1 s the count decides: a run spans a minute only after 60 passes.
pub const PROBATION_SLOW_PASSES: u16 = 8;
/// The span of [`PROBATION_SLOW_PASSES`] that grows the weight.
pub const PROBATION_SLOW_SPAN_MS: i64 = 60_000;

/// What a growth needs after `falls` growths fell back, each × 2 for each (up to × 8): passes
/// in a row, or fewer passes and the ms they must span.
fn grow_needs(falls: u8) -> (u16, u16, i64) {
    let k = falls.min(3);
    (
        PROBATION_GROW_PASSES << k,
        PROBATION_SLOW_PASSES << k,
        PROBATION_SLOW_SPAN_MS << k,
    )
}

/// The weight of an endpoint on probation for `dim`: a trickle of real calls that keeps the
/// evidence coming. A tenth of the slow-start weight when its calls may fail (a failed call
/// costs its user an error, and probes see errors too); half of it for slow first tokens (a
/// slow call costs only latency, and only real calls can show the first tokens fast again, so
/// they must come often enough even at a gateway's modest rate).
pub fn probation_weight(policy: &Policy, dim: Option<Dimension>) -> f64 {
    match dim {
        Some(Dimension::Ttft) => policy.slow_start_weight / 2.0,
        _ => policy.slow_start_weight / 10.0,
    }
}

/// Outcomes over which a share of 429s starts a cooldown (at most 16).
const LIMITED_HISTORY: u32 = 16;

/// What an ejection was for: the kind of evidence that can show the fault is gone.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Dimension {
    /// Failed calls or probes: any passing call or probe shows them gone.
    Errors,
    /// A share of calls failing (the failure rate, or a rate far above the peers'), not all of
    /// them: a passing probe or call is weak evidence, so it readmits only on probation.
    ErrorRate,
    /// Slow first tokens: only an outcome with a first token (a call, a synthetic completion)
    /// shows them gone; a health-route probe readmits on probation once the isolation is over.
    Ttft,
    /// Heartbeats stopped: only a heartbeat shows the endpoint back.
    Heartbeat,
    /// A critical dependency is down: only a probe reporting it up shows it back.
    Dependency,
    /// Rate limited: a cooldown, over when its time is.
    RateLimit,
}

impl Dimension {
    pub fn as_str(self) -> &'static str {
        match self {
            Dimension::Errors => "errors",
            Dimension::ErrorRate => "error_rate",
            Dimension::Ttft => "ttft",
            Dimension::Heartbeat => "heartbeat",
            Dimension::Dependency => "dependency",
            Dimension::RateLimit => "rate_limit",
        }
    }
}

/// A state an endpoint enters, with what entering it takes ([`Tracker::enter`]): what a rule
/// decides, typed, so that the state follows from it ([`Entry::state`]).
#[derive(Debug, Clone, Copy)]
pub(crate) enum Entry {
    /// Ejected: a new isolation (longer for a flapping endpoint), for what it is out for (None:
    /// what it was out for before, else errors).
    Eject(Option<Dimension>),
    /// The trial after an isolation failed: the same isolation again, jittered by this hash of
    /// the pool's and the endpoint's names.
    TrialFailed(Fnv64),
    /// 429s: a cooldown of this many ms, no backoff.
    Cooldown(i64),
    /// Held by an operator.
    Operator(Hold),
    /// Back in rotation: readmitted at slow-start weight (or a cooldown over), or on probation
    /// (at the probation weight, held: real calls decide).
    Recovering { probation: bool },
    /// On probation still: its weight starts to grow (true), or falls back to the probation
    /// weight and is held again (false). The count of passes goes on.
    Probation { growing: bool },
    /// In rotation: nothing of an isolation is left.
    InRotation(InRotation),
}

impl Entry {
    /// The state the entry publishes.
    pub fn state(&self) -> HealthState {
        match self {
            Entry::Eject(_) | Entry::TrialFailed(_) | Entry::Cooldown(_) => HealthState::Unhealthy,
            Entry::Operator(h) => h.state(),
            Entry::Recovering { .. } | Entry::Probation { .. } => HealthState::Recovering,
            Entry::InRotation(s) => s.state(),
        }
    }
}

/// What [`Tracker::enter`] recorded, for the decision the pool publishes.
pub(crate) struct Entered {
    pub from: HealthState,
    pub seq: u64,
    /// When the router's trial is due (or a cooldown ends), for an isolation.
    pub retry_at: Option<Micros>,
    pub evidence: Evidence,
    /// It was out on a cooldown before.
    pub was_cooling: bool,
}

/// The TTFT part of the score (the EWMA scoring practice docs/decisions.md describes): 100 at the baseline, 0 at `ttft_max_ms`.
pub(crate) fn ttft_score(ms: f64, policy: &Policy) -> f64 {
    let s = 100.0 - (ms - policy.ttft_baseline_ms) / (policy.ttft_max_ms - policy.ttft_baseline_ms) * 100.0;
    s.clamp(0.0, 100.0)
}

/// What a run of a call summary is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RunKind {
    Failures,
    Successes,
    RateLimited,
}

/// A run of like outcomes of one endpoint, applied at once: calls per class, and the counters
/// as the run leaves them.
#[derive(Debug, Clone)]
pub(crate) struct Run<'a> {
    pub kind: RunKind,
    pub counts: &'a [(OutcomeClass, u64)],
    pub failures: u32,
    pub successes: u32,
    pub hard: u32,
    pub rate_limited: u16,
    /// TTFT samples for the ring (µs), at most [`TTFT_SAMPLES`] spread over the run's.
    pub ttft: &'a [i64],
    /// The mean TTFT score of the run's successes.
    pub ttft_score: Option<f64>,
}

/// Deterministic jitter for a retry: up to a quarter of `base`, from the endpoint's names (`key`)
/// and the attempt (FNV-1a), so that replaying the log gives the same times and retries of
/// different endpoints (or of one endpoint after each failed trial) never line up with a
/// periodic fault.
fn jitter(key: Fnv64, isolations: u32, attempt: u16, base: i64) -> i64 {
    let h = key
        .bytes(isolations.to_le_bytes())
        .bytes(attempt.to_le_bytes())
        .finish();
    base / 1000 * (h % 250) as i64
}

/// One endpoint's state. Its stored form (the `stored` module's, version 1) is not its fields:
/// they may change, the bytes in a snapshot may not. Equality is the stored form's.
#[derive(Debug, Clone)]
pub struct Tracker {
    /// Where it is in its cycle of ejection and readmission, with that phase's data; its
    /// [`HealthState`] follows from it.
    phase: Phase,
    /// When it entered its state.
    since: Micros,
    seq: u64,
    window: Window,
    score: f64,
    /// When the score last rose above `recover_above`; the deadband's 30 s hold counts from here.
    above_since: Option<Micros>,
    /// An automatic ejection was refused by the pool's max-ejection rule.
    eject_refused: bool,
    /// Failure rate significantly above the peers' (Wilson bounds; set by the pool).
    failure_outlier: bool,
    /// First tokens far slower than the peers' (set by the pool).
    ttft_outlier: bool,
    /// When the engine first heard of the endpoint: its traffic is counted over no longer.
    born: Micros,
    /// The current runs of outcomes in a row.
    runs: Runs,
    /// Its ejections and readmissions so far: what makes the next isolation longer and a quick ejection a flap.
    history: History,
    /// Heartbeats from its prober.
    heartbeats: Heartbeats,
    /// Its latency, and whether it stands out from the peers'.
    latency: Latency,
    /// The latest first tokens.
    ttft: FirstTokens,
    /// 429s, and the cooldowns they brought.
    limits: RateLimits,
    /// Dependencies its probes found down.
    dependencies: Dependencies,
    /// The share of a sample the latest outcome was to the score ([`score_share`]), for the
    /// latency EWMA that the same outcome moves next: working memory, not state.
    share: Share,
    /// Restored from a stored form with flags its phase cannot hold (dropped, and counted by the
    /// engine): working memory, not state.
    restored_lossy: bool,
}

/// The current runs of outcomes in a row.
#[derive(Debug, Clone)]
struct Runs {
    failures: u32,
    successes: u32,
    hard: u32,
    /// Ids of the current run of failures, newest last, at most [`MAX_TRIGGERS`].
    failure_ids: Vec<String>,
}

/// Its ejections and readmissions so far: what makes the next isolation longer and a quick ejection a flap.
#[derive(Debug, Clone)]
struct History {
    /// Isolations in a row, each ejected soon after a readmission (k + 1 of the 30 s × 2^k
    /// backoff); 1 for a first ejection.
    isolations: u32,
    /// When the current (or last) ejection began: the minimum isolation counts from here.
    last_isolated_at: Option<Micros>,
    /// When the endpoint was last readmitted: an ejection soon after is a flap.
    readmitted_at: Option<Micros>,
    /// The endpoint's traffic when it last left rotation, in calls a day (the most of those of
    /// an ejection and the re-ejections that followed it): for the run of failures that
    /// re-ejects it in slow start (see [`noise_run`]), when its own window is empty.
    traffic_when_out: u64,
}

/// Heartbeats from its prober.
#[derive(Debug, Clone)]
struct Heartbeats {
    last: Option<Micros>,
    interval_ms: Option<i64>,
    /// Heartbeats have been silent past the suspect threshold.
    silent: bool,
}

/// Its latency, and whether it stands out from the peers'.
#[derive(Debug, Clone)]
struct Latency {
    ewma_ms: f64,
    samples: u32,
    outlier: bool,
    /// When the latency outlier flag last cleared (None while flagged, or never flagged): a
    /// degradation for latency holds for `recover_hold_ms` after it.
    clear_since: Option<Micros>,
    /// The peers' median latency (ms) at the last outlier check (0: none yet): a call whose
    /// EWMA passes `latency_outlier_factor` × it is checked at once, the rest every fourth.
    median_seen: f64,
}

/// The latest first tokens.
#[derive(Debug, Clone)]
struct FirstTokens {
    us: [u32; TTFT_SAMPLES],
    len: u8,
    pos: u8,
}

/// 429s, and the cooldowns they brought.
#[derive(Debug, Clone)]
struct RateLimits {
    /// 429s in a row.
    consecutive: u16,
    /// Cooldowns in a row, each begun soon after the last: the cooldown doubles with each.
    cooldowns: u16,
    /// When the last cooldown began.
    cooled_at: Option<Micros>,
    /// The latest outcomes that were not neutral, newest in bit 0: 1 for a 429.
    limited_bits: u16,
    /// The latest Retry-After the upstream sent with a 429, in ms.
    retry_after_ms: Option<u32>,
}

/// Dependencies its probes found down.
#[derive(Debug, Clone)]
struct Dependencies {
    critical_down: Vec<String>,
    noncritical_down: Vec<String>,
}

/// A [`Tracker`]'s latest sample share: recomputed with every outcome before it is read, so it
/// takes no part in equality or snapshots (a restored tracker starts at 1).
#[derive(Debug, Clone, Copy)]
struct Share(f64);

impl Default for Share {
    fn default() -> Self {
        Share(1.0)
    }
}

impl Tracker {
    pub(crate) fn new(now: Micros, policy: &Policy) -> Tracker {
        Tracker {
            phase: Phase::InRotation(InRotation::Healthy),
            since: now,
            seq: 0,
            window: Window::new(buckets(policy)),
            score: 100.0,
            above_since: Some(now),
            eject_refused: false,
            failure_outlier: false,
            ttft_outlier: false,
            born: now,
            runs: Runs {
                failures: 0,
                successes: 0,
                hard: 0,
                failure_ids: Vec::new(),
            },
            history: History {
                isolations: 0,
                last_isolated_at: None,
                readmitted_at: None,
                traffic_when_out: 0,
            },
            heartbeats: Heartbeats {
                last: None,
                interval_ms: None,
                silent: false,
            },
            latency: Latency {
                ewma_ms: 0.0,
                samples: 0,
                outlier: false,
                clear_since: None,
                median_seen: 0.0,
            },
            ttft: FirstTokens {
                us: [0; TTFT_SAMPLES],
                len: 0,
                pos: 0,
            },
            limits: RateLimits {
                consecutive: 0,
                cooldowns: 0,
                cooled_at: None,
                limited_bits: 0,
                retry_after_ms: None,
            },
            dependencies: Dependencies {
                critical_down: Vec::new(),
                noncritical_down: Vec::new(),
            },
            share: Share::default(),
            restored_lossy: false,
        }
    }

    /// The state it is in.
    pub fn state(&self) -> HealthState {
        self.phase.state()
    }

    /// When it entered its state (stream time).
    pub fn since(&self) -> Micros {
        self.since
    }

    /// Its transitions so far: the seq of the last one.
    /// The next transition's seq, taken by a scoped transition (which changes nothing else here).
    pub(crate) fn next_seq(&mut self) -> u64 {
        self.seq += 1;
        self.seq
    }

    pub fn seq(&self) -> u64 {
        self.seq
    }

    /// The EWMA health score, 0–100.
    pub fn score(&self) -> f64 {
        self.score
    }

    /// Isolations in a row (the k + 1 of the 30 s × 2^k backoff); 0 before any ejection.
    pub fn isolations(&self) -> u32 {
        self.history.isolations
    }

    pub fn consecutive_failures(&self) -> u32 {
        self.runs.failures
    }

    pub fn consecutive_successes(&self) -> u32 {
        self.runs.successes
    }

    /// Restored from a stored form with flags its phase could not hold (see `stored`).
    pub(crate) fn restored_lossy(&self) -> bool {
        self.restored_lossy
    }

    /// The operator's override in force, if any.
    pub fn forced(&self) -> Option<OverrideAction> {
        match self.phase {
            Phase::Operator(h) => Some(h.action()),
            _ => None,
        }
    }

    /// What the current ejection is for (None while in rotation).
    pub fn out_for(&self) -> Option<Dimension> {
        self.phase.out_for()
    }

    pub(crate) fn consecutive_hard(&self) -> u32 {
        self.runs.hard
    }

    pub(crate) fn consecutive_rate_limited(&self) -> u16 {
        self.limits.consecutive
    }

    pub(crate) fn above_since(&self) -> Option<Micros> {
        self.above_since
    }

    /// Ids of the current run of failures: the triggers of a transition they cause.
    pub(crate) fn failure_ids(&self) -> &[String] {
        &self.runs.failure_ids
    }

    pub(crate) fn eject_refused(&self) -> bool {
        self.eject_refused
    }

    pub(crate) fn latency_outlier(&self) -> bool {
        self.latency.outlier
    }

    pub(crate) fn failure_outlier(&self) -> bool {
        self.failure_outlier
    }

    pub(crate) fn ttft_outlier(&self) -> bool {
        self.ttft_outlier
    }

    pub(crate) fn latency_ewma_ms(&self) -> f64 {
        self.latency.ewma_ms
    }

    pub(crate) fn latency_samples(&self) -> u32 {
        self.latency.samples
    }

    pub(crate) fn critical_down(&self) -> &[String] {
        &self.dependencies.critical_down
    }

    pub(crate) fn noncritical_down(&self) -> &[String] {
        &self.dependencies.noncritical_down
    }

    pub(crate) fn heartbeat_silent(&self) -> bool {
        self.heartbeats.silent
    }

    pub(crate) fn trial_open(&self) -> bool {
        matches!(&self.phase, Phase::Out(i) if i.trial_open)
    }

    /// When the router's trial is due, or a cooldown ends (None unless out by a rule).
    pub(crate) fn isolated_until(&self) -> Option<Micros> {
        match &self.phase {
            Phase::Out(i) => Some(i.until),
            Phase::Cooldown(c) => Some(c.until),
            _ => None,
        }
    }

    /// When its weight reaches full: slow start's ramp, or a probation's growth.
    pub(crate) fn ramp_until(&self) -> Option<Micros> {
        match &self.phase {
            Phase::SlowStart(s) => Some(s.ramp_until),
            Phase::Probation(p) => p.growing_until,
            _ => None,
        }
    }

    /// Calls a day at its traffic when it last left rotation.
    pub(crate) fn traffic_when_out(&self) -> u64 {
        self.history.traffic_when_out
    }

    /// How many failures the policy's runs grow by at its traffic now ([`run_growth`]).
    pub(crate) fn run_growth(&self, now: Micros, policy: &Policy) -> u32 {
        run_growth(self.calls_a_day(now, policy))
    }

    /// Its traffic in calls a day: the successes and failures in the window over the time they
    /// span (whole buckets, the whole window once it is full; or, for an endpoint heard of
    /// since, the time since, at least a second).
    pub fn calls_a_day(&self, now: Micros, policy: &Policy) -> u64 {
        let counted = self.window.rate(now, us(policy.bucket_ms).max(1)).counted();
        self.calls_a_day_of(counted, now, policy)
    }

    /// The share of one sample a call is to the EWMAs (score and latency) at the endpoint's
    /// traffic ([`score_share`]), with `counted` calls in the window.
    fn share(&self, now: Micros, policy: &Policy, counted: u64) -> f64 {
        // A second (the least span counted) of fewer calls than a quiet endpoint's is quiet.
        if counted <= QUIET_CALLS_A_DAY / 86_400 {
            1.0
        } else {
            score_share(self.calls_a_day_of(counted, now, policy))
        }
    }

    /// [`Tracker::calls_a_day`] with the window's calls already counted.
    fn calls_a_day_of(&self, counted: u64, now: Micros, policy: &Policy) -> u64 {
        let bucket_us = us(policy.bucket_ms).max(1);
        let span_us = (i64::from(self.window.span_buckets(now, bucket_us)) * bucket_us)
            .min(now.saturating_sub(self.born).max(1_000_000));
        if span_us <= 0 {
            return 0;
        }
        u64::try_from(u128::from(counted) * 86_400_000_000 / span_us as u128).unwrap_or(u64::MAX)
    }

    pub(crate) fn last_isolated_at(&self) -> Option<Micros> {
        self.history.last_isolated_at
    }

    /// On probation: held at the probation weight while real calls decide.
    pub(crate) fn probation(&self) -> bool {
        matches!(self.phase, Phase::Probation(_))
    }

    /// Out of rotation (by a rule or forced unhealthy) or on probation: its latency is not a
    /// peer's (one phase test, on the hot path of every latency comparison).
    pub(crate) fn out_or_on_probation(&self) -> bool {
        matches!(
            self.phase,
            Phase::Out(_) | Phase::Cooldown(_) | Phase::Probation(_) | Phase::Operator(Hold::Unhealthy)
        )
    }

    /// On probation, its weight growing to full.
    pub(crate) fn probation_growing(&self) -> bool {
        matches!(&self.phase, Phase::Probation(p) if p.growing_until.is_some())
    }

    /// Times its weight grew and fell back in this probation (0 off probation).
    fn probation_falls(&self) -> u8 {
        match &self.phase {
            Phase::Probation(p) => p.falls,
            _ => 0,
        }
    }

    /// Whether the run of passes on probation grows its weight at `now`: [`PROBATION_GROW_PASSES`]
    /// of them, or [`PROBATION_SLOW_PASSES`] spanning [`PROBATION_SLOW_SPAN_MS`] (each × 2 for
    /// each growth that fell back in this probation, up to × 8). The threshold it met and how
    /// long the run has lasted (0 when unknown), if it does.
    pub(crate) fn probation_grows(&self, now: Micros) -> Option<(String, Micros)> {
        let Phase::Probation(p) = &self.phase else {
            return None;
        };
        let (passes, slow, span_ms) = grow_needs(p.falls);
        let span = p.run_from.map_or(0, |from| now.saturating_sub(from));
        if p.passes >= passes {
            Some((format!("probation_passes>={passes}"), span))
        } else if p.passes >= slow && span >= us(span_ms) {
            Some((format!("probation_passes>={slow}_over_{}s", span_ms / 1000), span))
        } else {
            None
        }
    }

    /// What the next growth needs once the growth under way falls back, for its reason.
    pub(crate) fn grow_needs_after_a_fall(&self) -> String {
        let (passes, slow, span_ms) = grow_needs(self.probation_falls().saturating_add(1));
        format!("{passes} outcomes in a row pass ({slow} over {} s)", span_ms / 1000)
    }

    pub(crate) fn retry_after_ms(&self) -> Option<u32> {
        self.limits.retry_after_ms
    }

    /// Out on a rate-limit cooldown: out of rotation, but not an outage.
    pub(crate) fn cooling(&self) -> bool {
        matches!(&self.phase, Phase::Cooldown(_))
    }

    pub fn totals(&self, now: Micros, policy: &Policy) -> Totals {
        self.window.totals(now, us(policy.bucket_ms))
    }

    pub fn rate(&self, now: Micros, policy: &Policy) -> Rate {
        self.window.rate(now, us(policy.bucket_ms))
    }

    /// Successes and failures over the most recent third of the window: a fault 10 s old is a
    /// tenth of a 30 s window still full of the calls before it.
    pub fn recent_rate(&self, now: Micros, policy: &Policy) -> Rate {
        self.window.rate_last(now, us(policy.bucket_ms), recent_buckets(policy))
    }

    /// Successes and failures over the most recent two thirds of the window.
    pub fn recent_rate_longer(&self, now: Micros, policy: &Policy) -> Rate {
        self.window
            .rate_last(now, us(policy.bucket_ms), recent_buckets(policy) * 2)
    }

    /// Per-class counts over the most recent third of the window.
    pub fn recent_totals(&self, now: Micros, policy: &Policy) -> Totals {
        self.window
            .totals_last(now, us(policy.bucket_ms), recent_buckets(policy))
    }

    /// Record an outcome: window, counters, score. `class` is the effective class (a success
    /// slower than `slow_call_ms` to its first token arrives here as a timeout).
    /// `sees_limits`: whether the outcome could have met a rate limit (a call or a completion
    /// probe, not a health route's probe). Returns the window's counts after recording.
    pub(crate) fn record(
        &mut self,
        now: Micros,
        policy: &Policy,
        class: OutcomeClass,
        ttft_us: Option<i64>,
        id: &str,
        sees_limits: bool,
    ) -> Rate {
        self.window.record(now, us(policy.bucket_ms), class);
        let rate = self.rate(now, policy);
        if class.is_neutral() {
            return rate;
        }
        let limited = class == OutcomeClass::RateLimited;
        // A pass that could not have met the limit (a health route's) says nothing of it.
        if limited || sees_limits {
            self.limits.limited_bits = (self.limits.limited_bits << 1) | u16::from(limited);
        }
        if limited {
            // Not a failure of the endpoint: its own rule (the cooldown) answers it.
            self.limits.consecutive = self.limits.consecutive.saturating_add(1);
            return rate;
        }
        if sees_limits {
            self.limits.consecutive = 0;
        }
        let failed = counts_as_failure(class);
        if failed {
            self.runs.failures += 1;
            self.runs.successes = 0;
            self.runs.hard = if class.is_hard() { self.runs.hard + 1 } else { 0 };
            if self.runs.failure_ids.len() == MAX_TRIGGERS {
                self.runs.failure_ids.remove(0);
            }
            self.runs.failure_ids.push(id.to_owned());
        } else {
            self.runs.successes += 1;
            self.runs.failures = 0;
            self.runs.hard = 0;
            self.runs.failure_ids.clear();
        }
        if let Some(t) = ttft_us {
            self.ttft.us[self.ttft.pos as usize] = u32::try_from(t).unwrap_or(u32::MAX);
            self.ttft.pos = ((self.ttft.pos as usize + 1) % TTFT_SAMPLES) as u8;
            self.ttft.len = (self.ttft.len + 1).min(TTFT_SAMPLES as u8);
        }
        // Seed 001: TTFT score and success rate, 0.6 / 0.4, smoothed with beta.
        let ttft_score = match (failed, ttft_us) {
            (true, _) => 0.0,
            (false, None) => 100.0,
            (false, Some(t)) => ttft_score(t as f64 / 1000.0, policy),
        };
        let success_rate = (1.0 - rate.failure_rate()) * 100.0;
        self.move_score(now, policy, 0.6 * ttft_score + 0.4 * success_rate, 1, rate.counted());
        rate
    }

    /// Move the EWMA score as `steps` samples of `sample` would, one after another; the hard
    /// break and the deadband's hold follow.
    ///
    /// Up to ~11 calls a second each call moves the score by the policy's β (the EWMA weight). Busier,
    /// a call moves it as that traffic's share of one ([`score_share`]): the score averages
    /// over the same time, not the same few calls. Per call, four failures in a row at β = 0.7
    /// take the score under `degrade_below` and two under `recover_above`: 1 % noise does the
    /// one every 70 s and the other every second at 14,000 calls a second, so every busy
    /// endpoint was degraded and none came back (fleet-bench: 468 of 500 endpoints).
    /// `counted`: the calls in the window.
    fn move_score(&mut self, now: Micros, policy: &Policy, sample: f64, steps: u64, counted: u64) {
        let share = self.share(now, policy, counted);
        self.share = Share(share);
        let keep = ewma_keep(policy.ewma_beta, steps, share);
        self.score = keep * self.score + (1.0 - keep) * sample;
        // The hard break's run zeroes the score: the policy's, or at high traffic the longer
        // run that noise does not make (the window is summed only when the policy's is met).
        let hard = policy.hard_break_after as u32;
        if self.runs.hard >= hard && self.runs.hard >= hard + self.run_growth(now, policy) {
            self.score = 0.0;
        }
        self.above_since = if self.score > policy.recover_above {
            self.above_since.or(Some(now))
        } else {
            None
        };
    }

    /// Record a run of outcomes at once, from a call summary: the window, the counters as the
    /// run leaves them, the TTFT samples, and the score as if each outcome had come alone
    /// (a success's sample from the run's mean TTFT score, in closed form). The window takes
    /// every call of the run at `now`.
    pub(crate) fn record_run(&mut self, now: Micros, policy: &Policy, run: &Run<'_>, id: &str) -> Rate {
        let bucket = us(policy.bucket_ms);
        for (c, n) in run.counts {
            self.window.record_n(now, bucket, *c, *n);
        }
        let rate = self.rate(now, policy);
        let calls: u64 = run.counts.iter().map(|(_, n)| n).sum();
        if calls == 0 {
            return rate;
        }
        let shifts = calls.min(16) as u32;
        let limited = run.kind == RunKind::RateLimited;
        self.limits.limited_bits = if limited {
            self.limits.limited_bits.checked_shl(shifts).unwrap_or(0) | (u16::MAX >> (16 - shifts))
        } else {
            self.limits.limited_bits.checked_shl(shifts).unwrap_or(0)
        };
        self.limits.consecutive = run.rate_limited;
        if limited {
            return rate;
        }
        self.runs.failures = run.failures;
        self.runs.successes = run.successes;
        self.runs.hard = run.hard;
        if run.kind == RunKind::Failures {
            if !self.runs.failure_ids.iter().any(|i| i == id) {
                if self.runs.failure_ids.len() == MAX_TRIGGERS {
                    self.runs.failure_ids.remove(0);
                }
                self.runs.failure_ids.push(id.to_owned());
            }
        } else {
            self.runs.failure_ids.clear();
        }
        for t in run.ttft {
            self.ttft.us[self.ttft.pos as usize] = u32::try_from(*t).unwrap_or(u32::MAX);
            self.ttft.pos = ((self.ttft.pos as usize + 1) % TTFT_SAMPLES) as u8;
            self.ttft.len = (self.ttft.len + 1).min(TTFT_SAMPLES as u8);
        }
        let success_rate = (1.0 - rate.failure_rate()) * 100.0;
        let sample = match run.kind {
            RunKind::Failures => 0.4 * success_rate,
            _ => 0.6 * run.ttft_score.unwrap_or(100.0) + 0.4 * success_rate,
        };
        self.move_score(now, policy, sample, calls, rate.counted());
        rate
    }

    /// Record `n` 4xx or cancelled calls (a call summary's): the window only, as one by one.
    pub(crate) fn record_neutral(&mut self, now: Micros, policy: &Policy, class: OutcomeClass, n: u64) {
        if n > 0 {
            self.window.record_n(now, us(policy.bucket_ms), class, n);
        }
    }

    /// Record the latencies of a summary's successes, `values` (µs) in the order taken for
    /// theirs, each standing for `calls`: each moves the EWMA as that many calls do
    /// ([`Tracker::record_latency`]), and the outlier flag is judged against the peers'
    /// `median` (None: too few peers) at each of them — the median does not move within a
    /// summary, so judging every step costs nothing, where a call checks only when
    /// [`Tracker::latency_check_due`]. Returns the flag to set, or None when no sample was
    /// judged: up if it was up at any of them (one by one, the degradation would have followed
    /// at once; the flag clears at the next summary's check).
    pub(crate) fn walk_latencies(
        &mut self,
        values: &[f64],
        calls: u64,
        median: Option<f64>,
        policy: &Policy,
    ) -> Option<bool> {
        let keep = ewma_keep(policy.ewma_beta, calls, self.share.0);
        let calls = u32::try_from(calls).unwrap_or(u32::MAX);
        let mut flag = self.latency.outlier;
        let mut judged = None;
        self.saw_latency_median(median);
        for v in values {
            self.move_latency(v / 1000.0, keep, calls);
            if self.latency.samples >= LATENCY_MIN_SAMPLES {
                flag = median.is_some_and(|m| latency_verdict(self.latency.ewma_ms, m, flag, policy));
                judged = Some(judged == Some(true) || flag);
            }
        }
        judged
    }

    pub(crate) fn record_latency(&mut self, latency_us: i64, policy: &Policy) {
        // As the score (the share its outcome was): busier than ~11 calls a second a call is a
        // share of one sample, so a healthy endpoint's long tail does not flag it.
        let keep = ewma_keep(policy.ewma_beta, 1, self.share.0);
        self.move_latency(latency_us as f64 / 1000.0, keep, 1);
    }

    fn move_latency(&mut self, ms: f64, keep: f64, calls: u32) {
        self.latency.ewma_ms = if self.latency.samples == 0 {
            ms
        } else {
            keep * self.latency.ewma_ms + (1.0 - keep) * ms
        };
        self.latency.samples = self.latency.samples.saturating_add(calls);
    }

    fn ttft_percentile(&self, q: f64) -> Option<f64> {
        if self.ttft.len == 0 {
            return None;
        }
        let mut v: Vec<u32> = self.ttft.us[..self.ttft.len as usize].to_vec();
        v.sort_unstable();
        let idx = ((v.len() as f64 - 1.0) * q).round() as usize;
        Some(f64::from(v[idx]) / 1000.0)
    }

    pub fn heartbeat_interval(&self, policy: &Policy) -> i64 {
        self.heartbeats.interval_ms.unwrap_or(policy.heartbeat_interval_ms)
    }

    pub fn heartbeat_silence(&self, now: Micros) -> Option<i64> {
        self.heartbeats.last.map(|t| now.saturating_sub(t))
    }

    /// The current isolation's length: base × 2^(isolations − 1), capped.
    pub fn isolation(&self, policy: &Policy) -> i64 {
        let k = self.history.isolations.saturating_sub(1).min(30);
        policy
            .isolation_base_ms
            .saturating_mul(1i64 << k)
            .min(policy.isolation_max_ms)
    }

    /// Whether this is a flapping endpoint (ejected again soon after a readmission): it then
    /// needs two passing probes in a row to come back, not one.
    pub fn passes_needed(&self) -> u16 {
        if self.history.isolations >= 2 {
            2
        } else {
            1
        }
    }

    /// Whether the minimum isolation has passed, after which passing evidence readmits.
    pub fn readmittable(&self, now: Micros, policy: &Policy) -> bool {
        self.history
            .last_isolated_at
            .is_none_or(|t| now.saturating_sub(t) >= us(policy.readmit_min_ms))
    }

    /// The earliest stream time at which a timer of this endpoint may change its state.
    pub fn deadline(&self, policy: &Policy) -> Option<Micros> {
        let mut d: Option<Micros> = None;
        let mut consider = |t: Micros| d = Some(d.map_or(t, |x: Micros| x.min(t)));
        match &self.phase {
            Phase::Operator(_) => return None,
            Phase::Out(i) if !i.trial_open => consider(i.until),
            Phase::Cooldown(c) => consider(c.until),
            Phase::SlowStart(s) => consider(s.ramp_until),
            Phase::Probation(p) => {
                if let Some(t) = p.growing_until {
                    consider(t);
                }
            }
            Phase::InRotation(InRotation::Degraded) => {
                if let Some(t) = self.above_since {
                    consider(t.saturating_add(us(policy.recover_hold_ms)));
                }
                if let Some(t) = self.latency.clear_since {
                    consider(t.saturating_add(us(policy.recover_hold_ms)));
                }
            }
            _ => {}
        }
        if let (Some(last), Phase::InRotation(_)) = (self.heartbeats.last, &self.phase) {
            let iv = us(self.heartbeat_interval(policy));
            let n = if self.heartbeats.silent {
                policy.heartbeat_unhealthy_intervals
            } else {
                policy.heartbeat_suspect_intervals
            };
            consider(last.saturating_add(iv.saturating_mul(n.into())));
        }
        d
    }

    pub fn evidence(
        &self,
        now: Micros,
        policy: &Policy,
        thresholds: Vec<String>,
        pool_median: Option<f64>,
    ) -> Evidence {
        let t = self.totals(now, policy);
        let rate = self.rate(now, policy);
        let n = |c: OutcomeClass| t.get(c) as i64;
        Evidence {
            window_ms: policy.window_ms,
            success: n(OutcomeClass::Success),
            timeout: n(OutcomeClass::Timeout),
            connect_error: n(OutcomeClass::ConnectError),
            connection_dropped: n(OutcomeClass::ConnectionDropped),
            rate_limited: n(OutcomeClass::RateLimited),
            server_error: n(OutcomeClass::ServerError),
            client_error: n(OutcomeClass::ClientError),
            invalid_response: n(OutcomeClass::InvalidResponse),
            cancelled: n(OutcomeClass::Cancelled),
            failure_rate: rate.failure_rate(),
            score: self.score,
            ttft_p50_ms: self.ttft_percentile(0.5),
            ttft_p99_ms: self.ttft_percentile(0.99),
            latency_ewma_ms: (self.latency.samples > 0).then_some(self.latency.ewma_ms),
            pool_latency_median_ms: pool_median,
            consecutive_failures: self.runs.failures as i32,
            consecutive_successes: self.runs.successes as i32,
            consecutive_hard_failures: self.runs.hard as i32,
            isolations: self.history.isolations as i32,
            thresholds,
            late: 0,
        }
    }

    /// A heartbeat arrived (with the interval the endpoint announces, if any).
    pub(crate) fn heartbeat(&mut self, now: Micros, interval_ms: Option<i64>) {
        self.heartbeats.last = Some(now);
        self.heartbeats.silent = false;
        if interval_ms.is_some() {
            self.heartbeats.interval_ms = interval_ms;
        }
    }

    /// Heartbeats have been silent past the suspect threshold: remember it (the deadline then
    /// moves to the unhealthy threshold).
    pub(crate) fn note_heartbeat_silence(&mut self, now: Micros, policy: &Policy) {
        if let (Some(silence), false) = (self.heartbeat_silence(now), self.heartbeats.silent) {
            if silence >= us(self.heartbeat_interval(policy)).saturating_mul(policy.heartbeat_suspect_intervals.into())
            {
                self.heartbeats.silent = true;
            }
        }
    }

    /// What a probe reported of the endpoint's dependencies, by name.
    pub(crate) fn dependencies(&mut self, critical_down: Vec<String>, noncritical_down: Vec<String>) {
        self.dependencies.critical_down = critical_down;
        self.dependencies.noncritical_down = noncritical_down;
    }

    /// The Retry-After a 429 came with.
    pub(crate) fn note_retry_after(&mut self, ms: i64) {
        self.limits.retry_after_ms = Some(u32::try_from(ms.max(0)).unwrap_or(u32::MAX));
    }

    /// The isolation has expired: the next call is the router's trial.
    pub(crate) fn open_trial_when_due(&mut self, now: Micros) {
        if let Phase::Out(i) = &mut self.phase {
            if i.until <= now {
                i.trial_open = true;
            }
        }
    }

    /// Count an outcome's verdict in its phase's run, and return the run: passing evidence in
    /// a row while out, passing outcomes in a row on probation (a failure starts either again).
    /// A failure while out for a share of failed calls whose failures now come `down_after` in
    /// a row says it is down, not partly failing: evidence that can see errors readmits it, as
    /// it would any endpoint that was down.
    pub(crate) fn tally(&mut self, now: Micros, passed: bool, down_after: u32) -> u16 {
        let failures = self.runs.failures;
        match &mut self.phase {
            Phase::Out(i) if passed => {
                i.passes = i.passes.saturating_add(1);
                i.passes
            }
            Phase::Out(i) => {
                i.passes = 0;
                if i.out_for == Dimension::ErrorRate && failures >= down_after {
                    i.out_for = Dimension::Errors;
                }
                0
            }
            Phase::Probation(p) => {
                if passed {
                    if p.passes == 0 {
                        p.run_from = Some(now);
                    }
                    p.passes = p.passes.saturating_add(1);
                } else {
                    p.passes = 0;
                    p.run_from = None;
                }
                p.passes
            }
            _ => 0,
        }
    }

    /// 429s among the latest `n` outcomes (at most 16) that were not neutral.
    pub(crate) fn recent_429s(&self, n: u32) -> u32 {
        let n = n.clamp(1, LIMITED_HISTORY);
        let mask = if n >= 16 { u16::MAX } else { (1u16 << n) - 1 };
        (self.limits.limited_bits & mask).count_ones()
    }

    /// The cooldown a new one would get: `base` ms, doubled for each cooldown in a row (one
    /// begun within `isolation_reset_ms` of the last) up to four times `base`, and never longer
    /// than the longest isolation.
    pub(crate) fn cooldown_for(&self, base: i64, now: Micros, policy: &Policy) -> i64 {
        let k = self.cooldowns_in_a_row(now, policy).saturating_sub(1).min(2);
        base.saturating_mul(1i64 << k).clamp(1, policy.isolation_max_ms.max(1))
    }

    /// Whether its last cooldown began within `ms` of `now`.
    pub(crate) fn cooled_within(&self, now: Micros, ms: i64) -> bool {
        self.limits.cooled_at.is_some_and(|t| now.saturating_sub(t) <= us(ms))
    }

    /// Cooldowns in a row including one begun `now`.
    fn cooldowns_in_a_row(&self, now: Micros, policy: &Policy) -> u16 {
        let recent = self
            .limits
            .cooled_at
            .is_some_and(|t| now.saturating_sub(t) <= us(policy.isolation_reset_ms));
        if recent {
            self.limits.cooldowns.saturating_add(1)
        } else {
            1
        }
    }

    pub(crate) fn set_eject_refused(&mut self, refused: bool) {
        self.eject_refused = refused;
    }

    /// Flag (or clear) the latency outlier at `now`; a flag cleared is remembered, so that a
    /// degradation for latency ends only once it has stayed clear for `recover_hold_ms`.
    pub(crate) fn set_latency_outlier(&mut self, outlier: bool, now: Micros) {
        self.latency.clear_since = match (outlier, self.latency.outlier) {
            (true, _) => None,
            (false, true) => Some(now),
            (false, false) => self.latency.clear_since,
        };
        self.latency.outlier = outlier;
    }

    /// Whether the latest call calls for the latency-outlier check: every fourth sample, each
    /// while flagged, and any whose EWMA passes the factor × the peers' median as last seen —
    /// a 10× call at a few calls a second is what flags a tail, and checked only every fourth
    /// call a flag lapsed for 30 s by chance. (Checking every call costs a peer median a call:
    /// 15 % of engine-bench.)
    pub(crate) fn latency_check_due(&self, policy: &Policy) -> bool {
        self.latency.samples >= LATENCY_MIN_SAMPLES
            && (self.latency.samples.is_multiple_of(4)
                || self.latency.outlier
                || self.latency.ewma_ms > policy.latency_outlier_factor * self.latency.median_seen)
    }

    /// The peers' median latency at a check (None: too few peers, and no check is due before
    /// the fourth sample).
    pub(crate) fn saw_latency_median(&mut self, median: Option<f64>) {
        self.latency.median_seen = median.unwrap_or(f64::MAX);
    }

    /// Whether the latency has been no outlier for `recover_hold_ms` (or never was).
    pub(crate) fn latency_held_clear(&self, now: Micros, policy: &Policy) -> bool {
        !self.latency.outlier
            && self
                .latency
                .clear_since
                .is_none_or(|s| now.saturating_sub(s) >= us(policy.recover_hold_ms))
    }

    pub(crate) fn set_failure_outlier(&mut self, outlier: bool) {
        self.failure_outlier = outlier;
    }

    pub(crate) fn set_ttft_outlier(&mut self, outlier: bool) {
        self.ttft_outlier = outlier;
    }

    /// A policy with other buckets: the window starts empty.
    pub(crate) fn resize_window(&mut self, buckets: usize) {
        self.window = Window::new(buckets);
    }

    /// Ejected: a new isolation (longer for a flapping endpoint), for `dim` or what it was out
    /// for before.
    fn eject(
        &mut self,
        now: Micros,
        policy: &Policy,
        from: HealthState,
        dim: Option<Dimension>,
    ) -> (Phase, Option<Micros>) {
        let traffic = self.calls_a_day(now, policy);
        self.history.traffic_when_out = match from {
            HealthState::Healthy | HealthState::Suspect | HealthState::Degraded => traffic,
            _ => self.history.traffic_when_out.max(traffic),
        };
        let ms = self.next_isolation(now, policy);
        let out_for = dim.or(self.out_for()).unwrap_or(Dimension::Errors);
        isolate(now, ms, out_for, 0)
    }

    /// A failed trial: the same isolation again, jittered by `key`.
    fn trial_failed(&mut self, now: Micros, policy: &Policy, key: Fnv64) -> (Phase, Option<Micros>) {
        // The same isolation again, jittered: a continuing outage does not grow it.
        let failed = match &self.phase {
            Phase::Out(i) => i.failed_trials,
            _ => 0,
        }
        .saturating_add(1);
        let iso = us(self.isolation(policy));
        let ms = iso.saturating_add(jitter(key, self.history.isolations, failed, iso)) / 1000;
        let out_for = self.out_for().unwrap_or(Dimension::Errors);
        isolate(now, ms, out_for, failed)
    }

    /// Back in rotation at slow start, or on probation: the isolation's counts reset.
    fn readmit(&mut self, now: Micros, policy: &Policy, probation: bool, was_cooling: bool) -> Phase {
        let ended_probation = self.probation() && !probation;
        // What it was out for, but the end of a cooldown is not a readmission: a later
        // ejection is no flap.
        let after = if was_cooling { None } else { self.out_for() };
        self.reset_for_recovery(now);
        // A Retry-After heard while cooling (a call still in flight) is of the window
        // that has ended: a 429 after this one says its own.
        self.limits.retry_after_ms = None;
        if !was_cooling && !ended_probation {
            self.history.readmitted_at = Some(now);
        }
        // On probation the weight is held: no ramp until it grows.
        if probation {
            Phase::Probation(Probation {
                after,
                passes: 0,
                run_from: None,
                falls: 0,
                growing_until: None,
            })
        } else {
            Phase::SlowStart(SlowStart {
                after,
                ramp_until: now.saturating_add(us(policy.slow_start_ms)),
            })
        }
    }

    /// On probation still: its weight grows, or falls back and is held.
    fn probation_step(&mut self, now: Micros, growing: bool) -> Phase {
        let mut p = match std::mem::replace(&mut self.phase, Phase::InRotation(InRotation::Healthy)) {
            Phase::Probation(p) => p,
            other => Probation {
                after: other.out_for(),
                passes: 0,
                run_from: None,
                falls: 0,
                growing_until: None,
            },
        };
        if growing {
            p.growing_until = Some(now.saturating_add(us(PROBATION_RAMP_MS)));
        } else {
            p.growing_until = None;
            p.falls = p.falls.saturating_add(1);
        }
        Phase::Probation(p)
    }

    /// Enter the state `entry` names, with what entering it resets, and record the transition:
    /// its evidence (with `thresholds` and the pool's latency median) is taken in the new state.
    pub(crate) fn enter(
        &mut self,
        entry: Entry,
        now: Micros,
        policy: &Policy,
        thresholds: Vec<String>,
        pool_median: Option<f64>,
    ) -> Entered {
        let from = self.state();
        let was_cooling = self.cooling();
        let (phase, retry_at) = match entry {
            Entry::Eject(dim) => self.eject(now, policy, from, dim),
            Entry::TrialFailed(key) => self.trial_failed(now, policy, key),
            Entry::Cooldown(ms) => {
                self.limits.cooldowns = self.cooldowns_in_a_row(now, policy);
                self.limits.cooled_at = Some(now);
                self.limits.retry_after_ms = None;
                isolate(now, ms, Dimension::RateLimit, 0)
            }
            Entry::Operator(hold) => (Phase::Operator(hold), None),
            Entry::Recovering { probation } => (self.readmit(now, policy, probation, was_cooling), None),
            Entry::Probation { growing } => (self.probation_step(now, growing), None),
            Entry::InRotation(to) => (Phase::InRotation(to), None),
        };
        self.phase = phase;
        self.since = now;
        self.seq += 1;
        let evidence = self.evidence(now, policy, thresholds, pool_median);
        if let Entry::Cooldown(_) = entry {
            // Judged afresh when the cooldown ends: the 429s that started it are in the evidence.
            self.reset_for_recovery(now);
        }
        Entered {
            from,
            seq: self.seq,
            retry_at,
            evidence,
            was_cooling,
        }
    }

    /// The isolation for a new ejection: base × 2^k, capped. k grows only for a flapping
    /// endpoint, one ejected again within `isolation_reset_ms` of its last readmission; a first
    /// ejection (or one after a quiet period) starts again at the base.
    fn next_isolation(&mut self, now: Micros, policy: &Policy) -> i64 {
        let flapping = self
            .history
            .readmitted_at
            .is_some_and(|t| now.saturating_sub(t) <= us(policy.isolation_reset_ms));
        if !flapping {
            self.history.isolations = 0;
        }
        self.history.isolations = self.history.isolations.saturating_add(1);
        self.history.last_isolated_at = Some(now);
        self.isolation(policy)
    }

    /// A fresh start after an isolation's trial succeeded: the old window and score were the
    /// evidence of the outage and are already in the audit log.
    fn reset_for_recovery(&mut self, now: Micros) {
        self.window.clear();
        self.score = 100.0;
        self.above_since = Some(now);
        self.runs.failures = 0;
        self.runs.hard = 0;
        self.limits.consecutive = 0;
        // The 429s seen while out (a completion probe meets the limit too) are not the
        // upstream's answer to the calls to come: a cooldown ends by its time, and what the
        // upstream takes now is for the calls after it to say.
        self.limits.limited_bits = 0;
        self.runs.failure_ids.clear();
        self.failure_outlier = false;
        self.ttft_outlier = false;
    }

    /// Kept serving through a suspected shared outage: judged on what happens from now on, not
    /// on the outage's window (its latest successes still count).
    pub(crate) fn forget_outage(&mut self, now: Micros) {
        let successes = self.runs.successes;
        self.reset_for_recovery(now);
        self.runs.successes = successes;
    }

    /// The `q` percentile of the recent first tokens, in ms, once there are at least `min`.
    pub fn ttft_p(&self, q: f64, min: usize) -> Option<f64> {
        if (self.ttft.len as usize) < min {
            return None;
        }
        self.ttft_percentile(q)
    }
}

/// Out of rotation for `ms` from `now`, for `out_for`, after `failed_trials` failed trials: the
/// phase, and when the router's trial is due.
/// (Out for 429s is a cooldown: its time alone ends it.)
fn isolate(now: Micros, ms: i64, out_for: Dimension, failed_trials: u16) -> (Phase, Option<Micros>) {
    let until = now.saturating_add(us(ms));
    let phase = match out_for {
        Dimension::RateLimit => Phase::Cooldown(Cooldown { until }),
        _ => Phase::Out(Isolation::new(out_for, until, failed_trials)),
    };
    (phase, Some(until))
}

/// The run [`noise_run`] asks for at up to ~11 calls a second: the policy's runs hold there,
/// and grow by one for each step beyond ([`run_growth`]).
const QUIET_RUN: u32 = 3;

/// The shortest run of failures that failures at 1 % — a healthy endpoint's noise, failing at
/// random — make less than once a day at `calls_a_day` (see [`Tracker::calls_a_day`]): 3 up to
/// ~11 calls a second, 4 up to ~1,157, 5 up to ~115,740, 6 beyond. Three failures in a row are
/// evidence at 5 calls a second (1 % noise makes them once in 2.3 days), and none at 5,000
/// (every 200 s): the hard break and the consecutive-failure rule ask for at least this
/// (`pool/ejection.rs`), so that a busy endpoint is not ejected for its noise, while a dead one
/// still is within a few calls. Whole numbers only (the engine replays bit for bit): the
/// smallest k with calls a day < 100^k.
pub fn noise_run(calls_a_day: u64) -> u32 {
    let (mut k, mut bound) = (1u32, 100u128);
    while u128::from(calls_a_day) >= bound {
        k += 1;
        bound *= 100;
    }
    k
}

/// A quiet endpoint's traffic: up to here the policy's runs and the score's β hold as written.
const QUIET_CALLS_A_DAY: u64 = 1_000_000;

/// The share of one sample a call is to the EWMA score at `calls_a_day`: 1 up to a million
/// calls a day (~11.6 a second, where the policy's runs hold: [`QUIET_RUN`]), and that traffic's
/// share of the endpoint's beyond, so that the score's memory stays ~0.3 s of calls (3.3
/// samples at β = 0.7) however busy the endpoint.
pub(crate) fn score_share(calls_a_day: u64) -> f64 {
    if calls_a_day <= QUIET_CALLS_A_DAY {
        1.0
    } else {
        QUIET_CALLS_A_DAY as f64 / calls_a_day as f64
    }
}

/// Whether a latency EWMA of `ewma_ms` is an outlier beside the peers' `median`, `was` one before:
/// far above it to be flagged, and only well inside the limit to be cleared (hysteresis).
pub(crate) fn latency_verdict(ewma_ms: f64, median: f64, was: bool, policy: &Policy) -> bool {
    let factor = policy.latency_outlier_factor;
    if was {
        ewma_ms > factor * median * 0.8
    } else {
        ewma_ms > factor * median && ewma_ms - median > policy.latency_outlier_min_ms
    }
}

/// What an EWMA keeps of itself after `steps` samples, each `share` of one (the score's and the
/// latency's): β itself for one whole sample, so that the common case takes no `powf`.
fn ewma_keep(beta: f64, steps: u64, share: f64) -> f64 {
    if steps == 1 && share >= 1.0 {
        beta
    } else {
        beta.powf(steps as f64 * share)
    }
}

/// How many failures the policy's runs (the hard break, consecutive failures, 429s) grow by at
/// `calls_a_day`: 0 up to ~11 calls a second, one more for each hundredfold of traffic beyond.
pub(crate) fn run_growth(calls_a_day: u64) -> u32 {
    noise_run(calls_a_day).saturating_sub(QUIET_RUN)
}

pub fn buckets(policy: &Policy) -> usize {
    (policy.window_ms / policy.bucket_ms).max(1) as usize
}

/// The buckets of the most recent third of the window.
fn recent_buckets(policy: &Policy) -> u32 {
    (buckets(policy) as u32).div_ceil(3)
}

/// Milliseconds to microseconds, saturating: a policy or probe value can never wrap stream time
/// (validation bounds them far below this, but the engine must not rely on its callers).
pub(crate) fn us(ms: i64) -> i64 {
    ms.saturating_mul(1000)
}
