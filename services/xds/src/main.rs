use clap::Parser;
use std::time::Duration;
use vitals_runtime::shell;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    shell::init_tracing();
    let cfg = vitals_xds::Config::parse();
    shell::run("vitals-xds", Duration::from_secs(10), |cancel| {
        vitals_xds::run(cfg, cancel)
    })
    .await
}
