//! Scoped health: a fault one gateway, one location or one credential sees is decided for that
//! scope only, and a fault every reporter sees is decided for the fleet as before. A fleet of
//! gateways calls a pool of three endpoints, each gateway following the fleet's transitions and
//! its own scopes' (as the health views do), trials included.

mod common;

use common::*;
use std::collections::BTreeMap;
use vitals_contracts::scope::Identity;
use vitals_contracts::*;
use vitals_engine::{Decision, Engine};

const ENDPOINTS: [&str; 3] = ["a", "b", "c"];

struct Gateway {
    name: String,
    attributes: BTreeMap<String, String>,
    identity: Identity,
    /// Per endpoint: the fleet's weight, and the own scopes' trial times while out.
    fleet: BTreeMap<&'static str, f64>,
    out: BTreeMap<&'static str, BTreeMap<String, Micros>>,
    next: usize,
}

impl Gateway {
    fn new(i: usize, location: Option<&str>, key: Option<&str>) -> Gateway {
        let name = format!("g{i}");
        let mut attributes = BTreeMap::new();
        if let Some(l) = location {
            attributes.insert("location".to_owned(), l.to_owned());
        }
        if let Some(k) = key {
            attributes.insert("key_id".to_owned(), k.to_owned());
        }
        let keys: Vec<String> = key.into_iter().map(str::to_owned).collect();
        Gateway {
            identity: Identity::new(Some(&name), location, &keys),
            name,
            attributes,
            fleet: ENDPOINTS.iter().map(|e| (*e, 1.0)).collect(),
            out: BTreeMap::new(),
            next: i,
        }
    }

    /// The endpoint of the next call: a due trial of an own scope's, else round robin over
    /// those in rotation for it (every one when none is: panic).
    fn pick(&mut self, now: Micros) -> &'static str {
        for (ep, scopes) in &mut self.out {
            if let Some(at) = scopes.values_mut().find(|at| now >= **at) {
                *at = now + 10 * SEC; // claimed: once, then again after 10 s with no word
                return ep;
            }
        }
        let usable: Vec<&'static str> = ENDPOINTS
            .iter()
            .copied()
            .filter(|e| self.fleet[e] > 0.0 && self.out.get(e).is_none_or(|s| s.is_empty()))
            .collect();
        let from = if usable.is_empty() { ENDPOINTS.to_vec() } else { usable };
        self.next += 1;
        from[self.next % from.len()]
    }

    fn follow(&mut self, h: &HealthChanged) {
        if !self.identity.applies(h.scope.as_deref()) {
            return;
        }
        let ep = ENDPOINTS.iter().copied().find(|e| *e == h.endpoint).unwrap();
        match &h.scope {
            None => {
                self.fleet.insert(ep, h.weight);
                if matches!(h.to_state, HealthState::Unhealthy | HealthState::Maintenance) {
                    self.out.remove(ep);
                }
            }
            Some(s) if h.to_state == HealthState::Unhealthy => {
                self.out.entry(ep).or_default().insert(s.clone(), h.retry_at.unwrap());
            }
            Some(s) => {
                self.out.entry(ep).or_default().remove(s);
            }
        }
    }
}

/// What a call of `gateway` to `ep` answers at `t` (s since start): outcome and status.
type Fault = dyn Fn(&Gateway, &str, i64) -> Option<(OutcomeClass, i32)>;

struct Outcome {
    decisions: Vec<(Micros, Decision)>,
    /// Calls that failed for their user.
    failed: u64,
    calls: u64,
}

impl Outcome {
    fn changes(&self) -> impl Iterator<Item = (Micros, &HealthChanged)> {
        self.decisions.iter().filter_map(|(t, d)| match d {
            Decision::Endpoint(h) => Some((*t, h.as_ref())),
            _ => None,
        })
    }

    fn fleet(&self, ep: &str) -> Vec<(Micros, &HealthChanged)> {
        self.changes()
            .filter(|(_, h)| h.endpoint == ep && h.scope.is_none())
            .collect()
    }

    fn scoped(&self, ep: &str, scope: &str) -> Vec<(Micros, &HealthChanged)> {
        self.changes()
            .filter(|(_, h)| h.endpoint == ep && h.scope.as_deref() == Some(scope))
            .collect()
    }
}

