// Decoding a request allocates every span's attributes, and the reporter's worker frees them:
// mimalloc takes that churn (otlp-bench).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

use clap::Parser;
use std::time::Duration;
use vitals_runtime::shell;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    shell::init_tracing();
    let cfg = vitals_otlp::Config::parse();
    shell::run("vitals-otlp", Duration::from_secs(10), |cancel| {
        vitals_otlp::run(cfg, cancel)
    })
    .await
}
