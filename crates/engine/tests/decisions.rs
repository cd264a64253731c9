//! Scenario tests of the decisions that restore fast, follow the evidence and never eject on
//! stale data: probe-driven readmission, jittered trials, evidence matched to the failure,
//! peer-relative failure outliers, rate-limit cooldowns and fresh evidence after a shared outage.

mod common;
use common::*;
use vitals_contracts::*;

const EPS: [&str; 4] = ["a", "b", "c", "d"];

/// Calls to every endpoint of `EPS` at `per_sec` each over [from, to), `outcome_of` deciding
/// each (endpoint, call number) → (class, ttft ms). Returns the next id.
fn traffic(
    r: &mut Run,
    from: Micros,
    to: Micros,
    per_sec: i64,
    mut id: u64,
    mut outcome_of: impl FnMut(&str, u64) -> (OutcomeClass, Option<i64>),
) -> u64 {
    let step = SEC / per_sec;
    let mut t = from;
    while t < to {
        for ep in EPS {
            id += 1;
            let (class, ttft) = outcome_of(ep, id);
            r.at(t, call("p", ep, id, class, ttft));
        }
        t += step;
    }
    id
}

fn ok(_: &str, _: u64) -> (OutcomeClass, Option<i64>) {
    (OutcomeClass::Success, Some(250))
}

fn http(ep: &str, id: u64, outcome: OutcomeClass) -> Signal {
    Signal::Probe(probe("p", ep, id, ProbeKind::Http, outcome))
}

fn completion(ep: &str, id: u64, ttft_ms: i64) -> Signal {
    let mut p = probe("p", ep, id, ProbeKind::SyntheticCompletion, OutcomeClass::Success);
    p.ttft_us = Some(ttft_ms * MS);
    p.latency_us = ttft_ms * MS + 100 * MS;
    Signal::Probe(p)
}

fn codes(r: &Run, ep: &str) -> Vec<String> {
    r.changes_of(ep).iter().map(|h| h.reason_code.clone()).collect()
}

/// A five-minute outage: the probes that fail during it change nothing (no "trial failed",
/// no doubling to 60, 120, 240 s), and the first probe that passes after it readmits.
#[test]
fn a_long_outage_ends_on_the_first_passing_probe_and_failed_probes_do_not_grow_the_isolation() {
    let mut r = Run::new();
    let mut id = traffic(&mut r, 0, 10 * SEC, 5, 0, ok);
    id = traffic(&mut r, 10 * SEC, 12 * SEC, 5, id, |ep, _| {
        if ep == "a" {
            (OutcomeClass::ConnectError, None)
        } else {
            (OutcomeClass::Success, Some(250))
        }
    });
    assert_eq!(r.state_of("p", "a"), HealthState::Unhealthy);
    let out = r.changes_of("a").len();
    let mut t = 15 * SEC;
    while t < 310 * SEC {
        id += 1;
        r.at(t, http("a", id, OutcomeClass::ConnectError));
        t += 5 * SEC;
    }
    assert_eq!(r.changes_of("a").len(), out, "failed probes are not transitions");
    let a = r.engine.pool("p").unwrap().endpoint("a").unwrap();
    assert_eq!(a.isolations(), 1, "a continuing outage does not grow the isolation");
    let d = r.at(312 * SEC, http("a", id + 1, OutcomeClass::Success));
    let back = transitions(&d);
    assert_eq!(back.len(), 1, "{back:#?}");
    assert_eq!(
        (back[0].to_state, back[0].reason_code.as_str(), back[0].weight),
        (HealthState::Recovering, "readmitted", 0.1)
    );
    assert!(back[0].reason.contains("http probe passed"), "{}", back[0].reason);
}

/// Without probes the router's trial calls decide. A failed trial keeps the isolation's length
/// (no doubling) and adds jitter derived from the endpoint and the attempt, so trials cannot
/// phase-lock with a periodic fault; replaying gives the same times.
#[test]
fn failed_trial_calls_retry_after_the_same_isolation_with_deterministic_jitter() {
    let run = || {
        let mut r = Run::new();
        for i in 0..5 {
            r.at(i * SEC, call("solo", "a", i as u64, OutcomeClass::Timeout, None));
        }
        let mut gaps = Vec::new();
        for attempt in 0..4u64 {
            let retry = r.changes_of("a").last().unwrap().retry_at.unwrap();
            r.tick_until(retry - T0);
            let at = r.now - T0 + SEC;
            let d = r.at(at, call("solo", "a", 100 + attempt, OutcomeClass::Timeout, None));
            let h = transitions(&d)[0].clone();
            assert_eq!(h.reason_code, "trial_failed");
            gaps.push(h.retry_at.unwrap() - h.stream_time);
        }
        (gaps, r.decisions.clone())
    };
    let (gaps, decisions) = run();
    for g in &gaps {
        assert!(
            (30 * SEC..37_500 * MS).contains(g),
            "30 s plus at most a quarter: {gaps:?}"
        );
    }
    let mut distinct = gaps.clone();
    distinct.dedup();
    assert!(distinct.len() > 1, "each attempt has its own jitter: {gaps:?}");
    assert_eq!(run().1, decisions, "replay gives the same decisions");
}

