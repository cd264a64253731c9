//! The decision targets, held on the closed-loop scorecard (simulated time: deterministic, not a
//! timed test). Medians over twenty seeds, as docs/decisions.md reports them (over five, a
//! detection spread from 2 to 22 s between seeds put the median 3 s from the tables'); false
//! ejections over every run.

use vitals_contracts::Micros;
use vitals_scorecard::{run, scenarios, Score, SEC};

const SEEDS: u64 = 20;

fn runs(name: &str) -> Vec<Score> {
    let s = scenarios()
        .into_iter()
        .find(|s| s.name == name)
        .expect("scenario exists");
    (1..=SEEDS).map(|seed| run(&s, seed)).collect()
}

fn median(mut v: Vec<Micros>) -> Micros {
    v.sort_unstable();
    v[v.len() / 2]
}

fn delay(scores: &[Score], f: fn(&Score) -> Option<Micros>) -> Micros {
    median(scores.iter().map(|s| f(s).unwrap_or(Micros::MAX)).collect())
}

fn restore(scores: &[Score]) -> Micros {
    median(
        scores
            .iter()
            .map(|s| match s.restore {
                Some(Ok(t)) => t,
                _ => Micros::MAX,
            })
            .collect(),
    )
}

fn false_ejections(scores: &[Score]) -> u32 {
    scores.iter().map(|s| s.false_ejections).sum()
}

#[test]
fn hard_down_is_detected_within_two_seconds_and_restored_within_a_probe_interval() {
    let s = runs("hard-down");
    assert!(delay(&s, |x| x.detection) <= 2 * SEC, "{s:#?}");
    assert!(restore(&s) <= 6 * SEC, "{s:#?}");
    let s = runs("recovery");
    assert!(restore(&s) <= 6 * SEC, "after five minutes down: {s:#?}");
}

#[test]
fn slow_first_tokens_are_detected_within_ten_seconds() {
    for name in ["slow-ttft", "slow-ttft-completion-probes"] {
        let s = runs(name);
        assert!(delay(&s, |x| x.detection) <= 10 * SEC, "{name}: {s:#?}");
        assert!(delay(&s, |x| x.ejection) <= 10 * SEC, "{name}: {s:#?}");
    }
}

#[test]
fn fifteen_percent_drops_are_out_within_ten_seconds() {
    let s = runs("drops-15pct");
    assert!(delay(&s, |x| x.ejection) <= 10 * SEC, "{s:#?}");
}

#[test]
fn noise_client_errors_and_a_shared_outage_eject_nothing_falsely() {
    for name in ["noise-1pct", "4xx-storm", "shared-outage"] {
        let s = runs(name);
        assert_eq!(false_ejections(&s), 0, "{name}: {s:#?}");
    }
    let s = runs("shared-outage");
    assert!(restore(&s) <= 6 * SEC, "{s:#?}");
    assert!(s.iter().all(|x| x.max_out <= 0.5), "max-ejection holds: {s:#?}");
}

#[test]
fn a_periodic_fault_costs_at_most_fifty_calls_and_restores_within_ten_seconds() {
    let s = runs("periodic");
    assert!(s.iter().all(|x| x.failed <= 50), "{s:#?}");
    assert!(restore(&s) <= 10 * SEC, "{s:#?}");
}

#[test]
fn the_same_seed_gives_the_same_scorecard() {
    let s = scenarios().into_iter().find(|s| s.name == "periodic").unwrap();
    assert_eq!(run(&s, 9), run(&s, 9));
}

fn worst(scores: &[Score], f: fn(&Score) -> u32) -> u32 {
    scores.iter().map(f).max().unwrap_or(0)
}

#[test]
fn fifteen_percent_drops_for_five_minutes_are_out_once_and_held_not_cycled() {
    for name in ["drops-15pct-5min", "drops-15pct-3-endpoints"] {
        let s = runs(name);
        assert!(delay(&s, |x| x.ejection) <= 10 * SEC, "{name}: {s:#?}");
        // Out, back on probation, held; a run of passes by chance grows its weight once and the
        // next drop holds it again (two more): at most 6, the bound. A growth needs 20
        // passes in a row (3.9 % at 15 % drops), the next 40 (0.15 %).
        assert!(worst(&s, |x| x.fault_transitions) <= 6, "{name}: {s:#?}");
        assert!(restore(&s) <= 10 * SEC, "{name}: {s:#?}");
        assert_eq!(false_ejections(&s), 0, "{name}");
    }
}

