//! One pool: its endpoints, its policy, and the dispatch of signals to the rules.
//!
//! The rules live in modules by concern, each looking at the pool and returning what it
//! decided, never writing it: the [`Change`] it wants (or none) from [`ejection`],
//! [`degradation`], [`suspicion`], [`readmission`] and [`cooldown`]; a verdict from [`peers`]
//! (the comparisons with the other endpoints); a [`panic::PoolChange`] from [`panic`] (the
//! pool's own rules). This module records and applies: the outcome into the tracker, the peer
//! verdicts into its flags, a verdict into its phase's run ([`Tracker::tally`], before the
//! readmission rules read it), a change into the tracker's state entry ([`Entry`], in
//! [`PoolState::apply_change`], with the refusal count) and the pool's change into its event.
//! Only the tracker's entry method resets what entering a state resets, and the tracker's
//! [`Phase`](crate::endpoint) makes a state's data exist only in that state.

mod cause;
mod cooldown;
mod degradation;
mod ejection;
mod panic;
mod peers;
mod readmission;
mod scope;
pub mod seen;
mod summary;
mod suspicion;

use crate::endpoint::{buckets, probation_weight, us, Dimension, Entry, Hold, InRotation, Tracker, PROBATION_RAMP_MS};
use crate::window::{counts_as_failure, Rate};
use crate::Decision;
use rustc_hash::FxHashMap as HashMap;
use serde::{Deserialize, Serialize};
use std::ops::ControlFlow;
use vitals_contracts::lateness as clocks;
use vitals_contracts::{
    DependencyStatus, HealthChanged, HealthState, Micros, OperatorOverride, OutcomeClass, OverrideAction, Policy,
    PolicyChange, PoolHealthChanged, ProbeKind, ReasonCode, Signal,
};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PoolState {
    pool: String,
    policy: Policy,
    now: Micros,
    seq: u64,
    #[serde(serialize_with = "crate::sorted")]
    /// Boxed: a small pool's hash table has spare slots, and a spare slot then costs a pointer,
    /// not a whole tracker (this keeps engine state under 1 KB per endpoint).
    endpoints: HashMap<String, Box<Tracker>>,
    /// Endpoints by state, kept with every transition (index: `state_index`).
    counts: [u32; 6],
    refused: u32,
    /// Endpoints out on a rate-limit cooldown: out of rotation, but not an outage (they count
    /// as healthy for panic mode and never as a refused ejection).
    #[serde(default)]
    cooling: u32,
    panic: bool,
    correlated_outage: bool,
    /// The earliest stream time at which some endpoint's timer may fire.
    next_deadline: Option<Micros>,
    /// A reusable buffer for the peer-latency median, so the hot path does not allocate.
    #[serde(skip)]
    scratch: Cache<Vec<f64>>,
    /// Who reported each endpoint's calls, and its scoped decisions ([`scope`]).
    #[serde(default, skip_serializing_if = "HashMap::is_empty", serialize_with = "crate::sorted")]
    books: HashMap<String, Box<scope::Book>>,
    /// Reporters whose calls are set aside for fleet decisions, sorted.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    faulty: Vec<String>,
    /// The endpoint names in sorted order, the order in which timers are evaluated; rebuilt
    /// when an endpoint joins (endpoints never leave).
    #[serde(skip)]
    order: Cache<Vec<String>>,
    /// A reusable buffer for a call's scope names ([`vitals_contracts::scope::of_call_into`]).
    #[serde(skip)]
    call_scopes: Cache<Vec<String>>,
    /// The reports applied lately, by id: one sent twice is applied once ([`seen`]).
    #[serde(default, skip_serializing_if = "seen::Seen::is_empty")]
    seen: seen::Seen,
    /// Reporters' clocks, as their reports show them against stream time ([`clocks`]).
    #[serde(default, skip_serializing_if = "clocks::Clocks::is_empty")]
    clocks: clocks::Clocks,
    /// Reports set aside as late, by endpoint (only endpoints that had some).
    #[serde(default, skip_serializing_if = "HashMap::is_empty", serialize_with = "crate::sorted")]
    late: HashMap<String, clocks::Late>,
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

/// Where an outcome comes from: a real call or a probe of some kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Source {
    Call,
    Probe(ProbeKind),
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
    /// Its latency and first token are the upstream's (not a call marked untimed: a gateway's
    /// cold start).
    timed: bool,
    /// How long before the report's stream time the call began, where its latency does not say
    /// (a call of a summary's: its place in the summary and the summary's longest call).
    began_before: Option<i64>,
}

