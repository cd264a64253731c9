//! A report sent more than once — an exporter retrying after a lost answer, a batch sent again,
//! a fallback resending — is applied once: a log with random repeats (each within a few minutes
//! of stream time of its first copy), read by a processor that stops and resumes from its last
//! snapshot at random points, decides and counts exactly what the same reports sent once do.

use proptest::prelude::*;
use vitals_contracts::{encode_signal, CallOutcome, CallSummary, Micros, OutcomeClass, Policy, Requests, Signal};
use vitals_engine::Engine;
use vitals_pipeline::{BatchWrite, Partition, Rollup, Topics};

fn topics() -> Topics {
    Topics {
        signals: "s".into(),
        changes: "c".into(),
        state: "st".into(),
        dlq: "d".into(),
    }
}

const T0_MS: i64 = 1_700_000_000_000;

/// One report: a call or a summary of ten calls, on one of three endpoints.
fn report(i: usize, endpoint: u8, failing: bool, summary: bool, at_ms: i64) -> Vec<u8> {
    let ep = format!("e{endpoint}");
    let class = if failing {
        OutcomeClass::ServerError
    } else {
        OutcomeClass::Success
    };
    let call = |k: i64| CallOutcome {
        latency_us: 2_000,
        ..CallOutcome::new(
            format!("c{i}-{k}"),
            "p",
            ep.as_str(),
            "g",
            at_ms * 1000 - k * 20_000,
            class,
        )
    };
    let signal = if summary {
        let mut s = CallSummary::new(format!("s{i}"), "p", &ep, "g", at_ms * 1000 - 250_000);
        for k in (0..10).rev() {
            s.add(&call(k));
        }
        Signal::Summary(s)
    } else {
        Signal::Call(call(0))
    };
    encode_signal(&signal).unwrap()
}

/// What a run decided and counted: the transitions (without the offsets they were read at) and
/// the calls by endpoint and minute.
#[derive(Debug, PartialEq)]
struct Outcome {
    transitions: Vec<vitals_contracts::HealthChanged>,
    pool_events: Vec<vitals_contracts::PoolHealthChanged>,
    counted: std::collections::BTreeMap<(String, Micros), Requests>,
}

/// Read `log` (timestamp, payload), stopping after each offset in `stops` and resuming from the
/// last snapshot (taken at each offset in `snapshots`) as a successor would.
fn run(log: &[(i64, Vec<u8>)], snapshots: &[usize], stops: &[usize]) -> Outcome {
    let t = topics();
    let mut out = BatchWrite::default();
    let mut rollups: Vec<Rollup> = Vec::new();
    let mut part = Partition::new(0, 1, Engine::new(Policy::default()), None, None);
    let (mut snapshot, mut counted) = (None, 0i64);
    let mut o = 0usize;
    let mut epoch = 1;
    let mut stops = stops.to_vec();
    while o < log.len() {
        let (ts, payload) = &log[o];
        part.step(o as i64, Some(*ts), Some(b"p"), Some(payload), &t, &mut out);
        o += 1;
        // Counts and a snapshot are written at the chosen offsets (counts always with one).
        let force = snapshots.contains(&o);
        if let Some(w) = part.write(1 << 40, force, force) {
            if let Some(c) = w.requests {
                counted = c.to;
                rollups.extend(c.rollups);
            }
            if let Some(s) = w.snapshot {
                snapshot = Some(s);
            }
        }
        if let Some(k) = stops.iter().position(|s| *s == o) {
            stops.remove(k);
            // Stopped: a successor resumes from the last snapshot, or from the start.
            epoch += 1;
            let (engine, from) = match &snapshot {
                Some(s) => (
                    Engine::from_snapshot(
                        Policy::default(),
                        s.stream_time,
                        s.pools.iter().map(|(_, b)| b.as_slice()),
                    )
                    .unwrap(),
                    s.offset,
                ),
                None => (Engine::new(Policy::default()), 0),
            };
            let start = (from > 0).then_some(from);
            part = Partition::new(0, epoch, engine, start, Some(o as i64)).counting_from(counted);
            o = from as usize;
        }
    }
    if let Some(c) = part.write(1 << 40, false, true).and_then(|w| w.requests) {
        rollups.extend(c.rollups);
    }
    let mut counted = std::collections::BTreeMap::new();
    for r in rollups {
        counted
            .entry((r.endpoint.clone(), r.minute))
            .or_insert_with(Requests::default)
            .merge(&r.requests);
    }
    Outcome {
        transitions: out.transitions.into_iter().map(|(h, _, _)| h).collect(),
        pool_events: out.pool_events.into_iter().map(|(e, _, _)| e).collect(),
        counted,
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    #[test]
    fn reports_sent_again_are_applied_and_counted_once_across_restarts(
        reports in prop::collection::vec((0u8..3, prop::bool::weighted(0.35), prop::bool::weighted(0.3), 0i64..3_000), 20..120),
        // For some reports: a second (and third) copy this many places later.
        repeats in prop::collection::vec((0usize..120, 1usize..40, prop::bool::ANY), 0..40),
        cuts in prop::collection::vec((0usize..200, prop::bool::ANY), 0..6),
    ) {
        // The reports sent once, a few seconds apart in stream time.
        let mut once: Vec<(i64, Vec<u8>)> = Vec::new();
        let mut at = T0_MS;
        for (i, (ep, failing, summary, gap)) in reports.iter().enumerate() {
            at += gap;
            once.push((at, report(i, *ep, *failing, *summary, at)));
        }
        // The same log with copies: a copy is read later (at that place's time), within the
        // window (40 places of at most 3 s).
        let mut slots: Vec<Vec<Vec<u8>>> = vec![Vec::new(); once.len()];
        for (which, later, third) in &repeats {
            let i = which % once.len();
            let j = (i + later).min(once.len() - 1);
            slots[j].push(once[i].1.clone());
            if *third {
                slots[j].push(once[i].1.clone());
            }
        }
        let mut sent: Vec<(i64, Vec<u8>)> = Vec::new();
        for (i, (ts, payload)) in once.iter().enumerate() {
            sent.push((*ts, payload.clone()));
            // Copies are read after the report of their place, at its time.
            sent.extend(slots[i].iter().map(|p| (*ts, p.clone())));
        }
        let (mut snaps, mut stops) = (Vec::new(), Vec::new());
        for (at, stop) in &cuts {
            let at = 1 + at % sent.len();
            snaps.push(at);
            if *stop {
                stops.push((at + 3).min(sent.len()));
            }
        }
        stops.sort_unstable();
        stops.dedup();
        let want = run(&once, &[], &[]);
        let got = run(&sent, &snaps, &stops);
        prop_assert_eq!(got, want);
    }
}
