use clap::Parser;
use std::time::Duration;
use vitals_processor::config::Config;
use vitals_runtime::shell;

/// The record step allocates and frees a few small buffers per signal (decoded names, rows);
/// glibc's allocator spent about 18 % of the processor's CPU on them, mimalloc far less.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    shell::init_tracing();
    let cfg = Config::parse();
    // The processor's own grace covers the last batch; five more seconds for the rest.
    let grace = Duration::from_secs(cfg.shutdown_grace_secs + 5);
    shell::run("vitals-processor", grace, |cancel| vitals_processor::run(cfg, cancel)).await
}