/// A flapping endpoint (ejected again soon after it was readmitted) backs off: its isolation
/// doubles, it needs two passing probes in a row to come back, and it comes back on probation
/// (a trickle of real calls decides), not to a slow start that would fail again.
#[test]
fn a_flapping_endpoint_backs_off_needs_two_passing_probes_and_comes_back_on_probation() {
    let mut r = Run::new();
    let mut id = traffic(&mut r, 0, 5 * SEC, 5, 0, ok);
    let fail_a = |ep: &str, _| {
        if ep == "a" {
            (OutcomeClass::ServerError, None)
        } else {
            (OutcomeClass::Success, Some(250))
        }
    };
    id = traffic(&mut r, 5 * SEC, 6 * SEC, 5, id, fail_a);
    assert_eq!(r.state_of("p", "a"), HealthState::Unhealthy);
    let first = (*r.changes_of("a").last().unwrap()).clone();
    assert!(
        first.reason.contains("out: a passing probe or call readmits it after "),
        "one pass readmits after a first ejection, and the reason says so in good grammar: {}",
        first.reason
    );
    id += 1;
    r.at(17 * SEC, http("a", id, OutcomeClass::Success));
    assert_eq!(r.state_of("p", "a"), HealthState::Recovering);
    id = traffic(&mut r, 18 * SEC, 19 * SEC, 5, id, fail_a);
    let again = (*r.changes_of("a").last().unwrap()).clone();
    assert_eq!(again.to_state, HealthState::Unhealthy);
    assert_eq!(again.evidence.isolations, 2);
    assert!(
        again
            .reason
            .contains("two passing probes or calls readmit it after 10 s, on probation"),
        "the reason says what comes next: {}",
        again.reason
    );
    assert_eq!(again.retry_at, Some(again.stream_time + 60 * SEC), "{}", again.reason);
    r.at(30 * SEC, http("a", id + 1, OutcomeClass::Success));
    assert_eq!(r.state_of("p", "a"), HealthState::Unhealthy, "one pass is not enough");
    r.at(35 * SEC, http("a", id + 2, OutcomeClass::Success));
    let back = *r.changes_of("a").last().unwrap();
    assert_eq!(
        (back.to_state, back.reason_code.as_str(), back.weight, back.ramp_ms),
        (HealthState::Recovering, "probation", 0.01, 0)
    );
    assert!(back.evidence.thresholds.contains(&"passing_evidence>=2".to_owned()));
}

/// Eject `a` for first tokens of 6 s while its peers answer in 250 ms; returns the next id.
fn eject_for_slow_first_tokens(r: &mut Run) -> u64 {
    let id = traffic(r, 0, 10 * SEC, 5, 0, ok);
    let id = traffic(r, 10 * SEC, 20 * SEC, 5, id, |ep, _| {
        (OutcomeClass::Success, Some(if ep == "a" { 6_000 } else { 250 }))
    });
    let out = r
        .changes_of("a")
        .into_iter()
        .find(|h| h.to_state == HealthState::Unhealthy)
        .expect("ejected for its first tokens");
    assert!(
        out.evidence.thresholds.iter().any(|t| t.starts_with("ttft>")),
        "{:?}",
        out.evidence.thresholds
    );
    id
}

/// An endpoint out for slow first tokens comes back on a synthetic completion only when the
/// completion's first token is fast: a slow one is a failure, not a pass.
#[test]
fn a_slow_first_token_ejection_is_readmitted_by_a_fast_completion_probe_only() {
    let mut r = Run::new();
    let id = eject_for_slow_first_tokens(&mut r);
    let out = r.changes_of("a").len();
    r.at(40 * SEC, completion("a", id + 1, 6_000));
    assert_eq!(r.changes_of("a").len(), out, "a slow completion readmits nothing");
    r.at(45 * SEC, completion("a", id + 2, 300));
    let back = *r.changes_of("a").last().unwrap();
    assert_eq!(
        (back.to_state, back.reason_code.as_str()),
        (HealthState::Recovering, "readmitted")
    );
    assert!(!back.reason.contains("canary"), "{}", back.reason);
}

/// Back from slow first tokens, in slow start, the endpoint goes down: it is out for errors now,
/// and passing health probes bring it back as they would any endpoint out for errors. Kept out
/// for first tokens, it waited for a fast first token, or for the whole isolation and then
/// probation on a health probe — and a busy one that came back to full weight a moment before
/// went out for errors: the same outage, two ways back (the summaries' property test found it,
/// the two engines a few milliseconds apart across slow start's end).
#[test]
fn back_from_slow_first_tokens_an_endpoint_that_goes_down_is_out_for_errors() {
    let mut r = Run::new();
    let mut id = eject_for_slow_first_tokens(&mut r);
    id += 1;
    r.at(45 * SEC, completion("a", id, 300));
    assert_eq!(r.state_of("p", "a"), HealthState::Recovering, "readmitted: slow start");
    let mut t = 46 * SEC;
    while r.state_of("p", "a") == HealthState::Recovering {
        id += 1;
        r.at(t, call("p", "a", id, OutcomeClass::ConnectError, None));
        t += 100 * MS;
    }
    let out = (*r.changes_of("a").last().unwrap()).clone();
    assert_eq!(out.reason_code, "failed_while_recovering");
    assert!(
        !out.reason.contains("first token"),
        "out for errors, not first tokens: {}",
        out.reason
    );
    // The isolation over, health probes pass (two: it flapped): back, on probation for errors.
    for k in 0..2 {
        id += 1;
        r.at(t + 15 * SEC + k * SEC, http("a", id, OutcomeClass::Success));
    }
    let back = *r.changes_of("a").last().unwrap();
    assert_eq!(back.to_state, HealthState::Recovering, "{}", back.reason);
    assert!(
        !back.reason.contains("ttft") && !back.reason.contains("first token"),
        "{}",
        back.reason
    );
}

