use clap::Parser;
use std::time::Duration;
use vitals_api::config::Config;
use vitals_runtime::shell;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    shell::init_tracing();
    let cfg = Config::parse();
    // Requests end within the request timeout; live streams end at once on shutdown.
    let grace = Duration::from_millis(cfg.request_timeout_ms) + Duration::from_secs(5);
    shell::run("vitals-api", grace, |cancel| async move {
        vitals_api::build(cfg, cancel).await?.run().await
    })
    .await
}
