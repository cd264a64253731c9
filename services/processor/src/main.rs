use clap::Parser;
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use vitals_processor::config::Config;
use vitals_processor::shell;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    shell::init_tracing();
    let cfg = Config::parse();
    let grace = Duration::from_secs(cfg.shutdown_grace_secs);
    let cancel = CancellationToken::new();
    shell::cancel_on_signals(cancel.clone());
    let run = vitals_processor::run(cfg, cancel.clone());
    tokio::pin!(run);
    tokio::select! {
        r = &mut run => r,
        _ = async { cancel.cancelled().await; tokio::time::sleep(grace + Duration::from_secs(5)).await } => {
            anyhow::bail!("did not stop within the shutdown grace period")
        }
    }
}