/// A health-route probe cannot see first tokens: it readmits a TTFT ejection only once the
/// announced isolation is over, and only on probation, where real calls decide. Slow calls keep
/// it there (no transition, no cycle of ejections); a few fast ones end the probation.
#[test]
fn a_health_probe_readmits_a_slow_first_token_ejection_only_on_probation_after_the_isolation() {
    let mut r = Run::new();
    let mut id = eject_for_slow_first_tokens(&mut r);
    let out = *r.changes_of("a").last().unwrap();
    assert!(
        out.reason
            .contains("a health probe only after 30 s, on probation at weight 0.05"),
        "the reason says what comes next: {}",
        out.reason
    );
    let retry_at = out.retry_at.unwrap() - T0;
    id += 1;
    r.at(retry_at - 5 * SEC, http("a", id, OutcomeClass::Success));
    assert_eq!(
        r.state_of("p", "a"),
        HealthState::Unhealthy,
        "not before the isolation is over"
    );
    id += 1;
    r.at(retry_at + SEC, http("a", id, OutcomeClass::Success));
    let back = *r.changes_of("a").last().unwrap();
    assert_eq!(
        (back.to_state, back.reason_code.as_str(), back.ramp_ms),
        (HealthState::Recovering, "probation", 0)
    );
    assert!(back.reason.contains("cannot see ttft"), "{}", back.reason);
    assert_eq!(
        back.weight, 0.05,
        "slow calls cost latency, not errors: half the slow-start weight"
    );
    let changes = r.changes_of("a").len();
    let mut t = retry_at + 2 * SEC;
    for _ in 0..10 {
        t += 2 * SEC;
        id += 1;
        r.at(t, call("p", "a", id, OutcomeClass::Success, Some(6_000)));
        id += 1;
        r.at(t, http("a", id, OutcomeClass::Success));
    }
    assert_eq!(
        r.changes_of("a").len(),
        changes,
        "slow calls keep it on probation, no cycle"
    );
    for _ in 0..3 {
        t += SEC;
        id += 1;
        r.at(t, call("p", "a", id, OutcomeClass::Success, Some(250)));
    }
    let over = (*r.changes_of("a").last().unwrap()).clone();
    assert_eq!(
        (over.to_state, over.reason_code.as_str(), over.weight),
        (HealthState::Recovering, "probation_over", 0.1)
    );
    r.tick_until(t + 31 * SEC);
    id += 1;
    r.at(r.now - T0, call("p", "a", id, OutcomeClass::Success, Some(250)));
    assert!(
        r.changes_of("a")
            .iter()
            .any(|h| h.stream_time > over.stream_time && h.reason_code == "recovered"),
        "slow start completes: {:#?}",
        r.changes_of("a")
            .iter()
            .map(|h| (h.stream_time - T0, &h.reason))
            .collect::<Vec<_>>()
    );
}

/// A call that began before the endpoint was readmitted says nothing about it now: a slow call
/// started during the fault and finishing after the readmission does not eject it again.
#[test]
fn a_call_begun_before_the_readmission_does_not_count_against_it() {
    let mut r = Run::new();
    let mut id = eject_for_slow_first_tokens(&mut r);
    id += 1;
    r.at(45 * SEC, completion("a", id, 300));
    assert_eq!(r.state_of("p", "a"), HealthState::Recovering);
    // Began at 41 s (6 s to its first token, 50 ms more), reported at 47.05 s.
    r.at(
        47 * SEC + 50 * MS,
        call("p", "a", id + 1, OutcomeClass::Success, Some(6_000)),
    );
    assert_eq!(r.state_of("p", "a"), HealthState::Recovering);
    r.at(53 * SEC, call("p", "a", id + 2, OutcomeClass::Success, Some(6_000)));
    assert_eq!(
        r.state_of("p", "a"),
        HealthState::Unhealthy,
        "one begun at 46.95 s counts"
    );
}

/// The seed's 15 % dropped connections, now with three clean peers: the failure rate is far
/// below 80 %, but far above the peers' (Wilson bounds), and the endpoint is out within 10 s.
#[test]
fn fifteen_percent_drops_with_clean_peers_are_ejected_within_ten_seconds() {
    let mut r = Run::new();
    let id = traffic(&mut r, 0, 30 * SEC, 5, 0, ok);
    let mut rng: u64 = 0x5eed;
    traffic(&mut r, 30 * SEC, 60 * SEC, 5, id, |ep, _| {
        rng = rng.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        if ep == "a" && (rng >> 33) % 100 < 15 {
            (OutcomeClass::ConnectionDropped, None)
        } else {
            (OutcomeClass::Success, Some(250))
        }
    });
    let out = r
        .changes_of("a")
        .into_iter()
        .find(|h| h.to_state == HealthState::Unhealthy)
        .expect("ejected");
    assert!(
        out.stream_time - T0 <= 40 * SEC,
        "out {} s after the drops began",
        (out.stream_time - T0 - 30 * SEC) / SEC
    );
    assert!(out.reason.contains("peers"), "{}", out.reason);
    assert!(out.evidence.failure_rate < 0.5);
    for ep in ["b", "c", "d"] {
        assert!(r.changes_of(ep).is_empty(), "{ep}: {:?}", r.path_of(ep));
    }
}

