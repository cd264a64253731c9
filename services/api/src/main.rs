use clap::Parser;
use tokio_util::sync::CancellationToken;
use vitals_api::config::Config;
use vitals_processor::shell;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    shell::init_tracing();
    let cfg = Config::parse();
    let cancel = CancellationToken::new();
    shell::cancel_on_signals(cancel.clone());
    vitals_api::build(cfg, cancel).await?.run().await
}
