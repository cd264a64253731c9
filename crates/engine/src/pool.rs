//! One pool: its endpoints, its policy and the pool-level rules (max-ejection, panic mode,
//! correlated-outage suspicion, peer-relative latency).

use crate::endpoint::{buckets, us, Dimension, Source, Tracker, Verdict, LATENCY_MIN_SAMPLES};
use crate::window::{counts_as_failure, Rate};
use crate::Decision;
use rustc_hash::FxHashMap as HashMap;
use serde::{Deserialize, Serialize};
use vitals_contracts::{
    DependencyStatus, HealthChanged, HealthState, Micros, OperatorOverride, OutcomeClass, OverrideAction, Policy,
    PolicyChange, PoolHealthChanged, ProbeKind, ReasonCode, Signal,
};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PoolState {
    pub pool: String,
    pub policy: Policy,
    pub now: Micros,
    pub seq: u64,
    #[serde(serialize_with = "crate::sorted")]
    /// Boxed: a small pool's hash table has spare slots, and a spare slot then costs a pointer,
    /// not a whole tracker (this keeps engine state under 1 KB per endpoint).
    pub endpoints: HashMap<String, Box<Tracker>>,
    /// Endpoints by state, kept with every transition (index: `state_index`).
    counts: [u32; 6],
    refused: u32,
    /// Endpoints out on a rate-limit cooldown: out of rotation, but not an outage (they count
    /// as healthy for panic mode and never as a refused ejection).
    #[serde(default)]
    cooling: u32,
    pub panic: bool,
    pub correlated_outage: bool,
    /// The earliest stream time at which some endpoint's timer may fire.
    next_deadline: Option<Micros>,
    /// A reusable buffer for the peer-latency median, so the hot path does not allocate.
    #[serde(skip)]
    scratch: Cache<Vec<f64>>,
    /// The endpoint names in sorted order, the order in which timers are evaluated; rebuilt
    /// when an endpoint joins (endpoints never leave).
    #[serde(skip)]
    order: Cache<Vec<String>>,
}

/// Working memory of a pool, not state: it never takes part in equality or snapshots (a restored
/// pool starts with it empty).
#[derive(Debug, Clone, Default)]
struct Cache<T>(T);

impl<T> PartialEq for Cache<T> {
    fn eq(&self, _: &Cache<T>) -> bool {
        true
    }
}

fn state_index(s: HealthState) -> usize {
    s as usize
}

/// What an outcome signal carries, from a call or a probe.
struct Outcome<'a> {
    id: &'a str,
    endpoint: &'a str,
    source: Source,
    class: OutcomeClass,
    latency_us: i64,
    ttft_us: Option<i64>,
    retry_after_ms: Option<i64>,
    /// A probe that reported the endpoint's dependencies.
    reports_dependencies: bool,
}

impl Outcome<'_> {
    /// When the call or probe began, on the engine's clock: its report's stream time less its
    /// latency (no producer clock involved).
    fn started(&self, now: Micros) -> Micros {
        now.saturating_sub(self.latency_us.max(0))
    }
}

/// A transition the rules chose, before it is applied.
struct Change {
    to: HealthState,
    code: ReasonCode,
    reason: String,
    thresholds: Vec<String>,
    triggers: Vec<String>,
    /// For an ejection: what it is for.
    out_for: Option<Dimension>,
    /// For a readmission: on evidence that cannot see the fault.
    canary: bool,
}

impl Change {
    fn new(
        to: HealthState,
        code: ReasonCode,
        reason: String,
        thresholds: Vec<String>,
        triggers: Vec<String>,
    ) -> Change {
        Change {
            to,
            code,
            reason,
            thresholds,
            triggers,
            out_for: None,
            canary: false,
        }
    }
}

/// Deterministic jitter for a retry: up to a quarter of `base`, from the endpoint and the attempt
/// (FNV-1a), so that replaying the log gives the same times and retries of different endpoints
/// (or of one endpoint after each failed trial) never line up with a periodic fault.
fn jitter(pool: &str, endpoint: &str, isolations: u32, attempt: u16, base: i64) -> i64 {
    let h = vitals_contracts::hash::Fnv64::new()
        .bytes(pool.bytes().chain([0]).chain(endpoint.bytes()))
        .bytes(isolations.to_le_bytes())
        .bytes(attempt.to_le_bytes())
        .finish();
    base / 1000 * (h % 250) as i64
}

/// Wilson score interval of `k` successes in `n` trials at width `z`.
fn wilson(k: u64, n: u64, z: f64) -> (f64, f64) {
    if n == 0 {
        return (0.0, 1.0);
    }
    let n = n as f64;
    let p = k as f64 / n;
    let z2 = z * z;
    let centre = (p + z2 / (2.0 * n)) / (1.0 + z2 / n);
    let half = z * (p * (1.0 - p) / n + z2 / (4.0 * n * n)).sqrt() / (1.0 + z2 / n);
    ((centre - half).max(0.0), (centre + half).min(1.0))
}

impl PoolState {
    pub fn new(pool: &str, policy: Policy, now: Micros) -> PoolState {
        PoolState {
            pool: pool.to_owned(),
            policy,
            now,
            seq: 0,
            endpoints: HashMap::default(),
            counts: [0; 6],
            refused: 0,
            cooling: 0,
            panic: false,
            correlated_outage: false,
            next_deadline: None,
            scratch: Cache::default(),
            order: Cache::default(),
        }
    }

