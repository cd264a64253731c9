//! The closed-loop scorecard: every scenario of `vitals_scorecard::scenarios`, run through the
//! engine with a router that follows its decisions, one row per scenario.
//!
//!   cargo run --release -p vitals-scorecard --bin scorecard -- [--seed N] [--runs N]
//!       [--scenario NAME] [--log] [--worst] [--anchors]

use clap::Parser;
use std::sync::atomic::{AtomicBool, Ordering};
use vitals_contracts::Micros;
use vitals_contracts::Policy;
use vitals_scorecard::anchors::{Envoy, Litellm};
use vitals_scorecard::{run_judged, run_with, scenarios, Scenario, Score, SEC};

/// The policy every run is judged under: the default, or with the options' changes.
static POLICY: std::sync::OnceLock<Policy> = std::sync::OnceLock::new();

fn run(s: &Scenario, seed: u64) -> Score {
    run_with(s, seed, POLICY.get_or_init(Policy::default))
}

#[derive(Parser)]
struct Args {
    /// The scoped faults instead (one gateway's, one location's, one credential's, a faulty
    /// gateway, everyone's): a fleet of gateways, with and without their identities.
    #[arg(long)]
    fleet: bool,
    /// Seed of the first run; run k uses seed + k.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Runs per scenario: the table shows medians (false ejections: the total over all runs).
    #[arg(long, default_value_t = 5)]
    runs: u64,
    /// Only this scenario.
    #[arg(long)]
    scenario: Option<String>,
    /// Print every transition of the first run (the audit log's reasons).
    #[arg(long)]
    log: bool,
    /// Show the worst run of each figure instead of the median.
    #[arg(long)]
    worst: bool,
    /// Put vitals beside the anchors' policies (Envoy's outlier detection and LiteLLM's
    /// cooldown, with their defaults): failed calls, slow calls, capacity lost, transitions.
    #[arg(long)]
    anchors: bool,
    /// Instead of the table: a pool of four at 5 calls a second each under 1 % noise (every
    /// endpoint, no fault) for this many hours of simulated time per seed, and the false
    /// ejections it made, per endpoint-week (the price of detecting a partial failure sooner).
    #[arg(long)]
    soak_hours: Option<u64>,
    /// The policy's `peer_failure_z` instead of its default (how far above its peers' an
    /// endpoint's failure rate must stand to be ejected): detection against false ejections.
    #[arg(long)]
    peer_failure_z: Option<f64>,
}

fn secs(us: Micros) -> String {
    format!("{:.1}", us as f64 / SEC as f64)
}

/// The median (or, with `--worst`, the largest) of the runs' values.
fn pick<T: Copy + Ord>(mut v: Vec<T>) -> Option<T> {
    v.sort_unstable();
    let i = if WORST.load(Ordering::Relaxed) {
        v.len().saturating_sub(1)
    } else {
        v.len() / 2
    };
    v.get(i).copied()
}

static WORST: AtomicBool = AtomicBool::new(false);

/// A delay over the runs; a run where it never happened counts as the slowest.
fn delay(scores: &[Score], f: fn(&Score) -> Option<Micros>) -> String {
    if scores.iter().all(|x| f(x).is_none()) {
        return "—".to_owned();
    }
    pick(scores.iter().map(|x| f(x).unwrap_or(Micros::MAX)).collect())
        .map(|d| if d == Micros::MAX { "never".to_owned() } else { secs(d) })
        .unwrap_or_default()
}

/// A time after the fault over the runs: never out < back after t < still out after t, so that
/// a median or worst run means what it says.
fn after_fault(scores: &[Score], f: fn(&Score) -> Option<Result<Micros, Micros>>) -> String {
    let v = pick(
        scores
            .iter()
            .map(|x| match f(x) {
                None => (0, 0),
                Some(Ok(t)) => (1, t),
                Some(Err(t)) => (2, t),
            })
            .collect(),
    );
    match v {
        Some((1, t)) => secs(t),
        Some((2, t)) => format!("> {}", secs(t)),
        _ => "—".to_owned(),
    }
}

