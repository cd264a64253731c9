//! `vitals-healthview`: what a router links. It holds the health of every endpoint — started from
//! the compacted state topic, kept current from the changes topic — and picks an endpoint of a
//! pool by weight. Per-endpoint `seq` drops duplicates and detects gaps; the slow-start ramp is
//! computed locally from `ramp_ms` and the transition's time; pool events give panic mode (spread
//! over every endpoint). A view that hears nothing from the processor (no change, no tick) for
//! `stale_after` is *stale* and keeps routing as last known; after `open_after` it *fails open*
//! and spreads over every endpoint, as in panic mode.
//!
//! **Trials.** An endpoint out of rotation for a fault comes back on evidence: a prober's, or the
//! router's *trial call*, which the transition that took it out announces (`retry_at`: "the
//! router's trial is due in 30 s"). Once it is due, the next pick of the pool is that endpoint,
//! once; the call is reported like any other and the processor readmits the endpoint if it
//! passed, or announces the next trial. A trial with no word after it (its report lost, or an
//! answer that says nothing, like a 4xx) is tried again after [`TRIAL_AGAIN_AFTER_US`]. An
//! endpoint read from the state topic (which carries no trial time) is tried
//! [`TRIAL_UNKNOWN_AFTER_US`] after it went out. No trial while the view is not fresh (nobody
//! would judge it) or the pool panics (every endpoint is in use then), and never for an
//! operator's maintenance.
//!
//! **Scopes.** A view has an [`Identity`] (its router's gateway id, location and credentials,
//! from its configuration). It applies the fleet's transitions and those of its own scopes: an
//! endpoint out for `gateway=g1` is out in g1's view only (weight 0, its trial at the scoped
//! transition's `retry_at`), and a fleet transition out of rotation ends every scoped one.
//! Other scopes' transitions only move the endpoint's seq. A scoped decision is not on the
//! state topic: a view started while one is in force learns it at its next transition.

mod follow;

pub use follow::{follow, follow_with, Config, Event, Follower};

use rustc_hash::FxHashMap as HashMap;
use std::cell::Cell;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;
pub use vitals_contracts::scope::Identity;
use vitals_contracts::{EndpointState, HealthChanged, HealthState, Micros, PoolHealthChanged};

/// An endpoint whose trial time the view does not know (read from the state topic) is tried this
/// long after it went out: the shortest isolation.
pub const TRIAL_UNKNOWN_AFTER_US: Micros = 30_000_000;
/// A trial that brought no transition is tried again after this long.
pub const TRIAL_AGAIN_AFTER_US: Micros = 10_000_000;

#[derive(Debug)]
struct Endpoint {
    /// Shared with every pick that returns it: a pick copies a pointer, not the name.
    name: Arc<str>,
    state: HealthState,
    weight: f64,
    ramp_ms: i64,
    since: Micros,
    seq: i64,
    /// When the router's trial is due, as the latest transition announced.
    retry_at: Option<Micros>,
    /// When this view last let a trial through (0: never); claimed under the read lock.
    trial_sent: AtomicI64,
    /// The scoped decisions of this view's scopes in force: (scope, trial time, since).
    scoped: Vec<(String, Option<Micros>, Micros)>,
}

impl Endpoint {
    /// The state this view routes by: out while a scope of its own is.
    fn effective(&self) -> HealthState {
        if self.scoped.is_empty() {
            self.state
        } else {
            HealthState::Unhealthy
        }
    }

    /// The trial time and the time it went out, of the decision this view routes by.
    fn trial_of(&self) -> (Option<Micros>, Micros) {
        match self.scoped.iter().min_by_key(|(_, r, _)| r.unwrap_or(i64::MAX)) {
            Some((_, retry_at, since)) => (*retry_at, *since),
            None => (self.retry_at, self.since),
        }
    }