    pub fn count(&self, s: HealthState) -> u32 {
        self.counts[state_index(s)]
    }

    pub fn total(&self) -> u32 {
        self.endpoints.len() as u32
    }

    /// Fire the timers at `d` at the latest, if `d` is still ahead (None: no timer).
    fn arm(&mut self, d: Option<Micros>) {
        if let Some(d) = d.filter(|d| *d > self.now) {
            self.next_deadline = Some(self.next_deadline.map_or(d, |x| x.min(d)));
        }
    }

    /// Look at every endpoint again at the next signal.
    fn rearm_now(&mut self) {
        self.next_deadline = Some(self.now);
    }

    /// The earliest timer still ahead. A timer that has fired and changed nothing is spent: it
    /// does not fire again at every later signal (it did, and each firing looked at every
    /// endpoint of the pool, so the engine slowed down as more timers were spent).
    fn future_deadline(&self) -> Option<Micros> {
        self.endpoints
            .values()
            .filter_map(|t| t.deadline(&self.policy))
            .filter(|d| *d > self.now)
            .min()
    }

    /// Move stream time and fire the timers that are due.
    pub fn advance(&mut self, now: Micros, out: &mut Vec<Decision>) {
        self.now = self.now.max(now);
        if self.next_deadline.is_none_or(|d| d > self.now) {
            return;
        }
        // Sorted, so that the decisions come in the same order in every run.
        let mut names = std::mem::take(&mut self.order.0);
        if names.len() != self.endpoints.len() {
            names = self.endpoints.keys().cloned().collect();
            names.sort_unstable();
        }
        for name in &names {
            if let Some(change) = self.timer_change(name) {
                self.apply_change(name, change, out);
            }
        }
        self.order.0 = names;
        self.next_deadline = self.future_deadline();
        self.pool_rules(out, None);
    }

    fn timer_change(&mut self, name: &str) -> Option<Change> {
        let now = self.now;
        let policy = &self.policy;
        let t = self.endpoints.get_mut(name)?;
        if t.forced.is_some() {
            return None;
        }
        match t.state {
            HealthState::Unhealthy if t.out_for == Some(Dimension::RateLimit) => {
                t.isolated_until.is_some_and(|u| u <= now).then(|| {
                    Change::new(
                        HealthState::Recovering,
                        ReasonCode::CooldownOver,
                        format!(
                            "cooldown over after {:.1} s; slow start over {} s finds what the upstream takes",
                            now.saturating_sub(t.since) as f64 / 1e6,
                            policy.slow_start_ms / 1000
                        ),
                        vec!["cooldown_over".into()],
                        vec![],
                    )
                })
            }
            HealthState::Unhealthy => {
                if t.isolated_until.is_some_and(|u| u <= now) && !t.trial_open {
                    t.trial_open = true;
                }
                None
            }
            HealthState::Recovering => self.recovery_complete(name),
            _ => {
                if let (Some(silence), false) = (t.heartbeat_silence(now), t.heartbeat_silent) {
                    if silence
                        >= us(t.heartbeat_interval(policy)).saturating_mul(policy.heartbeat_suspect_intervals.into())
                    {
                        t.heartbeat_silent = true;
                    }
                }
                self.automatic_change(name, Vec::new(), None)
            }
        }
    }

    pub fn apply(&mut self, signal: &Signal, out: &mut Vec<Decision>) {
        match signal {
            Signal::Call(c) => {
                let o = Outcome {
                    id: &c.event_id,
                    endpoint: &c.endpoint,
                    source: Source::Call,
                    class: c.outcome,
                    latency_us: c.latency_us,
                    ttft_us: c.ttft_us,
                    retry_after_ms: c.retry_after_ms,
                    reports_dependencies: false,
                };
                self.outcome(o, out);
            }
            Signal::Probe(p) => {
                self.probe_bookkeeping(p);
                let o = Outcome {
                    id: &p.probe_id,
                    endpoint: &p.endpoint,
                    source: Source::Probe(p.kind),
                    class: p.outcome,
                    latency_us: p.latency_us,
                    ttft_us: p.ttft_us,
                    retry_after_ms: None,
                    reports_dependencies: !p.dependencies.is_empty(),
                };
                self.outcome(o, out);
            }
            Signal::Override(o) => self.operator_override(o, out),
            Signal::Policy(p) => self.policy_change(p, out),
            Signal::Tick(_) => {}
        }
    }

    fn tracker(&mut self, endpoint: &str) -> &mut Tracker {
        if !self.endpoints.contains_key(endpoint) {
            self.endpoints
                .insert(endpoint.to_owned(), Box::new(Tracker::new(self.now, &self.policy)));
            self.counts[state_index(HealthState::Healthy)] += 1;
            if self.refused > 0 {
                // A larger pool may eject more: refused ejections are looked at again.
                self.rearm_now();
            }
        }
        self.endpoints.get_mut(endpoint).expect("inserted above")
    }

    fn probe_bookkeeping(&mut self, p: &vitals_contracts::ProbeResult) {
        let now = self.now;
        let t = self.tracker(&p.endpoint);
        if p.kind == ProbeKind::Heartbeat {
            t.last_heartbeat = Some(now);
            t.heartbeat_silent = false;
            if p.interval_ms.is_some() {
                t.heartbeat_interval_ms = p.interval_ms;
            }
        }
        let down = |critical: bool| -> Vec<String> {
            p.dependencies
                .iter()
                .filter(|d| d.critical == critical && d.status == DependencyStatus::Down)
                .map(|d| d.name.clone())
                .collect()
        };
        // A probe without dependency reports says nothing about dependencies.
        if !p.dependencies.is_empty() {
            t.critical_down = down(true);
            t.noncritical_down = down(false);
        }
    }

