//! Scoped faults in a closed loop: a fleet of gateways, each a router that follows the fleet's
//! transitions and its own scopes' (as the health views do, trials included), calls a pool of
//! three endpoints with Poisson traffic. A fault is seen by one gateway, one location, one
//! credential, or everyone. Run with the gateways' identities (scoped health) and without
//! (every call anonymous: one shared state, the engine as it was), on the same seeds.

use crate::{Rng, MS, SEC, T0};
use std::collections::BTreeMap;
use vitals_contracts::scope::Identity;
use vitals_contracts::{
    CallOutcome, HealthChanged, HealthState, Micros, OutcomeClass, Policy, ProbeKind, ProbeResult, Signal, Tick,
};
use vitals_engine::{Decision, Engine};

const ENDPOINTS: [&str; 3] = ["a", "b", "c"];
const POOL: &str = "fleet";

/// Who sees a fault of endpoint `a`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Seen {
    /// Gateway g1: its route to `a` refuses connections.
    Gateway,
    /// Every gateway of location eu (half the fleet): timeouts.
    Location,
    /// Gateway g1's credential for `a` is revoked: 401.
    Credential,
    /// Gateway g1 fails to every endpoint (connections refused): a faulty reporter.
    FaultyGateway,
    /// Every gateway: `a` answers 503.
    Everyone,
}

/// One scoped-fault experiment: `gateways` at 4 calls/s each, the fault from 60 s to 240 s.
#[derive(Debug, Clone)]
pub struct FleetScenario {
    pub name: &'static str,
    pub gateways: usize,
    pub seen: Seen,
}

pub fn fleet_scenarios() -> Vec<FleetScenario> {
    let s = |name, gateways, seen| FleetScenario { name, gateways, seen };
    vec![
        s("one_gateway_route_5", 5, Seen::Gateway),
        s("one_gateway_route_20", 20, Seen::Gateway),
        s("one_location_route", 10, Seen::Location),
        s("one_credential_revoked", 5, Seen::Credential),
        s("faulty_gateway", 5, Seen::FaultyGateway),
        s("everyone_sees_it", 5, Seen::Everyone),
    ]
}

const FROM: Micros = 60 * SEC;
const TO: Micros = 240 * SEC;
const END: Micros = 300 * SEC;

/// The figures of one run.
#[derive(Debug, Clone, PartialEq)]
pub struct FleetScore {
    pub name: &'static str,
    /// Capacity the gateways that did not see the fault lost: endpoint-seconds of weight below
    /// 1 in their routing, over the fault.
    pub unaffected_capacity_lost: f64,
    /// Fleet-wide transitions during the fault.
    pub fleet_transitions: u32,
    /// From the fault's start until an affected gateway stopped calling the endpoint (weight
    /// 0 for it, by a scoped or a fleet decision).
    pub affected_out_after: Option<Micros>,
    /// Transitions that changed an affected gateway's routing during the fault.
    pub affected_transitions: u32,
    /// Calls of the affected gateways that failed.
    pub affected_failed: u32,
    pub faulty_named: bool,
}

struct Gateway {
    name: String,
    location: &'static str,
    identity: Identity,
    fleet: BTreeMap<&'static str, f64>,
    /// Own scopes' decisions in force per endpoint: scope → trial time (since the run's start).
    out: BTreeMap<&'static str, BTreeMap<String, Micros>>,
    /// The weight its routing gave each endpoint since this instant.
    lost_from: Micros,
    lost: f64,
}

impl Gateway {
    fn weight(&self, ep: &str) -> f64 {
        if self.out.get(ep).is_some_and(|s| !s.is_empty()) {
            0.0
        } else {
            self.fleet[ep]
        }
    }

    /// Count the capacity lost up to `at` (during the fault).
    fn account(&mut self, at: Micros) {
        let (from, to) = (self.lost_from.max(FROM), at.min(TO));
        if to > from {
            let missing: f64 = ENDPOINTS.iter().map(|e| 1.0 - self.weight(e)).sum();
            self.lost += missing * (to - from) as f64 / SEC as f64;
        }
        self.lost_from = at;
    }