/// How the gateways' calls reach the engine.
enum Path {
    /// One by one.
    Direct,
    /// The mesh shape (docs/fleet.md): each gateway's summarizer, then a merge stage that sums
    /// every gateway's calls to an endpoint and commits every `interval` — with failure caps
    /// of `cap` (0: every failure is summed).
    Merged {
        gateways: Vec<Summarizer>,
        merger: Box<Summarizer>,
        interval: Micros,
        next_flush: Micros,
    },
}

impl Path {
    fn merged(n: usize, cap: u32, interval: Micros) -> Path {
        let cfg = SummaryConfig {
            failure_cap: cap,
            ..SummaryConfig::default()
        };
        let merging = SummaryConfig {
            interval_us: Micros::MAX / 4,
            ..cfg
        };
        Path::Merged {
            gateways: (0..n).map(|i| Summarizer::new(cfg, &format!("g{i}"))).collect(),
            merger: Box::new(Summarizer::merging(merging, "m", "merger")),
            interval,
            next_flush: T0 + interval,
        }
    }

    /// What reaches the engine by `now` once gateway `i` made `call`.
    fn deliver(&mut self, i: usize, call: CallOutcome, now: Micros) -> Vec<Signal> {
        let Path::Merged {
            gateways,
            merger,
            interval,
            next_flush,
        } = self
        else {
            return vec![Signal::Call(call)];
        };
        let mut from_gateways = Vec::new();
        gateways[i].add(call, now, &mut from_gateways);
        let mut out = Vec::new();
        if now >= *next_flush {
            for g in gateways.iter_mut() {
                g.flush_due(now, &mut from_gateways);
            }
        }
        for s in from_gateways {
            match s {
                Signal::Call(c) => merger.add(c, now, &mut out),
                Signal::Summary(x) => merger.add_summary(x, now, &mut out),
                other => out.push(other),
            }
        }
        if now >= *next_flush {
            merger.flush_all(&mut out);
            *next_flush = now + *interval;
        }
        out
    }
}

/// Each gateway calls 4 times a second, in turn, for `secs` seconds; probes of every endpoint
/// pass every 5 s (the health route answers whatever the callers see).
fn run(gateways: &mut [Gateway], fault: &Fault, secs: i64) -> Outcome {
    run_by(gateways, fault, secs, &mut Path::Direct)
}

fn run_by(gateways: &mut [Gateway], fault: &Fault, secs: i64, path: &mut Path) -> Outcome {
    let mut engine = Engine::new(Policy::default());
    let mut out = Outcome {
        decisions: Vec::new(),
        failed: 0,
        calls: 0,
    };
    let n = gateways.len() as i64;
    let step = SEC / (4 * n);
    let mut id = 0u64;
    let mut t = 0;
    while t < secs * SEC {
        let i = ((t / step) % n) as usize;
        let now = T0 + t;
        let g = &mut gateways[i];
        let ep = g.pick(now);
        let (outcome, status) = fault(g, ep, t / SEC).unwrap_or((OutcomeClass::Success, 200));
        id += 1;
        out.calls += 1;
        if outcome != OutcomeClass::Success {
            out.failed += 1;
        }
        let call = CallOutcome {
            http_status: Some(status).filter(|s| *s > 0),
            latency_us: 80 * MS,
            attributes: g.attributes.clone(),
            ..CallOutcome::new(format!("call-{id}"), "p", ep, g.name.clone(), now, outcome)
        };
        let mut ds = Vec::new();
        for signal in path.deliver(i, call, now) {
            ds.extend(engine.step(now, &signal));
        }
        if t % (5 * SEC) < step {
            for (k, e) in ENDPOINTS.iter().enumerate() {
                let p = probe("p", e, id * 10 + k as u64, ProbeKind::Http, OutcomeClass::Success);
                ds.extend(engine.step(now, &stamped(now, &Signal::Probe(p))));
            }
            ds.extend(engine.step(now, &tick()));
        }
        for d in ds {
            if let Decision::Endpoint(h) = &d {
                gateways.iter_mut().for_each(|g| g.follow(h));
            }
            out.decisions.push((t, d));
        }
        t += step;
    }
    out
}

