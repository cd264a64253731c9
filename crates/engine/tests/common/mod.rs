//! Helpers shared by the engine's scenario and property tests.
#![allow(dead_code)]

use vitals_contracts::*;
use vitals_engine::{Decision, Engine};

pub const T0: Micros = 1_700_000_000_000_000;

/// splitmix64: a test's randomness, from its seed.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}
pub const SEC: Micros = 1_000_000;
pub const MS: Micros = 1_000;

pub fn call(pool: &str, ep: &str, id: u64, outcome: OutcomeClass, ttft_ms: Option<i64>) -> Signal {
    Signal::Call(CallOutcome {
        http_status: match outcome {
            OutcomeClass::Success => Some(200),
            OutcomeClass::ServerError => Some(503),
            OutcomeClass::ClientError => Some(400),
            OutcomeClass::RateLimited => Some(429),
            _ => None,
        },
        latency_us: ttft_ms.map_or(80 * MS, |t| t * MS + 50 * MS),
        ttft_us: ttft_ms.map(|t| t * MS),
        ..CallOutcome::new(format!("{ep}-{id}"), pool, ep, "gw-1", T0, outcome)
    })
}

pub fn probe(pool: &str, ep: &str, id: u64, kind: ProbeKind, outcome: OutcomeClass) -> ProbeResult {
    ProbeResult {
        probe_id: format!("{ep}-probe-{id}"),
        pool: pool.into(),
        endpoint: ep.into(),
        prober: "prober-1".into(),
        occurred_at: T0,
        kind,
        outcome,
        latency_us: 20 * MS,
        ttft_us: None,
        http_status: None,
        interval_ms: None,
        dependencies: vec![],
        detail: String::new(),
    }
}

pub fn tick() -> Signal {
    Signal::Tick(Tick {
        ticker: "ticker".into(),
        emitted_at: T0,
    })
}

pub fn transitions(ds: &[Decision]) -> Vec<&HealthChanged> {
    ds.iter()
        .filter_map(|d| match d {
            Decision::Endpoint(h) => Some(h.as_ref()),
            _ => None,
        })
        .collect()
}

pub fn pool_events(ds: &[Decision]) -> Vec<&PoolHealthChanged> {
    ds.iter()
        .filter_map(|d| match d {
            Decision::Pool(p) => Some(p),
            _ => None,
        })
        .collect()
}

/// Drives an engine through time and records everything it decided.
pub struct Run {
    pub engine: Engine,
    pub now: Micros,
    pub decisions: Vec<Decision>,
}

impl Run {
    pub fn new() -> Run {
        Run {
            engine: Engine::new(Policy::default()),
            now: T0,
            decisions: Vec::new(),
        }
    }

    pub fn at(&mut self, offset: Micros, s: Signal) -> Vec<Decision> {
        self.now = T0 + offset;
        let d = self.engine.step(self.now, &stamped(self.now, &s));
        self.decisions.extend(d.iter().cloned());
        d
    }

    /// Ticks every second from the current time up to `offset`.
    pub fn tick_until(&mut self, offset: Micros) -> Vec<Decision> {
        let mut all = Vec::new();
        let mut t = self.now - T0;
        while t < offset {
            t = (t + SEC).min(offset);
            all.extend(self.at(t, tick()));
        }
        all
    }

    pub fn state_of(&self, pool: &str, ep: &str) -> HealthState {
        self.engine.pool(pool).unwrap().endpoint(ep).unwrap().state()
    }

    pub fn changes_of(&self, ep: &str) -> Vec<&HealthChanged> {
        transitions(&self.decisions)
            .into_iter()
            .filter(|h| h.endpoint == ep)
            .collect()
    }

    pub fn path_of(&self, ep: &str) -> Vec<HealthState> {
        self.changes_of(ep).iter().map(|h| h.to_state).collect()
    }
}

/// `s` as a reporter whose clock is right stamps it when it arrives at `at`: a call or probe
/// ended then (begun its latency before), a summary's last call ended then. The engine sets
/// reports later than the window aside (its late rule), so a test's reports are stamped as they
/// arrive unless the test is about lateness.
pub fn stamped(at: Micros, s: &Signal) -> Signal {
    let mut s = s.clone();
    match &mut s {
        Signal::Call(c) => c.occurred_at = at - c.latency_us.max(0),
        Signal::Probe(p) => p.occurred_at = at - p.latency_us.max(0),
        Signal::Summary(m) => {
            let span = m.ended_at - m.started_at;
            m.ended_at = at;
            m.started_at = at - span;
        }
        _ => {}
    }
    s
}
