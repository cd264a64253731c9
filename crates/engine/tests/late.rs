//! One rule for late evidence, whatever its outcome: a report later than the window (after its
//! reporter's measured clock offset) is set aside whole and counted; a reporter whose clock is off
//! is named in a pool event and its reports are shifted by its offset, never half of them taken.

mod common;
use common::*;
use vitals_contracts::*;
use vitals_engine::{ClockChange, Decision, Engine};

const POOL: &str = "p";

/// A call of `gateway` to `ep`, stamped as ending at `ended` by the gateway's clock.
fn call_by(gateway: &str, ep: &str, id: u64, outcome: OutcomeClass, ended: Micros) -> Signal {
    Signal::Call(CallOutcome {
        latency_us: 80 * MS,
        http_status: Some(if outcome == OutcomeClass::Success { 200 } else { 503 }),
        ..CallOutcome::new(
            format!("{gateway}-{ep}-{id}"),
            POOL,
            ep,
            gateway,
            ended - 80 * MS,
            outcome,
        )
    })
}

struct Run {
    engine: Engine,
    decisions: Vec<(Micros, Decision)>,
    late: u64,
    clocks: Vec<ClockChange>,
}

impl Run {
    fn new() -> Run {
        Run {
            engine: Engine::new(Policy::default()),
            decisions: Vec::new(),
            late: 0,
            clocks: Vec::new(),
        }
    }

    fn at(&mut self, at: Micros, s: &Signal) {
        for d in self.engine.step(at, s) {
            self.decisions.push((at, d));
        }
        let notes = self.engine.take_notes();
        self.late += notes.late;
        self.clocks.extend(notes.clocks.into_iter().map(|(_, c)| c));
    }

    fn transitions(&self) -> Vec<&HealthChanged> {
        self.decisions
            .iter()
            .filter_map(|(_, d)| match d {
                Decision::Endpoint(h) => Some(h.as_ref()),
                _ => None,
            })
            .collect()
    }
}

/// The case from the field: an endpoint failing one call in ten, its calls reported 70 s late
/// (an exporter's backlog, for 20 s) beside fresh calls of its healthy peers. Before the rule, a
/// late failure counted and a late success did not, and it was ejected as "failure rate 100 %".
/// Now every late call is set aside, successes and failures alike, and counted. (A reporter
/// late by the same 70 s for longer is a clock 70 s behind: see the skewed gateway below.)
#[test]
fn calls_reported_seventy_seconds_late_are_set_aside_whatever_their_outcome() {
    let mut r = Run::new();
    let mut id = 0;
    let mut late_sent = 0;
    for k in 0..200 {
        let now = T0 + k * 100 * MS;
        for ep in ["b", "c"] {
            id += 1;
            r.at(now, &call_by("g-fresh", ep, id, OutcomeClass::Success, now));
        }
        id += 1;
        let outcome = if id % 10 == 0 {
            OutcomeClass::ServerError
        } else {
            OutcomeClass::Success
        };
        r.at(now, &call_by("g-late", "a", id, outcome, now - 70 * SEC));
        late_sent += 1;
        if k % 10 == 0 {
            r.at(now, &tick());
        }
    }
    assert!(r.transitions().is_empty(), "{:?}", r.transitions());
    assert_eq!(r.late, late_sent, "every late call is set aside, none applied");
    let pool = r.engine.pool(POOL).unwrap();
    assert!(pool.late_reports("a") > 0);
    // Nothing of it reached the endpoint's window: it is not even a member yet.
    assert!(pool.endpoint("a").is_none());
}

/// A fault of the past reported after it healed (a merger's backlog of failures, 90 s old,
/// draining at once): it ejects nothing now, and a decision made meanwhile says how much was
/// set aside.
#[test]
fn a_backlog_of_old_failures_ejects_nothing_and_a_decision_says_how_many_were_late() {
    let mut r = Run::new();
    let start = T0 + 120 * SEC;
    for i in 0..200 {
        r.at(
            start,
            &call_by(
                "g1",
                "a",
                i,
                OutcomeClass::ServerError,
                start - 90 * SEC + i as i64 * 10 * MS,
            ),
        );
    }
    assert!(r.transitions().is_empty());
    assert_eq!(r.late, 200);
    // Fresh failures now take it out, and the transition names the late reports beside them.
    for i in 200..230 {
        let now = start + (i - 199) * 100 * MS;
        r.at(now, &call_by("g1", "a", i as u64, OutcomeClass::ServerError, now));
    }
    let t = r.transitions();
    assert_eq!(t.last().map(|h| h.to_state), Some(HealthState::Unhealthy), "{t:?}");
    for h in &t {
        assert_eq!(h.evidence.late, 200);
        assert!(h.reason.contains("200 late reports set aside"), "{}", h.reason);
        assert!(
            h.evidence.server_error <= 30,
            "only the fresh failures count: {:?}",
            h.evidence
        );
    }
}

