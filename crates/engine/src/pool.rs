//! One pool: its endpoints, its policy and the pool-level rules (max-ejection, panic mode,
//! correlated-outage suspicion, peer-relative latency).

use crate::endpoint::{buckets, us, Tracker, LATENCY_MIN_SAMPLES};
use crate::window::Rate;
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
    class: OutcomeClass,
    latency_us: i64,
    ttft_us: Option<i64>,
}

/// A transition the rules chose, before it is applied.
struct Change {
    to: HealthState,
    code: ReasonCode,
    reason: String,
    thresholds: Vec<String>,
    triggers: Vec<String>,
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
                    class: c.outcome,
                    latency_us: c.latency_us,
                    ttft_us: c.ttft_us,
                };
                self.outcome(o, out);
            }
            Signal::Probe(p) => {
                self.probe_bookkeeping(p);
                let o = Outcome {
                    id: &p.probe_id,
                    endpoint: &p.endpoint,
                    class: p.outcome,
                    latency_us: p.latency_us,
                    ttft_us: p.ttft_us,
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
        let mut check_latency = false;
        if class == OutcomeClass::Success {
            t.record_latency(o.latency_us, policy);
            check_latency =
                t.latency_samples >= LATENCY_MIN_SAMPLES && (t.latency_samples.is_multiple_of(4) || t.latency_outlier);
        }
        let state = t.state;
        if check_latency {
            self.check_latency_outlier(o.endpoint);
        }
        let extra = if slow {
            vec![format!("ttft>{}ms", self.policy.slow_call_ms)]
        } else {
            Vec::new()
        };
        let change = match state {
            HealthState::Unhealthy | HealthState::Recovering | HealthState::Maintenance => {
                self.isolated_outcome(o.endpoint, class, o.id)
            }
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

    /// An outcome for an endpoint that is out of rotation: the trial after isolation, or a
    /// signal during the slow-start ramp.
    fn isolated_outcome(&mut self, name: &str, class: OutcomeClass, id: &str) -> Option<Change> {
        let policy = &self.policy;
        let t = &self.endpoints[name];
        if t.forced.is_some() {
            return None;
        }
        let failed = class.is_failure();
        match t.state {
            HealthState::Unhealthy if t.trial_open => Some(if failed {
                Change {
                    to: HealthState::Unhealthy,
                    code: ReasonCode::TrialFailed,
                    reason: format!("trial after isolation failed ({})", class.as_str()),
                    thresholds: vec!["trial_failed".into()],
                    triggers: vec![id.to_owned()],
                }
            } else {
                Change {
                    to: HealthState::Recovering,
                    code: ReasonCode::TrialSucceeded,
                    reason: format!(
                        "trial after isolation succeeded; slow start over {} s",
                        policy.slow_start_ms / 1000
                    ),
                    thresholds: vec!["trial_succeeded".into()],
                    triggers: vec![id.to_owned()],
                }
            }),
            HealthState::Recovering if failed => {
                let thresholds = vec!["failure_while_recovering".into()];
                if self.may_eject() {
                    return Some(Change {
                        to: HealthState::Unhealthy,
                        code: ReasonCode::FailedWhileRecovering,
                        reason: format!("{} while recovering; isolated again", class.as_str()),
                        thresholds,
                        triggers: vec![id.to_owned()],
                    });
                }
                self.set_refused(name, true);
                Some(self.refusal(name, thresholds))
            }
            HealthState::Recovering => self.recovery_complete(name),
            _ => None,
        }
    }

    fn recovery_complete(&self, name: &str) -> Option<Change> {
        let t = &self.endpoints[name];
        let m = self.policy.consecutive_successes as u32;
        (t.consecutive_successes >= m && t.ramp_until.is_none_or(|r| r <= self.now)).then(|| Change {
            to: HealthState::Healthy,
            code: ReasonCode::Recovered,
            reason: format!(
                "{} consecutive successes and slow start complete",
                t.consecutive_successes
            ),
            thresholds: vec![format!("consecutive_successes>={m}")],
            triggers: vec![],
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
                let triggers = t.failure_ids.clone();
                return Some(Change {
                    to: HealthState::Unhealthy,
                    code: ReasonCode::Ejected,
                    reason,
                    thresholds,
                    triggers,
                });
            }
            let newly_refused = !t.eject_refused;
            self.set_refused(name, true);
            if state != HealthState::Degraded || newly_refused {
                return Some(self.refusal(name, thresholds));
            }
            return None;
        }
        if t.eject_refused {
            self.set_refused(name, false);
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
            return Some(Change {
                to: HealthState::Degraded,
                code: ReasonCode::Degraded,
                reason,
                thresholds,
                triggers,
            });
        }
        let suspicious = t.suspicious(policy);
        match state {
            HealthState::Healthy if suspicious => {
                let suspect = t.suspect_causes(policy);
                let reason = format!("suspect: {}", suspect.join(", "));
                let triggers = t.failure_ids.clone();
                Some(Change {
                    to: HealthState::Suspect,
                    code: ReasonCode::Suspect,
                    reason,
                    thresholds: suspect,
                    triggers,
                })
            }
            HealthState::Suspect if !suspicious && t.consecutive_successes >= policy.consecutive_successes as u32 => {
                Some(Change {
                    to: HealthState::Healthy,
                    code: ReasonCode::Cleared,
                    reason: format!("{} consecutive successes", t.consecutive_successes),
                    thresholds: vec![format!("consecutive_successes>={}", policy.consecutive_successes)],
                    triggers: vec![],
                })
            }
            HealthState::Degraded
                if !suspicious
                    && t.above_since
                        .is_some_and(|s| now.saturating_sub(s) >= us(policy.recover_hold_ms)) =>
            {
                Some(Change {
                    to: HealthState::Healthy,
                    code: ReasonCode::Recovered,
                    reason: format!(
                        "score {:.0} held above {} for {} s",
                        t.score,
                        policy.recover_above,
                        policy.recover_hold_ms / 1000
                    ),
                    thresholds: vec![format!(
                        "score>{}_for_{}ms",
                        policy.recover_above, policy.recover_hold_ms
                    )],
                    triggers: vec![],
                })
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
        Change {
            to: HealthState::Degraded,
            code: ReasonCode::EjectionRefused,
            reason,
            thresholds,
            triggers,
        }
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
        let t = self.endpoints.get_mut(name).expect("known endpoint");
        let from = t.state;
        let mut retry_at = None;
        match change.to {
            HealthState::Unhealthy if t.forced.is_none() => {
                let iso = t.next_isolation(now, &policy);
                t.isolated_until = Some(now.saturating_add(us(iso)));
                t.trial_open = false;
                t.ramp_until = None;
                retry_at = t.isolated_until;
            }
            HealthState::Recovering => {
                t.reset_for_recovery(now);
                t.isolated_until = None;
                t.trial_open = false;
                t.ramp_until = Some(now.saturating_add(us(policy.slow_start_ms)));
            }
            HealthState::Healthy => {
                t.isolated_until = None;
                t.trial_open = false;
                t.ramp_until = None;
            }
            _ => {}
        }
        t.state = change.to;
        t.since = now;
        t.seq += 1;
        let forced = t.forced;
        let evidence = t.evidence(now, &policy, change.thresholds, median);
        let seq = t.seq as i64;
        self.counts[state_index(from)] -= 1;
        self.counts[state_index(change.to)] += 1;
        let (weight, ramp_ms) = self.weight(change.to, forced);
        let d = self.endpoints[name].deadline(&policy);
        self.arm(d);
        if from == HealthState::Unhealthy && self.refused > 0 {
            // An ejection slot came free: the endpoints whose ejection was refused are looked at
            // again at the next signal.
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
        let fraction = if total == 0 {
            1.0
        } else {
            f64::from(healthy) / f64::from(total)
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
        let change = Change {
            to,
            code,
            reason: format!("{} by {}: {}", action_words(o.action), o.actor, o.reason),
            thresholds: vec![format!("operator:{}", o.actor)],
            triggers: vec![o.override_id.clone()],
        };
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
