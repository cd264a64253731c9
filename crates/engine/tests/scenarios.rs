//! Scenario tests: the practice articles' situations (docs/decisions.md names them), fed through the engine as signals.

mod common;
use common::*;
use vitals_contracts::*;
use vitals_engine::Engine;

/// Seed 001: the provider answers 200 OK while TTFT climbs from 250 ms to 25 s.
#[test]
fn silent_degradation_ttft_climb_degrades_then_ejects() {
    let mut r = Run::new();
    let mut id = 0;
    // 120 s, a call every 500 ms to each of three endpoints; only `a`'s TTFT climbs.
    for step in 0..240i64 {
        let t = step * 500 * MS;
        let ttft_a = 250 + (25_000 - 250) * step / 239;
        for (ep, ttft) in [("a", ttft_a), ("b", 250), ("c", 260)] {
            id += 1;
            r.at(t, call("llm", ep, id, OutcomeClass::Success, Some(ttft)));
        }
    }
    let a = r.changes_of("a");
    let path: Vec<HealthState> = a.iter().map(|h| h.to_state).collect();
    assert_eq!(
        path[0],
        HealthState::Degraded,
        "first a degradation, not an ejection: {path:?}"
    );
    assert!(path.contains(&HealthState::Unhealthy), "then ejected: {path:?}");
    let degraded = a[0];
    assert!(degraded.reason.contains("score<60"), "{}", degraded.reason);
    assert!(
        degraded.evidence.ttft_p50_ms.unwrap() < 10_000.0,
        "degraded before any call timed out"
    );
    assert_eq!(
        degraded.evidence.failure_rate, 0.0,
        "every call was a 200 when it degraded"
    );
    assert_eq!(degraded.weight, Policy::default().degraded_weight);
    let ejected = a.iter().find(|h| h.to_state == HealthState::Unhealthy).unwrap();
    assert!(
        ejected.evidence.thresholds.iter().any(|t| t.starts_with("ttft>")),
        "{:?}",
        ejected.evidence.thresholds
    );
    assert!(ejected.retry_at.is_some());
    assert!(r.changes_of("b").is_empty() && r.changes_of("c").is_empty());
}

/// Seed 001's deadband: out below 60, back only above 85 held for 30 s.
#[test]
fn degraded_recovers_only_after_score_held_above_85_for_30s() {
    let mut r = Run::new();
    let mut id = 0;
    let mut t = 0;
    // Slow first tokens (1.1 s) for 10 s: the score sinks below 60.
    while t < 10 * SEC {
        id += 1;
        r.at(t, call("llm", "a", id, OutcomeClass::Success, Some(1_100)));
        t += 500 * MS;
    }
    assert_eq!(r.state_of("llm", "a"), HealthState::Degraded);
    // Back to 250 ms; watch when the score first crosses 85.
    let mut crossed_at = None;
    let mut healthy_at = None;
    while t < 90 * SEC && healthy_at.is_none() {
        id += 1;
        let d = r.at(t, call("llm", "a", id, OutcomeClass::Success, Some(250)));
        let score = r.engine.pool("llm").unwrap().endpoint("a").unwrap().score();
        if score > 85.0 && crossed_at.is_none() {
            crossed_at = Some(t);
        }
        if transitions(&d).iter().any(|h| h.to_state == HealthState::Healthy) {
            healthy_at = Some(t);
        }
        t += 500 * MS;
    }
    let (crossed, healthy) = (crossed_at.unwrap(), healthy_at.expect("recovers in the end"));
    assert!(
        healthy - crossed >= 30 * SEC,
        "healthy {} s after crossing 85",
        (healthy - crossed) / SEC
    );
    assert!(healthy - crossed <= 31 * SEC);
    assert_eq!(r.path_of("a"), vec![HealthState::Degraded, HealthState::Healthy]);
}