/// The scoped faults over `runs` seeds: medians, without identities (one shared state) and with.
fn fleet(seed: u64, runs: u64) {
    use vitals_scorecard::fleet::{fleet_scenarios, run_fleet, FleetScore};
    println!(
        "scoped faults: gateways at 4 calls/s, pool of 3, fault from 60 s to 240 s; medians over seeds {seed}..{}",
        seed + runs - 1
    );
    println!("| scenario | unaffected capacity lost (endpoint-s) | fleet transitions | affected out after s | affected transitions | affected failed calls | faulty reporter named |");
    println!("|---|---:|---:|---:|---:|---:|---:|");
    fn median<T: Copy + PartialOrd>(mut v: Vec<T>) -> T {
        v.sort_by(|a, b| a.partial_cmp(b).expect("no NaN"));
        v[v.len() / 2]
    }
    for s in fleet_scenarios() {
        eprintln!("[scorecard] {} …", s.name);
        for (label, scoped) in [("before", false), ("after", true)] {
            let scores: Vec<FleetScore> = (seed..seed + runs).map(|k| run_fleet(&s, k, scoped)).collect();
            let out = median(
                scores
                    .iter()
                    .map(|x| x.affected_out_after.unwrap_or(i64::MAX))
                    .collect(),
            );
            println!(
                "| {} ({label}) | {:.1} | {} | {} | {} | {} | {}/{} |",
                s.name,
                median(scores.iter().map(|x| x.unaffected_capacity_lost).collect()),
                median(scores.iter().map(|x| x.fleet_transitions).collect()),
                if out == i64::MAX {
                    "—".to_owned()
                } else {
                    format!("{:.2}", out as f64 / 1e6)
                },
                median(scores.iter().map(|x| x.affected_transitions).collect()),
                median(scores.iter().map(|x| x.affected_failed).collect()),
                scores.iter().filter(|x| x.faulty_named).count(),
                scores.len()
            );
        }
    }
}

fn main() {
    let args = Args::parse();
    let mut policy = Policy::default();
    if let Some(z) = args.peer_failure_z {
        policy.peer_failure_z = z;
    }
    POLICY.set(policy).expect("set once");
    WORST.store(args.worst, Ordering::Relaxed);
    if args.fleet {
        fleet(args.seed, args.runs.max(1));
        return;
    }
    let all = scenarios();
    let chosen: Vec<_> = all
        .iter()
        .filter(|s| args.scenario.as_deref().is_none_or(|n| n == s.name))
        .collect();
    if chosen.is_empty() {
        let names: Vec<_> = all.iter().map(|s| s.name).collect();
        eprintln!("no scenario {:?}; there are: {}", args.scenario, names.join(", "));
        std::process::exit(2);
    }
    let runs = args.runs.max(1);
    if let Some(hours) = args.soak_hours {
        soak(hours, args.seed, runs);
        return;
    }
    if args.anchors {
        anchors(&chosen, args.seed, runs, args.worst);
        return;
    }
    println!(
        "closed loop: {} endpoints, router follows the engine's weights and panic mode; {} runs per scenario (seeds {}..{}), {}",
        chosen[0].endpoints,
        runs,
        args.seed,
        args.seed + runs - 1,
        if args.worst { "worst run of each figure" } else { "medians" }
    );
    println!(
        "| scenario | detection s | out after s | false ejections | transitions | in the fault | max out | failed calls | slow calls | restore s | full weight s | capacity lost |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for s in chosen {
        eprintln!("[scorecard] {} ({}) …", s.name, s.what);
        let scores: Vec<Score> = (0..runs).map(|k| run(s, args.seed + k)).collect();
        let detection = delay(&scores, |x| x.detection);
        let ejection = delay(&scores, |x| x.ejection);
        let restore = after_fault(&scores, |x| x.restore);
        let full_weight = after_fault(&scores, |x| x.full_weight);
        let med = |f: fn(&Score) -> u32| pick(scores.iter().map(f).collect()).unwrap_or(0);
        let max_out = pick(scores.iter().map(|x| (x.max_out * 100.0).round() as u32).collect()).unwrap_or(0);
        println!(
            "| {} | {} | {} | {} | {} | {} | {} % | {} | {} | {} | {} | {} |",
            s.name,
            detection,
            ejection,
            scores.iter().map(|x| x.false_ejections).sum::<u32>(),
            med(|x| x.transitions),
            med(|x| x.fault_transitions),
            max_out,
            med(|x| x.failed),
            med(|x| x.slow),
            restore,
            full_weight,
            lost(&scores)
        );
        if args.log {
            for (at, ep, from, to, reason) in &scores[0].log {
                eprintln!(
                    "    {:>7} s  {ep}  {} → {}  {reason}",
                    secs(*at),
                    from.as_str(),
                    to.as_str()
                );
            }
        }
    }
}

