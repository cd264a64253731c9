//! `vitals simulate`: the engine as a filter.

use std::path::PathBuf;

#[derive(clap::Args)]
pub struct Args {
    /// The policy every pool starts with (JSON, fields as in PUT /v1/pools/{pool}/policy;
    /// missing fields keep their defaults).
    #[arg(long)]
    policy: Option<PathBuf>,
}

pub async fn run(a: Args) -> anyhow::Result<u8> {
    let policy = super::policy_or_default(a.policy.as_ref())?;
    let totals = tokio::task::spawn_blocking(move || {
        let stdin = std::io::stdin().lock();
        let stdout = std::io::BufWriter::with_capacity(1 << 16, std::io::stdout().lock());
        crate::simulate::run(policy, stdin, stdout)
    })
    .await??;
    eprintln!(
        "vitals simulate: {} lines, {} decisions, {} errors",
        totals.lines, totals.decisions, totals.errors
    );
    Ok(if totals.errors > 0 { 4 } else { 0 })
}