impl Outcome<'_> {
    /// When the call or probe began, on the engine's clock: its report's stream time less its
    /// latency (no producer clock involved).
    fn started(&self, now: Micros) -> Micros {
        now.saturating_sub(self.began_before.unwrap_or(self.latency_us).max(0))
    }

    /// Whether it is stale evidence to `t` out of rotation or recovering: the call began before
    /// the endpoint was ejected or readmitted (a slow call begun during the fault ends after
    /// it). Recovering, since slow start (or probation) began: a call in flight when a
    /// probation ended was begun during the fault it was on probation for.
    fn stale(&self, t: &Tracker, now: Micros) -> bool {
        let since = match t.state() {
            HealthState::Recovering => Some(t.since()),
            _ => t.last_isolated_at(),
        };
        since.is_some_and(|s| self.started(now) < s)
    }
}

/// The peer comparisons an outcome calls for.
struct Checks {
    latency: bool,
    /// The first-token comparison, with the latest first token (µs).
    ttft: Option<i64>,
    failures: bool,
}

/// A transition a rule chose, before it is applied: the entry it means (the state follows
/// from it), and why.
struct Change {
    entry: Entry,
    code: ReasonCode,
    reason: String,
    thresholds: Vec<String>,
    triggers: Vec<String>,
    /// The max-ejection rule refused its ejection: the pool counts it as refused (until its
    /// shared outage is over).
    refused: bool,
}

impl Change {
    fn new(entry: Entry, code: ReasonCode, reason: String, thresholds: Vec<String>, triggers: Vec<String>) -> Change {
        Change {
            entry,
            code,
            reason,
            thresholds,
            triggers,
            refused: false,
        }
    }