/// 1 % of calls failing at random everywhere is noise: nothing is ejected or made suspect.
#[test]
fn one_percent_noise_in_a_pool_of_four_changes_nothing() {
    let mut r = Run::new();
    let mut rng: u64 = 7;
    traffic(&mut r, 0, 600 * SEC, 5, 0, |_, _| {
        rng = rng.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        if (rng >> 33) % 1000 < 10 {
            (OutcomeClass::ServerError, None)
        } else {
            (OutcomeClass::Success, Some(250))
        }
    });
    for ep in EPS {
        assert!(r.changes_of(ep).is_empty(), "{ep}: {:?}", codes(&r, ep));
    }
}

/// Two failures in a row among many successes (3 %) used to make an endpoint suspect and clear
/// it three calls later, over and over: isolated failures now leave the audit log alone.
#[test]
fn isolated_failures_do_not_make_an_endpoint_suspect() {
    let mut r = Run::new();
    for i in 0..600u64 {
        let outcome = if i % 60 >= 58 {
            OutcomeClass::ConnectionDropped
        } else {
            OutcomeClass::Success
        };
        r.at(i as i64 * 200 * MS, call("solo", "a", i, outcome, Some(250)));
    }
    assert!(
        r.path_of("a").is_empty(),
        "{:?}",
        r.changes_of("a")
            .iter()
            .map(|h| (h.stream_time - T0, &h.reason))
            .collect::<Vec<_>>()
    );
}

/// 429s are the upstream asking for less traffic: a cooldown of its Retry-After, no isolation
/// backoff, and never an outage — with every endpoint rate limited, at most max-ejection of
/// them cool down, the rest keep serving, and the pool neither suspects a shared outage nor
/// panics. A storm that comes back soon after a cooldown: its first 429 cools it again, for the
/// Retry-After it says (the upstream knows when its limit lifts).
#[test]
fn rate_limiting_cools_down_for_retry_after_as_said_and_never_an_outage() {
    let mut r = Run::new();
    let mut id = traffic(&mut r, 0, 10 * SEC, 5, 0, ok);
    let limited = |r: &mut Run, at: Micros, ep: &str, id: u64| {
        let Signal::Call(mut c) = call("p", ep, id, OutcomeClass::RateLimited, None) else {
            unreachable!()
        };
        c.retry_after_ms = Some(7_000);
        r.at(at, Signal::Call(c))
    };
    for k in 0..3 {
        for ep in EPS {
            id += 1;
            limited(&mut r, 10 * SEC + k * 100 * MS, ep, id);
        }
    }
    let pool = r.engine.pool("p").unwrap();
    assert_eq!(pool.count(HealthState::Unhealthy), 2, "max-ejection holds");
    let a = (*r.changes_of("a").last().unwrap()).clone();
    assert_eq!(
        (a.to_state, a.reason_code.as_str()),
        (HealthState::Unhealthy, "cooldown")
    );
    assert_eq!(a.retry_at, Some(a.stream_time + 7 * SEC), "{}", a.reason);
    assert!(a.reason.contains("Retry-After"), "{}", a.reason);
    assert_eq!(a.evidence.rate_limited, 3);
    for ep in ["c", "d"] {
        assert!(r.changes_of(ep).is_empty(), "{ep} keeps serving: {:?}", codes(&r, ep));
    }
    assert!(
        pool_events(&r.decisions)
            .iter()
            .all(|e| !e.correlated_outage && !e.panic),
        "{:#?}",
        pool_events(&r.decisions)
    );
    r.tick_until(18 * SEC);
    let over = *r.changes_of("a").last().unwrap();
    assert_eq!(
        (over.to_state, over.reason_code.as_str()),
        (HealthState::Recovering, "cooldown_over")
    );
    assert_eq!(over.stream_time, a.stream_time + 7 * SEC);
    // The storm again, soon after: one 429 cools it again, for what it says, and still no
    // isolation backoff.
    id += 1;
    limited(&mut r, 20 * SEC, "a", id);
    let second = *r.changes_of("a").last().unwrap();
    assert_eq!(
        (second.reason_code.as_str(), second.stream_time),
        ("cooldown", T0 + 20 * SEC)
    );
    assert_eq!(second.retry_at, Some(second.stream_time + 7 * SEC), "{}", second.reason);
    assert!(
        second.reason.contains("Retry-After") && !second.reason.contains("doubled"),
        "{}",
        second.reason
    );
    assert_eq!(r.engine.pool("p").unwrap().endpoint("a").unwrap().isolations(), 0);
    // Long after (past isolation_reset_ms): the upstream's Retry-After again.
    r.tick_until(20 * SEC + 11 * 60 * SEC);
    let now = r.now - T0;
    for k in 0..3 {
        id += 1;
        limited(&mut r, now + k * 100 * MS, "a", id);
    }
    let later = *r.changes_of("a").last().unwrap();
    assert_eq!(later.reason_code, "cooldown");
    assert_eq!(later.retry_at, Some(later.stream_time + 7 * SEC), "{}", later.reason);
}