/// Seed 001: 15% of connections silently dropped. The score notices; the window's failure
/// rate (far below 80%) and the consecutive rule do not eject.
#[test]
fn fifteen_percent_dropped_connections_degrade_without_ejecting() {
    let mut r = Run::new();
    let mut rng: u64 = 0x5eed;
    let mut dropped = 0;
    for i in 0..600u64 {
        rng = rng.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        let drop = (rng >> 33) % 100 < 15;
        dropped += drop as u32;
        let outcome = if drop {
            OutcomeClass::ConnectionDropped
        } else {
            OutcomeClass::Success
        };
        r.at(
            i as i64 * 500 * MS,
            call("llm", "a", i, outcome, if drop { None } else { Some(300) }),
        );
        r.at(
            i as i64 * 500 * MS,
            call("llm", "b", i, OutcomeClass::Success, Some(300)),
        );
    }
    assert!((60..=120).contains(&dropped), "the mix is about 15%: {dropped}/600");
    let path = r.path_of("a");
    assert!(path.contains(&HealthState::Degraded), "{path:?}");
    assert!(!path.contains(&HealthState::Unhealthy), "never ejected: {path:?}");
    let d = r
        .changes_of("a")
        .into_iter()
        .find(|h| h.to_state == HealthState::Degraded)
        .unwrap();
    assert!(d.evidence.connection_dropped > 0);
    assert!(d.evidence.failure_rate < 0.5, "{}", d.evidence.failure_rate);
}

/// Seed 000: 5 failed probes → unhealthy → isolation → trial → recovering → healthy; the next
/// isolation lasts twice as long.
#[test]
fn five_failed_probes_isolate_then_trial_recover_and_second_isolation_is_twice_as_long() {
    let mut r = Run::new();
    let p = |id, outcome| Signal::Probe(probe("models", "a", id, ProbeKind::SyntheticCompletion, outcome));
    for peer in ["b", "c", "d"] {
        r.at(
            0,
            Signal::Probe(probe(
                "models",
                peer,
                0,
                ProbeKind::SyntheticCompletion,
                OutcomeClass::Success,
            )),
        );
    }
    for i in 0..5 {
        r.at(i * SEC, p(i as u64, OutcomeClass::ConnectError));
    }
    let ejected = *r.changes_of("a").last().unwrap();
    assert_eq!(ejected.to_state, HealthState::Unhealthy);
    assert_eq!(ejected.evidence.consecutive_failures, 5);
    assert_eq!(
        ejected.trigger_ids.len(),
        5,
        "the five failed probes: {:?}",
        ejected.trigger_ids
    );
    assert_eq!(ejected.retry_at, Some(T0 + 4 * SEC + 30 * SEC));
    // On the way out the score may already have marked it degraded (two failures take the
    // EWMA below 60) before the fifth failure ejects it.
    let path = r.path_of("a");
    assert_eq!(path.last(), Some(&HealthState::Unhealthy), "{path:?}");
    assert!(path.len() <= 2, "{path:?}");

    // A success during isolation is not a trial.
    r.at(10 * SEC, p(10, OutcomeClass::Success));
    assert_eq!(r.state_of("models", "a"), HealthState::Unhealthy);
    r.tick_until(34 * SEC);
    let d = r.at(35 * SEC, p(35, OutcomeClass::Success));
    let rec = transitions(&d)[0];
    assert_eq!(
        (rec.to_state, rec.weight, rec.ramp_ms),
        (HealthState::Recovering, 0.1, 30_000)
    );
    for s in 36..=66 {
        r.at(s * SEC, p(s as u64, OutcomeClass::Success));
    }
    assert_eq!(r.state_of("models", "a"), HealthState::Healthy);
    let healthy = *r.changes_of("a").last().unwrap();
    assert_eq!(
        healthy.stream_time,
        T0 + 65 * SEC,
        "healthy when the 30 s slow start ends"
    );

    for i in 0..5 {
        r.at((70 + i) * SEC, p(70 + i as u64, OutcomeClass::ConnectError));
    }
    let second = *r.changes_of("a").last().unwrap();
    assert_eq!(second.to_state, HealthState::Unhealthy);
    assert_eq!(
        second.retry_at,
        Some(second.stream_time + 60 * SEC),
        "{}",
        second.reason
    );
    assert_eq!(second.evidence.isolations, 2);
}

/// A failure while recovering sends the endpoint straight back to unhealthy.
#[test]
fn failure_while_recovering_isolates_again() {
    let mut r = Run::new();
    for i in 0..5 {
        r.at(i * SEC, call("p", "a", i as u64, OutcomeClass::Timeout, None));
    }
    r.tick_until(40 * SEC);
    r.at(41 * SEC, call("p", "a", 100, OutcomeClass::Success, None));
    r.at(42 * SEC, call("p", "a", 101, OutcomeClass::ServerError, None));
    let last = *r.changes_of("a").last().unwrap();
    assert_eq!(
        (last.from_state, last.to_state),
        (HealthState::Recovering, HealthState::Unhealthy)
    );
    assert_eq!(last.reason_code, "failed_while_recovering");
}