    /// The state it enters.
    fn to(&self) -> HealthState {
        self.entry.state()
    }
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
            books: HashMap::default(),
            faulty: Vec::new(),
            scratch: Cache::default(),
            order: Cache::default(),
            call_scopes: Cache::default(),
            seen: seen::Seen::default(),
            clocks: clocks::Clocks::default(),
            late: HashMap::default(),
        }
    }

    /// Whether `signal` is a report this pool applied within the window before `now` (a call,
    /// a summary or a probe with the same id): applying it again changes nothing.
    pub fn is_repeat(&self, signal: &Signal, now: Micros) -> bool {
        report_id(signal).is_some_and(|id| self.seen.contains(id, now.max(self.now)))
    }

    /// The pool's name.
    pub fn name(&self) -> &str {
        &self.pool
    }

    /// The pool's stream time.
    pub fn now(&self) -> Micros {
        self.now
    }

    /// The policy in force.
    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    /// Panic mode: too few endpoints healthy, so the router spreads over all of them.
    pub fn panic(&self) -> bool {
        self.panic
    }

    /// The max-ejection rule refused an ejection: a shared dependency is suspected.
    pub fn correlated_outage(&self) -> bool {
        self.correlated_outage
    }

    /// Endpoints restored with stored flags their phase could not hold.
    pub fn lossy_restores(&self) -> usize {
        self.endpoints.values().filter(|t| t.restored_lossy()).count()
    }

    /// One endpoint's state.
    pub fn endpoint(&self, name: &str) -> Option<&Tracker> {
        self.endpoints.get(name).map(|t| t.as_ref())
    }

    pub fn count(&self, s: HealthState) -> u32 {
        self.counts[state_index(s)]
    }

    /// Endpoints in the pool.
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

    /// What a timer of `name` changes: a cooldown over, the router's trial opened, slow start
    /// complete, heartbeats gone quiet, the rules of an endpoint in rotation.
    fn timer_change(&mut self, name: &str) -> Option<Change> {
        let now = self.now;
        let t = self.endpoints.get_mut(name)?;
        if t.forced().is_some() {
            return None;
        }
        match t.state() {
            HealthState::Unhealthy if t.out_for() == Some(Dimension::RateLimit) => self.cooldown_over(name),
            HealthState::Unhealthy => {
                t.open_trial_when_due(now);
                None
            }
            HealthState::Recovering => self.recovery_complete(name),
            _ => {
                t.note_heartbeat_silence(now, &self.policy);
                self.automatic_change(name, &[], None)
            }
        }
    }

    /// A call, with the names of its scopes.
    fn call(&mut self, c: &vitals_contracts::CallOutcome, scopes: &[String], out: &mut Vec<Decision>) {
        let refused = vitals_contracts::scope::credential_refused(c);
        let failed = counts_as_failure(c.outcome) || refused;
        let r = scope::Reported {
            endpoint: &c.endpoint,
            id: &c.event_id,
            scopes,
            calls: u64::from(failed || !c.outcome.is_neutral()),
            failures: u64::from(failed),
            trailing: u64::from(failed),
        };
        if !self.endpoints.contains_key(c.endpoint.as_str()) {
            self.tracker(&c.endpoint);
        }
        self.scoped(&r, out);
        if self.set_aside(scopes) {
            return;
        }
        // A gateway's cold start: the outcome counts, its timing is not the upstream's.
        let timed = c
            .attributes
            .get(vitals_contracts::scope::UNTIMED_ATTRIBUTE)
            .is_none_or(|v| v != "true");
        let o = Outcome {
            id: &c.event_id,
            endpoint: &c.endpoint,
            source: Source::Call,
            class: c.outcome,
            latency_us: c.latency_us,
            ttft_us: c.ttft_us.filter(|_| timed),
            retry_after_ms: c.retry_after_ms,
            reports_dependencies: false,
            began_before: None,
            timed,
        };
        self.outcome(o, out);
    }

    pub fn apply(&mut self, signal: &Signal, out: &mut Vec<Decision>, notes: &mut crate::Notes) {
        if report_id(signal).is_some_and(|id| !self.seen.first(id, self.now)) {
            return;
        }
        if self.set_aside_late(signal, out, notes) {
            return;
        }
        match signal {
            Signal::Call(c) => {
                let mut scopes = std::mem::take(&mut self.call_scopes.0);
                let n = vitals_contracts::scope::of_call_into(c, &mut scopes);
                self.call(c, &scopes[..n], out);
                self.call_scopes.0 = scopes;
            }
            Signal::Summary(s) if s.reporters.is_some() => {
                if !self.endpoints.contains_key(s.endpoint.as_str()) {
                    self.tracker(&s.endpoint);
                }
                self.scoped_merged(s, out);
                self.summary(s, out);
            }
            Signal::Summary(s) => {
                // A summary's gateway is a scope when it names one, as a call's is.
                let scopes: Vec<String> = (!s.gateway.is_empty())
                    .then(|| vitals_contracts::scope::name("gateway", &s.gateway))
                    .into_iter()
                    .collect();
                let failures: u64 = s
                    .calls
                    .iter()
                    .filter(|(c, _)| counts_as_failure(*c))
                    .map(|(_, n)| n.max(0) as u64)
                    .sum();
                let r = scope::Reported {
                    endpoint: &s.endpoint,
                    id: &s.summary_id,
                    scopes: &scopes,
                    calls: failures + s.calls.success.max(0) as u64,
                    failures,
                    trailing: s.trailing_failures.max(0) as u64,
                };
                if !self.endpoints.contains_key(s.endpoint.as_str()) {
                    self.tracker(&s.endpoint);
                }
                self.scoped(&r, out);
                if !self.set_aside(&scopes) {
                    self.summary(s, out);
                }
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
                    began_before: None,
                    timed: true,
                };
                self.outcome(o, out);
            }
            Signal::Override(o) => self.operator_override(o, out),
            Signal::Policy(p) => self.policy_change(p, out),
            Signal::Tick(_) => {}
        }
    }

    /// The one rule for late evidence ([`clocks`]): a report later than the window, after its
    /// reporter's clock offset, is set aside whole, whatever its outcome, and counted for its
    /// endpoint. A reporter's clock named off or back is the pool's event.
    fn set_aside_late(&mut self, signal: &Signal, out: &mut Vec<Decision>, notes: &mut crate::Notes) -> bool {
        let Some(r) = report_time(signal) else {
            return false;
        };
        let (lateness, change) = self.clocks.judge(r.kind, r.reporter, r.ended, self.now);
        if let Some(change) = change {
            let reason = change.reason();
            notes.clocks.push((self.pool.clone(), change));
            self.pool_rules(out, Some(reason));
        }
        let window = self.policy.window_ms.saturating_mul(1000).max(1);
        if lateness <= window {
            return false;
        }
        notes.late += r.calls;
        let now = self.now;
        match self.late.get_mut(r.endpoint) {
            Some(l) => l.add(now, window, r.calls),
            None => self
                .late
                .entry(r.endpoint.to_owned())
                .or_default()
                .add(now, window, r.calls),
        }
        true
    }

    /// Reports of `endpoint` set aside as late in this window and the last.
    pub fn late_reports(&self, endpoint: &str) -> u64 {
        let window = self.policy.window_ms.saturating_mul(1000).max(1);
        self.late.get(endpoint).map_or(0, |l| l.count(self.now, window))
    }

    /// The reporters whose clocks this pool has named off, with their offsets (µs; positive is
    /// behind stream time).
    pub fn clocks_off(&self) -> impl Iterator<Item = (String, Micros)> + '_ {
        self.clocks.off()
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
            t.heartbeat(now, p.interval_ms);
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
            t.dependencies(down(true), down(false));
        }
    }

    fn outcome(&mut self, o: Outcome<'_>, out: &mut Vec<Decision>) {
        let now = self.now;
        // A 200 whose first token took longer than slow_call_ms is a timeout to the user who waited.
        let slow = o.class == OutcomeClass::Success && o.ttft_us.is_some_and(|t| t > us(self.policy.slow_call_ms));
        let class = if slow { OutcomeClass::Timeout } else { o.class };
        let t = match self.endpoints.get_mut(o.endpoint) {
            Some(t) => t,
            None => {
                self.tracker(o.endpoint);
                self.endpoints.get_mut(o.endpoint).expect("created above")
            }
        };
        let policy = &self.policy;
        // A failure of a call begun before the endpoint was readmitted (a hung stream of the
        // fault, ending 13 s after it began) says nothing of it since: it stays out of slow
        // start's fresh window and of the runs that take it out again, as a summary's do.
        if t.state() == HealthState::Recovering && counts_as_failure(class) && o.stale(t, now) {
            return;
        }
        let sees_limits = match o.source {
            Source::Probe(kind) => kind == ProbeKind::SyntheticCompletion,
            _ => true,
        };
        let totals = t.record(now, policy, class, o.ttft_us, o.id, sees_limits);
        if class.is_neutral() {
            return;
        }
        if class == OutcomeClass::RateLimited {
            if let Some(ms) = o.retry_after_ms {
                t.note_retry_after(ms);
            }
        }
        let mut check_latency = false;
        let mut check_ttft = false;
        // The latency EWMA is the calls' own: a probe's (a health route's 15 ms, a short
        // completion's) is another distribution, and mixed in at low traffic it made a peer's
        // call look 3× the pool's median.
        if class == OutcomeClass::Success && o.timed {
            if o.source == Source::Call {
                t.record_latency(o.latency_us, policy);
                check_latency = t.latency_check_due(policy);
            }
            check_ttft = o
                .ttft_us
                .is_some_and(|v| t.ttft_outlier() || v as f64 > policy.ttft_max_ms * 1000.0);
        }
        let checks = Checks {
            latency: check_latency,
            ttft: check_ttft.then(|| o.ttft_us.unwrap_or(0)),
            failures: counts_as_failure(class) || t.failure_outlier(),
        };
        self.decide(o.endpoint, o.id, Some(&o), class, slow, checks, totals, out);
    }

    /// The rules after an outcome (or a run of a summary's) was recorded: the peer comparisons
    /// it calls for, then the endpoint's rules for its state (an endpoint out of rotation is
    /// decided by single outcomes only, `o`), then the pool's.
    #[allow(clippy::too_many_arguments)]
    fn decide(
        &mut self,
        endpoint: &str,
        id: &str,
        o: Option<&Outcome<'_>>,
        class: OutcomeClass,
        slow: bool,
        checks: Checks,
        totals: Rate,
        out: &mut Vec<Decision>,
    ) {
        let state = self.endpoints[endpoint].state();
        let in_rotation = matches!(
            state,
            HealthState::Healthy | HealthState::Suspect | HealthState::Degraded
        );
        // The peer comparisons judge; their verdicts are recorded here, before the rules read them.
        let now = self.now;
        if checks.latency {
            let (outlier, median) = self.latency_outlier(endpoint);
            let t = self.endpoints.get_mut(endpoint).expect("known endpoint");
            t.saw_latency_median(median);
            t.set_latency_outlier(outlier, now);
        }
        if let Some(latest) = checks.ttft.filter(|_| in_rotation) {
            let outlier = self.ttft_outlier(endpoint, latest);
            self.endpoints
                .get_mut(endpoint)
                .expect("known endpoint")
                .set_ttft_outlier(outlier);
        }
        if checks.failures && in_rotation {
            let outlier = self.failure_outlier(endpoint);
            self.endpoints
                .get_mut(endpoint)
                .expect("known endpoint")
                .set_failure_outlier(outlier);
        }
        let change = match state {
            HealthState::Unhealthy | HealthState::Recovering | HealthState::Maintenance => {
                o.and_then(|o| self.isolated_outcome(o, class))
            }
            _ if class == OutcomeClass::RateLimited => self.rate_limited(endpoint),
            _ if slow => {
                let extra = [format!("ttft>{}ms", self.policy.slow_call_ms)];
                self.automatic_change(endpoint, &extra, Some(totals))
            }
            _ => self.automatic_change(endpoint, &[], Some(totals)),
        };
        if let Some(mut change) = change {
            if change.triggers.is_empty() {
                change.triggers.push(id.to_owned());
            }
            self.apply_change(endpoint, change, out);
        } else {
            let d = self.endpoints[endpoint].deadline(&self.policy);
            self.arm(d);
        }
        self.pool_rules(out, None);
    }

    /// The automatic rules for an endpoint in rotation (healthy, suspect or degraded), in order:
    /// ejection (or its refusal), the end of a suspected shared outage, degradation, suspicion,
    /// the end of a degradation. `extra` are thresholds the outcome itself crossed.
    fn automatic_change(&mut self, name: &str, extra: &[String], totals: Option<Rate>) -> Option<Change> {
        // One look-up of the endpoint for every rule below (again only after it changes).
        let mut t = &self.endpoints[name];
        if t.forced().is_some() {
            return None;
        }
        let totals = totals.unwrap_or_else(|| t.rate(self.now, &self.policy));
        if let ControlFlow::Break(change) = self.ejection(name, t, extra, &totals) {
            return change;
        }
        if t.eject_refused() {
            // No ejection rule holds any more for an endpoint kept serving through a suspected
            // shared outage: the outage is over for it, and it is judged on the calls since.
            self.set_refused(name, false);
            let now = self.now;
            self.endpoints.get_mut(name).expect("known endpoint").forget_outage(now);
            if let Some(change) = self.shared_outage_over(name) {
                return Some(change);
            }
            t = &self.endpoints[name];
        }
        if let ControlFlow::Break(change) = self.degradation(t, extra) {
            return change;
        }
        let suspicious = self.suspicious(t, &totals);
        self.suspicion(t, &totals, suspicious)
            .or_else(|| self.degradation_over(t, suspicious))
    }

    /// The weight routers give an endpoint, and the ramp to full weight (slow start).
    fn weight(&self, t: &Tracker) -> (f64, i64) {
        match t.state() {
            HealthState::Healthy | HealthState::Suspect => (1.0, 0),
            HealthState::Degraded => (self.policy.degraded_weight, 0),
            // Held on probation, or growing from its weight to full over the ramp.
            HealthState::Recovering if t.probation() => (
                probation_weight(&self.policy, t.out_for()),
                if t.probation_growing() { PROBATION_RAMP_MS } else { 0 },
            ),
            HealthState::Recovering => (self.policy.slow_start_weight, self.policy.slow_start_ms),
            HealthState::Unhealthy | HealthState::Maintenance => (0.0, 0),
        }
    }

    /// What jitters a failed trial's isolation: a hash of the pool's and the endpoint's names.
    fn trial_key(&self, name: &str) -> vitals_contracts::hash::Fnv64 {
        vitals_contracts::hash::Fnv64::new().bytes(self.pool.bytes().chain([0]).chain(name.bytes()))
    }

    /// Enter the state a change asks for, keep the pool's counts, and publish the transition;
    /// unless the failures it is for are one scope's ([`scope`]): then that scope's decision.
    fn apply_change(&mut self, name: &str, change: Change, out: &mut Vec<Decision>) {
        if self.scope_gate(name, &change, out) {
            let d = self.endpoints[name].deadline(&self.policy);
            self.arm(d);
            return;
        }
        self.scopes_superseded(name, change.to(), out);
        let now = self.now;
        let median = if self.endpoints[name].latency_outlier() {
            self.peer_median(name, false, 1)
        } else {
            None
        };
        if change.refused {
            self.set_refused(name, true);
        }
        let to = change.to();
        let t = self.endpoints.get_mut(name).expect("known endpoint");
        let entered = t.enter(change.entry, now, &self.policy, change.thresholds, median);
        let cooling = t.cooling();
        match (entered.was_cooling, cooling) {
            (false, true) => self.cooling += 1,
            (true, false) => self.cooling -= 1,
            _ => {}
        }
        self.counts[state_index(entered.from)] -= 1;
        self.counts[state_index(to)] += 1;
        let (weight, ramp_ms) = self.weight(&self.endpoints[name]);
        let d = self.endpoints[name].deadline(&self.policy);
        self.arm(d);
        if entered.from == HealthState::Unhealthy {
            let back = matches!(to, HealthState::Recovering | HealthState::Healthy);
            self.ejection_slot_freed(back && !entered.was_cooling);
        }
        let mut reason = match entered.retry_at {
            Some(r) => format!("{}; {}", change.reason, self.what_readmits(name, r)),
            None => change.reason,
        };
        let mut evidence = entered.evidence;
        let late = self.late_reports(name);
        if late > 0 {
            evidence.late = late as i64;
            reason.push_str(&format!("; {late} late reports set aside"));
        }
        let seq = entered.seq as i64;
        out.push(Decision::Endpoint(Box::new(HealthChanged {
            transition_id: vitals_contracts::keys::transition_id(&self.pool, name, seq),
            pool: self.pool.clone(),
            endpoint: name.to_owned(),
            seq,
            from_state: entered.from,
            to_state: to,
            weight,
            ramp_ms,
            retry_at: entered.retry_at,
            reason_code: change.code.as_str().to_owned(),
            reason,
            evidence,
            policy_version: self.policy.version,
            trigger_ids: change.triggers,
            stream_time: now,
            scope: None,
        })));
    }

    fn operator_override(&mut self, o: &OperatorOverride, out: &mut Vec<Decision>) {
        let t = self.tracker(&o.endpoint);
        let hold = Hold::of(o.action);
        let (entry, code) = match (hold, t.forced()) {
            (Some(h), _) => (Entry::Operator(h), forced_code(h)),
            // Released from out of rotation: readmitted at slow start.
            (None, Some(OverrideAction::ForceUnhealthy | OverrideAction::MaintenanceOn)) => {
                (Entry::Recovering { probation: false }, ReasonCode::OverrideCleared)
            }
            // Released from forced healthy, or nothing held: the state it is in, entered again.
            (None, _) => (again(t.state()), ReasonCode::OverrideCleared),
        };
        if hold.is_some() && t.eject_refused() {
            self.set_refused(&o.endpoint, false);
        }
        let change = Change::new(
            entry,
            code,
            format!("{} by {}: {}", action_words(o.action), o.actor, o.reason),
            vec![format!("operator:{}", o.actor)],
            vec![o.override_id.clone()],
        );
        self.apply_change(&o.endpoint, change, out);
        self.pool_rules(out, None);
    }

    /// An endpoint came back out of an ejection (not a cooldown): the shared cause may be gone,
    /// so those kept serving through it are judged on what they do from now on, not on the
    /// outage's window (they were ejected on it seconds after an outage ended, their latest
    /// calls fine). Either way an ejection slot came free: refused ejections are looked at again
    /// at the next signal.
    fn ejection_slot_freed(&mut self, back_in_rotation: bool) {
        if self.refused == 0 {
            return;
        }
        if back_in_rotation {
            let now = self.now;
            for t in self.endpoints.values_mut().filter(|t| t.eject_refused()) {
                t.forget_outage(now);
            }
        }
        self.rearm_now();
    }

    /// Count `name` as refused by the max-ejection rule, or no longer.
    fn set_refused(&mut self, name: &str, refused: bool) {
        let t = self.endpoints.get_mut(name).expect("known endpoint");
        if t.eject_refused() != refused {
            t.set_eject_refused(refused);
            if refused {
                self.refused += 1;
            } else {
                self.refused -= 1;
            }
        }
    }

    /// The pool's rules ([`panic`]), and the pool event when they changed something.
    fn pool_rules(&mut self, out: &mut Vec<Decision>, force_reason: Option<String>) {
        let Some(change) = self.pool_change(force_reason) else {
            return;
        };
        self.panic = change.panic;
        self.correlated_outage = change.correlated;
        self.seq += 1;
        out.push(Decision::Pool(PoolHealthChanged {
            pool: self.pool.clone(),
            seq: self.seq as i64,
            endpoints: self.total() as i32,
            healthy: self.count(HealthState::Healthy) as i32,
            ejected: self.count(HealthState::Unhealthy) as i32,
            healthy_fraction: change.healthy_fraction,
            panic: change.panic,
            correlated_outage: change.correlated,
            reason: change.reason,
            policy_version: self.policy.version,
            stream_time: self.now,
            faulty_reporters: self.faulty.clone(),
        }));
    }

    fn policy_change(&mut self, p: &PolicyChange, out: &mut Vec<Decision>) {
        let resize = buckets(&p.policy) != buckets(&self.policy) || p.policy.bucket_ms != self.policy.bucket_ms;
        self.policy = p.policy.clone();
        if resize {
            let n = buckets(&self.policy);
            for t in self.endpoints.values_mut() {
                t.resize_window(n);
            }
        }
        self.next_deadline = self.future_deadline();
        let reason = format!("policy version {} applied by {}", p.policy.version, p.actor);
        self.pool_rules(out, Some(reason));
    }
}