/// Every endpoint fails for 30 s: half are ejected, half kept serving. When the outage ends,
/// the ones kept serving are judged on the calls after it — none is ejected on the outage's
/// window — and the ejected ones come back on their first passing evidence.
#[test]
fn after_a_shared_outage_endpoints_kept_serving_are_judged_on_fresh_calls() {
    let mut r = Run::new();
    let id = traffic(&mut r, 0, 10 * SEC, 5, 0, ok);
    let id = traffic(&mut r, 10 * SEC, 40 * SEC, 5, id, |_, _| {
        (OutcomeClass::ServerError, None)
    });
    let pool = r.engine.pool("p").unwrap();
    assert_eq!(pool.count(HealthState::Unhealthy), 2);
    assert!(pool.correlated_outage());
    let before = r.decisions.len();
    let mut id = traffic(&mut r, 40 * SEC, 41 * SEC, 5, id, ok);
    for ep in EPS {
        id += 1;
        r.at(42 * SEC, http(ep, id, OutcomeClass::Success));
    }
    traffic(&mut r, 42 * SEC, 80 * SEC, 5, id, ok);
    let after: Vec<&HealthChanged> = transitions(&r.decisions[before..]);
    assert!(
        after.iter().all(|h| h.to_state != HealthState::Unhealthy),
        "no ejection after the outage: {:#?}",
        after.iter().map(|h| (&h.endpoint, &h.reason)).collect::<Vec<_>>()
    );
    assert_eq!(
        after
            .iter()
            .filter(|h| h.reason() == Some(ReasonCode::OutageOver))
            .count(),
        2,
        "{:#?}",
        after.iter().map(|h| (&h.endpoint, &h.reason_code)).collect::<Vec<_>>()
    );
    let pool = r.engine.pool("p").unwrap();
    assert_eq!(pool.count(HealthState::Healthy), 4);
    assert!(!pool.correlated_outage());
}

/// A deterministic stream of drops: `share` percent of `a`'s calls.
fn drops(share: u64, seed: u64) -> impl FnMut(&str, u64) -> (OutcomeClass, Option<i64>) {
    let mut rng = seed;
    move |ep, _| {
        rng = rng.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        if ep == "a" && (rng >> 33) % 100 < share {
            (OutcomeClass::ConnectionDropped, None)
        } else {
            (OutcomeClass::Success, Some(250))
        }
    }
}

/// 15 % dropped connections: a passing health probe says little about them, so the endpoint
/// comes back on probation (a trickle of real calls), where its drops are no transition; once
/// it is fine, a long run of passes ends the probation. A run of 20 passes can happen by chance
/// among many outcomes: then slow start fails, and the next probation asks for 40. A handful of
/// transitions — not the eject/readmit cycle that re-exposed users every 10–20 s.
#[test]
fn an_endpoint_dropping_a_share_of_calls_comes_back_on_probation_and_stays_there_while_it_drops() {
    let mut r = Run::new();
    let mut id = traffic(&mut r, 0, 30 * SEC, 5, 0, ok);
    id = traffic(&mut r, 30 * SEC, 60 * SEC, 5, id, drops(15, 0x5eed));
    let out = *r
        .changes_of("a")
        .iter()
        .find(|h| h.to_state == HealthState::Unhealthy)
        .unwrap();
    assert!(
        out.reason
            .contains("a passing probe or call readmits it after 10 s, on probation"),
        "{}",
        out.reason
    );
    // Probes pass; the next one readmits on probation.
    let mut t = out.stream_time - T0 + 11 * SEC;
    id += 1;
    r.at(t, http("a", id, OutcomeClass::Success));
    let back = *r.changes_of("a").iter().find(|h| h.reason_code == "probation").unwrap();
    assert_eq!(
        (back.to_state, back.weight, back.ramp_ms),
        (HealthState::Recovering, 0.01, 0)
    );
    let changes = r.changes_of("a").len();
    // Four minutes more of 15 % drops, a call to `a` a second and a probe every 5 s.
    let mut fail = drops(15, 0xfeed);
    let until = t + 240 * SEC;
    while t < until {
        t += SEC;
        id += 1;
        let (class, ttft) = fail("a", id);
        r.at(t, call("p", "a", id, class, ttft));
        if (t / SEC) % 5 == 0 {
            id += 1;
            let (class, _) = fail("a", id);
            r.at(t, http("a", id, class));
        }
    }
    // A run of passes by chance grows its weight; the next drop holds it again, and each
    // growth asks for twice the run: a few transitions in four minutes, never out of rotation.
    let during = codes(&r, "a").split_off(changes);
    assert!(
        during.len() <= 4 && during.iter().all(|c| c.starts_with("probation")),
        "{during:?}"
    );
    let held = *r.changes_of("a").last().unwrap();
    assert_eq!(
        (held.to_state, held.weight, held.ramp_ms),
        (HealthState::Recovering, 0.01, 0),
        "held on probation: {during:?}"
    );
    // Fine again: a run of passes grows its weight to full over 10 s, and probation ends there.
    for _ in 0..120 {
        t += SEC;
        id += 1;
        r.at(t, call("p", "a", id, OutcomeClass::Success, Some(250)));
        if r.state_of("p", "a") == HealthState::Healthy {
            break;
        }
    }
    let after = r.changes_of("a").split_off(changes + during.len());
    let path: Vec<_> = after
        .iter()
        .map(|h| (h.reason_code.as_str(), h.weight, h.ramp_ms))
        .collect();
    assert_eq!(path, [("probation_growing", 0.01, 10_000), ("recovered", 1.0, 0)]);
    assert!(
        after[1].stream_time - after[0].stream_time >= 10 * SEC,
        "full weight once the ramp has run"
    );
}