/// Seed 004: every endpoint of a pool fails at once. Vitals ejects no more than max-ejection %
/// and decides, once, that a shared dependency is the likelier cause.
#[test]
fn shared_dependency_outage_ejects_at_most_max_ejection_and_raises_one_pool_decision() {
    let mut r = Run::new();
    let eps = ["e1", "e2", "e3", "e4", "e5", "e6"];
    for e in eps {
        r.at(0, call("shared", e, 0, OutcomeClass::Success, None));
    }
    for round in 1..=20i64 {
        for e in eps {
            r.at(
                round * 100 * MS,
                call("shared", e, round as u64, OutcomeClass::ServerError, None),
            );
        }
    }
    let pool = r.engine.pool("shared").unwrap();
    assert_eq!(pool.count(HealthState::Unhealthy), 3, "50% of 6");
    assert_eq!(pool.count(HealthState::Degraded), 3, "the rest keep serving, degraded");
    let refused: Vec<_> = transitions(&r.decisions)
        .into_iter()
        .filter(|h| h.reason() == Some(ReasonCode::EjectionRefused))
        .collect();
    assert_eq!(refused.len(), 3);
    assert!(
        refused[0].reason.contains("suspected shared dependency"),
        "{}",
        refused[0].reason
    );
    let events = pool_events(&r.decisions);
    let mut raised = 0;
    let mut before = false;
    for e in &events {
        raised += (e.correlated_outage && !before) as u32;
        before = e.correlated_outage;
    }
    assert_eq!(raised, 1, "one correlated-outage decision: {events:#?}");
    let last = events.last().unwrap();
    assert!(last.correlated_outage && last.panic, "{last:?}");
}

/// Seed 002: alternating results must not flap the state.
#[test]
fn flapping_endpoint_does_not_flap() {
    let mut r = Run::new();
    for i in 0..600i64 {
        let outcome = if i % 2 == 0 {
            OutcomeClass::Success
        } else {
            OutcomeClass::Timeout
        };
        r.at(i * 500 * MS, call("p", "a", i as u64, outcome, None));
    }
    let path = r.path_of("a");
    assert!(
        path.len() <= 1,
        "at most one move (to degraded) in 5 minutes of alternation: {path:?}"
    );
    assert!(!path.contains(&HealthState::Unhealthy));
}

/// Seed 002: no heartbeat for 3 × interval → suspect; continued silence → unhealthy.
#[test]
fn heartbeat_silence_makes_suspect_then_unhealthy() {
    let mut r = Run::new();
    let hb = |id| {
        let mut p = probe("p", "a", id, ProbeKind::Heartbeat, OutcomeClass::Success);
        p.interval_ms = Some(5_000);
        Signal::Probe(p)
    };
    for i in 0..4 {
        r.at(i * 5 * SEC, hb(i as u64));
    }
    let last_beat = 15 * SEC;
    r.tick_until(last_beat + 70 * SEC);
    let changes = r.changes_of("a");
    assert_eq!(changes.len(), 2, "{changes:#?}");
    assert_eq!(changes[0].to_state, HealthState::Suspect);
    assert_eq!(changes[0].stream_time, T0 + last_beat + 15 * SEC);
    assert_eq!(changes[1].to_state, HealthState::Unhealthy);
    assert_eq!(changes[1].stream_time, T0 + last_beat + 45 * SEC);
    assert!(changes[1].reason.contains("heartbeat"), "{}", changes[1].reason);
}

