//! Snapshot compatibility: a snapshot written by an earlier build of the engine still restores,
//! keeps every field it had (a later build may add fields, never rename or drop one), and the
//! restored engine continues deterministically.
//!
//! `fixtures/pool-snapshot-2026-12.json` was written by the engine as it stood before its rules
//! moved into modules and before probation existed, from [`mixed_signals`] cut at
//! [`CUT`]; the refactor alone re-serialized it to the same bytes and continued it exactly as the
//! uninterrupted run (checked then; the rules have changed since). To write a new fixture for a
//! later format, run this test with `VITALS_WRITE_SNAPSHOT_FIXTURE=<path>`.

mod common;
use common::*;
use vitals_contracts::*;
use vitals_engine::{Decision, Engine};

const FIXTURE: &[u8] = include_bytes!("fixtures/pool-snapshot-2026-12.json");
const CUT: usize = 3_000;

/// Three pools whose endpoints go through every kind of state entry: ejection and trial, a
/// cooldown after 429s, degradation on slow first tokens, heartbeat silence, a critical
/// dependency down, an operator override and a policy change.
fn mixed_signals() -> Vec<(Micros, Signal)> {
    let mut v = Vec::new();
    let mut id = 0u64;
    for step in 0..1_200i64 {
        let t = T0 + step * 100 * MS;
        let phase = (step / 150) % 4;
        for (i, ep) in ["a", "b", "c", "d"].into_iter().enumerate() {
            id += 1;
            let class = match (ep, phase) {
                ("a", 1 | 2) => OutcomeClass::ConnectError,
                ("b", 2) if step % 5 < 2 => OutcomeClass::RateLimited,
                ("c", 3) if step % 7 == 0 => OutcomeClass::ConnectionDropped,
                _ => OutcomeClass::Success,
            };
            let ttft = if ep == "d" && phase == 1 {
                6_000
            } else {
                300 + (i as i64) * 20
            };
            let mut s = call("chat", ep, id, class, Some(ttft));
            if let Signal::Call(c) = &mut s {
                if class == OutcomeClass::RateLimited {
                    c.retry_after_ms = Some(4_000);
                }
            }
            v.push((t, s));
        }
        if step % 10 == 0 {
            let failing = (300..700).contains(&step);
            let outcome = if failing {
                OutcomeClass::ConnectError
            } else {
                OutcomeClass::Success
            };
            v.push((t, Signal::Probe(probe("chat", "a", id, ProbeKind::Http, outcome))));
            if !(400..600).contains(&step) {
                let mut hb = probe("edge", "h", id, ProbeKind::Heartbeat, OutcomeClass::Success);
                hb.interval_ms = Some(2_000);
                v.push((t, Signal::Probe(hb)));
            }
            let mut dep = probe("db", "x", id, ProbeKind::Http, OutcomeClass::Success);
            dep.dependencies = vec![DependencyReport {
                name: "postgres".into(),
                critical: true,
                status: if (500..800).contains(&step) {
                    DependencyStatus::Down
                } else {
                    DependencyStatus::Up
                },
            }];
            v.push((t, Signal::Probe(dep)));
            v.push((t, tick()));
        }
        if step == 900 {
            v.push((
                t,
                Signal::Override(OperatorOverride {
                    override_id: "ov-1".into(),
                    pool: "chat".into(),
                    endpoint: "c".into(),
                    action: OverrideAction::MaintenanceOn,
                    actor: "alice".into(),
                    reason: "upgrade".into(),
                    issued_at: T0,
                }),
            ));
        }
        if step == 1_000 {
            v.push((
                t,
                Signal::Policy(PolicyChange {
                    change_id: "pc-1".into(),
                    pool: "chat".into(),
                    policy: Policy {
                        version: 2,
                        consecutive_failures: 3,
                        ..Policy::default()
                    },
                    actor: "bob".into(),
                    issued_at: T0,
                }),
            ));
        }
    }
    v
}

fn run(engine: &mut Engine, signals: &[(Micros, Signal)]) -> Vec<Decision> {
    let mut out = Vec::new();
    for (t, s) in signals {
        engine.apply(*t, &stamped(*t, s), &mut out);
    }
    out
}

/// Every field of `old` is in `new`, with the same value (`new` may have more).
fn keeps_every_field(old: &serde_json::Value, new: &serde_json::Value, path: &str) -> Result<(), String> {
    use serde_json::Value;
    match (old, new) {
        (Value::Object(o), Value::Object(n)) => o.iter().try_for_each(|(k, v)| match n.get(k) {
            Some(nv) => keeps_every_field(v, nv, &format!("{path}.{k}")),
            None => Err(format!("{path}.{k} was dropped or renamed")),
        }),
        (Value::Array(o), Value::Array(n)) if o.len() == n.len() => o
            .iter()
            .zip(n)
            .enumerate()
            .try_for_each(|(i, (v, nv))| keeps_every_field(v, nv, &format!("{path}[{i}]"))),
        _ if old == new => Ok(()),
        _ => Err(format!("{path}: {old} became {new}")),
    }
}

