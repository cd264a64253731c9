//! No rule flaps: under any stationary fault — one that does not change for minutes — every
//! endpoint settles, and makes at most a few transitions a minute (before the latency rule had hysteresis, a latency tail went
//! healthy → degraded → healthy 1,521 times in 90 s, each exit tens of milliseconds after the
//! entry, because the rule that entered had no hysteresis of its own). Random faults of every
//! kind the scorecard simulates, at random strengths, pool sizes and traffic, through the
//! closed loop (the router follows the weights), for five minutes; counted over every minute
//! from the second of the fault on.

use proptest::prelude::*;
use vitals_contracts::{Micros, ProbeKind};
use vitals_scorecard::{run, Fault, Injection, Scenario, SEC};

/// Transitions one endpoint may make a minute, on average over a stationary fault from its
/// second minute on: a fault that comes and goes at random (drops, 429s) cycles an endpoint
/// through out → on probation → its weight growing → held, or cooled → slow start → cooled (a
/// 40 % rate limit without Retry-After: every ~35 s), each cycle longer than the last. In any
/// one minute, at most [`BURST`] (the first cycles of such a fault, probation's end included).
///
/// An upstream that announces a Retry-After is tried again when it says (back
/// within 2 s of the limit lifting): a limit that persists is out and back once a window it
/// announces, its own cadence ([`allowed`]). Retry-Afters under 5 s are not generated: there
/// the cycle is the upstream's too, but every one costs two transitions and a failed call; a
/// trickle of trial calls while cooling would test the limit without them (not built yet).
const PER_MINUTE: f64 = 4.0;
const BURST: usize = 6;

/// The transitions an endpoint with `fault` may make in any minute and a minute on average.
fn allowed(fault: Fault) -> (usize, f64) {
    match fault {
        Fault::RateLimited {
            retry_after_ms: Some(ra),
            ..
        } => {
            let windows = 60_000.0 / ra as f64;
            (
                BURST.max(2 * windows.ceil() as usize + 2),
                PER_MINUTE.max(2.0 * windows + 1.0),
            )
        }
        _ => (BURST, PER_MINUTE),
    }
}

fn fault() -> impl Strategy<Value = Fault> {
    prop_oneof![
        Just(Fault::Down),
        Just(Fault::ServerErrors),
        (1_500i64..20_000).prop_map(|ttft_ms| Fault::SlowTtft { ttft_ms }),
        (0.03f64..1.0).prop_map(|share| Fault::Drops { share }),
        // Not with a Retry-After under 5 s: see [`PER_MINUTE`].
        (0.05f64..0.9, prop::option::of(5_000i64..30_000))
            .prop_map(|(share, retry_after_ms)| Fault::RateLimited { share, retry_after_ms }),
        (0.03f64..0.9).prop_map(|share| Fault::ClientErrors { share }),
        (0.05f64..0.5, 3i64..20).prop_map(|(share, factor)| Fault::LatencyTail { share, factor }),
    ]
}

fn scenario() -> impl Strategy<Value = Scenario> {
    (
        3usize..9,
        prop_oneof![Just(0.5f64), 1.0f64..20.0, 20.0f64..400.0],
        fault(),
        any::<bool>(),
        prop_oneof![Just(0.0f64), 0.001f64..0.02],
    )
        .prop_map(|(endpoints, per_endpoint, fault, completions, noise)| Scenario {
            name: "stationary",
            what: "",
            endpoints,
            rate: per_endpoint * endpoints as f64,
            duration: 360 * SEC,
            probe_every: 5 * SEC,
            traffic_probe_every: 15 * SEC,
            fast_probe_every: SEC,
            probe_kind: if completions {
                ProbeKind::SyntheticCompletion
            } else {
                ProbeKind::Http
            },
            // The fault on e0, and background noise (up to 2 % of calls failing at random) on
            // every other endpoint, or none — from 5 s: at the start the loop's first reports
            // are all failures (a 5xx reports in 30 ms, a success in 650), and three in a row
            // eject a healthy endpoint there (the peer rule at an endpoint's first
            // calls).
            faults: std::iter::once(Injection {
                endpoint: 0,
                fault,
                from: 30 * SEC,
                to: 360 * SEC,
                period: None,
            })
            .chain((1..endpoints).filter(|_| noise > 0.0).map(|endpoint| Injection {
                endpoint,
                fault: Fault::Noise { share: noise },
                from: 5 * SEC,
                to: 360 * SEC,
                period: None,
            }))
            .collect(),
        })
}

/// The most transitions any endpoint made in any minute from `from` to the end.
fn most_in_a_minute(
    log: &[(
        Micros,
        String,
        vitals_contracts::HealthState,
        vitals_contracts::HealthState,
        String,
    )],
    from: Micros,
    to: Micros,
) -> (usize, String) {
    let mut worst = (0, String::new());
    let mut eps: Vec<&String> = log.iter().map(|m| &m.1).collect();
    eps.sort();
    eps.dedup();
    for ep in eps {
        let times: Vec<Micros> = log
            .iter()
            .filter(|m| &m.1 == ep && m.0 >= from && m.0 < to)
            .map(|m| m.0)
            .collect();
        for (i, t) in times.iter().enumerate() {
            let n = times[i..].iter().take_while(|u| **u < t + 60 * SEC).count();
            if n > worst.0 {
                worst = (n, format!("{ep} from {} s", t / SEC));
            }
        }
    }
    worst
}

proptest! {
    // 48 cases, or `PROPTEST_CASES` for a sweep (docs/benchmarks.md, "Generative sweeps").
    #![proptest_config(ProptestConfig::with_cases(
        std::env::var("PROPTEST_CASES").ok().and_then(|c| c.parse().ok()).unwrap_or(48)
    ))]

    #[test]
    fn no_endpoint_flaps_under_a_stationary_fault(s in scenario(), seed in any::<u64>()) {
        let score = run(&s, seed);
        let from = 90 * SEC;
        let (n, at) = most_in_a_minute(&score.log, from, s.duration);
        let mut per_endpoint = std::collections::BTreeMap::new();
        for m in score.log.iter().filter(|m| m.0 >= from) {
            *per_endpoint.entry(m.1.as_str()).or_insert(0usize) += 1;
        }
        let most = per_endpoint.values().copied().max().unwrap_or(0);
        let minutes = (s.duration - from) as f64 / (60 * SEC) as f64;
        let log = || {
            score.log.iter().map(|m| format!("{:.1} s {} {:?} → {:?} {}", m.0 as f64 / 1e6, m.1, m.2, m.3, m.4)).take(40).collect::<Vec<_>>()
        };
        let (burst, per_minute) = allowed(s.faults[0].fault);
        prop_assert!(
            n <= burst && most as f64 <= per_minute * minutes,
            "{n} transitions in a minute ({at}), {most} in {minutes:.1} minutes; {:?} at {} calls/s among {}: {:#?}",
            s.faults[0].fault,
            s.rate,
            s.endpoints,
            log()
        );
    }
}