    fn outcome(&mut self, o: Outcome<'_>, out: &mut Vec<Decision>) {
        let now = self.now;
        // A 200 whose first token took longer than slow_call_ms is a timeout to the user who waited.
        let slow = o.class == OutcomeClass::Success && o.ttft_us.is_some_and(|t| t > us(self.policy.slow_call_ms));
        let class = if slow { OutcomeClass::Timeout } else { o.class };
        if !self.endpoints.contains_key(o.endpoint) {
            self.tracker(o.endpoint);
        }
        let policy = &self.policy;
        let t = self.endpoints.get_mut(o.endpoint).expect("created above");
        let totals = t.record(now, policy, class, o.ttft_us, o.id);
        if class.is_neutral() {
            return;
        }
        if class == OutcomeClass::RateLimited {
            if let Some(ms) = o.retry_after_ms {
                t.retry_after_ms = Some(u32::try_from(ms.max(0)).unwrap_or(u32::MAX));
            }
        }
        let mut check_latency = false;
        let mut check_ttft = false;
        if class == OutcomeClass::Success {
            t.record_latency(o.latency_us, policy);
            check_latency =
                t.latency_samples >= LATENCY_MIN_SAMPLES && (t.latency_samples.is_multiple_of(4) || t.latency_outlier);
            check_ttft = o
                .ttft_us
                .is_some_and(|v| t.ttft_outlier || v as f64 > policy.ttft_max_ms * 1000.0);
        }
        let check_failures = counts_as_failure(class) || t.failure_outlier;
        let state = t.state;
        let in_rotation = matches!(
            state,
            HealthState::Healthy | HealthState::Suspect | HealthState::Degraded
        );
        if check_latency {
            self.check_latency_outlier(o.endpoint);
        }
        if check_ttft && in_rotation {
            self.check_ttft_outlier(o.endpoint, o.ttft_us.unwrap_or(0));
        }
        if check_failures && in_rotation {
            self.check_failure_outlier(o.endpoint);
        }
        let extra = if slow {
            vec![format!("ttft>{}ms", self.policy.slow_call_ms)]
        } else {
            Vec::new()
        };
        let change = match state {
            HealthState::Unhealthy | HealthState::Recovering | HealthState::Maintenance => {
                self.isolated_outcome(&o, class)
            }
            _ if class == OutcomeClass::RateLimited => self.rate_limited(o.endpoint),
            _ => self.automatic_change(o.endpoint, extra, Some(totals)),
        };
        if let Some(mut change) = change {
            if change.triggers.is_empty() {
                change.triggers.push(o.id.to_owned());
            }
            self.apply_change(o.endpoint, change, out);
        } else {
            let d = self.endpoints[o.endpoint].deadline(&self.policy);
            self.arm(d);
        }
        self.pool_rules(out, None);
    }

    /// An outcome for an endpoint that is out of rotation or recovering: evidence that may
    /// readmit it, the router's trial call, or a failure during the slow-start ramp.
    fn isolated_outcome(&mut self, o: &Outcome<'_>, class: OutcomeClass) -> Option<Change> {
        let t = &self.endpoints[o.endpoint];
        if t.forced.is_some() {
            return None;
        }
        // Fresh evidence only: a call that began before the endpoint was ejected or readmitted
        // says nothing about it now (a slow call begun during the fault ends after it).
        let since = match t.state {
            HealthState::Recovering => t.readmitted_at,
            _ => t.last_isolated_at,
        };
        if since.is_some_and(|s| o.started(self.now) < s) {
            return None;
        }
        if t.state == HealthState::Recovering && class == OutcomeClass::RateLimited {
            return self.rate_limited(o.endpoint);
        }
        let dim = t.out_for.unwrap_or(Dimension::Errors);
        let verdict = t.verdict(dim, o.source, class, o.ttft_us, o.reports_dependencies, &self.policy);
        match t.state {
            HealthState::Unhealthy => self.while_out(o, class, dim, verdict),
            HealthState::Recovering if verdict == Verdict::Fail => {
                let what = if counts_as_failure(class) {
                    class.as_str().to_owned()
                } else {
                    format!("first token after {} ms", o.ttft_us.unwrap_or(0) / 1000)
                };
                let thresholds = vec!["failure_while_recovering".into()];
                if self.may_eject() {
                    return Some(Change::new(
                        HealthState::Unhealthy,
                        ReasonCode::FailedWhileRecovering,
                        format!("{what} while recovering; isolated again"),
                        thresholds,
                        vec![o.id.to_owned()],
                    ));
                }
                self.set_refused(o.endpoint, true);
                Some(self.refusal(o.endpoint, thresholds))
            }
            HealthState::Recovering => {
                let m = self.policy.consecutive_successes;
                let t = self.endpoints.get_mut(o.endpoint).expect("known endpoint");
                if t.canary && o.source == Source::Call && verdict == Verdict::Pass {
                    t.canary_calls = t.canary_calls.saturating_add(1);
                    if i32::from(t.canary_calls) >= m {
                        t.canary = false;
                    }
                }
                self.recovery_complete(o.endpoint)
            }
            _ => None,
        }
    }