/// A timer that fired and changed nothing does not fire again at every later signal (that made
/// the engine slower as the run grew); an ejection the max-ejection rule refused is looked at
/// again as soon as a slot comes free, not only when the endpoint speaks.
#[test]
fn a_refused_ejection_is_taken_when_a_slot_comes_free() {
    let mut r = Run::new();
    let hb = |ep: &str, id| {
        let mut p = probe("p", ep, id, ProbeKind::Heartbeat, OutcomeClass::Success);
        p.interval_ms = Some(5_000);
        Signal::Probe(p)
    };
    for i in 0..4u64 {
        r.at(i as i64 * 5 * SEC, hb("a", i));
        r.at(i as i64 * 5 * SEC, hb("b", 100 + i));
    }
    // Both fall silent; at 9 intervals a is ejected and b, the second of two, is refused.
    r.tick_until(15 * SEC + 50 * SEC);
    assert_eq!(r.state_of("p", "a"), HealthState::Unhealthy);
    assert_eq!(r.state_of("p", "b"), HealthState::Degraded);
    // a's isolation ends and its trial succeeds: it leaves the ejected set, and b (still silent,
    // sending nothing) is ejected at the pool's next signal.
    r.tick_until(15 * SEC + 45 * SEC + 31 * SEC);
    let trial_at = r.now - T0;
    r.at(trial_at, hb("a", 9));
    assert_eq!(r.state_of("p", "a"), HealthState::Recovering);
    assert_eq!(r.state_of("p", "b"), HealthState::Degraded);
    r.at(trial_at + SEC, tick());
    assert_eq!(r.state_of("p", "b"), HealthState::Unhealthy);
    let last = *r.changes_of("b").last().unwrap();
    assert_eq!(last.stream_time, T0 + trial_at + SEC);
    assert!(last.reason.contains("heartbeat"), "{}", last.reason);
}

/// A heartbeat after suspicion clears it after M successes.
#[test]
fn heartbeats_returning_clear_suspicion() {
    let mut r = Run::new();
    let hb = |id| Signal::Probe(probe("p", "a", id, ProbeKind::Heartbeat, OutcomeClass::Success));
    r.at(0, hb(0));
    r.tick_until(16 * SEC);
    assert_eq!(r.state_of("p", "a"), HealthState::Suspect);
    for i in 1..=3 {
        r.at((16 + i) * SEC, hb(i as u64));
    }
    assert_eq!(r.path_of("a"), vec![HealthState::Suspect, HealthState::Healthy]);
}

/// 4xx and cancelled calls are the caller's problem: nothing changes.
#[test]
fn client_error_storm_changes_nothing() {
    let mut r = Run::new();
    for i in 0..2_000i64 {
        let outcome = if i % 3 == 0 {
            OutcomeClass::Cancelled
        } else {
            OutcomeClass::ClientError
        };
        r.at(i * 10 * MS, call("p", "a", i as u64, outcome, None));
    }
    assert!(r.decisions.is_empty(), "{:#?}", r.decisions.first());
    let t = r.engine.pool("p").unwrap().endpoint("a").unwrap();
    assert_eq!(
        (t.state(), t.score(), t.consecutive_failures()),
        (HealthState::Healthy, 100.0, 0)
    );
}

/// Operator overrides are transitions like any other, with who and why.
#[test]
fn override_and_its_audit_trail() {
    let mut r = Run::new();
    let ov = |id: &str, action, actor: &str| {
        Signal::Override(OperatorOverride {
            override_id: id.into(),
            pool: "p".into(),
            endpoint: "a".into(),
            action,
            actor: actor.into(),
            reason: "INC-42 bad deploy".into(),
            issued_at: T0,
        })
    };
    r.at(0, call("p", "a", 0, OutcomeClass::Success, None));
    let d = r.at(SEC, ov("ov-1", OverrideAction::ForceUnhealthy, "alice"));
    let h = transitions(&d)[0];
    assert_eq!(
        (h.from_state, h.to_state, h.seq),
        (HealthState::Healthy, HealthState::Unhealthy, 1)
    );
    assert_eq!(h.reason, "forced unhealthy by alice: INC-42 bad deploy");
    assert_eq!(h.trigger_ids, vec!["ov-1".to_string()]);
    assert_eq!(h.evidence.thresholds, vec!["operator:alice".to_string()]);
    assert_eq!(h.retry_at, None, "a forced state has no trial");
    // Automatic rules stay out of a forced state.
    for i in 1..50 {
        r.at(
            SEC + i * 100 * MS,
            call("p", "a", i as u64, OutcomeClass::Success, None),
        );
    }
    r.tick_until(120 * SEC);
    assert_eq!(r.changes_of("a").len(), 1);
    r.at(121 * SEC, ov("ov-2", OverrideAction::MaintenanceOn, "bob"));
    r.at(122 * SEC, ov("ov-3", OverrideAction::MaintenanceOff, "bob"));
    assert_eq!(
        r.path_of("a"),
        vec![
            HealthState::Unhealthy,
            HealthState::Maintenance,
            HealthState::Recovering
        ]
    );
    let seqs: Vec<i64> = r.changes_of("a").iter().map(|h| h.seq).collect();
    assert_eq!(seqs, vec![1, 2, 3]);
}