fn fleet_of(n: usize) -> Vec<Gateway> {
    (1..=n).map(|i| Gateway::new(i, None, None)).collect()
}

fn broken_route(from: i64, to: i64) -> impl Fn(&Gateway, &str, i64) -> Option<(OutcomeClass, i32)> {
    move |g, ep, t| (g.name == "g1" && ep == "a" && (from..to).contains(&t)).then_some((OutcomeClass::ConnectError, 0))
}

#[test]
fn one_gateways_broken_route_takes_the_endpoint_out_for_that_gateway_only() {
    for n in [5, 20] {
        let mut gateways = fleet_of(n);
        let out = run(&mut gateways, &broken_route(60, 240), 300);
        assert!(
            out.fleet("a").is_empty(),
            "{n} gateways: no fleet transition: {:?}",
            out.fleet("a")
        );
        let g1 = out.scoped("a", "gateway=g1");
        let (first, h) = g1.first().expect("out for g1");
        assert_eq!(h.to_state, HealthState::Unhealthy);
        assert!(
            *first - 60 * SEC <= 10 * SEC,
            "{n}: out for g1 {} ms after the fault",
            (first - 60 * SEC) / MS
        );
        let during = g1.iter().filter(|(t, _)| *t < 240 * SEC).count();
        eprintln!(
            "{n} gateways: out for g1 after {} ms, {during} scoped transitions during the fault, {} in all; {} of {} calls failed",
            (first - 60 * SEC) / MS,
            g1.len(),
            out.failed,
            out.calls
        );
        assert!(during <= 4, "{n}: {during} transitions for g1 during the fault");
        let (_, last) = g1.last().unwrap();
        assert_ne!(
            last.to_state,
            HealthState::Unhealthy,
            "{n}: back for g1 after the fault"
        );
        assert!(
            h.evidence.thresholds.iter().any(|t| t.starts_with("rest:failed=0/")),
            "{:?}",
            h.evidence.thresholds
        );
        // The scoped transitions share the endpoint's seq: one sequence, no gaps.
        let seqs: Vec<i64> = out
            .changes()
            .filter(|(_, h)| h.endpoint == "a")
            .map(|(_, h)| h.seq)
            .collect();
        assert_eq!(seqs, (1..=seqs.len() as i64).collect::<Vec<_>>());
        assert!(out.changes().all(|(_, h)| h.endpoint == "a"), "b and c untouched");
    }
}

#[test]
fn one_locations_broken_route_is_that_locations_and_one_credential_revoked_is_that_keys() {
    let mut gateways: Vec<Gateway> = (1..=10)
        .map(|i| Gateway::new(i, Some(if i <= 5 { "eu" } else { "us" }), None))
        .collect();
    let eu = |g: &Gateway, ep: &str, t: i64| {
        (g.attributes["location"] == "eu" && ep == "a" && (60..240).contains(&t)).then_some((OutcomeClass::Timeout, 0))
    };
    let out = run(&mut gateways, &eu, 300);
    assert!(out.fleet("a").is_empty(), "{:?}", out.fleet("a"));
    let scoped = out.scoped("a", "location=eu");
    assert!(!scoped.is_empty() && scoped[0].0 - 60 * SEC <= 10 * SEC, "{scoped:?}");
    assert!(scoped.iter().filter(|(t, _)| *t < 240 * SEC).count() <= 4);
    assert!(
        out.changes().all(|(_, h)| h.scope.as_deref() == Some("location=eu")),
        "no gateway of eu alone is blamed"
    );

    let mut gateways: Vec<Gateway> = (1..=5).map(|i| Gateway::new(i, None, Some(&format!("k{i}")))).collect();
    let revoked = |g: &Gateway, ep: &str, t: i64| {
        (g.name == "g1" && ep == "a" && (60..240).contains(&t)).then_some((OutcomeClass::ClientError, 401))
    };
    let out = run(&mut gateways, &revoked, 300);
    assert!(out.fleet("a").is_empty());
    let scoped = out.scoped("a", "gateway=g1");
    assert!(
        !scoped.is_empty(),
        "401s take it out for the caller: {:?}",
        out.changes().collect::<Vec<_>>()
    );
    assert!(scoped[0].0 - 60 * SEC <= 10 * SEC);
}