/// Down 10 s, up 10 s: within one good phase nothing tells a healed endpoint from the next
/// good phase of a flap. After one failed slow start it is held on probation through the flap
/// (in rotation, so it is back as soon as the fault really ends) instead of being ejected and
/// readmitted every cycle.
#[test]
fn an_endpoint_down_ten_seconds_in_twenty_is_held_on_probation_not_cycled() {
    let mut r = Run::new();
    let mut id = traffic(&mut r, 0, 10 * SEC, 5, 0, ok);
    let mut t = 10 * SEC;
    let down = |t: Micros| ((t - 10 * SEC) / (10 * SEC)) % 2 == 0;
    while t < 310 * SEC {
        for ep in EPS {
            // The router's share: a trickle for `a` while it is on probation.
            let probation = r
                .changes_of("a")
                .last()
                .is_some_and(|h| h.weight < 0.05 && h.weight > 0.0);
            if ep == "a"
                && (r.state_of("p", "a") == HealthState::Unhealthy || (probation && (t / (200 * MS)) % 25 != 0))
            {
                continue;
            }
            id += 1;
            let class = if ep == "a" && down(t) {
                OutcomeClass::ConnectError
            } else {
                OutcomeClass::Success
            };
            r.at(
                t,
                call("p", ep, id, class, (class == OutcomeClass::Success).then_some(250)),
            );
        }
        if (t / (200 * MS)) % 25 == 0 {
            id += 1;
            let class = if down(t) {
                OutcomeClass::ConnectError
            } else {
                OutcomeClass::Success
            };
            r.at(t, http("a", id, class));
        }
        t += 200 * MS;
    }
    let path = codes(&r, "a");
    assert!(
        path.len() <= 6,
        "a handful of transitions over 5 minutes, not ~30: {path:?}"
    );
    assert_eq!(path.last().map(String::as_str), Some("probation"), "{path:?}");
    assert_eq!(
        r.state_of("p", "a"),
        HealthState::Recovering,
        "in rotation when the flap ends"
    );
}

/// An endpoint on probation that goes down for good (every call and probe fails) is taken out
/// again, with the isolation grown: probation is not a way to keep a dead endpoint serving. It
/// takes the whole window failing, not only a run of ten: at a prober's fast cadence ten
/// failures are one down phase of a fault that comes and goes every 10 s.
#[test]
fn an_endpoint_on_probation_that_goes_down_is_ejected_again_with_a_longer_isolation() {
    let mut r = Run::new();
    let mut id = traffic(&mut r, 0, 30 * SEC, 5, 0, ok);
    id = traffic(&mut r, 30 * SEC, 60 * SEC, 5, id, drops(15, 0x5eed));
    let out = (*r
        .changes_of("a")
        .iter()
        .find(|h| h.to_state == HealthState::Unhealthy)
        .unwrap())
    .clone();
    let mut t = out.stream_time - T0 + 11 * SEC;
    id += 1;
    r.at(t, http("a", id, OutcomeClass::Success));
    // Back on probation (the drops that go on may grow its weight and hold it again).
    assert!(codes(&r, "a").contains(&"probation".to_owned()), "{:?}", codes(&r, "a"));
    assert_eq!(r.state_of("p", "a"), HealthState::Recovering);
    // Failures at a prober's fast cadence: while the pass that readmitted it is in the window,
    // the run is one phase of an intermittent fault; once the whole window has failed, it is
    // down.
    // Its last pass: the drops' traffic ran to 60 s.
    let last_pass = 60 * SEC;
    for _ in 0..45 {
        t += SEC;
        id += 1;
        r.at(t, call("p", "a", id, OutcomeClass::ConnectError, None));
        if r.state_of("p", "a") == HealthState::Unhealthy {
            break;
        }
    }
    let again = *r.changes_of("a").last().unwrap();
    assert_eq!(
        (again.to_state, again.reason_code.as_str()),
        (HealthState::Unhealthy, "failed_while_recovering")
    );
    assert!(
        again
            .reason
            .contains("failures in a row on probation (connect_error) and no pass in 30 s"),
        "{}",
        again.reason
    );
    let after = again.stream_time - T0 - last_pass;
    assert!(
        (27 * SEC..=33 * SEC).contains(&after),
        "out again once its last pass left the window: {} s after it",
        after / SEC
    );
    assert_eq!(again.evidence.isolations, 2);
    assert_eq!(again.retry_at, Some(again.stream_time + 60 * SEC));
}

/// Panic mode is for when too few endpoints can serve. Two endpoints recovering (slow start)
/// and one ejected is not a panic: spreading calls onto the ejected one would only hurt.
#[test]
fn panic_counts_endpoints_that_serve_so_two_recovering_and_one_ejected_is_no_panic() {
    let mut r = Run::new();
    let eps = ["x", "y", "z"];
    let mut id = 0;
    for ep in eps {
        id += 1;
        r.at(0, call("q", ep, id, OutcomeClass::Success, Some(250)));
    }
    // x and y go down and are readmitted; then z goes down and is ejected.
    let mut t = SEC;
    for ep in ["x", "y"] {
        for _ in 0..5 {
            id += 1;
            r.at(t, call("q", ep, id, OutcomeClass::ConnectError, None));
            t += 100 * MS;
        }
        t += 11 * SEC;
        id += 1;
        r.at(
            t,
            Signal::Probe(probe("q", ep, id, ProbeKind::Http, OutcomeClass::Success)),
        );
    }
    for _ in 0..5 {
        id += 1;
        r.at(t, call("q", "z", id, OutcomeClass::ConnectError, None));
        t += 100 * MS;
    }
    let pool = r.engine.pool("q").unwrap();
    assert_eq!(
        (
            pool.count(HealthState::Recovering),
            pool.count(HealthState::Unhealthy),
            pool.count(HealthState::Healthy)
        ),
        (2, 1, 0)
    );
    assert!(!pool.panic());
    assert!(
        pool_events(&r.decisions).iter().all(|e| !e.panic),
        "no panic at any point: {:#?}",
        pool_events(&r.decisions)
    );
}