    /// The endpoint of the next call (a due trial first), or none when every weight is 0.
    fn pick(&mut self, now: Micros, rng: &mut Rng) -> Option<&'static str> {
        for (ep, scopes) in &mut self.out {
            if let Some(at) = scopes.values_mut().find(|at| now >= **at) {
                *at = now + 10 * SEC;
                return Some(ep);
            }
        }
        let total: f64 = ENDPOINTS.iter().map(|e| self.weight(e)).sum();
        if total <= 0.0 {
            return None;
        }
        let mut x = rng.unit() * total;
        for e in ENDPOINTS {
            let w = self.weight(e);
            if x < w {
                return Some(e);
            }
            x -= w;
        }
        Some(ENDPOINTS[2])
    }

    /// Apply a transition; true if it changed this gateway's routing.
    fn follow(&mut self, h: &HealthChanged, at: Micros) -> bool {
        if !self.identity.applies(h.scope.as_deref()) {
            return false;
        }
        self.account(at);
        let ep = ENDPOINTS
            .iter()
            .copied()
            .find(|e| *e == h.endpoint)
            .expect("a known endpoint");
        let before = self.weight(ep);
        match &h.scope {
            None => {
                self.fleet.insert(ep, h.weight);
                if vitals_contracts::scope::ends_scoped(h.to_state) {
                    self.out.remove(ep);
                }
            }
            Some(s) if h.to_state == HealthState::Unhealthy => {
                self.out
                    .entry(ep)
                    .or_default()
                    .insert(s.clone(), h.retry_at.map_or(at + 30 * SEC, |r| r - T0));
            }
            Some(s) => {
                self.out.entry(ep).or_default().remove(s);
            }
        }
        before != self.weight(ep) || h.scope.is_some()
    }
}

impl FleetScenario {
    fn affected(&self, g: &Gateway) -> bool {
        match self.seen {
            Seen::Location => g.location == "eu",
            Seen::Everyone => true,
            _ => g.name == "g1",
        }
    }

    fn answer(&self, g: &Gateway, ep: &str, at: Micros) -> (OutcomeClass, Option<i32>) {
        let on = (FROM..TO).contains(&at) && self.affected(g);
        match self.seen {
            _ if !on => (OutcomeClass::Success, Some(200)),
            Seen::FaultyGateway => (OutcomeClass::ConnectError, None),
            _ if ep != "a" => (OutcomeClass::Success, Some(200)),
            Seen::Gateway => (OutcomeClass::ConnectError, None),
            Seen::Location => (OutcomeClass::Timeout, None),
            Seen::Credential => (OutcomeClass::ClientError, Some(401)),
            Seen::Everyone => (OutcomeClass::ServerError, Some(503)),
        }
    }
}