/// The capacity lost over the runs (median or worst), in endpoint-seconds.
fn lost(scores: &[Score]) -> String {
    let v = pick(scores.iter().map(|x| (x.capacity_lost * 10.0).round() as u64).collect()).unwrap_or(0);
    format!("{:.1}", v as f64 / 10.0)
}

/// One row per scenario: each figure for vitals, Envoy and LiteLLM side by side.
fn anchors(chosen: &[&Scenario], seed: u64, runs: u64, worst: bool) {
    println!(
        "the same closed loop under vitals' default policy, Envoy's outlier detection and LiteLLM's cooldown (their defaults); {runs} runs per scenario (seeds {seed}..{}), {}; each cell vitals / Envoy / LiteLLM",
        seed + runs - 1,
        if worst { "worst run of each figure" } else { "medians" }
    );
    println!("| scenario | failed calls | slow calls | capacity lost (endpoint-s) | transitions | false ejections |");
    println!("|---|---:|---:|---:|---:|---:|");
    for s in chosen {
        eprintln!("[scorecard] {} ({}) …", s.name, s.what);
        let by: Vec<Vec<Score>> = vec![
            (0..runs).map(|k| run(s, seed + k)).collect(),
            (0..runs)
                .map(|k| run_judged(s, seed + k, &mut Envoy::new(s.endpoints)))
                .collect(),
            (0..runs)
                .map(|k| run_judged(s, seed + k, &mut Litellm::new()))
                .collect(),
        ];
        let cells = |f: &dyn Fn(&[Score]) -> String| by.iter().map(|v| f(v)).collect::<Vec<_>>().join(" / ");
        let med = |f: fn(&Score) -> u32| move |v: &[Score]| pick(v.iter().map(f).collect()).unwrap_or(0).to_string();
        println!(
            "| {} | {} | {} | {} | {} | {} |",
            s.name,
            cells(&med(|x| x.failed)),
            cells(&med(|x| x.slow)),
            cells(&lost),
            cells(&med(|x| x.transitions)),
            cells(&|v: &[Score]| v.iter().map(|x| x.false_ejections).sum::<u32>().to_string()),
        );
    }
}

/// `--soak-hours`: false ejections under 1 % noise over a long run, per endpoint-week.
fn soak(hours: u64, seed: u64, runs: u64) {
    // The scorecard's `noise-1pct`, its noise lasting the whole soak.
    let duration = hours as i64 * 3600 * SEC;
    let mut s = scenarios()
        .into_iter()
        .find(|s| s.name == "noise-1pct")
        .expect("the noise scenario");
    s.duration = duration;
    for f in &mut s.faults {
        f.to = duration;
    }
    let (mut ejections, mut transitions, mut calls) = (0u64, 0u64, 0u64);
    for k in 0..runs {
        eprintln!("[scorecard] soak {hours} h, seed {} …", seed + k);
        let score = run(&s, seed + k);
        ejections += u64::from(score.false_ejections);
        transitions += u64::from(score.transitions);
        calls += u64::from(score.calls);
        for (at, ep, from, to, reason) in score
            .log
            .iter()
            .filter(|m| m.3 == vitals_contracts::HealthState::Unhealthy)
        {
            eprintln!(
                "    {:>9} s  {ep}  {} → {}  {reason}",
                secs(*at),
                from.as_str(),
                to.as_str()
            );
        }
    }
    let weeks = (runs * hours) as f64 * 4.0 / (7.0 * 24.0);
    println!(
        "noise soak: {runs} × {hours} h, 4 endpoints at 5 calls/s, 1 % noise: {calls} calls, {transitions} transitions, {ejections} false ejections = {:.2} per endpoint-week",
        ejections as f64 / weeks
    );
}
