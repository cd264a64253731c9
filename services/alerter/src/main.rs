use clap::Parser;
use std::time::Duration;
use vitals_runtime::shell;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    shell::init_tracing();
    let cfg = vitals_alerter::Config::parse();
    shell::run("vitals-alerter", Duration::from_secs(10), |cancel| {
        vitals_alerter::run(cfg, cancel)
    })
    .await
}
