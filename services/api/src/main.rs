use clap::Parser;
use tokio_util::sync::CancellationToken;
use vitals_api::config::Config;

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
    let cancel = CancellationToken::new();
    let signals = cancel.clone();
    tokio::spawn(async move {
        let Ok(mut term) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) else {
            tracing::error!("cannot install SIGTERM handler");
            return;
        };
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
        tracing::info!("shutdown requested");
        signals.cancel();
    });
    let app = vitals_api::build(cfg, cancel).await?;
    app.run().await
}