    /// Claim its trial if it is due at `now` (see the module's notes): true for one caller only.
    fn claim_trial(&self, now: Micros) -> bool {
        if self.effective() != HealthState::Unhealthy {
            return false;
        }
        let (retry_at, since) = self.trial_of();
        let due = retry_at.unwrap_or(since.saturating_add(TRIAL_UNKNOWN_AFTER_US));
        let sent = self.trial_sent.load(Ordering::Relaxed);
        let due_now = now >= due && (sent < due.max(since) || now.saturating_sub(sent) >= TRIAL_AGAIN_AFTER_US);
        due_now
            && self
                .trial_sent
                .compare_exchange(sent, now, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
    }

    /// The weight now: a recovering endpoint ramps from its weight to 1 over `ramp_ms`.
    fn weight_at(&self, now: Micros) -> f64 {
        if !self.scoped.is_empty() {
            return 0.0;
        }
        self.fleet_weight_at(now)
    }

    /// The fleet's weight now, whatever the scoped decisions.
    fn fleet_weight_at(&self, now: Micros) -> f64 {
        if self.ramp_ms <= 0 || self.weight >= 1.0 {
            return self.weight;
        }
        let done = (now.saturating_sub(self.since) as f64 / (self.ramp_ms as f64 * 1000.0)).clamp(0.0, 1.0);
        self.weight + (1.0 - self.weight) * done
    }
}

#[derive(Debug, Default)]
struct Pool {
    endpoints: Vec<Endpoint>,
    index: HashMap<String, usize>,
    panic: bool,
    correlated_outage: bool,
    seq: i64,
    /// Endpoints out of rotation for a fault: picks look for a due trial only when there are.
    unhealthy: usize,
}

impl Pool {
    /// Keep the count of endpoints out for a fault as one goes from `was` to `is`.
    fn moved(&mut self, was: HealthState, is: HealthState) {
        let out = |s| s == HealthState::Unhealthy;
        match (out(was), out(is)) {
            (false, true) => self.unhealthy += 1,
            (true, false) => self.unhealthy -= 1,
            _ => {}
        }
    }

    /// Whether a pick may be a trial: the view fresh, the pool not panicking, and some endpoint
    /// of it out for a fault.
    fn may_trial(&self, freshness: Freshness) -> bool {
        self.unhealthy > 0 && !self.panic && freshness == Freshness::Fresh
    }
}

impl Pool {
    fn endpoint(&mut self, name: &str) -> &mut Endpoint {
        let i = match self.index.get(name) {
            Some(i) => *i,
            None => {
                self.endpoints.push(Endpoint {
                    name: Arc::from(name),
                    state: HealthState::Healthy,
                    weight: 1.0,
                    ramp_ms: 0,
                    since: 0,
                    seq: -1,
                    retry_at: None,
                    trial_sent: AtomicI64::new(0),
                    scoped: Vec::new(),
                });
                self.index.insert(name.to_owned(), self.endpoints.len() - 1);
                self.endpoints.len() - 1
            }
        };
        &mut self.endpoints[i]
    }
}

/// What applying one event did (the contracts' per-endpoint sequence rule).
pub use vitals_contracts::seq::Applied;

/// Counters of what the view has seen.
#[derive(Debug, Default)]
pub struct Counters {
    pub applied: AtomicU64,
    pub duplicates: AtomicU64,
    pub gaps: AtomicU64,
    /// Times the state topic was read again after a gap.
    pub rereads: AtomicU64,
    /// Trial calls let through to endpoints out of rotation.
    pub trials: AtomicU64,
}

/// How current the view is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Freshness {
    /// The processor was heard from within `stale_after`.
    Fresh,
    /// Silent for longer: picks go on as last known.
    Stale,
    /// Silent for longer than `open_after`: picks spread over every endpoint.
    Open,
}

impl Freshness {
    pub fn as_str(self) -> &'static str {
        match self {
            Freshness::Fresh => "fresh",
            Freshness::Stale => "stale",
            Freshness::Open => "open",
        }
    }
}