/// Policy changes arrive through the log and take effect from there.
#[test]
fn policy_change_from_the_log_changes_thresholds() {
    let mut r = Run::new();
    let policy = Policy {
        version: 7,
        consecutive_failures: 2,
        suspect_after_failures: 1,
        ..Policy::default()
    };
    let d = r.at(
        0,
        Signal::Policy(PolicyChange {
            change_id: "pc-1".into(),
            pool: "p".into(),
            actor: "carol".into(),
            issued_at: T0,
            policy,
        }),
    );
    let pe = pool_events(&d);
    assert_eq!(pe.len(), 1);
    assert!(pe[0].reason.contains("policy version 7 applied by carol"));
    r.at(SEC, call("p", "b", 0, OutcomeClass::Success, None));
    r.at(SEC, call("p", "a", 1, OutcomeClass::ConnectError, None));
    r.at(2 * SEC, call("p", "a", 2, OutcomeClass::ConnectError, None));
    let last = *r.changes_of("a").last().unwrap();
    assert_eq!((last.to_state, last.policy_version), (HealthState::Unhealthy, 7));
}

/// A pool holds at most its policy's `max_endpoints`: a signal naming one more is refused and
/// changes nothing (not even stream time), while the endpoints it holds go on being judged, and
/// an operator override for an unknown endpoint is refused the same way.
#[test]
fn a_pool_at_its_endpoint_cap_refuses_new_endpoints_and_keeps_judging_the_rest() {
    let mut r = Run::new();
    let policy = Policy {
        version: 2,
        max_endpoints: 2,
        ..Policy::default()
    };
    r.at(
        0,
        Signal::Policy(PolicyChange {
            change_id: "pc-cap".into(),
            pool: "p".into(),
            actor: "carol".into(),
            issued_at: T0,
            policy,
        }),
    );
    assert!(r
        .engine
        .refusal(&call("p", "a", 0, OutcomeClass::Success, None))
        .is_none());
    r.at(SEC, call("p", "a", 0, OutcomeClass::Success, None));
    r.at(SEC, call("p", "b", 0, OutcomeClass::Success, None));
    let third = call("p", "c", 0, OutcomeClass::ConnectError, None);
    let why = r.engine.refusal(&third).expect("a third endpoint is refused");
    assert!(why.contains("max_endpoints 2") && why.contains("\"c\""), "{why}");
    let mut out = Vec::new();
    assert_eq!(
        r.engine.apply(T0 + 5 * SEC, &stamped(T0 + 5 * SEC, &third), &mut out),
        None
    );
    assert!(out.is_empty());
    assert_eq!(r.engine.now(), T0 + SEC, "a refused signal does not move stream time");
    assert!(r.engine.pool("p").unwrap().endpoint("c").is_none());
    assert_eq!(r.engine.pool("p").unwrap().total(), 2);
    // Known endpoints are not refused, and another pool has its own cap.
    assert!(r
        .engine
        .refusal(&call("p", "a", 1, OutcomeClass::ServerError, None))
        .is_none());
    assert!(r
        .engine
        .refusal(&call("q", "c", 0, OutcomeClass::Success, None))
        .is_none());
    let force = Signal::Override(OperatorOverride {
        override_id: "o-1".into(),
        pool: "p".into(),
        endpoint: "z".into(),
        action: OverrideAction::ForceUnhealthy,
        actor: "carol".into(),
        reason: "test".into(),
        issued_at: T0,
    });
    assert!(r.engine.refusal(&force).is_some());
    for i in 1..=5 {
        r.at(
            SEC + i * 100 * MS,
            call("p", "a", i as u64, OutcomeClass::ConnectError, None),
        );
    }
    assert_eq!(r.state_of("p", "a"), HealthState::Unhealthy);
}

/// Seed 004: latency far above the pool's peers is a health signal.
#[test]
fn latency_far_above_peers_degrades() {
    let mut r = Run::new();
    for i in 0..40u64 {
        for (ep, ms) in [("a", 900), ("b", 100), ("c", 110), ("d", 95)] {
            let mut s = call("p", ep, i, OutcomeClass::Success, None);
            if let Signal::Call(c) = &mut s {
                c.latency_us = ms * MS;
            }
            r.at(i as i64 * 250 * MS, s);
        }
    }
    let a = r.changes_of("a");
    assert_eq!(a.len(), 1, "{a:#?}");
    assert_eq!(a[0].to_state, HealthState::Degraded);
    assert!(a[0].evidence.pool_latency_median_ms.unwrap() < 120.0);
    assert!(r.changes_of("b").is_empty());
}

