//! What every vitals binary does at its edge: structured logs, and one cancellation token that
//! SIGTERM or Ctrl-C fires.

use tokio_util::sync::CancellationToken;

/// Logs to stderr, filtered by `VITALS_LOG` (default `info`, quieter for rdkafka and sqlx).
pub fn init_tracing() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("VITALS_LOG")
                .unwrap_or_else(|_| "info,rdkafka=warn,sqlx=warn".into()),
        )
        .with_writer(std::io::stderr)
        .init();
}

/// Cancel `cancel` on the first SIGTERM or SIGINT.
pub fn cancel_on_signals(cancel: CancellationToken) {
    tokio::spawn(async move {
        let Ok(mut term) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) else {
            tracing::error!("cannot install the SIGTERM handler");
            return;
        };
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
        tracing::info!("shutdown requested");
        cancel.cancel();
    });
}