#[derive(Debug)]
pub struct HealthView {
    pools: RwLock<HashMap<String, Pool>>,
    pub counters: Counters,
    /// When the processor was last heard from (µs; 0: the view is not followed, always fresh).
    heard: AtomicI64,
    stale_after_us: i64,
    open_after_us: i64,
    /// The scopes whose transitions this view applies besides the fleet's.
    identity: Identity,
}

impl Default for HealthView {
    fn default() -> Self {
        HealthView::with_staleness(Duration::from_secs(15), Duration::from_secs(60))
    }
}

thread_local! {
    /// Seeded per thread from a process-wide counter, so that threads do not pick in step.
    static RNG: Cell<u64> = Cell::new({
        static SEEDS: AtomicU64 = AtomicU64::new(0x9e37_79b9_7f4a_7c15);
        SEEDS.fetch_add(0x6a09_e667_f3bc_c909, Ordering::Relaxed) | 1
    });
}

/// A fast per-thread random number (xorshift64*): picks need spread, not secrecy.
fn random() -> u64 {
    RNG.with(|r| {
        let mut x = r.get();
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        r.set(x);
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    })
}

/// The index of one of `weights` chosen in proportion to its weight, by the random number `r`
/// (None if every weight is 0). This is the view's choice: weighted random, which needs no state
/// per pool, so picks only read (smooth weighted round robin writes per pick; power of two
/// choices by weight strays from the weights: see healthview-bench).
pub fn select_weighted(weights: &[f64], r: u64) -> Option<usize> {
    let total: f64 = weights.iter().sum();
    if total <= 0.0 {
        return None;
    }
    let mut x = (r >> 11) as f64 / (1u64 << 53) as f64 * total;
    for (i, w) in weights.iter().enumerate() {
        if x < *w {
            return Some(i);
        }
        x -= w;
    }
    weights.iter().rposition(|w| *w > 0.0)
}

/// Pools up to this size are picked from with the weights on the stack.
const STACK: usize = 32;

/// The index of one of `n` choices: uniformly when `uniform`, else by `weight` (None if every
/// weight is 0). Each weight is computed once; pools of up to 32 endpoints allocate nothing.
fn weighted(n: usize, weight: impl Fn(usize) -> f64, uniform: bool) -> Option<usize> {
    if n == 0 {
        return None;
    }
    let r = random();
    if uniform {
        return Some((r % n as u64) as usize);
    }
    if n <= STACK {
        let mut w = [0.0; STACK];
        for (i, slot) in w[..n].iter_mut().enumerate() {
            *slot = weight(i);
        }
        select_weighted(&w[..n], r)
    } else {
        select_weighted(&(0..n).map(weight).collect::<Vec<_>>(), r)
    }
}

impl HealthView {
    pub fn new() -> HealthView {
        HealthView::default()
    }

    /// A view that is stale after `stale_after` without a word from the processor, and fails
    /// open after `open_after`.
    pub fn with_staleness(stale_after: Duration, open_after: Duration) -> HealthView {
        HealthView {
            pools: RwLock::default(),
            counters: Counters::default(),
            heard: AtomicI64::new(0),
            stale_after_us: stale_after.as_micros() as i64,
            open_after_us: open_after.max(stale_after).as_micros() as i64,
            identity: Identity::fleet(),
        }
    }

    /// This view as the router `identity` names: it applies the transitions of its scopes too.
    pub fn identified(mut self, identity: Identity) -> HealthView {
        self.identity = identity;
        self
    }

    pub fn identity(&self) -> &Identity {
        &self.identity
    }

    /// The processor was heard from at `now` (a change or a tick on the changes topic).
    pub fn heard(&self, now: Micros) {
        self.heard.fetch_max(now, Ordering::Relaxed);
    }

