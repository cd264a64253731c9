//! Property tests of the engine's invariants over arbitrary signal sequences.

mod common;
use common::*;
use proptest::prelude::*;
use std::collections::HashMap;
use vitals_contracts::*;
use vitals_engine::{Admission, Decision, Engine};

const ENDPOINTS: [&str; 5] = ["a", "b", "c", "d", "e"];
const POOLS: [&str; 2] = ["p1", "p2"];

/// One generated step: how far time moves, and what arrives.
#[derive(Debug, Clone)]
enum Step {
    Call {
        pool: usize,
        ep: usize,
        class: usize,
        ttft_ms: Option<i64>,
    },
    Heartbeat {
        pool: usize,
        ep: usize,
    },
    Tick,
    Override {
        pool: usize,
        ep: usize,
        action: usize,
    },
}

fn step() -> impl Strategy<Value = (i64, Step)> {
    let class = prop_oneof![6 => Just(0usize), 4 => 1usize..9];
    let s = prop_oneof![
        12 => (0..2usize, 0..5usize, class, proptest::option::of(100i64..30_000))
            .prop_map(|(pool, ep, class, ttft_ms)| Step::Call { pool, ep, class, ttft_ms }),
        2 => (0..2usize, 0..5usize).prop_map(|(pool, ep)| Step::Heartbeat { pool, ep }),
        3 => Just(Step::Tick),
        1 => (0..2usize, 0..5usize, 0..5usize).prop_map(|(pool, ep, action)| Step::Override { pool, ep, action }),
    ];
    (0i64..3_000, s)
}

fn signals(steps: &[(i64, Step)]) -> Vec<(Micros, Signal)> {
    let mut t = T0;
    steps
        .iter()
        .enumerate()
        .map(|(i, (dt, s))| {
            t += dt * MS;
            let sig = match s {
                Step::Call {
                    pool,
                    ep,
                    class,
                    ttft_ms,
                } => call(
                    POOLS[*pool],
                    ENDPOINTS[*ep],
                    i as u64,
                    OutcomeClass::ALL[*class],
                    *ttft_ms,
                ),
                Step::Heartbeat { pool, ep } => Signal::Probe(probe(
                    POOLS[*pool],
                    ENDPOINTS[*ep],
                    i as u64,
                    ProbeKind::Heartbeat,
                    OutcomeClass::Success,
                )),
                Step::Tick => tick(),
                Step::Override { pool, ep, action } => Signal::Override(OperatorOverride {
                    override_id: format!("ov-{i}"),
                    pool: POOLS[*pool].into(),
                    endpoint: ENDPOINTS[*ep].into(),
                    action: [
                        OverrideAction::ForceHealthy,
                        OverrideAction::ForceUnhealthy,
                        OverrideAction::MaintenanceOn,
                        OverrideAction::MaintenanceOff,
                        OverrideAction::Clear,
                    ][*action],
                    actor: "op".into(),
                    reason: "test".into(),
                    issued_at: t,
                }),
            };
            (t, sig)
        })
        .collect()
}

