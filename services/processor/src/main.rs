use clap::Parser;
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use vitals_processor::config::Config;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("VITALS_LOG")
                .unwrap_or_else(|_| "info,rdkafka=warn,sqlx=warn".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let cfg = Config::parse();
    let grace = Duration::from_secs(cfg.shutdown_grace_secs);
    let cancel = CancellationToken::new();
    let signals = cancel.clone();
    tokio::spawn(async move {
        let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(s) => s,
            Err(e) => {
                tracing::error!(error = %e, "cannot install SIGTERM handler");
                return;
            }
        };
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
        tracing::info!("shutdown requested");
        signals.cancel();
    });
    let run = vitals_processor::run(cfg, cancel.clone());
    tokio::pin!(run);
    tokio::select! {
        r = &mut run => r,
        _ = async { cancel.cancelled().await; tokio::time::sleep(grace + Duration::from_secs(5)).await } => {
            anyhow::bail!("did not stop within the shutdown grace period")
        }
    }
}