    /// An outcome while the endpoint is out. Every one is evidence: after the minimum isolation
    /// the first passing one that can see what the endpoint is out for readmits it (two in a row
    /// for a flapping endpoint); one that cannot see it readmits it as a canary. A call after
    /// the isolation is the router's trial. A failure says the fault is still there and starts
    /// the count again; only a failed trial call is a transition (it carries the next trial's time).
    fn while_out(&mut self, o: &Outcome<'_>, class: OutcomeClass, dim: Dimension, verdict: Verdict) -> Option<Change> {
        let now = self.now;
        let policy = &self.policy;
        let t = self.endpoints.get_mut(o.endpoint).expect("known endpoint");
        if dim == Dimension::RateLimit {
            // A cooldown ends by its time, whatever the calls in flight say.
            return None;
        }
        let trial = o.source == Source::Call && t.trial_open;
        let what = match o.source {
            Source::Call => "a call".to_owned(),
            Source::Probe(k) => format!("a {} probe", k.as_str()),
        };
        match verdict {
            Verdict::Neutral => None,
            Verdict::Fail => {
                t.passes_while_out = 0;
                trial.then(|| {
                    Change::new(
                        HealthState::Unhealthy,
                        ReasonCode::TrialFailed,
                        format!("trial after isolation failed ({})", class.as_str()),
                        vec!["trial_failed".into()],
                        vec![o.id.to_owned()],
                    )
                })
            }
            Verdict::Pass | Verdict::Canary => {
                t.passes_while_out = t.passes_while_out.saturating_add(1);
                let canary = verdict == Verdict::Canary;
                let ramp = format!("slow start over {} s", policy.slow_start_ms / 1000);
                let mut change = if trial {
                    Change::new(
                        HealthState::Recovering,
                        ReasonCode::TrialSucceeded,
                        format!("trial after isolation succeeded; {ramp}"),
                        vec!["trial_succeeded".into()],
                        vec![o.id.to_owned()],
                    )
                } else if t.readmittable(now, policy) && t.passes_while_out >= t.passes_needed() {
                    let out_s = now.saturating_sub(t.last_isolated_at.unwrap_or(now)) / 1_000_000;
                    let passes = t.passes_while_out;
                    let reason = if canary {
                        format!(
                            "{what} passed after {out_s} s out but cannot see {}: readmitted as a canary at weight {}; real calls decide",
                            dim.as_str(),
                            policy.slow_start_weight
                        )
                    } else {
                        format!(
                            "{what} passed after {out_s} s out (ejected for {}); readmitted, {ramp}",
                            dim.as_str()
                        )
                    };
                    Change::new(
                        HealthState::Recovering,
                        ReasonCode::Readmitted,
                        reason,
                        vec![
                            format!("passing_evidence>={passes}"),
                            format!("out>={}ms", policy.readmit_min_ms),
                        ],
                        vec![o.id.to_owned()],
                    )
                } else {
                    return None;
                };
                change.canary = canary;
                Some(change)
            }
        }
    }

    /// A 429 for an endpoint in rotation: a run of them (as long as the hard break's) or a share
    /// of at least `rate_limited_share` of the recent calls (at least `min_volume`) starts a cooldown of the upstream's
    /// Retry-After (else the policy's), with no isolation backoff. A cooldown takes an ejection
    /// slot; with none free the endpoint keeps serving, and nothing suspects an outage.
    fn rate_limited(&mut self, name: &str) -> Option<Change> {
        let now = self.now;
        let policy = &self.policy;
        let t = &self.endpoints[name];
        if t.forced.is_some() {
            return None;
        }
        // Over the most recent third of the window, like the peer comparison: a storm that
        // began 5 s ago is a small share of a 30 s window.
        let limited = t.recent_totals(now, policy).get(OutcomeClass::RateLimited);
        let all = t.recent_rate(now, policy).counted() + limited;
        let by_run = i32::from(t.consecutive_rate_limited) >= policy.hard_break_after;
        let by_share = all >= policy.min_volume as u64 && limited as f64 >= policy.rate_limited_share * all as f64;
        if !(by_run || by_share) || !self.may_eject() {
            return None;
        }
        let mut thresholds = Vec::new();
        if by_run {
            thresholds.push(format!("consecutive_429>={}", policy.hard_break_after));
        }
        if by_share {
            thresholds.push(format!("429_share>={}", policy.rate_limited_share));
        }
        let ms = self.cooldown_ms(t);
        let source = if t.retry_after_ms.is_some() {
            "the upstream's Retry-After"
        } else {
            "the policy's cooldown"
        };
        let mut change = Change::new(
            HealthState::Unhealthy,
            ReasonCode::Cooldown,
            format!(
                "rate limited: {limited} of the last {all} calls were 429s; cooling down for {:.1} s ({source}), no isolation backoff",
                ms as f64 / 1000.0
            ),
            thresholds,
            vec![],
        );
        change.out_for = Some(Dimension::RateLimit);
        Some(change)
    }

    fn cooldown_ms(&self, t: &Tracker) -> i64 {
        t.retry_after_ms
            .map_or(self.policy.cooldown_ms, i64::from)
            .clamp(1, self.policy.isolation_max_ms.max(1))
    }

