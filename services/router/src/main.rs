use anyhow::Context as _;
use clap::Parser;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use vitals_router::{router, Proxy, Routes};
use vitals_runtime::args::KafkaArgs;
use vitals_runtime::shell;

#[derive(Parser)]
#[command(
    name = "vitals-router",
    about = "A reference OpenAI-compatible router that follows vitals' health view"
)]
struct Config {
    /// The routes file (TOML): `listen`, `gateway`, `[[pool]]` with `models` and `[[pool.upstream]]`.
    #[arg(long, env = "VITALS_ROUTER_CONFIG")]
    config: PathBuf,
    #[command(flatten)]
    kafka: KafkaArgs,
    #[arg(long, env = "VITALS_SIGNALS_TOPIC", default_value = vitals_contracts::topics::SIGNALS)]
    signals_topic: String,
    #[arg(long, env = "VITALS_CHANGES_TOPIC", default_value = vitals_contracts::topics::HEALTH_CHANGES)]
    changes_topic: String,
    #[arg(long, env = "VITALS_STATE_TOPIC", default_value = vitals_contracts::topics::HEALTH_STATE)]
    state_topic: String,
    /// Seconds without a change or a tick from the processor after which the health view is
    /// stale (it routes as last known).
    #[arg(long, env = "VITALS_ROUTER_STALE_AFTER_SECS", default_value_t = 15)]
    stale_after_secs: u64,
    /// Seconds of silence after which the view fails open: every endpoint takes calls.
    #[arg(long, env = "VITALS_ROUTER_FAIL_OPEN_AFTER_SECS", default_value_t = 60)]
    fail_open_after_secs: u64,
    /// Calls are summed per endpoint over this many milliseconds (failures still go one by
    /// one, up to 8 an interval); 0 sends one record per call.
    #[arg(long, env = "VITALS_ROUTER_SUMMARIZE_MS", default_value_t = 250)]
    summarize_ms: u64,
    /// Report to a merge stage on this topic (vitals.gateway-signals.v1), keyed by endpoint,
    /// instead of to the signals topic: for a fleet where every replica calls every endpoint
    /// (docs/fleet.md).
    #[arg(long, env = "VITALS_MERGER_TOPIC")]
    merger_topic: Option<String>,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    shell::init_tracing();
    let cfg = Config::parse();
    shell::run("vitals-router", Duration::from_secs(10), |cancel| async move {
        let text = std::fs::read_to_string(&cfg.config).with_context(|| format!("reading {}", cfg.config.display()))?;
        let routes = Routes::parse(&text).map_err(|e| anyhow::anyhow!("{}: {e}", cfg.config.display()))?;
        let options: Vec<(String, String)> = cfg.kafka.pairs().map(|(k, v)| (k.to_owned(), v.to_owned())).collect();
        let mut rc = vitals_reporter::Config::new(cfg.kafka.brokers.clone());
        rc.topic = cfg.signals_topic.clone();
        rc.kafka_options = options.clone();
        rc.summarize = vitals_reporter::summaries_every_ms(cfg.summarize_ms);
        if let Some(topic) = &cfg.merger_topic {
            rc.topic = topic.clone();
            rc.keyed_by_endpoint = true;
        }
        let reporter = Arc::new(vitals_reporter::Reporter::new(rc)?);
        let mut vc = vitals_healthview::Config::new(cfg.kafka.brokers.clone());
        vc.kafka_options = options;
        vc.state_topic = cfg.state_topic.clone();
        vc.changes_topic = cfg.changes_topic.clone();
        vc.stale_after = Duration::from_secs(cfg.stale_after_secs);
        vc.open_after = Duration::from_secs(cfg.fail_open_after_secs);
        vc.identity = routes.identity();
        let follower = tokio::task::spawn_blocking(move || vitals_healthview::follow(vc)).await??;
        tracing::info!(endpoints = follower.view.len(), cold_start = ?follower.cold_start, "health view loaded");
        let listen = routes.listen;
        let proxy = Arc::new(Proxy::new(routes, follower.view.clone(), reporter.clone())?);
        let listener = tokio::net::TcpListener::bind(listen)
            .await
            .with_context(|| format!("binding {listen}"))?;
        tracing::info!(addr = %listener.local_addr()?, "routing");
        axum::serve(listener, router(proxy))
            .with_graceful_shutdown(async move { cancel.cancelled().await })
            .await?;
        let r = reporter.clone();
        tokio::task::spawn_blocking(move || r.flush(Duration::from_secs(5))).await?;
        drop(follower);
        Ok(())
    })
    .await
}
