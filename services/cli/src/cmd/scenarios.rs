//! `vitals scenarios`: the scorecard's scenarios under a candidate policy beside the default.

use super::print_typed;
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct Args {
    /// The candidate policy (JSON; missing fields keep their defaults); default: the default.
    #[arg(long)]
    policy: Option<PathBuf>,
    /// Only this scenario.
    #[arg(long)]
    scenario: Option<String>,
    /// Seeds per scenario (medians are shown).
    #[arg(long, default_value_t = 5)]
    runs: u64,
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// JSON instead of a table.
    #[arg(long)]
    json: bool,
}

pub async fn run(a: Args) -> anyhow::Result<u8> {
    let candidate = super::policy_or_default(a.policy.as_ref())?;
    let (seed, runs, scenario) = (a.seed, a.runs, a.scenario);
    let rows =
        tokio::task::spawn_blocking(move || crate::scenarios::compare(&candidate, seed, runs, scenario.as_deref()))
            .await??;
    if a.json {
        print_typed(&rows)?;
    } else {
        crate::scenarios::print(&rows);
    }
    Ok(0)
}