#[test]
fn a_gateway_failing_to_every_endpoint_is_a_faulty_reporter() {
    let mut gateways = fleet_of(5);
    let faulty = |g: &Gateway, _: &str, t: i64| {
        (g.name == "g1" && (60..240).contains(&t)).then_some((OutcomeClass::ConnectError, 0))
    };
    let out = run(&mut gateways, &faulty, 300);
    for ep in ENDPOINTS {
        assert!(out.fleet(ep).is_empty(), "{ep}: {:?}", out.fleet(ep));
    }
    let events: Vec<&PoolHealthChanged> = out
        .decisions
        .iter()
        .filter_map(|(_, d)| match d {
            Decision::Pool(p) => Some(p),
            _ => None,
        })
        .collect();
    let named = events
        .iter()
        .find(|p| p.faulty_reporters == ["gateway=g1"])
        .expect("a pool event names g1");
    assert!(named.reason.contains("gateway=g1 fails to"), "{}", named.reason);
    assert!(
        events.last().unwrap().faulty_reporters.is_empty(),
        "over once g1 is back"
    );
}

/// A fault every gateway sees is the endpoint's: decided as fast as when nobody says who saw
/// it (no scope at all: the engine before scoped health).
#[test]
fn a_fault_every_gateway_sees_is_decided_for_the_fleet_as_fast_as_without_scopes() {
    for (fault, what) in [
        (OutcomeClass::ConnectError, "down"),
        (OutcomeClass::ServerError, "503s"),
    ] {
        let everyone =
            move |_: &Gateway, ep: &str, t: i64| (ep == "a" && (60..240).contains(&t)).then_some((fault, 503));
        let scoped = run(&mut fleet_of(5), &everyone, 120);
        let mut anonymous = fleet_of(5);
        anonymous.iter_mut().for_each(|g| g.name.clear());
        let plain = run(&mut anonymous, &everyone, 120);
        let out_at = |o: &Outcome| {
            o.fleet("a")
                .iter()
                .find(|(_, h)| h.to_state == HealthState::Unhealthy)
                .map(|(t, _)| *t)
        };
        assert!(out_at(&plain).is_some(), "{what}");
        assert_eq!(out_at(&scoped), out_at(&plain), "{what}: ejected at the same instant");
        assert!(
            scoped.changes().all(|(_, h)| h.scope.is_none()),
            "{what}: nothing scoped"
        );
    }
}

/// Random faults: whoever sees them, every scoped decision blames a scope that had the fault,
/// and a fault of every gateway's never makes a scoped one (the false-attribution rate).
#[test]
fn attribution_blames_only_scopes_that_saw_the_fault() {
    let mut rng = Rng(7);
    let mut blamed_wrongly = 0;
    let mut runs = 0;
    for _ in 0..12 {
        let share = 0.3 + rng.below(70) as f64 / 100.0;
        let who = rng.below(3); // 0: g1 only, 1: g1 and g2, 2: everyone
        let seed = rng.next();
        let fault = move |g: &Gateway, ep: &str, t: i64| {
            let sees = match who {
                0 => g.name == "g1",
                1 => g.name == "g1" || g.name == "g2",
                _ => true,
            };
            let mut h = seed ^ (t as u64).wrapping_mul(0x9e37) ^ g.name.len() as u64 ^ (ep.as_bytes()[0] as u64) << 7;
            h = h.wrapping_mul(0xbf58_476d_1ce4_e5b9) ^ (g.next as u64).wrapping_mul(0x94d0_49bb);
            let r = (h >> 11) as f64 / (1u64 << 53) as f64;
            (sees && ep == "a" && (30..150).contains(&t) && r < share).then_some((OutcomeClass::ServerError, 503))
        };
        let mut gateways = fleet_of(5);
        let out = run(&mut gateways, &fault, 180);
        runs += 1;
        for (_, h) in out.changes().filter(|(_, h)| h.scope.is_some()) {
            let s = h.scope.as_deref().unwrap();
            let ok = match who {
                0 => s == "gateway=g1",
                1 => s == "gateway=g1" || s == "gateway=g2",
                _ => false,
            };
            if !ok {
                blamed_wrongly += 1;
                eprintln!("fault of {who}, share {share:.2}: {s} blamed: {}", h.reason);
            }
        }
    }
    assert_eq!(blamed_wrongly, 0, "wrong scoped decisions over {runs} runs");
}