/// 40 % of calls rate limited: three 429s among the latest calls (a share of 25 %) start the
/// cooldown within a few calls, not after 25 % of the last 10 s.
#[test]
fn forty_percent_429s_start_a_cooldown_within_a_few_calls() {
    let mut r = Run::new();
    let mut id = traffic(&mut r, 0, 20 * SEC, 5, 0, ok);
    let mut n = 0u64;
    let start = 20 * SEC;
    traffic(&mut r, start, 40 * SEC, 5, id, |ep, _| {
        if ep == "a" {
            n += 1;
            if n % 5 < 2 {
                return (OutcomeClass::RateLimited, None);
            }
        }
        (OutcomeClass::Success, Some(250))
    });
    id += 1;
    let cool = *r
        .changes_of("a")
        .iter()
        .find(|h| h.reason_code == "cooldown")
        .expect("cooled down");
    assert!(
        cool.stream_time - T0 - start <= 2 * SEC,
        "cooled {} ms after the 429s began",
        (cool.stream_time - T0 - start) / MS
    );
    assert!(
        cool.evidence.thresholds.iter().any(|t| t.starts_with("429_share")),
        "{:?}",
        cool.evidence.thresholds
    );
    let _ = id;
}

/// A prober's completion probes meet the limit while the endpoint cools (it probes an endpoint
/// that is out at its fast interval): their 429s, and a Retry-After heard then, are of the
/// window that has ended. When the cooldown is over the endpoint waits for the calls after it:
/// the first 429 with a Retry-After cools it for what that says. Counted, the probes' 429s sent
/// it out again on the first tick after every cooldown, for the policy's cooldown doubled (40 s)
/// — out of step with the upstream's windows, so that the next 429 said "1 s" and it cycled
/// through them (10 transitions a minute in the generative stationary test).
#[test]
fn the_429s_probes_meet_while_cooling_do_not_send_it_out_again_when_the_cooldown_ends() {
    let mut r = Run::new();
    let mut id = traffic(&mut r, 0, 10 * SEC, 5, 0, ok);
    let limited = |r: &mut Run, at: Micros, id: u64, retry_after_ms: i64| {
        let Signal::Call(mut c) = call("p", "a", id, OutcomeClass::RateLimited, None) else {
            unreachable!()
        };
        c.retry_after_ms = Some(retry_after_ms);
        r.at(at, Signal::Call(c))
    };
    for k in 0..3 {
        id += 1;
        limited(&mut r, 10 * SEC + k * 100 * MS, id, 10_000);
    }
    let cool = (*r.changes_of("a").last().unwrap()).clone();
    assert_eq!(cool.reason_code, "cooldown");
    let back = cool.retry_at.expect("a cooldown says when it ends") - T0;
    // Probes every second while out, nearly all 429s; a call in flight reports a 429 too.
    let mut t = 10 * SEC + 700 * MS;
    while t < back {
        id += 1;
        let p = probe("p", "a", id, ProbeKind::SyntheticCompletion, OutcomeClass::RateLimited);
        r.at(t, Signal::Probe(p));
        t += SEC;
    }
    id += 1;
    limited(&mut r, back - 200 * MS, id, 1_000);
    r.tick_until(back + 3 * SEC);
    // The first probe after it meets the limit: one 429 without a Retry-After is no run.
    id += 1;
    let p = probe("p", "a", id, ProbeKind::SyntheticCompletion, OutcomeClass::RateLimited);
    r.at(back + 3 * SEC, Signal::Probe(p));
    assert_eq!(
        codes(&r, "a")[1..],
        ["cooldown_over"],
        "waits for the calls after the cooldown"
    );
    id += 1;
    limited(&mut r, back + 3 * SEC + 100 * MS, id, 9_000);
    let again = *r.changes_of("a").last().unwrap();
    assert_eq!(again.reason_code, "cooldown");
    assert_eq!(again.retry_at, Some(again.stream_time + 9 * SEC), "{}", again.reason);
}

/// A Retry-After longer than the longest isolation is capped, and the reason says so (it said
/// "the upstream's Retry-After" for a cooldown of 300 s when the upstream asked for 600 s).
#[test]
fn a_retry_after_beyond_the_longest_isolation_is_capped_and_the_reason_says_so() {
    let mut r = Run::new();
    let id = traffic(&mut r, 0, 10 * SEC, 5, 0, ok);
    for k in 0..3 {
        let Signal::Call(mut c) = call("p", "a", id + 1 + k, OutcomeClass::RateLimited, None) else {
            unreachable!()
        };
        c.retry_after_ms = Some(600_000);
        r.at(10 * SEC + k as i64 * 100 * MS, Signal::Call(c));
    }
    let cool = *r.changes_of("a").last().unwrap();
    assert_eq!(cool.reason_code, "cooldown");
    assert_eq!(cool.retry_at, Some(cool.stream_time + 300 * SEC));
    assert!(
        cool.reason.contains("Retry-After of 600 s, capped at 300 s"),
        "{}",
        cool.reason
    );
}

