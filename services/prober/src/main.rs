use clap::Parser;
use std::time::Duration;
use vitals_prober::service::{run, Config};
use vitals_runtime::shell;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    shell::init_tracing();
    let cfg = Config::parse();
    let grace = Duration::from_secs(cfg.shutdown_grace_secs + 5);
    shell::run("vitals-prober", grace, |cancel| run(cfg, cancel)).await
}