    fn recovery_complete(&self, name: &str) -> Option<Change> {
        let t = &self.endpoints[name];
        let m = self.policy.consecutive_successes as u32;
        (t.consecutive_successes >= m && !t.canary && t.ramp_until.is_none_or(|r| r <= self.now)).then(|| {
            Change::new(
                HealthState::Healthy,
                ReasonCode::Recovered,
                format!(
                    "{} consecutive successes and slow start complete",
                    t.consecutive_successes
                ),
                vec![format!("consecutive_successes>={m}")],
                vec![],
            )
        })
    }

    /// The automatic rules for an endpoint in rotation (healthy, suspect or degraded).
    fn automatic_change(&mut self, name: &str, extra: Vec<String>, totals: Option<Rate>) -> Option<Change> {
        let now = self.now;
        let policy = &self.policy;
        let t = &self.endpoints[name];
        if t.forced.is_some() {
            return None;
        }
        let totals = totals.unwrap_or_else(|| t.rate(now, policy));
        let state = t.state;
        let slow = !extra.is_empty();
        // The rules are evaluated at every timer of the pool; the thresholds are only spelled
        // out when the state changes (building them for an endpoint that stays put was most of
        // the engine's time once timers fired often).
        if t.ejectable(&totals, policy, now) && !self.may_eject() && t.eject_refused && state == HealthState::Degraded {
            return None;
        }
        let eject = t.eject_causes(&totals, policy, now);
        if !eject.is_empty() {
            let mut thresholds = extra;
            thresholds.extend(eject);
            if self.may_eject() {
                let reason = format!(
                    "ejected: {} (failure rate {:.0}% of {} calls, score {:.0})",
                    thresholds.join(", "),
                    totals.failure_rate() * 100.0,
                    totals.counted(),
                    t.score
                );
                let mut reason = reason;
                if t.failure_outlier {
                    let own = t.recent_rate(now, policy);
                    let (peers, n) = self.peer_failures(name);
                    reason.push_str(&format!(
                        "; last {} s: {} of {} calls failed, its {n} peers {} of {}",
                        policy.window_ms / 3000,
                        own.failed,
                        own.counted(),
                        peers.failed,
                        peers.counted()
                    ));
                }
                let triggers = t.failure_ids.clone();
                let mut change = Change::new(
                    HealthState::Unhealthy,
                    ReasonCode::Ejected,
                    reason,
                    thresholds,
                    triggers,
                );
                change.out_for = Some(t.eject_dimension(&totals, policy, now, slow));
                return Some(change);
            }
            let newly_refused = !t.eject_refused;
            self.set_refused(name, true);
            if state != HealthState::Degraded || newly_refused {
                return Some(self.refusal(name, thresholds));
            }
            return None;
        }
        if t.eject_refused {
            // Kept serving through a suspected shared outage, and the latest outcomes pass: it
            // is judged on what happens from now on, not on the outage's window.
            self.set_refused(name, false);
            let t = self.endpoints.get_mut(name).expect("known endpoint");
            t.forget_outage(now);
            let successes = t.consecutive_successes;
            if state == HealthState::Degraded && !t.degradable(&self.policy) {
                return Some(Change::new(
                    HealthState::Healthy,
                    ReasonCode::OutageOver,
                    "kept serving through a suspected shared outage; the calls since pass, so it is judged on them"
                        .to_owned(),
                    vec![format!("consecutive_successes>={successes}")],
                    vec![],
                ));
            }
        }
        let t = &self.endpoints[name];
        let policy = &self.policy;
        if state == HealthState::Degraded && t.degradable(policy) {
            return None;
        }
        let degrade = t.degrade_causes(policy);
        if !degrade.is_empty() {
            let mut thresholds = extra;
            thresholds.extend(degrade);
            let reason = format!(
                "degraded: {} (score {:.0}, weight {})",
                thresholds.join(", "),
                t.score,
                policy.degraded_weight
            );
            let triggers = t.failure_ids.clone();
            return Some(Change::new(
                HealthState::Degraded,
                ReasonCode::Degraded,
                reason,
                thresholds,
                triggers,
            ));
        }
        let suspicious = t.suspicious(&totals, policy);
        match state {
            HealthState::Healthy if suspicious => {
                let suspect = t.suspect_causes(&totals, policy);
                let reason = format!("suspect: {}", suspect.join(", "));
                let triggers = t.failure_ids.clone();
                Some(Change::new(
                    HealthState::Suspect,
                    ReasonCode::Suspect,
                    reason,
                    suspect,
                    triggers,
                ))
            }
            HealthState::Suspect if !suspicious && t.consecutive_successes >= policy.consecutive_successes as u32 => {
                Some(Change::new(
                    HealthState::Healthy,
                    ReasonCode::Cleared,
                    format!("{} consecutive successes", t.consecutive_successes),
                    vec![format!("consecutive_successes>={}", policy.consecutive_successes)],
                    vec![],
                ))
            }
            HealthState::Degraded
                if !suspicious
                    && t.above_since
                        .is_some_and(|s| now.saturating_sub(s) >= us(policy.recover_hold_ms)) =>
            {
                Some(Change::new(
                    HealthState::Healthy,
                    ReasonCode::Recovered,
                    format!(
                        "score {:.0} held above {} for {} s",
                        t.score,
                        policy.recover_above,
                        policy.recover_hold_ms / 1000
                    ),
                    vec![format!(
                        "score>{}_for_{}ms",
                        policy.recover_above, policy.recover_hold_ms
                    )],
                    vec![],
                ))
            }
            _ => None,
        }
    }