/// A health route's passing probe cannot meet a rate limit, so it says nothing of one: every
/// call rate-limited, each followed by a prober's fast probes of the health route (which pass),
/// still cools the endpoint down on the run of 429s. Counted as passes, the probes broke the
/// run and diluted the share of 429s below three among twelve: never cooled, every call failed.
#[test]
fn health_probes_passing_between_429s_do_not_hide_the_limit() {
    let mut r = Run::new();
    let mut id = traffic(&mut r, 0, 20 * SEC, 5, 0, ok);
    let start = 20 * SEC;
    for k in 0..4i64 {
        id += 1;
        r.at(start + k * SEC, call("p", "a", id, OutcomeClass::RateLimited, None));
        for j in 1..=5 {
            id += 1;
            r.at(start + k * SEC + j * 150 * MS, http("a", id, OutcomeClass::Success));
        }
    }
    let cool = r
        .changes_of("a")
        .into_iter()
        .find(|h| h.reason_code == "cooldown")
        .expect("cooled down on the 429s");
    assert!(
        cool.evidence
            .thresholds
            .iter()
            .any(|t| t.starts_with("consecutive_429")),
        "{:?}",
        cool.evidence.thresholds
    );
    assert_eq!(cool.stream_time - T0, start + 2 * SEC, "on the third 429");
}

/// Without a prober the evidence on probation is the calls its weight brings: 0.07 a second
/// into a pool of four at 5 each. A run of passes long in time grows the weight as one long in
/// count does: 8 over a minute (~2 minutes of such calls, where 20 take ~5); 8 that come within
/// seconds (a prober's fast cadence) do not — a fault that fails 15 % of them passes 8 in a row
/// 27 % of the time.
#[test]
fn on_probation_a_slow_run_of_passes_grows_the_weight_where_a_fast_one_must_be_longer() {
    let (mut r, mut id, mut t) = on_probation_after_drops();
    let on_probation = r.changes_of("a").len();
    let mut pass = |r: &mut Run, t: Micros| {
        id += 1;
        r.at(t, call("p", "a", id, OutcomeClass::Success, Some(250)));
    };
    // Eight passes a second apart, then a drop: no growth.
    for _ in 0..8 {
        t += SEC;
        pass(&mut r, t);
    }
    t += SEC;
    r.at(t, call("p", "a", 1_000_000, OutcomeClass::ConnectionDropped, None));
    assert_eq!(r.changes_of("a").len(), on_probation, "8 fast passes grow nothing");
    // Eight passes 14 s apart: the eighth spans 98 s and grows the weight.
    for k in 1..=8 {
        t += 14 * SEC;
        pass(&mut r, t);
        let grew = r.changes_of("a").len() > on_probation;
        assert_eq!(grew, k == 8, "pass {k}: {:?}", codes(&r, "a"));
    }
    let grow = *r.changes_of("a").last().unwrap();
    assert_eq!(grow.reason_code, "probation_growing");
    assert_eq!(grow.evidence.thresholds, ["probation_passes>=8_over_60s"]);
    assert!(
        grow.reason
            .contains("8 passing outcomes in a row on probation over 98 s"),
        "{}",
        grow.reason
    );
    assert_eq!((grow.weight, grow.ramp_ms), (0.01, 10_000));
}

/// A busy endpoint on probation that goes down fails a hundred calls within a second: out
/// again at once, not after a window without a pass (at 67 calls a second, the probation
/// weight's share of a busy pool, a window is 2,000 failed calls).
#[test]
fn a_busy_endpoint_on_probation_that_goes_down_is_out_again_within_a_second() {
    let (mut r, mut id, mut t) = on_probation_after_drops();
    // Its calls pass for a while, then it goes down.
    for _ in 0..5 {
        t += 100 * MS;
        id += 1;
        r.at(t, call("p", "a", id, OutcomeClass::Success, Some(250)));
    }
    let back = t;
    let mut n = 0;
    while r.state_of("p", "a") != HealthState::Unhealthy {
        assert!(n < 200, "out again on its run of failures");
        n += 1;
        t += 10 * MS;
        id += 1;
        r.at(t, call("p", "a", id, OutcomeClass::ConnectError, None));
    }
    let again = *r.changes_of("a").last().unwrap();
    assert_eq!(n, 100, "{}", again.reason);
    assert!(t - back <= SEC);
    assert!(
        again
            .reason
            .contains("100 failures in a row on probation (connect_error); isolated again"),
        "{}",
        again.reason
    );
}

/// `a` ejected for 15 % drops, then readmitted on probation by a passing probe 11 s later: the
/// run, the last id used and the time of the readmission.
fn on_probation_after_drops() -> (Run, u64, Micros) {
    let mut r = Run::new();
    let mut id = traffic(&mut r, 0, 30 * SEC, 5, 0, ok);
    // 15 % drops on `a` until it is out for them.
    let mut fail = drops(15, 0x5eed);
    let mut t = 30 * SEC;
    while r.state_of("p", "a") != HealthState::Unhealthy {
        assert!(t < 90 * SEC, "ejected for its drops");
        for ep in EPS {
            id += 1;
            let (class, ttft) = fail(ep, id);
            r.at(t, call("p", ep, id, class, ttft));
        }
        t += 200 * MS;
    }
    t += 11 * SEC;
    id += 1;
    r.at(t, http("a", id, OutcomeClass::Success));
    assert_eq!(codes(&r, "a").last().map(String::as_str), Some("probation"));
    (r, id, t)
}
