//! `vitals scenarios`: the scorecard's closed-loop fault scenarios under a candidate policy, side
//! by side with the default policy, on the same seeds.

use serde::Serialize;
use vitals_contracts::{Micros, Policy};
use vitals_scorecard::{run_with, scenarios, Score, SEC};

/// One scenario's figures under one policy (medians over the seeds; false ejections summed).
#[derive(Debug, Serialize, PartialEq)]
pub struct Figures {
    pub detection_s: Option<f64>,
    pub out_after_s: Option<f64>,
    pub false_ejections: u32,
    pub failed_calls: u32,
    pub slow_calls: u32,
    pub transitions: u32,
    /// Transitions of the faulty endpoints while the fault lasted.
    pub transitions_in_fault: u32,
    /// From the end of the fault until every faulty endpoint was back in rotation (None: none
    /// was out, or one was still out at the end).
    pub restore_s: Option<f64>,
}

#[derive(Debug, Serialize)]
pub struct Row {
    pub scenario: &'static str,
    pub what: &'static str,
    pub default: Figures,
    pub candidate: Figures,
}

fn median<T: Copy + Ord>(mut v: Vec<T>) -> T {
    v.sort_unstable();
    v[v.len() / 2]
}

fn figures(scores: &[Score]) -> Figures {
    let delay = |f: fn(&Score) -> Option<Micros>| -> Option<f64> {
        let d = median(scores.iter().map(|s| f(s).unwrap_or(Micros::MAX)).collect());
        (d != Micros::MAX).then(|| d as f64 / SEC as f64)
    };
    Figures {
        detection_s: delay(|s| s.detection),
        out_after_s: delay(|s| s.ejection),
        false_ejections: scores.iter().map(|s| s.false_ejections).sum(),
        failed_calls: median(scores.iter().map(|s| s.failed).collect()),
        slow_calls: median(scores.iter().map(|s| s.slow).collect()),
        transitions: median(scores.iter().map(|s| s.transitions).collect()),
        transitions_in_fault: median(scores.iter().map(|s| s.fault_transitions).collect()),
        restore_s: delay(|s| match s.restore {
            Some(Ok(t)) => Some(t),
            _ => None,
        }),
    }
}

/// Every scenario (or the one named) under both policies, `runs` seeds from `seed`; progress on
/// stderr.
pub fn compare(candidate: &Policy, seed: u64, runs: u64, only: Option<&str>) -> anyhow::Result<Vec<Row>> {
    let all = scenarios();
    let chosen: Vec<_> = all.iter().filter(|s| only.is_none_or(|n| n == s.name)).collect();
    if chosen.is_empty() {
        let names: Vec<_> = all.iter().map(|s| s.name).collect();
        anyhow::bail!("no scenario {:?}; there are: {}", only.unwrap_or(""), names.join(", "));
    }
    let default = Policy::default();
    let mut rows = Vec::new();
    for (i, s) in chosen.iter().enumerate() {
        eprintln!("vitals scenarios: [{}/{}] {} …", i + 1, chosen.len(), s.name);
        let under = |p: &Policy| -> Vec<Score> { (0..runs.max(1)).map(|k| run_with(s, seed + k, p)).collect() };
        rows.push(Row {
            scenario: s.name,
            what: s.what,
            default: figures(&under(&default)),
            candidate: figures(&under(candidate)),
        });
    }
    Ok(rows)
}

pub fn print(rows: &[Row]) {
    let s = |v: Option<f64>| v.map_or("never".to_owned(), |v| format!("{v:.1}"));
    let restore = |v: Option<f64>| v.map_or("—".to_owned(), |v| format!("{v:.1}"));
    let pair = |a: String, b: String| if a == b { a } else { format!("{a} → {b}") };
    let table: Vec<Vec<String>> = rows
        .iter()
        .map(|r| {
            let (d, c) = (&r.default, &r.candidate);
            vec![
                r.scenario.to_owned(),
                pair(s(d.detection_s), s(c.detection_s)),
                pair(s(d.out_after_s), s(c.out_after_s)),
                pair(d.false_ejections.to_string(), c.false_ejections.to_string()),
                pair(d.failed_calls.to_string(), c.failed_calls.to_string()),
                pair(d.slow_calls.to_string(), c.slow_calls.to_string()),
                pair(d.transitions_in_fault.to_string(), c.transitions_in_fault.to_string()),
                pair(restore(d.restore_s), restore(c.restore_s)),
            ]
        })
        .collect();
    crate::api::table(
        &[
            "scenario",
            "detection s",
            "out after s",
            "false ejections",
            "failed calls",
            "slow calls",
            "transitions in the fault",
            "restore s",
        ],
        &table,
    );
    println!("(default → candidate where they differ; medians over the seeds, false ejections summed)");
}