#[test]
fn a_snapshot_from_before_the_rules_moved_restores_keeps_every_field_and_continues_deterministically() {
    let signals = mixed_signals();
    if let Ok(path) = std::env::var("VITALS_WRITE_SNAPSHOT_FIXTURE") {
        let mut whole = Engine::new(Policy::default());
        run(&mut whole, &signals[..CUT]);
        std::fs::write(path, whole.snapshot()).unwrap();
    }
    let restored = Engine::restore(FIXTURE).expect("an older snapshot restores");
    let old: serde_json::Value = serde_json::from_slice(FIXTURE).unwrap();
    let new: serde_json::Value = serde_json::from_slice(&restored.snapshot()).unwrap();
    keeps_every_field(&old, &new, "").unwrap();
    let states: Vec<String> = ["a", "b", "c", "d"]
        .iter()
        .map(|e| format!("{:?}", restored.pool("chat").unwrap().endpoint(e).unwrap().state()))
        .collect();
    assert!(
        states.iter().any(|s| s != "Healthy"),
        "the fixture holds endpoints out: {states:?}"
    );
    let continue_from = |mut e: Engine| {
        let out = run(&mut e, &signals[CUT..]);
        (out, e)
    };
    let (first, engine) = continue_from(Engine::restore(FIXTURE).unwrap());
    let (second, _) = continue_from(Engine::restore(FIXTURE).unwrap());
    assert!(!first.is_empty());
    assert_eq!(first, second, "a restored engine continues deterministically");
    let again = Engine::restore(&engine.snapshot()).unwrap();
    assert_eq!(again, engine, "and its own snapshot restores to it");
}

/// `fixtures/pool-snapshot-2026-12-flags.json` was written from [`mixed_signals`] cut at [`CUT`]
/// by the engine whose endpoint kept its phases (isolation, trial, cooldown, probation, ramp) as
/// flags. Restored into the engine that keeps them as a phase, its stored form must read into
/// the same state (it writes it back byte for byte) and continue deterministically; and a
/// snapshot taken at the cut by today's engine must continue exactly as an uninterrupted run.
/// (The fixture's state is that of the rules of its day: probation grew on 8 passes then, on 20
/// now, so from the cut on it decides as those rules left it, not as today's would have.)
const FLAGS_FIXTURE: &[u8] = include_bytes!("fixtures/pool-snapshot-2026-12-flags.json");

#[test]
fn a_snapshot_from_the_flags_engine_continues_exactly_as_an_uninterrupted_run() {
    let signals = mixed_signals();
    let mut restored = Engine::restore(FLAGS_FIXTURE).expect("the flags engine's snapshot restores");
    assert_eq!(
        String::from_utf8(restored.snapshot()).unwrap(),
        String::from_utf8(FLAGS_FIXTURE.to_vec()).unwrap(),
        "the stored form is the flags engine's, byte for byte"
    );
    assert_eq!(restored.lossy_restores(), 0, "every flag it wrote, a phase holds");
    let continued = run(&mut restored, &signals[CUT..]);
    let mut again = Engine::restore(FLAGS_FIXTURE).unwrap();
    assert_eq!(run(&mut again, &signals[CUT..]), continued, "deterministically");
    assert!(continued.len() > 20, "the continuation decides: {}", continued.len());

    let mut whole = Engine::new(Policy::default());
    run(&mut whole, &signals[..CUT]);
    let mut cut = Engine::restore(&whole.snapshot()).expect("today's snapshot restores");
    let uninterrupted = run(&mut whole, &signals[CUT..]);
    assert!(
        uninterrupted.len() > 20,
        "the continuation decides: {}",
        uninterrupted.len()
    );
    assert_eq!(run(&mut cut, &signals[CUT..]), uninterrupted);
    assert_eq!(cut, whole, "and ends in the same state");
}

/// Flags a phase cannot hold (a trial open on a healthy endpoint, an operator's hold on a state
/// it does not hold) restore, are dropped, and are counted; the same stored form without them
/// restores with none counted.
#[test]
fn flags_no_phase_can_hold_are_dropped_and_counted() {
    let mut stored: serde_json::Value = serde_json::from_slice(FLAGS_FIXTURE).unwrap();
    let endpoints = &mut stored["pools"]["chat"]["endpoints"];
    assert_eq!(endpoints["d"]["state"], "HEALTHY");
    endpoints["d"]["trial_open"] = true.into();
    endpoints["d"]["failed_trials"] = 2.into();
    assert_eq!(endpoints["a"]["state"], "RECOVERING");
    endpoints["a"]["forced"] = "MAINTENANCE_ON".into();
    let bytes = serde_json::to_vec(&stored).unwrap();
    let restored = Engine::restore(&bytes).expect("leftover flags restore");
    assert_eq!(restored.lossy_restores(), 2);
    let chat = restored.pool("chat").unwrap();
    assert_eq!(format!("{:?}", chat.endpoint("d").unwrap().state()), "Healthy");
    assert_eq!(
        format!("{:?}", chat.endpoint("a").unwrap().state()),
        "Maintenance",
        "the operator's hold wins"
    );
    let again = Engine::restore(&restored.snapshot()).unwrap();
    assert_eq!(again.lossy_restores(), 0, "what it writes back, its phases hold");
}