    /// How current the view is at `now`.
    pub fn freshness(&self, now: Micros) -> Freshness {
        let heard = self.heard.load(Ordering::Relaxed);
        let silent = now.saturating_sub(heard);
        if heard == 0 || silent <= self.stale_after_us {
            Freshness::Fresh
        } else if silent <= self.open_after_us {
            Freshness::Stale
        } else {
            Freshness::Open
        }
    }

    /// An endpoint's state from the compacted state topic (a cold start): kept only if newer.
    pub fn apply_state(&self, s: &EndpointState) {
        let mut pools = self.pools.write().expect("view lock");
        let pool = pools.entry(s.pool.clone()).or_default();
        let ep = pool.endpoint(&s.endpoint);
        if s.seq > ep.seq || ep.seq < 0 {
            let was = ep.effective();
            ep.state = s.state;
            ep.weight = s.weight;
            ep.ramp_ms = s.ramp_ms;
            ep.since = s.since;
            ep.seq = s.seq;
            ep.retry_at = None; // the state topic does not carry it
            if vitals_contracts::scope::ends_scoped(s.state) {
                ep.scoped.clear();
            }
            let is = ep.effective();
            pool.moved(was, is);
        }
    }

    /// A transition from the changes topic.
    pub fn apply_change(&self, h: &HealthChanged) -> Applied {
        let mut pools = self.pools.write().expect("view lock");
        let pool = pools.entry(h.pool.clone()).or_default();
        let ep = pool.endpoint(&h.endpoint);
        let applied = Applied::of((ep.seq >= 0).then_some(ep.seq), h.seq);
        if applied != Applied::Duplicate {
            let was = ep.effective();
            ep.seq = h.seq;
            match &h.scope {
                None => {
                    ep.state = h.to_state;
                    ep.weight = h.weight;
                    ep.ramp_ms = h.ramp_ms;
                    ep.since = h.stream_time;
                    ep.retry_at = h.retry_at;
                    if vitals_contracts::scope::ends_scoped(h.to_state) {
                        ep.scoped.clear();
                    }
                }
                Some(scope) if self.identity.applies(Some(scope)) => {
                    ep.scoped.retain(|(s, _, _)| s != scope);
                    if h.to_state == HealthState::Unhealthy {
                        ep.scoped.push((scope.clone(), h.retry_at, h.stream_time));
                    }
                }
                Some(_) => {} // another scope's: only its seq
            }
            let is = ep.effective();
            pool.moved(was, is);
        }
        let c = match applied {
            Applied::Next => &self.counters.applied,
            Applied::Gap => &self.counters.gaps,
            Applied::Duplicate => &self.counters.duplicates,
        };
        c.fetch_add(1, Ordering::Relaxed);
        applied
    }

    /// A pool decision: panic mode and correlated outage. Returns whether it was new.
    pub fn apply_pool(&self, p: &PoolHealthChanged) -> bool {
        let mut pools = self.pools.write().expect("view lock");
        let pool = pools.entry(p.pool.clone()).or_default();
        if p.seq > pool.seq {
            pool.seq = p.seq;
            pool.panic = p.panic;
            pool.correlated_outage = p.correlated_outage;
            return true;
        }
        false
    }

    /// An endpoint's weight at `now` (µs since the epoch).
    pub fn weight(&self, pool: &str, endpoint: &str, now: Micros) -> Option<f64> {
        let pools = self.pools.read().expect("view lock");
        let p = pools.get(pool)?;
        p.index.get(endpoint).map(|i| p.endpoints[*i].weight_at(now))
    }

    /// The state this view routes by: the fleet's, or out while one of its scopes is.
    pub fn state(&self, pool: &str, endpoint: &str) -> Option<HealthState> {
        let pools = self.pools.read().expect("view lock");
        let p = pools.get(pool)?;
        p.index.get(endpoint).map(|i| p.endpoints[*i].effective())
    }

    pub fn panic(&self, pool: &str) -> bool {
        self.pools.read().expect("view lock").get(pool).is_some_and(|p| p.panic)
    }