fn run(engine: &mut Engine, input: &[(Micros, Signal)]) -> Vec<Decision> {
    let mut out = Vec::new();
    for (t, s) in input {
        engine.apply(*t, &stamped(*t, s), &mut out);
    }
    out
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn same_signals_same_decisions(steps in proptest::collection::vec(step(), 1..400)) {
        let input = signals(&steps);
        let a = run(&mut Engine::new(Policy::default()), &input);
        let b = run(&mut Engine::new(Policy::default()), &input);
        prop_assert_eq!(a, b);
    }

    #[test]
    fn sequence_numbers_increase_by_one_per_endpoint(steps in proptest::collection::vec(step(), 1..400)) {
        let out = run(&mut Engine::new(Policy::default()), &signals(&steps));
        let mut last: HashMap<(String, String), i64> = HashMap::new();
        let mut pool_last: HashMap<String, i64> = HashMap::new();
        for d in &out {
            match d {
                Decision::Endpoint(h) => {
                    let prev = last.insert((h.pool.clone(), h.endpoint.clone()), h.seq).unwrap_or(0);
                    prop_assert_eq!(h.seq, prev + 1);
                    prop_assert_eq!(&h.transition_id, &format!("{}/{}/{}", h.pool, h.endpoint, h.seq));
                }
                Decision::Pool(p) => {
                    let prev = pool_last.insert(p.pool.clone(), p.seq).unwrap_or(0);
                    prop_assert_eq!(p.seq, prev + 1);
                }
            }
        }
    }

    #[test]
    fn automatic_decisions_never_exceed_max_ejection(steps in proptest::collection::vec(step(), 1..400)) {
        let mut engine = Engine::new(Policy::default());
        for (t, s) in signals(&steps) {
            let before: HashMap<String, u32> =
                engine.pools().map(|p| (p.name().to_owned(), p.count(HealthState::Unhealthy))).collect();
            let out = engine.step(t, &stamped(t, &s));
            // Walk the step's transitions in order, keeping each pool's count of ejected endpoints.
            let mut running = before;
            for h in transitions(&out) {
                let n = running.entry(h.pool.clone()).or_insert(0);
                let into = h.to_state == HealthState::Unhealthy && h.from_state != HealthState::Unhealthy;
                let out_of = h.from_state == HealthState::Unhealthy && h.to_state != HealthState::Unhealthy;
                *n = *n + into as u32 - out_of as u32;
                if into && !matches!(h.reason(), Some(ReasonCode::ForcedHealthy | ReasonCode::ForcedUnhealthy)) {
                    let pool = engine.pool(&h.pool).unwrap();
                    prop_assert!(*n <= pool.max_ejected(), "{} ejected of {} after {:?}", n, pool.total(), h);
                }
            }
        }
    }

    #[test]
    fn every_transition_carries_evidence(steps in proptest::collection::vec(step(), 1..400)) {
        let out = run(&mut Engine::new(Policy::default()), &signals(&steps));
        for h in transitions(&out) {
            prop_assert!(!h.reason.trim().is_empty());
            prop_assert!(!h.reason_code.is_empty());
            prop_assert!(!h.evidence.thresholds.is_empty(), "{:?}", h);
            prop_assert!(h.evidence.window_ms > 0);
            prop_assert!((0.0..=100.0).contains(&h.evidence.score));
            prop_assert!((0.0..=1.0).contains(&h.evidence.failure_rate));
            prop_assert!((0.0..=1.0).contains(&h.weight));
        }
    }

    #[test]
    fn snapshot_and_restore_anywhere_changes_nothing(
        steps in proptest::collection::vec(step(), 2..400),
        cut in 0.0f64..1.0,
    ) {
        let input = signals(&steps);
        let k = ((input.len() as f64) * cut) as usize;
        let mut whole = Engine::new(Policy::default());
        let expected = run(&mut whole, &input);
        let mut first = Engine::new(Policy::default());
        let mut got = run(&mut first, &input[..k]);
        // Per pool, as the processor stores it.
        let snap = first.partition_snapshot();
        let mut restored =
            Engine::from_snapshot(Policy::default(), snap.stream_time, snap.pools.iter().map(|(_, b)| b.as_slice()))
                .unwrap();
        got.extend(run(&mut restored, &input[k..]));
        prop_assert_eq!(got, expected);
        prop_assert_eq!(restored.snapshot(), whole.snapshot());
    }

    /// The processor asks [`Engine::admit`] and then applies what it admitted; that must be
    /// [`Engine::apply`] exactly: the same decisions, first states and state, with repeated
    /// reports and endpoints refused by a pool's cap among the signals.
    #[test]
    fn admitting_then_applying_is_applying(
        steps in proptest::collection::vec(step(), 1..400),
        repeats in proptest::collection::vec(0usize..400, 0..40),
    ) {
        let mut input = signals(&steps);
        for r in repeats {
            if let Some((t, s)) = input.get(r % input.len()).cloned() {
                input.push((t.max(input.last().map_or(t, |l| l.0)), s));
            }
        }
        let policy = Policy { max_endpoints: 3, ..Policy::default() };
        let (mut a, mut b) = (Engine::new(policy.clone()), Engine::new(policy));
        let (mut out_a, mut out_b) = (Vec::new(), Vec::new());
        for (t, s) in &input {
            let s = stamped(*t, s);
            let first_a = a.apply(*t, &s, &mut out_a);
            let first_b = match b.admit(*t, &s) {
                Admission::Repeat => b.apply(*t, &s, &mut out_b),
                Admission::Refused(why) => {
                    prop_assert_eq!(Some(why), b.refusal(&s));
                    None
                }
                Admission::Apply { first_seen, .. } => b.apply_admitted(*t, &s, first_seen, &mut out_b),
            };
            prop_assert_eq!(first_a, first_b);
        }
        prop_assert_eq!(out_a, out_b);
        prop_assert_eq!(a.snapshot(), b.snapshot());
    }
}