    /// The max-ejection rule said no: keep the endpoint serving, degraded, and let the pool
    /// suspect a shared dependency.
    fn refusal(&self, name: &str, mut thresholds: Vec<String>) -> Change {
        let reason = format!(
            "would eject ({}) but {} of {} endpoints are already out (max {}%): suspected shared dependency, kept serving",
            thresholds.join(", "),
            self.count(HealthState::Unhealthy),
            self.total(),
            self.policy.max_ejection_pct
        );
        thresholds.push(format!("max_ejection_pct={}", self.policy.max_ejection_pct));
        let triggers = self.endpoints[name].failure_ids.clone();
        Change::new(
            HealthState::Degraded,
            ReasonCode::EjectionRefused,
            reason,
            thresholds,
            triggers,
        )
    }

    /// Envoy's rule: never eject more than max_ejection_pct of the pool, but always allow one.
    fn may_eject(&self) -> bool {
        self.count(HealthState::Unhealthy) < self.max_ejected()
    }

    pub fn max_ejected(&self) -> u32 {
        let by_pct = (f64::from(self.total()) * self.policy.max_ejection_pct / 100.0).floor() as u32;
        by_pct.max(1)
    }

    fn set_refused(&mut self, name: &str, refused: bool) {
        let t = self.endpoints.get_mut(name).expect("known endpoint");
        if t.eject_refused != refused {
            t.eject_refused = refused;
            if refused {
                self.refused += 1;
            } else {
                self.refused -= 1;
            }
        }
    }

    /// The median latency EWMA of `name`'s peers that have enough samples (and, for the rule,
    /// are in rotation); None with fewer than `min_peers` of them.
    fn peer_median(&mut self, name: &str, in_rotation_only: bool, min_peers: usize) -> Option<f64> {
        let mut peers = std::mem::take(&mut self.scratch.0);
        peers.clear();
        peers.extend(
            self.endpoints
                .iter()
                .filter(|(n, t)| {
                    n.as_str() != name
                        && t.latency_samples >= LATENCY_MIN_SAMPLES
                        && !(in_rotation_only && t.state == HealthState::Unhealthy)
                })
                .map(|(_, t)| t.latency_ewma_ms),
        );
        let median = (!peers.is_empty() && peers.len() >= min_peers).then(|| {
            let mid = peers.len() / 2;
            *peers.select_nth_unstable_by(mid, f64::total_cmp).1
        });
        self.scratch.0 = peers;
        median
    }

    fn check_latency_outlier(&mut self, name: &str) {
        let min_peers = self.policy.latency_outlier_min_peers as usize;
        let Some(median) = self.peer_median(name, true, min_peers) else {
            return;
        };
        let policy = &self.policy;
        let factor = policy.latency_outlier_factor;
        let min_ms = policy.latency_outlier_min_ms;
        let t = self.endpoints.get_mut(name).expect("known endpoint");
        let ewma = t.latency_ewma_ms;
        t.latency_outlier = if t.latency_outlier {
            // Hysteresis: clear only well inside the limit.
            ewma > factor * median * 0.8
        } else {
            ewma > factor * median && ewma - median > min_ms
        };
    }

    /// The recent failures (see [`Tracker::recent_rate`]) of the peers of `name` in rotation,
    /// pooled, with the number of peers.
    fn peer_failures(&self, name: &str) -> (Rate, u32) {
        let mut peers = (Rate::default(), 0u32);
        for (n, p) in &self.endpoints {
            let routable = matches!(
                p.state,
                HealthState::Healthy | HealthState::Suspect | HealthState::Degraded | HealthState::Recovering
            );
            if n.as_str() != name && routable && p.forced.is_none() {
                let r = p.recent_rate(self.now, &self.policy);
                peers.0.ok += r.ok;
                peers.0.failed += r.failed;
                peers.1 += 1;
            }
        }
        peers
    }

    /// Whether the failure rate of `name` lies significantly above its peers': the lower Wilson
    /// bound of its recent rate above both the upper bound of the peers' pooled rate and the
    /// peers' rate plus `peer_failure_margin`. Only in a pool with at least two other endpoints
    /// in rotation; pools of one or two keep the absolute rules. Cheap checks on the endpoint's
    /// own counts come first, so a healthy endpoint never looks at its peers.
    fn check_failure_outlier(&mut self, name: &str) {
        let policy = &self.policy;
        let own = self.endpoints[name].recent_rate(self.now, policy);
        let margin = policy.peer_failure_margin;
        let z = policy.peer_failure_z;
        let mut outlier = false;
        if own.failed >= 3 && own.failure_rate() > margin && wilson(own.failed, own.counted(), z).0 > margin {
            let (peers, n) = self.peer_failures(name);
            if n >= 2 {
                let low = wilson(own.failed, own.counted(), z).0;
                let high = wilson(peers.failed, peers.counted(), z).1;
                outlier = low > high && low > peers.failure_rate() + margin;
            }
        }
        self.endpoints.get_mut(name).expect("known endpoint").failure_outlier = outlier;
    }