    /// Whether the processor sees the whole pool failing together.
    pub fn correlated_outage(&self, pool: &str) -> bool {
        self.pools
            .read()
            .expect("view lock")
            .get(pool)
            .is_some_and(|p| p.correlated_outage)
    }

    /// Claim the due trial of one of `endpoints` (indices into the pool's), counted.
    fn claim_trial(&self, p: &Pool, mut endpoints: impl Iterator<Item = (usize, usize)>, now: Micros) -> Option<usize> {
        let found = endpoints
            .find(|(_, j)| p.endpoints[*j].claim_trial(now))
            .map(|(i, _)| i);
        if found.is_some() {
            self.counters.trials.fetch_add(1, Ordering::Relaxed);
        }
        found
    }

    /// Whether `endpoint` of `pool` is due its trial at `now`, claimed (true for one caller): a
    /// gateway that steers by state rather than by picks (vitals-haproxy) lets traffic through
    /// to it for a while. Same rules as the picks' trials.
    pub fn claim_trial_of(&self, pool: &str, endpoint: &str, now: Micros) -> bool {
        let freshness = self.freshness(now);
        let pools = self.pools.read().expect("view lock");
        let Some(p) = pools.get(pool) else {
            return false;
        };
        let Some(j) = p.index.get(endpoint).copied() else {
            return false;
        };
        p.may_trial(freshness) && self.claim_trial(p, std::iter::once((j, j)), now).is_some()
    }

    /// An endpoint of `pool` chosen by weight at `now` (or one whose trial is due: see the
    /// module's notes); in panic mode, or when the view has failed open, any endpoint,
    /// uniformly. None if the pool is unknown or every weight is 0.
    pub fn pick(&self, pool: &str, now: Micros) -> Option<Arc<str>> {
        let freshness = self.freshness(now);
        let open = freshness == Freshness::Open;
        let pools = self.pools.read().expect("view lock");
        let p = pools.get(pool)?;
        if p.may_trial(freshness) {
            if let Some(i) = self.claim_trial(p, (0..p.endpoints.len()).map(|i| (i, i)), now) {
                return Some(p.endpoints[i].name.clone());
            }
        }
        let i = weighted(p.endpoints.len(), |i| p.endpoints[i].weight_at(now), p.panic || open)?;
        Some(p.endpoints[i].name.clone())
    }

    /// One of `candidates` (endpoints of `pool`, e.g. a router's configured upstreams) chosen
    /// the same way, as its index; one the view does not know yet weighs 1.
    pub fn choose(&self, pool: &str, candidates: &[&str], now: Micros) -> Option<usize> {
        let freshness = self.freshness(now);
        let open = freshness == Freshness::Open;
        let pools = self.pools.read().expect("view lock");
        let p = pools.get(pool);
        if let Some(p) = p.filter(|p| p.may_trial(freshness)) {
            let known = candidates
                .iter()
                .enumerate()
                .filter_map(|(i, c)| p.index.get(*c).map(|j| (i, *j)));
            if let Some(i) = self.claim_trial(p, known, now) {
                return Some(i);
            }
        }
        let weight = |i: usize| {
            p.and_then(|p| p.index.get(candidates[i]).map(|j| &p.endpoints[*j]))
                .map_or(1.0, |e| e.weight_at(now))
        };
        weighted(candidates.len(), weight, open || p.is_some_and(|p| p.panic))
    }