/// One run of `s` with seed `seed`; `scoped`: the gateways say who they are.
pub fn run_fleet(s: &FleetScenario, seed: u64, scoped: bool) -> FleetScore {
    let mut rng = Rng::new(seed);
    let mut engine = Engine::new(Policy::default());
    let mut gateways: Vec<Gateway> = (1..=s.gateways)
        .map(|i| {
            let name = format!("g{i}");
            let location = if i * 2 <= s.gateways { "eu" } else { "us" };
            Gateway {
                identity: Identity::new(Some(&name), Some(location), &[format!("k{i}")]),
                name,
                location,
                fleet: ENDPOINTS.iter().map(|e| (*e, 1.0)).collect(),
                out: BTreeMap::new(),
                lost_from: 0,
                lost: 0.0,
            }
        })
        .collect();
    let mut next: Vec<Micros> = gateways.iter().map(|_| rng.gap(4.0)).collect();
    let mut score = FleetScore {
        name: s.name,
        unaffected_capacity_lost: 0.0,
        fleet_transitions: 0,
        affected_out_after: None,
        affected_transitions: 0,
        affected_failed: 0,
        faulty_named: false,
    };
    let (mut id, mut probe_at, mut ds) = (0u64, 0, Vec::new());
    loop {
        let (i, &at) = next.iter().enumerate().min_by_key(|(_, t)| **t).expect("gateways");
        if at >= END {
            break;
        }
        next[i] = at + rng.gap(4.0);
        ds.clear();
        while probe_at <= at {
            for e in ENDPOINTS {
                id += 1;
                let p = ProbeResult {
                    probe_id: format!("probe-{id}"),
                    pool: POOL.into(),
                    endpoint: e.into(),
                    prober: "scorecard".into(),
                    occurred_at: T0 + probe_at,
                    kind: ProbeKind::Http,
                    outcome: OutcomeClass::Success,
                    latency_us: 20 * MS,
                    ttft_us: None,
                    http_status: Some(200),
                    interval_ms: Some(5_000),
                    dependencies: vec![],
                    detail: String::new(),
                };
                engine.apply(T0 + probe_at, &Signal::Probe(p), &mut ds);
            }
            let tick = Tick {
                ticker: "scorecard".into(),
                emitted_at: T0 + probe_at,
            };
            engine.apply(T0 + probe_at, &Signal::Tick(tick), &mut ds);
            probe_at += 5 * SEC;
        }
        let g = &mut gateways[i];
        let affected = s.affected(g);
        match g.pick(at, &mut rng) {
            None => score.affected_failed += u32::from(affected), // nowhere to send it
            Some(ep) => {
                let (outcome, status) = s.answer(g, ep, at);
                if affected && outcome != OutcomeClass::Success {
                    score.affected_failed += 1;
                }
                id += 1;
                let mut attributes = BTreeMap::new();
                if scoped {
                    attributes.insert("location".to_owned(), g.location.to_owned());
                    attributes.insert("key_id".to_owned(), format!("k{}", &g.name[1..]));
                }
                let gateway = if scoped { g.name.clone() } else { String::new() };
                let call = CallOutcome {
                    http_status: status,
                    latency_us: 80 * MS,
                    attributes,
                    ..CallOutcome::new(format!("call-{id}"), POOL, ep, gateway, T0 + at, outcome)
                };
                engine.apply(T0 + at, &Signal::Call(call), &mut ds);
            }
        }
        for d in &ds {
            match d {
                Decision::Endpoint(h) => {
                    let during = (FROM..TO).contains(&at);
                    if h.scope.is_none() && during {
                        score.fleet_transitions += 1;
                    }
                    for g in gateways.iter_mut() {
                        let changed = g.follow(h, at);
                        if changed && during && s.affected(g) {
                            score.affected_transitions += 1;
                            if g.weight(&h.endpoint) == 0.0 && score.affected_out_after.is_none() {
                                score.affected_out_after = Some(at - FROM);
                            }
                        }
                    }
                }
                Decision::Pool(p) => score.faulty_named |= !p.faulty_reporters.is_empty(),
            }
        }
    }
    for g in &mut gateways {
        g.account(END);
        if !s.affected(g) {
            score.unaffected_capacity_lost += g.lost;
        }
    }
    score
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scoped_faults_cost_the_unaffected_gateways_nothing_and_a_shared_fault_is_as_before() {
        for s in fleet_scenarios() {
            for seed in 1..=3 {
                let after = run_fleet(&s, seed, true);
                let before = run_fleet(&s, seed, false);
                if s.seen == Seen::Everyone {
                    assert_eq!(after.affected_out_after, before.affected_out_after, "{}", s.name);
                    continue;
                }
                assert_eq!(after.unaffected_capacity_lost, 0.0, "{} seed {seed}: {after:?}", s.name);
                assert_eq!(after.fleet_transitions, 0, "{} seed {seed}: {after:?}", s.name);
                assert!(
                    after.affected_out_after.is_some_and(|t| t <= 10 * SEC),
                    "{} seed {seed}: {after:?}",
                    s.name
                );
                if s.seen != Seen::Credential {
                    assert!(
                        before.unaffected_capacity_lost > 0.0,
                        "{} seed {seed}: the shared state lost some: {before:?}",
                        s.name
                    );
                }
                assert_eq!(after.faulty_named, s.seen == Seen::FaultyGateway, "{}", s.name);
            }
        }
    }
}
