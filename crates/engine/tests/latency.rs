//! A latency outlier: one endpoint of several whose calls take 10x the others' on 15 % of
//! calls, none failing (measured with `vitals simulate` before the latency rule had hysteresis: healthy → degraded → healthy 65 times in 90 s
//! at 10 calls a second and 1,521 times at 200). The flag on the latency EWMA cleared within
//! tens of milliseconds of being set, and the degradation ended with it.

mod common;
use common::*;
use vitals_contracts::*;
use vitals_engine::{Decision, Engine};

const POOL: &str = "p";

fn call_at(t: Micros, ep: &str, id: u64, latency_ms: i64) -> Signal {
    let mut s = call(POOL, ep, id, OutcomeClass::Success, None);
    if let Signal::Call(c) = &mut s {
        c.latency_us = latency_ms * MS;
        c.occurred_at = t - c.latency_us;
    }
    s
}

/// `n` endpoints at `rate` calls a second each for `secs`; "a" takes 10x on 15 % of its calls.
/// Returns a's transitions (time from the start, state).
fn tail(n: usize, rate: i64, secs: i64, seed: u64) -> Vec<(Micros, HealthState)> {
    let mut engine = Engine::new(Policy::default());
    let mut rng = Rng(seed);
    let eps: Vec<String> = (0..n)
        .map(|i| if i == 0 { "a".into() } else { format!("e{i}") })
        .collect();
    let gap = SEC / (rate * n as i64);
    let (mut t, mut i, mut next_tick) = (T0, 0u64, T0 + SEC);
    let mut out = Vec::new();
    while t < T0 + secs * SEC {
        if t >= next_tick {
            out.extend(engine.step(next_tick, &tick()).into_iter().map(|d| (next_tick, d)));
            next_tick += SEC;
        }
        let ep = &eps[(i % n as u64) as usize];
        let base = 80 + rng.below(40) as i64;
        let ms = if ep == "a" && rng.below(100) < 15 {
            base * 10
        } else {
            base
        };
        out.extend(engine.step(t, &call_at(t, ep, i, ms)).into_iter().map(|d| (t, d)));
        i += 1;
        t += gap;
    }
    let mut a = Vec::new();
    for (at, d) in out {
        if let Decision::Endpoint(h) = d {
            assert!(
                h.endpoint == "a",
                "a peer changed: {} → {:?}: {}",
                h.endpoint,
                h.to_state,
                h.reason
            );
            a.push((at - T0, h.to_state));
        }
    }
    a
}

/// Degraded within 15 s, and then held: at most 4 transitions over five minutes, at 10 and 200
/// calls a second, among 5 and 10 endpoints.
#[test]
fn a_latency_tail_degrades_once_and_holds() {
    for (n, rate) in [(5, 10), (10, 10), (5, 200), (10, 200)] {
        for seed in [1, 2, 3] {
            let a = tail(n, rate, 300, seed);
            let first = a
                .first()
                .unwrap_or_else(|| panic!("{n} × {rate}/s seed {seed}: never degraded"));
            assert_eq!(first.1, HealthState::Degraded, "{n} × {rate}/s seed {seed}: {a:?}");
            assert!(
                first.0 <= 15 * SEC,
                "{n} × {rate}/s seed {seed}: degraded after {} ms",
                first.0 / 1000
            );
            assert!(
                a.len() <= 4,
                "{n} × {rate}/s seed {seed}: {} transitions: {a:?}",
                a.len()
            );
        }
    }
}

/// A gateway's cold start: "a"'s first calls take 1.5 s (a client made, a connection opened)
/// where its peers' take 100 ms. Reported as untimed (`vitals.untimed`), they count as calls and
/// move no latency: "a" stays healthy. Reported timed, the same calls degrade it.
#[test]
fn untimed_cold_start_calls_count_but_move_no_latency() {
    let run = |untimed: bool| {
        let mut engine = Engine::new(Policy::default());
        let mut decisions = Vec::new();
        let mut t = T0;
        for i in 0..600u64 {
            let ep = ["a", "b", "c", "d"][(i % 4) as usize];
            let cold = ep == "a" && i < 40;
            let mut s = call_at(t, ep, i, if cold { 1_500 } else { 100 });
            if let (Signal::Call(c), true) = (&mut s, cold && untimed) {
                c.attributes.insert(scope::UNTIMED_ATTRIBUTE.into(), "true".into());
            }
            decisions.extend(engine.step(t, &s));
            t += 25 * MS;
        }
        decisions
            .into_iter()
            .filter(|d| matches!(d, Decision::Endpoint(h) if h.endpoint == "a"))
            .count()
    };
    assert_eq!(run(true), 0, "untimed: no transition");
    assert!(run(false) > 0, "timed, the same calls degrade a");
}