/// Critical dependency down → unhealthy; non-critical → degraded only.
#[test]
fn critical_and_noncritical_dependencies() {
    let mut r = Run::new();
    let with_dep = |ep: &str, id, critical| {
        let mut p = probe("p", ep, id, ProbeKind::Http, OutcomeClass::Success);
        p.dependencies = vec![DependencyReport {
            name: "db".into(),
            critical,
            status: DependencyStatus::Down,
        }];
        Signal::Probe(p)
    };
    for e in ["a", "b", "c", "d"] {
        r.at(0, call("p", e, 0, OutcomeClass::Success, None));
    }
    r.at(SEC, with_dep("a", 1, false));
    r.at(SEC, with_dep("b", 1, true));
    assert_eq!(r.state_of("p", "a"), HealthState::Degraded);
    assert_eq!(r.state_of("p", "b"), HealthState::Unhealthy);
    assert!(r.changes_of("b")[0].reason.contains("critical_dependency_down:db"));
}

/// Snapshot in the middle of a scenario, restore, continue: identical decisions.
#[test]
fn snapshot_mid_scenario_continues_identically() {
    let signals: Vec<(Micros, Signal)> = (0..400i64)
        .map(|i| {
            let outcome = if (i / 20) % 3 == 0 {
                OutcomeClass::Timeout
            } else {
                OutcomeClass::Success
            };
            (
                T0 + i * 300 * MS,
                call("p", ["a", "b", "c"][(i % 3) as usize], i as u64, outcome, Some(300)),
            )
        })
        .collect();
    let mut whole = Engine::new(Policy::default());
    let mut expected = Vec::new();
    for (t, s) in &signals {
        whole.apply(*t, &stamped(*t, s), &mut expected);
    }
    let mut first = Engine::new(Policy::default());
    let mut got = Vec::new();
    for (t, s) in &signals[..173] {
        first.apply(*t, &stamped(*t, s), &mut got);
    }
    let mut second = Engine::restore(&first.snapshot()).unwrap();
    for (t, s) in &signals[173..] {
        second.apply(*t, &stamped(*t, s), &mut got);
    }
    assert!(!expected.is_empty());
    assert_eq!(got, expected);
    assert_eq!(second, whole);
}

/// Values no validated policy can hold (the API and the processor refuse them) must still not
/// wrap stream time: a heartbeat interval of i64::MAX ms once ejected a healthy endpoint right
/// after its successful heartbeat, and a huge isolation put `retry_at` before the ejection.
#[test]
fn absurd_policy_values_saturate_instead_of_wrapping_stream_time() {
    let policy = Policy {
        heartbeat_interval_ms: i64::MAX,
        isolation_base_ms: 17_444_980_000_000_000,
        isolation_max_ms: 17_444_980_000_000_000,
        slow_start_ms: i64::MAX,
        recover_hold_ms: i64::MAX,
        ..Policy::default()
    };
    let mut r = Run::new();
    r.engine = Engine::new(policy);
    let mut hb = probe("p", "a", 0, ProbeKind::Heartbeat, OutcomeClass::Success);
    hb.interval_ms = None;
    r.at(0, Signal::Probe(hb));
    r.tick_until(10 * SEC);
    assert_eq!(r.path_of("a"), vec![], "a healthy heartbeat is not an ejection");
    for i in 0..5 {
        r.at(
            11 * SEC + i * 100 * MS,
            call("p", "b", i as u64, OutcomeClass::ConnectError, None),
        );
    }
    let ejected = r
        .changes_of("b")
        .into_iter()
        .find(|h| h.to_state == HealthState::Unhealthy)
        .cloned();
    let ejected = ejected.expect("five connect errors eject");
    let retry_at = ejected.retry_at.expect("an isolation has a retry time");
    assert!(
        retry_at > ejected.stream_time,
        "retry_at {retry_at} after {}",
        ejected.stream_time
    );
    r.tick_until(60 * SEC);
    assert_eq!(r.state_of("p", "b"), HealthState::Unhealthy, "still isolated");
}
