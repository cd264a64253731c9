//! `vitals backtest`: a time range replayed under a candidate policy, against the audit log.

use super::{print_typed, read_policy, Connection};
use anyhow::Context as _;
use std::path::PathBuf;
use vitals_contracts::Policy;

#[derive(clap::Args)]
pub struct Args {
    /// Start of the range (RFC 3339).
    #[arg(long)]
    from: String,
    /// End of the range (RFC 3339).
    #[arg(long)]
    to: String,
    /// The candidate policy (JSON; missing fields keep their defaults).
    #[arg(long)]
    policy: PathBuf,
    /// Only this pool.
    #[arg(long)]
    pool: Option<String>,
    /// Signals read before --from so that windows and scores are warm, seconds.
    #[arg(long, default_value_t = 900)]
    warmup_secs: i64,
    /// Also write a page with the timelines (current and candidate) per endpoint.
    #[arg(long)]
    html: Option<PathBuf>,
    #[arg(long, env = "VITALS_KAFKA_BROKERS", default_value = "127.0.0.1:9092")]
    brokers: String,
    #[arg(long, env = "VITALS_SIGNALS_TOPIC", default_value = vitals_contracts::topics::SIGNALS)]
    signals_topic: String,
    #[command(flatten)]
    conn: Connection,
}

pub async fn run(a: Args) -> anyhow::Result<u8> {
    let time = |flag: &str, v: &str| -> anyhow::Result<i64> {
        chrono::DateTime::parse_from_rfc3339(v)
            .map(|t| t.timestamp_micros())
            .with_context(|| format!("--{flag} {v:?} is not an RFC 3339 time"))
    };
    let range = crate::backtest::Range {
        from_us: time("from", &a.from)?,
        to_us: time("to", &a.to)?,
        warmup_us: a.warmup_secs.max(0) * 1_000_000,
        pool: a.pool,
    };
    anyhow::ensure!(range.to_us > range.from_us, "--to must be after --from");
    let candidate: Policy = serde_json::from_value(read_policy(&a.policy)?)?;
    let api = a.conn.api()?;
    let current = crate::backtest::current(&api, &range).await?;
    let (brokers, signals_topic) = (a.brokers, a.signals_topic);
    let (candidate, range) = tokio::task::spawn_blocking(move || {
        crate::backtest::replay(&brokers, &signals_topic, &range, &candidate).map(|o| (o, range))
    })
    .await??;
    let diffs = crate::backtest::compare(&current, &candidate, &range);
    if let Some(path) = &a.html {
        std::fs::write(path, crate::backtest::html(&diffs, &range))
            .with_context(|| format!("writing {}", path.display()))?;
        eprintln!("vitals backtest: timelines in {}", path.display());
    }
    if a.conn.json {
        print_typed(&diffs)?;
    } else {
        crate::backtest::print_table(&diffs);
    }
    Ok(0)
}
