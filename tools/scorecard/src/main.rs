//! The closed-loop scorecard: every scenario of `vitals_scorecard::scenarios`, run through the
//! engine with a router that follows its decisions, one row per scenario.
//!
//!   cargo run --release -p vitals-scorecard --bin scorecard -- [--seed N] [--runs N]
//!       [--scenario NAME] [--log]

use clap::Parser;
use vitals_contracts::Micros;
use vitals_scorecard::{run, scenarios, Score, SEC};

#[derive(Parser)]
struct Args {
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
}

fn secs(us: Micros) -> String {
    format!("{:.1}", us as f64 / SEC as f64)
}

fn median<T: Copy + Ord>(mut v: Vec<T>) -> Option<T> {
    v.sort_unstable();
    v.get(v.len() / 2).copied().filter(|_| !v.is_empty())
}

fn main() {
    let args = Args::parse();
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
    println!(
        "closed loop: {} endpoints, router follows the engine's weights and panic mode; {} runs per scenario (seeds {}..{}), medians",
        chosen[0].endpoints,
        runs,
        args.seed,
        args.seed + runs - 1
    );
    println!(
        "| scenario | detection s | false ejections | transitions | max out | failed calls | slow calls | restore s |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|");
    for s in chosen {
        eprintln!("[scorecard] {} ({}) …", s.name, s.what);
        let scores: Vec<Score> = (0..runs).map(|k| run(s, args.seed + k)).collect();
        let detection = if scores.iter().all(|x| x.detection.is_none()) {
            "—".to_owned()
        } else {
            // A run that never detected counts as the slowest.
            median(scores.iter().map(|x| x.detection.unwrap_or(Micros::MAX)).collect())
                .map(|d| if d == Micros::MAX { "never".to_owned() } else { secs(d) })
                .unwrap_or_default()
        };
        let restore = if scores.iter().all(|x| x.restore.is_none()) {
            "—".to_owned()
        } else {
            let v: Vec<(bool, Micros)> = scores
                .iter()
                .map(|x| match x.restore {
                    None => (false, 0),
                    Some(Ok(t)) => (false, t),
                    Some(Err(t)) => (true, t),
                })
                .collect();
            match median(v) {
                Some((true, t)) => format!("> {}", secs(t)),
                Some((false, t)) => secs(t),
                None => String::new(),
            }
        };
        let med = |f: fn(&Score) -> u32| median(scores.iter().map(f).collect()).unwrap_or(0);
        let max_out = median(scores.iter().map(|x| (x.max_out * 100.0).round() as u32).collect()).unwrap_or(0);
        println!(
            "| {} | {} | {} | {} | {} % | {} | {} | {} |",
            s.name,
            detection,
            scores.iter().map(|x| x.false_ejections).sum::<u32>(),
            med(|x| x.transitions),
            max_out,
            med(|x| x.failed),
            med(|x| x.slow),
            restore
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