    /// Whether the first tokens of `name` are far slower than its peers': its latest and its
    /// median (of the last 16) above `ttft_max_ms` and above `latency_outlier_factor` × the
    /// median of the peers' medians (at least two peers in rotation with enough samples).
    fn check_ttft_outlier(&mut self, name: &str, latest_us: i64) {
        let policy = &self.policy;
        let max = policy.ttft_max_ms;
        let min = LATENCY_MIN_SAMPLES as usize;
        let t = &self.endpoints[name];
        let mut outlier = false;
        if let Some(own) = t
            .ttft_p(0.5, min)
            .filter(|p| latest_us as f64 > max * 1000.0 && *p > max)
        {
            let mut peers = std::mem::take(&mut self.scratch.0);
            peers.clear();
            peers.extend(
                self.endpoints
                    .iter()
                    .filter(|(n, p)| {
                        n.as_str() != name
                            && matches!(
                                p.state,
                                HealthState::Healthy | HealthState::Suspect | HealthState::Degraded
                            )
                    })
                    .filter_map(|(_, p)| p.ttft_p(0.5, min)),
            );
            if peers.len() >= 2 {
                let mid = peers.len() / 2;
                let median = *peers.select_nth_unstable_by(mid, f64::total_cmp).1;
                outlier = own > policy.latency_outlier_factor * median;
            }
            self.scratch.0 = peers;
        }
        self.endpoints.get_mut(name).expect("known endpoint").ttft_outlier = outlier;
    }

    fn weight(&self, state: HealthState, forced: Option<OverrideAction>) -> (f64, i64) {
        match (state, forced) {
            (_, Some(OverrideAction::ForceHealthy)) => (1.0, 0),
            (HealthState::Healthy | HealthState::Suspect, _) => (1.0, 0),
            (HealthState::Degraded, _) => (self.policy.degraded_weight, 0),
            (HealthState::Recovering, _) => (self.policy.slow_start_weight, self.policy.slow_start_ms),
            (HealthState::Unhealthy | HealthState::Maintenance, _) => (0.0, 0),
        }
    }

    fn apply_change(&mut self, name: &str, change: Change, out: &mut Vec<Decision>) {
        let now = self.now;
        let policy = self.policy.clone();
        let median = if self.endpoints[name].latency_outlier {
            self.peer_median(name, false, 1)
        } else {
            None
        };
        let cooldown = self.cooldown_ms(&self.endpoints[name]);
        let t = self.endpoints.get_mut(name).expect("known endpoint");
        let from = t.state;
        let was_cooling = from == HealthState::Unhealthy && t.out_for == Some(Dimension::RateLimit);
        let mut retry_at = None;
        match change.to {
            HealthState::Unhealthy if t.forced.is_none() => {
                let ms = match change.code {
                    // The same isolation again, jittered: a continuing outage does not grow it.
                    ReasonCode::TrialFailed => {
                        t.failed_trials = t.failed_trials.saturating_add(1);
                        let iso = us(t.isolation(&policy));
                        let j = jitter(&self.pool, name, t.isolations, t.failed_trials, iso);
                        iso.saturating_add(j) / 1000
                    }
                    ReasonCode::Cooldown => {
                        t.retry_after_ms = None;
                        cooldown
                    }
                    _ => t.next_isolation(now, &policy),
                };
                t.out_for = change.out_for.or(t.out_for).or(Some(Dimension::Errors));
                t.isolated_until = Some(now.saturating_add(us(ms)));
                t.trial_open = false;
                t.passes_while_out = 0;
                t.canary = false;
                t.ramp_until = None;
                retry_at = t.isolated_until;
            }
            HealthState::Unhealthy | HealthState::Maintenance => {
                t.out_for = None;
                t.canary = false;
            }
            HealthState::Recovering => {
                t.reset_for_recovery(now);
                t.isolated_until = None;
                t.trial_open = false;
                t.passes_while_out = 0;
                t.canary = change.canary;
                t.canary_calls = 0;
                if was_cooling {
                    // The end of a cooldown is not a readmission: a later ejection is no flap.
                    t.out_for = None;
                } else {
                    t.readmitted_at = Some(now);
                }
                t.ramp_until = Some(now.saturating_add(us(policy.slow_start_ms)));
            }
            HealthState::Healthy => {
                t.isolated_until = None;
                t.trial_open = false;
                t.ramp_until = None;
                t.out_for = None;
                t.canary = false;
            }
            _ => {}
        }
        let cooling = change.to == HealthState::Unhealthy && t.out_for == Some(Dimension::RateLimit);
        t.state = change.to;
        t.since = now;
        t.seq += 1;
        let forced = t.forced;
        let evidence = t.evidence(now, &policy, change.thresholds, median);
        if change.code == ReasonCode::Cooldown {
            // Judged afresh when the cooldown ends: the 429s that started it are in the evidence.
            t.reset_for_recovery(now);
        }
        let seq = t.seq as i64;
        match (was_cooling, cooling) {
            (false, true) => self.cooling += 1,
            (true, false) => self.cooling -= 1,
            _ => {}
        }
        self.counts[state_index(from)] -= 1;
        self.counts[state_index(change.to)] += 1;
        let (weight, ramp_ms) = self.weight(change.to, forced);
        let d = self.endpoints[name].deadline(&policy);
        self.arm(d);
        if from == HealthState::Unhealthy && self.refused > 0 {
            // An ejection slot came free: the endpoints whose ejection was refused are looked at
            // again at the next signal.
            if matches!(change.to, HealthState::Recovering | HealthState::Healthy) && !was_cooling {
                // An endpoint came back, so the shared cause may be gone: those kept serving
                // through it are judged on what they do from now on, not on the outage's window
                // (they were ejected on it seconds after an outage ended, their latest calls fine).
                for t in self.endpoints.values_mut().filter(|t| t.eject_refused) {
                    t.forget_outage(now);
                }
            }
            self.rearm_now();
        }
        let reason = match retry_at {
            Some(r) => format!(
                "{}; isolated for {} s",
                change.reason,
                r.saturating_sub(now) / 1_000_000
            ),
            None => change.reason,
        };
        out.push(Decision::Endpoint(Box::new(HealthChanged {
            transition_id: vitals_contracts::keys::transition_id(&self.pool, name, seq),
            pool: self.pool.clone(),
            endpoint: name.to_owned(),
            seq,
            from_state: from,
            to_state: change.to,
            weight,
            ramp_ms,
            retry_at,
            reason_code: change.code.as_str().to_owned(),
            reason,
            evidence,
            policy_version: policy.version,
            trigger_ids: change.triggers,
            stream_time: now,
        })));
    }