/// Six gateways; one's clock is 90 s behind. Its reports are set aside whole until its clock is
/// measured (three slots of 10 s), a pool event names it, and from then on its reports are
/// shifted and applied; nothing is ejected, and its failures are then judged like anyone's.
#[test]
fn a_gateway_whose_clock_is_behind_is_named_and_shifted_never_half_taken() {
    let mut r = Run::new();
    let mut id = 0;
    let skew = 90 * SEC;
    let mut applied_before_named = 0;
    for k in 0..900 {
        let now = T0 + k * 100 * MS;
        for g in 0..6 {
            let gateway = format!("g{g}");
            let stamp = if g == 5 { now - skew } else { now };
            for ep in ["a", "b", "c"] {
                id += 1;
                r.at(now, &call_by(&gateway, ep, id, OutcomeClass::Success, stamp));
            }
        }
        if r.clocks.is_empty() {
            applied_before_named = r.late;
        }
        if k % 10 == 0 {
            r.at(now, &tick());
        }
    }
    assert!(r.transitions().is_empty(), "{:?}", r.transitions());
    assert_eq!(
        r.clocks,
        vec![ClockChange::Off {
            reporter: "gateway=g5".into(),
            offset: skew
        }]
    );
    // All of g5's reports until it was named were late (3 a tenth of a second for 30 s), none after.
    assert_eq!(r.late, applied_before_named);
    assert_eq!(r.late, 3 * 300, "three slots of g5's calls");
    let events: Vec<&PoolHealthChanged> = r
        .decisions
        .iter()
        .filter_map(|(_, d)| match d {
            Decision::Pool(p) => Some(p),
            _ => None,
        })
        .collect();
    assert_eq!(events.len(), 1);
    assert!(
        events[0].reason.contains("gateway=g5's clock is 90 s behind"),
        "{}",
        events[0].reason
    );
    let pool = r.engine.pool(POOL).unwrap();
    assert_eq!(
        pool.clocks_off().collect::<Vec<_>>(),
        vec![("gateway=g5".to_owned(), skew)]
    );

    // Shifted, its failures count as anyone's: g5 alone sees "c" fail, and "c" is out for g5.
    let mut now = T0 + 90 * SEC;
    for _ in 0..40 {
        now += 100 * MS;
        id += 1;
        r.at(now, &call_by("g5", "c", id, OutcomeClass::ServerError, now - skew));
        for g in 0..5 {
            id += 1;
            r.at(now, &call_by(&format!("g{g}"), "c", id, OutcomeClass::Success, now));
        }
    }
    let scoped: Vec<&HealthChanged> = r.transitions().into_iter().filter(|h| h.endpoint == "c").collect();
    assert!(
        scoped
            .iter()
            .any(|h| h.scope.as_deref() == Some("gateway=g5") && h.to_state == HealthState::Unhealthy),
        "{scoped:?}"
    );
    assert!(
        scoped.iter().all(|h| h.scope.is_some()),
        "no fleet decision: {scoped:?}"
    );
}

/// Replaying the same log with late and skewed reporters decides the same, and a snapshot taken
/// anywhere continues as the uninterrupted run (the clocks and late counts are in it).
#[test]
fn late_and_skewed_reports_replay_and_restore_identically() {
    let mut rng = Rng(7);
    let mut log = Vec::new();
    for k in 0..3_000i64 {
        let now = T0 + k * 50 * MS;
        let g = rng.below(4);
        let stamp = match g {
            0 => now - 60 * SEC,
            1 => now + 20 * SEC,
            2 => now - (rng.below(80) as i64) * SEC,
            _ => now,
        };
        let outcome = if rng.below(5) == 0 {
            OutcomeClass::Timeout
        } else {
            OutcomeClass::Success
        };
        let ep = ["a", "b", "c", "d"][rng.below(4) as usize];
        log.push((now, call_by(&format!("g{g}"), ep, k as u64, outcome, stamp)));
        if k % 20 == 0 {
            log.push((now, tick()));
        }
    }
    let run = |from: usize, mut e: Engine| {
        let mut out = Vec::new();
        for (t, s) in &log[from..] {
            e.apply(*t, s, &mut out);
        }
        (e, out)
    };
    let (whole, all) = run(0, Engine::new(Policy::default()));
    let (again, all_again) = run(0, Engine::new(Policy::default()));
    assert_eq!(all, all_again);
    assert_eq!(whole.snapshot(), again.snapshot());
    for cut in [500, 1_700, 2_900] {
        let mut first = Engine::new(Policy::default());
        let mut head = Vec::new();
        for (t, s) in &log[..cut] {
            first.apply(*t, s, &mut head);
        }
        let restored = Engine::restore(&first.snapshot()).unwrap();
        let (end, tail) = run(cut, restored);
        head.extend(tail);
        assert_eq!(head, all, "cut at {cut}");
        assert_eq!(end.snapshot(), whole.snapshot());
    }
    assert!(
        whole.pool(POOL).unwrap().clocks_off().any(|(r, _)| r == "gateway=g0"),
        "the gateway a minute behind is named"
    );
}