/// The attribution's memory does not grow with the fleet: 500 gateways, one of them failing.
#[test]
fn a_mesh_of_500_gateways_keeps_a_bounded_book_per_endpoint() {
    let mut engine = Engine::new(Policy::default());
    for i in 0..20_000u64 {
        let g = i % 500;
        let outcome = if g == 7 {
            OutcomeClass::ConnectError
        } else {
            OutcomeClass::Success
        };
        let c = CallOutcome::new(format!("c{i}"), "p", "a", format!("g{g}"), T0, outcome);
        engine.step(T0 + i as i64 * MS, &stamped(T0 + i as i64 * MS, &Signal::Call(c)));
    }
    let pool = engine.pool("p").unwrap();
    let bytes = pool.book_bytes("a");
    eprintln!("book of one endpoint after 500 gateways: {bytes} bytes");
    assert!(bytes < 2_000, "{bytes} bytes");
    assert_eq!(
        pool.scoped_out("a").iter().map(|(s, _)| s.as_str()).collect::<Vec<_>>(),
        ["gateway=g7"]
    );
}

/// Through a merge stage (the mesh shape) whose summaries sum every gateway's calls, with no
/// failure sent one by one: a merged summary still says whose failures they were, so one
/// gateway's broken route is still that gateway's, and a fault every gateway sees is still the
/// fleet's.
#[test]
fn through_a_merger_failures_keep_their_reporters() {
    for n in [5, 20] {
        let mut path = Path::merged(n, 0, 500 * MS);
        let out = run_by(&mut fleet_of(n), &broken_route(60, 240), 300, &mut path);
        assert!(out.fleet("a").is_empty(), "{n} gateways: {:?}", out.fleet("a"));
        let g1 = out.scoped("a", "gateway=g1");
        let (first, _) = g1.first().expect("out for g1");
        assert!(
            *first - 60 * SEC <= 10 * SEC,
            "{n}: out for g1 after {} ms",
            (first - 60 * SEC) / MS
        );
        assert!(g1.iter().filter(|(t, _)| *t < 240 * SEC).count() <= 4, "{g1:?}");
        assert!(
            out.changes()
                .all(|(_, h)| h.scope.as_deref().is_none_or(|s| s == "gateway=g1")),
            "nobody else (not the merger) is blamed"
        );
    }
    let everyone = |_: &Gateway, ep: &str, t: i64| {
        (ep == "a" && (60..240).contains(&t)).then_some((OutcomeClass::ServerError, 503))
    };
    let out = run_by(&mut fleet_of(20), &everyone, 120, &mut Path::merged(20, 0, 500 * MS));
    assert!(
        out.fleet("a").iter().any(|(_, h)| h.to_state == HealthState::Unhealthy),
        "the fleet's fault ejects it: {:?}",
        out.changes().collect::<Vec<_>>()
    );
    assert!(out.changes().all(|(_, h)| h.scope.is_none()), "nothing scoped");
}

/// g1 fails one call in 10 to `a`, scattered (never five in a row). Its failures go one by one
/// with their gateway, its successes are summed with everyone's: the merged summaries list
/// them as g1's, so its run ends at each — not counted on across its successes into a
/// scoped ejection.
#[test]
fn through_a_merger_one_gateways_scattered_failures_are_no_run() {
    let scattered = |g: &Gateway, ep: &str, t: i64| {
        (g.name == "g1" && ep == "a" && g.next.is_multiple_of(10) && t >= 10)
            .then_some((OutcomeClass::ServerError, 503))
    };
    let out = run_by(&mut fleet_of(20), &scattered, 600, &mut Path::merged(20, 1, 500 * MS));
    assert!(out.failed > 20, "{} failed calls", out.failed);
    assert_eq!(out.changes().count(), 0, "{:?}", out.changes().collect::<Vec<_>>());
}