/// The reason code of an operator's hold.
fn forced_code(h: Hold) -> ReasonCode {
    match h {
        Hold::Healthy => ReasonCode::ForcedHealthy,
        Hold::Unhealthy => ReasonCode::ForcedUnhealthy,
        Hold::Maintenance => ReasonCode::MaintenanceOn,
    }
}

/// The entry into `state` again, for an override that releases nothing: in rotation as it is,
/// recovering at slow start, or out by a rule (a new isolation, for what it was out for).
fn again(state: HealthState) -> Entry {
    match InRotation::of(state) {
        Some(s) => Entry::InRotation(s),
        None if state == HealthState::Recovering => Entry::Recovering { probation: false },
        None => Entry::Eject(None),
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

/// The id a report is known by: a call's event id, a summary's id, a probe's id.
/// When a report's calls ended by its reporter's clock, and who reported it.
struct ReportTime<'a> {
    kind: clocks::Kind,
    reporter: &'a str,
    endpoint: &'a str,
    ended: Micros,
    calls: u64,
}

fn report_time(signal: &Signal) -> Option<ReportTime<'_>> {
    Some(match signal {
        Signal::Call(c) => ReportTime {
            kind: clocks::Kind::Gateway,
            reporter: &c.gateway,
            endpoint: &c.endpoint,
            ended: c.occurred_at.saturating_add(c.latency_us.max(0)),
            calls: 1,
        },
        Signal::Summary(s) => ReportTime {
            kind: clocks::Kind::Gateway,
            reporter: &s.gateway,
            endpoint: &s.endpoint,
            ended: s.ended_at,
            calls: OutcomeClass::ALL.iter().map(|c| s.calls.get(*c).max(0) as u64).sum(),
        },
        Signal::Probe(p) => ReportTime {
            kind: clocks::Kind::Prober,
            reporter: &p.prober,
            endpoint: &p.endpoint,
            ended: p.occurred_at.saturating_add(p.latency_us.max(0)),
            calls: 1,
        },
        _ => return None,
    })
}

fn report_id(signal: &Signal) -> Option<&str> {
    match signal {
        Signal::Call(c) => Some(&c.event_id),
        Signal::Summary(s) => Some(&s.summary_id),
        Signal::Probe(p) => Some(&p.probe_id),
        _ => None,
    }
}
