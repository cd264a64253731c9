//! What vitals-xds serves, at any moment, to a client of any identity: a health view that keeps
//! every scope's decisions ([`Identity::every`]), the address map, trials, and a generation that
//! moves whenever an answer may have changed (a transition, a pool event, a ramp's step, a trial,
//! the view going stale or failing open), which wakes the streams.

use crate::map::AddressMap;
use crate::resources::{self, Assign, Built, Degraded, LbPolicy, Served};
use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::watch;
use vitals_contracts::{HealthState, Micros};
use vitals_healthview::{Freshness, HealthView, Identity};
use vitals_runtime::metrics::Counter;

/// How long an endpoint out of rotation whose trial is due is served in rotation, at
/// [`TRIAL_SHARE`] of full weight: the calls clients send it meanwhile are its trial, which the
/// processor readmits it on (no prober needed), as vitals-haproxy lets HAProxy try a server.
pub const TRIAL_WINDOW: Duration = Duration::from_secs(3);
pub const TRIAL_SHARE: f64 = 0.1;

pub struct Table {
    view: Arc<HealthView>,
    map: AddressMap,
    policy: LbPolicy,
    /// (pool, endpoint) → the end of its trial window.
    trials: Mutex<HashMap<(String, String), Micros>>,
    generation: watch::Sender<u64>,
    /// A fingerprint of what the fleet is served, taken each second: the generation moves when
    /// it changes (ramps, trials, freshness).
    fingerprint: AtomicU64,
    /// Endpoints left out of answers for want of an address (`vitals_xds_unmapped_endpoints`).
    unmapped: Counter,
    /// What was built in this generation, by what it depends on: ten thousand streams of a few
    /// identities build each answer once per change, not once each.
    cache: Mutex<Cache>,
}

#[derive(Default)]
struct Cache {
    generation: u64,
    pools: Option<Arc<Vec<String>>>,
    built: HashMap<CacheKey, Built>,
}

/// What a built resource depends on besides the generation: its type and pool, and for an
/// assignment the client's scopes and how it is told of degraded endpoints.
#[derive(Hash, PartialEq, Eq)]
struct CacheKey {
    type_url: &'static str,
    pool: String,
    scopes: Vec<String>,
    degraded: Degraded,
}

impl Table {
    pub fn new(view: Arc<HealthView>, map: AddressMap, policy: LbPolicy, unmapped: Counter) -> Table {
        Table {
            view,
            map,
            policy,
            trials: Mutex::default(),
            generation: watch::Sender::new(0),
            fingerprint: AtomicU64::new(0),
            unmapped,
            cache: Mutex::default(),
        }
    }

    pub fn view(&self) -> &HealthView {
        &self.view
    }

