use clap::Parser;
use std::time::Duration;
use vitals_runtime::shell;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    shell::init_tracing();
    let cfg = vitals_haproxy::Config::parse();
    shell::run("vitals-haproxy", Duration::from_secs(10), |cancel| {
        vitals_haproxy::run(cfg, cancel)
    })
    .await
}