    /// Endpoints known, over every pool.
    pub fn len(&self) -> usize {
        self.pools
            .read()
            .expect("view lock")
            .values()
            .map(|p| p.endpoints.len())
            .sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The pools the view knows, in name order.
    pub fn pool_names(&self) -> Vec<String> {
        let mut names: Vec<String> = self.pools.read().expect("view lock").keys().cloned().collect();
        names.sort_unstable();
        names
    }

    /// Every endpoint of `pool` as a router of identity `who` routes by at `now`: its name, its
    /// state (the fleet's, or out while a scoped decision of one of `who`'s scopes is in force)
    /// and its weight (ramping in slow start; 0 while out for a scope), in the order the view
    /// learnt them. A view of [`Identity::every`] holds every scope's decisions and serves any
    /// `who`; another view knows its own scopes only. Empty for a pool the view does not know.
    pub fn endpoints_for(&self, pool: &str, who: &Identity, now: Micros) -> Vec<(Arc<str>, HealthState, f64)> {
        let pools = self.pools.read().expect("view lock");
        pools.get(pool).map_or_else(Vec::new, |p| {
            p.endpoints
                .iter()
                .map(|e| {
                    if e.scoped.iter().any(|(s, _, _)| who.applies(Some(s))) {
                        (e.name.clone(), HealthState::Unhealthy, 0.0)
                    } else {
                        (e.name.clone(), e.state, e.fleet_weight_at(now))
                    }
                })
                .collect()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_silent_processor_makes_the_view_stale_then_open() {
        let v = HealthView::with_staleness(Duration::from_secs(15), Duration::from_secs(60));
        v.apply_change(&change("a", 1, HealthState::Healthy, 1.0, 0, 0));
        v.apply_change(&change("b", 1, HealthState::Unhealthy, 0.0, 0, 0));
        let s = 1_000_000;
        assert_eq!(v.freshness(s + 100_000_000), Freshness::Fresh, "never followed: fresh");
        v.heard(s);
        assert_eq!(v.freshness(s + 15_000_000), Freshness::Fresh);
        assert_eq!(v.freshness(s + 15_000_001), Freshness::Stale);
        // Stale: as last known, b (weight 0) gets nothing.
        for _ in 0..200 {
            assert_eq!(v.pick("p", s + 30_000_000).as_deref(), Some("a"));
        }
        assert_eq!(v.freshness(s + 60_000_001), Freshness::Open);
        let picked: std::collections::BTreeSet<usize> = (0..200)
            .filter_map(|_| v.choose("p", &["a", "b"], s + 61_000_000))
            .collect();
        assert_eq!(picked.len(), 2, "failed open: every endpoint");
        v.heard(s + 61_000_000);
        assert_eq!(v.freshness(s + 61_000_000), Freshness::Fresh);
    }

    fn change(ep: &str, seq: i64, to: HealthState, weight: f64, ramp_ms: i64, at: Micros) -> HealthChanged {
        HealthChanged {
            transition_id: format!("p/{ep}/{seq}"),
            weight,
            ramp_ms,
            reason_code: "ejected".into(),
            ..HealthChanged::new("p", ep, seq, HealthState::Healthy, to, at)
        }
    }

    /// Pool `p` of `endpoints`, one ejected, in panic mode.
    fn panicking(endpoints: i32) -> PoolHealthChanged {
        PoolHealthChanged {
            pool: "p".into(),
            seq: 1,
            endpoints,
            healthy: 0,
            ejected: 1,
            healthy_fraction: 0.0,
            panic: true,
            correlated_outage: false,
            reason: String::new(),
            policy_version: 0,
            stream_time: 0,
            faulty_reporters: vec![],
        }
    }

    fn out(ep: &str, seq: i64, at: Micros, retry_at: Option<Micros>) -> HealthChanged {
        HealthChanged {
            retry_at,
            ..change(ep, seq, HealthState::Unhealthy, 0.0, 0, at)
        }
    }

    #[test]
    fn a_due_trial_takes_one_pick_and_waits_for_the_next_word() {
        let v = HealthView::new();
        let t0 = 1_000_000_000;
        v.apply_change(&change("a", 1, HealthState::Healthy, 1.0, 0, t0));
        v.apply_change(&out("b", 1, t0, Some(t0 + 30_000_000)));
        v.apply_change(&change("m", 1, HealthState::Maintenance, 0.0, 0, t0));
        let names = ["a", "b", "m"];
        let picks = |at: Micros, n: usize| (0..n).filter_map(|_| v.choose("p", &names, at)).collect::<Vec<_>>();
        v.heard(t0 + 29_000_000);
        assert!(
            picks(t0 + 29_999_999, 200).iter().all(|i| *i == 0),
            "not before it is due"
        );
        v.heard(t0 + 30_000_000);
        let at = picks(t0 + 30_000_000, 200);
        assert_eq!(at[0], 1, "due: the next pick is its trial");
        assert!(at[1..].iter().all(|i| *i == 0), "one trial, not every pick");
        v.heard(t0 + 40_000_000);
        assert_eq!(picks(t0 + 39_999_999, 1), [0]);
        assert_eq!(picks(t0 + 40_000_000, 1), [1], "no word on it after 10 s: tried again");
        // The trial failed: the next one as the processor announced it; pick() too.
        v.apply_change(&out("b", 2, t0 + 41_000_000, Some(t0 + 75_000_000)));
        v.heard(t0 + 75_000_000);
        assert_eq!(v.pick("p", t0 + 74_000_000).as_deref(), Some("a"));
        assert_eq!(v.pick("p", t0 + 75_000_000).as_deref(), Some("b"));
        v.apply_change(&change("b", 3, HealthState::Recovering, 0.1, 30_000, t0 + 76_000_000));
        v.heard(t0 + 200_000_000);
        assert!(!v.claim_trial_of("p", "b", t0 + 200_000_000), "back: no trial");
        assert!(
            !v.claim_trial_of("p", "m", t0 + 200_000_000),
            "an operator's maintenance: never"
        );
        assert_eq!(v.counters.trials.load(Ordering::Relaxed), 3);
    }

    #[test]
    fn no_trial_when_stale_or_in_panic_and_one_from_the_state_topic_after_30_s() {
        let v = HealthView::new();
        let t0 = 1_000_000_000;
        v.apply_state(&EndpointState {
            state: HealthState::Unhealthy,
            weight: 0.0,
            seq: 4,
            since: t0,
            ..EndpointState::first_seen("p", "b", t0, 0)
        });
        v.heard(t0 + 30_000_000);
        assert!(!v.claim_trial_of("p", "b", t0 + 29_999_999));
        assert!(
            !v.claim_trial_of("p", "b", t0 + 46_000_000),
            "stale: nobody would judge it"
        );
        assert!(v.claim_trial_of("p", "b", t0 + 30_000_000), "30 s after it went out");
        assert!(!v.claim_trial_of("p", "b", t0 + 30_000_000), "claimed once");
        v.apply_pool(&panicking(1));
        v.heard(t0 + 45_000_000);
        assert!(
            !v.claim_trial_of("p", "b", t0 + 45_000_000),
            "panic: every endpoint in use"
        );
    }

    #[test]
    fn duplicates_are_dropped_and_gaps_counted() {
        let v = HealthView::new();
        assert_eq!(
            v.apply_change(&change("a", 1, HealthState::Unhealthy, 0.0, 0, 10)),
            Applied::Next
        );
        assert_eq!(
            v.apply_change(&change("a", 1, HealthState::Unhealthy, 0.0, 0, 10)),
            Applied::Duplicate
        );
        assert_eq!(
            v.apply_change(&change("a", 3, HealthState::Healthy, 1.0, 0, 30)),
            Applied::Gap
        );
        assert_eq!(
            v.apply_change(&change("a", 2, HealthState::Recovering, 0.1, 0, 20)),
            Applied::Duplicate
        );
        assert_eq!(v.state("p", "a"), Some(HealthState::Healthy));
        assert_eq!(v.counters.gaps.load(Ordering::Relaxed), 1);
    }

    #[test]
    fn a_view_applies_the_fleets_transitions_and_its_own_scopes_only() {
        let g1 = HealthView::new().identified(Identity::new(Some("g1"), Some("eu"), &[]));
        let g2 = HealthView::new().identified(Identity::new(Some("g2"), Some("us"), &[]));
        let t0 = 1_000_000_000;
        for v in [&g1, &g2] {
            v.apply_change(&change("a", 1, HealthState::Healthy, 1.0, 0, t0));
            v.apply_change(&change("b", 1, HealthState::Healthy, 1.0, 0, t0));
        }
        let scoped = |seq, scope: &str, to, retry_at| HealthChanged {
            scope: Some(scope.into()),
            retry_at,
            ..change(
                "a",
                seq,
                to,
                if to == HealthState::Unhealthy { 0.0 } else { 1.0 },
                0,
                t0 + seq,
            )
        };
        let out = scoped(2, "gateway=g1", HealthState::Unhealthy, Some(t0 + 30_000_000));
        assert_eq!(g1.apply_change(&out), Applied::Next);
        assert_eq!(
            g2.apply_change(&out),
            Applied::Next,
            "another scope's moves the seq: no gap"
        );
        assert_eq!(g1.state("p", "a"), Some(HealthState::Unhealthy));
        assert_eq!(g1.weight("p", "a", t0), Some(0.0));
        assert_eq!(g2.state("p", "a"), Some(HealthState::Healthy));
        assert!((0..100).all(|_| g1.pick("p", t0 + 1).as_deref() == Some("b")));
        assert_eq!(g1.pick("p", t0 + 30_000_000).as_deref(), Some("a"), "the scope's trial");
        // A location's decision applies to every router there.
        g2.apply_change(&scoped(3, "location=us", HealthState::Unhealthy, Some(t0 + 30_000_000)));
        assert_eq!(g2.state("p", "a"), Some(HealthState::Unhealthy));
        g2.apply_change(&scoped(4, "location=us", HealthState::Healthy, None));
        assert_eq!(g2.state("p", "a"), Some(HealthState::Healthy));
        // A fleet transition out of rotation ends the scoped ones.
        g1.apply_change(&change("a", 3, HealthState::Unhealthy, 0.0, 0, t0 + 5));
        g1.apply_change(&change("a", 4, HealthState::Recovering, 0.1, 30_000, t0 + 6));
        assert_eq!(g1.state("p", "a"), Some(HealthState::Recovering));
    }

    #[test]
    fn a_recovering_endpoint_ramps_locally() {
        let v = HealthView::new();
        v.apply_change(&change("a", 1, HealthState::Recovering, 0.1, 30_000, 1_000_000));
        let w = |t| v.weight("p", "a", t).unwrap();
        assert!((w(1_000_000) - 0.1).abs() < 1e-9);
        assert!((w(16_000_000) - 0.55).abs() < 1e-9);
        assert!((w(40_000_000) - 1.0).abs() < 1e-9);
    }

    #[test]
    fn picks_follow_the_weights_and_panic_spreads_over_all() {
        let v = HealthView::new();
        v.apply_change(&change("a", 1, HealthState::Healthy, 1.0, 0, 0));
        v.apply_change(&change("b", 1, HealthState::Degraded, 0.25, 0, 0));
        v.apply_change(&change("c", 1, HealthState::Unhealthy, 0.0, 0, 0));
        let mut counts: std::collections::HashMap<String, u32> = Default::default();
        for _ in 0..50_000 {
            *counts.entry(v.pick("p", 0).unwrap().to_string()).or_default() += 1;
        }
        let share = |e: &str| f64::from(counts.get(e).copied().unwrap_or(0)) / 50_000.0;
        assert!((share("a") - 0.8).abs() < 0.02, "{counts:?}");
        assert!((share("b") - 0.2).abs() < 0.02, "{counts:?}");
        assert_eq!(share("c"), 0.0);
        v.apply_pool(&panicking(3));
        let mut seen = std::collections::BTreeSet::new();
        for _ in 0..1_000 {
            seen.insert(v.pick("p", 0).unwrap());
        }
        assert_eq!(seen.len(), 3, "panic mode spreads over every endpoint");
        assert_eq!(v.pick("nope", 0), None);
    }
}