fn capacity_lost(scores: &[Score]) -> f64 {
    let mut v: Vec<f64> = scores.iter().map(|s| s.capacity_lost).collect();
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Capacity back soon after a fault ends (docs/decisions.md, capacity back): the weight of an endpoint on
/// probation grows after a run of passes, where it used to be held at 0.01 for 20 to 60 passes
/// and then slow start (59 to 89 endpoint-seconds lost after these faults, the whole of the
/// 60 or 90 s the runs go on after them). At full weight within 30 s of the fault's end, the
/// issue's target, now that the prober's fast cadence brings the evidence.
#[test]
fn a_healed_endpoint_on_probation_gives_its_capacity_back_within_thirty_seconds() {
    for name in ["drops-15pct", "periodic", "periodic-10s", "periodic-503"] {
        let s = runs(name);
        assert!(capacity_lost(&s) <= 25.0, "{name}: {s:#?}");
        let full = median(
            s.iter()
                .map(|x| match x.full_weight {
                    Some(Ok(t)) => t,
                    _ => Micros::MAX,
                })
                .collect(),
        );
        assert!(full <= 30 * SEC, "{name}: {s:#?}");
    }
}

#[test]
fn a_fault_that_comes_and_goes_for_five_minutes_is_held_on_probation() {
    for name in ["periodic-10s", "periodic-503"] {
        let s = runs(name);
        assert!(worst(&s, |x| x.fault_transitions) <= 12, "{name}: {s:#?}");
        assert!(restore(&s) <= 10 * SEC, "{name}: {s:#?}");
    }
    // No more failed calls than when it was ejected and readmitted every cycle (19, median).
    let s = runs("periodic-10s");
    let mut failed: Vec<u32> = s.iter().map(|x| x.failed).collect();
    failed.sort_unstable();
    assert!(failed[failed.len() / 2] <= 19, "{failed:?}");
}

#[test]
fn slow_first_tokens_seen_only_by_health_probes_re_expose_users_once() {
    let s = runs("slow-ttft-5min");
    assert!(worst(&s, |x| x.fault_transitions) <= 4, "{s:#?}");
    // 151 slow calls (median) when a health probe readmitted it as a canary every ~30 s.
    assert!(s.iter().all(|x| x.slow < 151), "{s:#?}");
}

#[test]
fn forty_percent_429s_cool_within_five_seconds_and_cost_few_calls() {
    for name in ["429-storm", "429-5min"] {
        let s = runs(name);
        assert!(delay(&s, |x| x.detection) <= 5 * SEC, "{name}: {s:#?}");
        assert!(
            s.iter().all(|x| x.detection.is_some_and(|d| d <= 7 * SEC)),
            "{name}: {s:#?}"
        );
    }
    assert!(worst(&runs("429-5min"), |x| x.failed) <= 40);
}

/// A cooldown ends when the upstream's Retry-After says (docs/decisions.md, rate limits): in every run the
/// endpoint is back within 2 s of the limit lifting (7.6 s median and 37 s worst over 20 seeds
/// when a cooldown right after another doubled).
#[test]
fn an_announced_rate_limit_is_lifted_within_two_seconds_of_the_upstream_lifting_it() {
    let s = runs("429-storm");
    assert!(
        s.iter().all(|x| matches!(x.restore, Some(Ok(t)) if t <= 2 * SEC)),
        "{s:#?}"
    );
}

#[test]
fn a_latency_tail_is_degraded_within_fifteen_seconds_and_held_never_ejected() {
    for name in [
        "latency-tail",
        "latency-tail-10-endpoints",
        "latency-tail-busy",
        "latency-tail-busy-10-endpoints",
    ] {
        let s = runs(name);
        assert!(delay(&s, |x| x.detection) <= 15 * SEC, "{name}: {s:#?}");
        assert!(worst(&s, |x| x.fault_transitions) <= 4, "{name}: {s:#?}");
        assert!(
            s.iter().all(|x| x.ejection.is_none() && x.max_out == 0.0),
            "{name}: {s:#?}"
        );
    }
}
