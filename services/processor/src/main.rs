use clap::Parser;
use std::time::Duration;
use vitals_processor::config::Config;
use vitals_runtime::shell;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    shell::init_tracing();
    let cfg = Config::parse();
    // The processor's own grace covers the last batch; five more seconds for the rest.
    let grace = Duration::from_secs(cfg.shutdown_grace_secs + 5);
    shell::run("vitals-processor", grace, |cancel| vitals_processor::run(cfg, cancel)).await
}