    /// Panic mode and correlated-outage suspicion; a pool event when either flips, or when
    /// `force_reason` says so (policy changes).
    fn pool_rules(&mut self, out: &mut Vec<Decision>, force_reason: Option<String>) {
        let total = self.total();
        let healthy = self.count(HealthState::Healthy);
        // An endpoint cooling down after 429s is not part of an outage.
        let fraction = if total == 0 {
            1.0
        } else {
            f64::from(healthy + self.cooling) / f64::from(total)
        };
        let panic = total > 0 && fraction * 100.0 < self.policy.panic_threshold_pct;
        let correlated = self.refused > 0;
        if panic == self.panic && correlated == self.correlated_outage && force_reason.is_none() {
            return;
        }
        let mut reasons = Vec::new();
        if let Some(r) = force_reason {
            reasons.push(r);
        }
        if correlated != self.correlated_outage {
            reasons.push(if correlated {
                format!(
                    "correlated outage suspected: ejection refused for {} endpoint(s) at max-ejection {}%",
                    self.refused, self.policy.max_ejection_pct
                )
            } else {
                "correlated outage over".to_owned()
            });
        }
        if panic != self.panic {
            reasons.push(if panic {
                format!(
                    "panic mode: {:.0}% healthy is below {}%; route over all endpoints",
                    fraction * 100.0,
                    self.policy.panic_threshold_pct
                )
            } else {
                format!("panic mode over: {:.0}% healthy", fraction * 100.0)
            });
        }
        self.panic = panic;
        self.correlated_outage = correlated;
        self.seq += 1;
        out.push(Decision::Pool(PoolHealthChanged {
            pool: self.pool.clone(),
            seq: self.seq as i64,
            endpoints: total as i32,
            healthy: healthy as i32,
            ejected: self.count(HealthState::Unhealthy) as i32,
            healthy_fraction: fraction,
            panic,
            correlated_outage: correlated,
            reason: reasons.join("; "),
            policy_version: self.policy.version,
            stream_time: self.now,
        }));
    }

    fn operator_override(&mut self, o: &OperatorOverride, out: &mut Vec<Decision>) {
        let t = self.tracker(&o.endpoint);
        let previous = t.forced;
        let (to, forced, code) = match o.action {
            OverrideAction::ForceHealthy => (HealthState::Healthy, Some(o.action), ReasonCode::ForcedHealthy),
            OverrideAction::ForceUnhealthy => (HealthState::Unhealthy, Some(o.action), ReasonCode::ForcedUnhealthy),
            OverrideAction::MaintenanceOn => (HealthState::Maintenance, Some(o.action), ReasonCode::MaintenanceOn),
            OverrideAction::MaintenanceOff | OverrideAction::Clear => match previous {
                None | Some(OverrideAction::ForceHealthy) => (t.state, None, ReasonCode::OverrideCleared),
                Some(_) => (HealthState::Recovering, None, ReasonCode::OverrideCleared),
            },
        };
        t.forced = forced;
        if forced.is_some() && t.eject_refused {
            self.set_refused(&o.endpoint, false);
        }
        let change = Change::new(
            to,
            code,
            format!("{} by {}: {}", action_words(o.action), o.actor, o.reason),
            vec![format!("operator:{}", o.actor)],
            vec![o.override_id.clone()],
        );
        self.apply_change(&o.endpoint, change, out);
        self.pool_rules(out, None);
    }

    fn policy_change(&mut self, p: &PolicyChange, out: &mut Vec<Decision>) {
        let resize = buckets(&p.policy) != buckets(&self.policy) || p.policy.bucket_ms != self.policy.bucket_ms;
        self.policy = p.policy.clone();
        if resize {
            let n = buckets(&self.policy);
            for t in self.endpoints.values_mut() {
                t.window = crate::window::Window::new(n);
            }
        }
        self.next_deadline = self.future_deadline();
        let reason = format!("policy version {} applied by {}", p.policy.version, p.actor);
        self.pool_rules(out, Some(reason));
    }
}

fn action_words(a: OverrideAction) -> &'static str {
    match a {
        OverrideAction::ForceHealthy => "forced healthy",
        OverrideAction::ForceUnhealthy => "forced unhealthy",
        OverrideAction::MaintenanceOn => "maintenance on",
        OverrideAction::MaintenanceOff => "maintenance off",
        OverrideAction::Clear => "override cleared",
    }
}
