//! A realistic, reproducible signal mix: mostly successes with TTFT, a trickle of random
//! failures, bursts of failures on a few endpoints, 4xx noise, heartbeats and ticks.

use std::collections::BTreeMap;
use vitals_contracts::*;

pub const T0: Micros = 1_700_000_000_000_000;

/// A small deterministic PRNG (PCG-style LCG) so every run sees the same input.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }
    pub fn next_u32(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        self.0 >> 33
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u32() % n
    }
}

pub struct Mix {
    pub pools: usize,
    pub endpoints_per_pool: usize,
    /// Signals per second of stream time across the whole fleet.
    pub rate: u64,
}

/// `n` signals with their stream times.
pub fn generate(mix: &Mix, n: usize, seed: u64) -> Vec<(Micros, Signal)> {
    let mut rng = Rng::new(seed);
    let names: Vec<(String, Vec<String>)> = (0..mix.pools)
        .map(|p| {
            (
                format!("pool-{p:04}"),
                (0..mix.endpoints_per_pool)
                    .map(|e| format!("pool-{p:04}-ep-{e:02}"))
                    .collect(),
            )
        })
        .collect();
    let endpoints = mix.pools * mix.endpoints_per_pool;
    let step = 1_000_000 / mix.rate.max(1) as i64;
    // (pool, endpoint) -> signals left in a failure burst
    let mut bursts: BTreeMap<(usize, usize), u32> = BTreeMap::new();
    let mut out = Vec::with_capacity(n);
    for i in 0..n {
        let t = T0 + i as i64 * step;
        if i % 10_000 == 0 {
            out.push((
                t,
                Signal::Tick(Tick {
                    ticker: "bench".into(),
                    emitted_at: t,
                }),
            ));
            continue;
        }
        let k = rng.below(endpoints as u64) as usize;
        let (p, e) = (k / mix.endpoints_per_pool, k % mix.endpoints_per_pool);
        if rng.below(20_000) == 0 {
            bursts.insert((p, e), 8 + rng.below(30) as u32);
        }
        let in_burst = match bursts.get_mut(&(p, e)) {
            Some(left) if *left > 0 => {
                *left -= 1;
                true
            }
            _ => false,
        };
        let roll = rng.below(1000);
        let outcome = if in_burst {
            [
                OutcomeClass::Timeout,
                OutcomeClass::ServerError,
                OutcomeClass::ConnectError,
            ][rng.below(3) as usize]
        } else if roll < 15 {
            OutcomeClass::ServerError
        } else if roll < 25 {
            OutcomeClass::RateLimited
        } else if roll < 45 {
            OutcomeClass::ClientError
        } else {
            OutcomeClass::Success
        };
        let (pool, eps) = &names[p];
        let ttft = 180_000 + rng.below(200_000) as i64;
        let signal = if roll >= 990 {
            Signal::Probe(ProbeResult {
                probe_id: format!("pr-{i}"),
                pool: pool.clone(),
                endpoint: eps[e].clone(),
                prober: "bench".into(),
                occurred_at: t,
                kind: ProbeKind::Heartbeat,
                outcome,
                latency_us: 5_000,
                ttft_us: None,
                http_status: None,
                interval_ms: Some(5_000),
                dependencies: vec![],
                detail: String::new(),
            })
        } else {
            Signal::Call(CallOutcome {
                http_status: Some(if outcome == OutcomeClass::Success { 200 } else { 503 }),
                latency_us: ttft + 400_000 + rng.below(300_000) as i64,
                ttft_us: (outcome == OutcomeClass::Success).then_some(ttft),
                tpot_us: Some(20_000),
                attributes: BTreeMap::new(),
                ..CallOutcome::new(format!("ev-{i}"), pool.clone(), eps[e].clone(), "gw-1", t, outcome)
            })
        };
        out.push((t, signal));
    }
    out
}