    /// Wake every stream: something it serves may have changed.
    pub fn bump(&self) {
        self.generation.send_modify(|g| *g += 1);
    }

    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.generation.subscribe()
    }

    /// Once a second: open the trials that are due, close the windows that are over, and wake
    /// the streams if what the fleet is served has changed since the last look (a ramp's step,
    /// the view gone stale or open).
    pub fn tick(&self, now: Micros) {
        let mut changed = false;
        {
            let mut trials = self.trials.lock().expect("trials lock");
            let before = trials.len();
            trials.retain(|_, until| *until > now);
            changed |= trials.len() != before;
            for pool in self.pools() {
                for (ep, state, _) in self.view.endpoints_for(&pool, &Identity::every(), now) {
                    if state == HealthState::Unhealthy && self.view.claim_trial_of(&pool, &ep, now) {
                        let window = i64::try_from(TRIAL_WINDOW.as_micros()).unwrap_or(i64::MAX);
                        trials.insert((pool.clone(), ep.to_string()), now.saturating_add(window));
                        changed = true;
                    }
                }
            }
        }
        let mut h = vitals_contracts::hash::Fnv64::default();
        h = h.bytes([self.view.freshness(now) as u8]);
        for pool in self.pools() {
            for e in self.served(&pool, &Identity::fleet(), now) {
                h = h.parts(&[
                    e.name.as_bytes(),
                    &[e.state as u8],
                    &resources::lb_weight(e.weight).to_le_bytes(),
                ]);
            }
        }
        let f = h.finish();
        if self.fingerprint.swap(f, Ordering::Relaxed) != f || changed {
            self.bump();
        }
    }

    /// The pools served: those the view knows and those the map names.
    pub fn pools(&self) -> Vec<String> {
        let mut pools: BTreeSet<String> = self.view.pool_names().into_iter().collect();
        pools.extend(self.map.pools().map(str::to_owned));
        pools.into_iter().collect()
    }

    /// Pool `pool`'s endpoints as a client of identity `who` is to route by at `now`: the view's
    /// (its scopes' decisions applied), the map's it has no word of (healthy), every one in
    /// rotation at full weight once the view has failed open, and a due trial let in.
    pub fn served(&self, pool: &str, who: &Identity, now: Micros) -> Vec<Served> {
        let open = self.view.freshness(now) == Freshness::Open;
        let mut out: Vec<Served> = self
            .view
            .endpoints_for(pool, who, now)
            .into_iter()
            .map(|(name, state, weight)| Served {
                name: name.to_string(),
                state,
                weight,
            })
            .collect();
        for ep in self.map.endpoints_of(pool) {
            if !out.iter().any(|s| s.name == ep) {
                out.push(Served {
                    name: ep.to_owned(),
                    state: HealthState::Healthy,
                    weight: 1.0,
                });
            }
        }
        let trials = self.trials.lock().expect("trials lock");
        for s in &mut out {
            if open {
                s.state = HealthState::Healthy;
                s.weight = 1.0;
            } else if s.state == HealthState::Unhealthy
                && trials.get(&(pool.to_owned(), s.name.clone())).is_some_and(|u| *u > now)
            {
                s.state = HealthState::Recovering;
                s.weight = TRIAL_SHARE;
            }
        }
        out
    }

    /// The resources of `type_url` named `names` (every pool, for a wildcard: None) as a client
    /// of identity `who` is to get them at `now`, in name order. Names that are no pool served
    /// are left out.
    pub fn resources(
        &self,
        type_url: &str,
        names: Option<&BTreeSet<String>>,
        who: &Identity,
        degraded: Degraded,
        now: Micros,
    ) -> Vec<Built> {
        let Some(type_url) = resources::TYPES.iter().map(|(t, _)| *t).find(|t| *t == type_url) else {
            return Vec::new();
        };
        let generation = *self.generation.borrow();
        let mut cache = self.cache.lock().expect("cache lock");
        if cache.generation != generation {
            *cache = Cache {
                generation,
                ..Cache::default()
            };
        }
        let pools = match &cache.pools {
            Some(p) => p.clone(),
            None => {
                let p = Arc::new(self.pools());
                cache.pools = Some(p.clone());
                p
            }
        };
        let assignment = type_url == resources::ENDPOINTS;
        let mut out = Vec::new();
        for pool in pools.iter().filter(|p| names.is_none_or(|n| n.contains(*p))) {
            let key = CacheKey {
                type_url,
                pool: pool.clone(),
                scopes: if assignment { who.scopes().to_vec() } else { Vec::new() },
                degraded: if assignment { degraded } else { Degraded::default() },
            };
            if let Some(b) = cache.built.get(&key) {
                out.push(b.clone());
                continue;
            }
            let b = self.build(type_url, pool, who, degraded, now);
            cache.built.insert(key, b.clone());
            out.push(b);
        }
        out
    }

    fn build(&self, type_url: &str, pool: &str, who: &Identity, degraded: Degraded, now: Micros) -> Built {
        match type_url {
            resources::LISTENER => Built::of(pool, &resources::listener(pool)),
            resources::ROUTE => Built::of(pool, &resources::route_configuration(pool)),
            resources::CLUSTER => Built::of(pool, &resources::cluster(pool, self.policy)),
            _ => {
                let served = self.served(pool, who, now);
                let assign = Assign {
                    map: &self.map,
                    degraded,
                };
                let (cla, unmapped) = resources::load_assignment(pool, &served, &assign);
                if unmapped > 0 {
                    self.unmapped.inc_by(unmapped as u64);
                }
                Built::of(pool, &cla)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vitals_contracts::HealthChanged;

    const T: Micros = 1_700_000_000_000_000;

    fn change(ep: &str, seq: i64, to: HealthState, weight: f64, scope: Option<&str>) -> HealthChanged {
        HealthChanged {
            weight,
            scope: scope.map(str::to_owned),
            retry_at: (to == HealthState::Unhealthy).then_some(T + 30_000_000),
            ..HealthChanged::new("p", ep, seq, HealthState::Healthy, to, T)
        }
    }

    fn table() -> Table {
        let view =
            HealthView::with_staleness(Duration::from_secs(15), Duration::from_secs(60)).identified(Identity::every());
        view.heard(T);
        Table::new(
            Arc::new(view),
            AddressMap::default(),
            LbPolicy::RoundRobin,
            Counter::default(),
        )
    }

    fn states(t: &Table, who: &Identity, now: Micros) -> Vec<(String, HealthState, u32)> {
        t.served("p", who, now)
            .into_iter()
            .map(|s| (s.name, s.state, resources::lb_weight(s.weight)))
            .collect()
    }

    /// Each client gets the fleet's decisions and its own scope's: an endpoint out for
    /// `gateway=g1` is out for g1's clients only.
    #[test]
    fn a_scoped_decision_is_served_to_its_scope_only() {
        let t = table();
        t.view()
            .apply_change(&change("h:1", 1, HealthState::Healthy, 1.0, None));
        t.view()
            .apply_change(&change("h:1", 2, HealthState::Unhealthy, 0.0, Some("gateway=g1")));
        t.view()
            .apply_change(&change("h:2", 1, HealthState::Degraded, 0.25, None));
        let g1 = Identity::new(Some("g1"), None, &[]);
        let g2 = Identity::new(Some("g2"), Some("eu"), &[]);
        assert_eq!(
            states(&t, &g1, T),
            [
                ("h:1".into(), HealthState::Unhealthy, 1),
                ("h:2".into(), HealthState::Degraded, 25)
            ]
        );
        assert_eq!(
            states(&t, &g2, T),
            [
                ("h:1".into(), HealthState::Healthy, 100),
                ("h:2".into(), HealthState::Degraded, 25)
            ]
        );
        // A fleet ejection ends the scoped one: out for everyone.
        t.view()
            .apply_change(&change("h:1", 3, HealthState::Unhealthy, 0.0, None));
        assert_eq!(states(&t, &g2, T)[0].1, HealthState::Unhealthy);
    }

    /// Silent past `open_after`, every endpoint is served in rotation at full weight; a due trial
    /// lets an endpoint in at a tenth for its window, once.
    #[test]
    fn fail_open_and_trials() {
        let t = table();
        t.view()
            .apply_change(&change("h:1", 1, HealthState::Unhealthy, 0.0, None));
        let fleet = Identity::fleet();
        assert_eq!(states(&t, &fleet, T + 1_000_000)[0].1, HealthState::Unhealthy);
        // The trial is due 30 s on: the tick lets it in for 3 s.
        t.view().heard(T + 31_000_000);
        t.tick(T + 31_000_000);
        assert_eq!(
            states(&t, &fleet, T + 31_500_000)[0],
            ("h:1".into(), HealthState::Recovering, 10)
        );
        t.tick(T + 34_100_000);
        assert_eq!(states(&t, &fleet, T + 34_200_000)[0].1, HealthState::Unhealthy);
        // Nothing heard for over a minute: open.
        assert_eq!(
            states(&t, &fleet, T + 31_000_000 + 61_000_000)[0],
            ("h:1".into(), HealthState::Healthy, 100)
        );
    }

    /// The generation moves when what is served moves with time (a ramp's step), not otherwise.
    #[test]
    fn the_tick_wakes_the_streams_only_for_a_change() {
        let t = table();
        let mut rx = t.subscribe();
        let mut h = change("h:1", 1, HealthState::Recovering, 0.1, None);
        h.ramp_ms = 10_000;
        t.view().apply_change(&h);
        t.tick(T);
        assert!(rx.has_changed().unwrap());
        rx.borrow_and_update();
        t.tick(T);
        assert!(!rx.has_changed().unwrap(), "nothing moved");
        t.tick(T + 5_000_000);
        assert!(rx.has_changed().unwrap(), "the ramp moved the weight");
    }
}
