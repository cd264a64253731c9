// mimalloc, as the processor: the merger allocates per record (names, histograms).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

use anyhow::Context as _;
use axum::routing::get;
use clap::Parser;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;
use vitals_contracts::topics;
use vitals_merger::run::{run, Settings};
use vitals_merger::Counters;
use vitals_runtime::args::KafkaArgs;
use vitals_runtime::shell;

#[derive(Parser)]
#[command(
    name = "vitals-merger",
    about = "Merges every gateway's calls to an endpoint into one stream per endpoint (docs/fleet.md)"
)]
struct Config {
    #[command(flatten)]
    kafka: KafkaArgs,
    /// What the gateways report to (keyed by endpoint).
    #[arg(long, env = "VITALS_MERGER_INPUT_TOPIC", default_value = topics::GATEWAY_SIGNALS)]
    input_topic: String,
    /// What the processor reads.
    #[arg(long, env = "VITALS_SIGNALS_TOPIC", default_value = topics::SIGNALS)]
    signals_topic: String,
    /// Where input that is no valid signal goes (the processor's dead-letter topic), with its
    /// origin and the reason in headers.
    #[arg(long, env = "VITALS_DLQ_TOPIC", default_value = topics::SIGNALS_DLQ)]
    dlq_topic: String,
    #[arg(long, env = "VITALS_MERGER_GROUP", default_value = "vitals-merger")]
    group: String,
    /// Stable per instance (e.g. the pod's name): a restarted merger then aborts what it left
    /// open at once. Default: vitals-merger-{hostname}.
    #[arg(long, env = "VITALS_MERGER_TRANSACTIONAL_ID")]
    transactional_id: Option<String>,
    /// One interval is one Kafka transaction: merged summaries cover it, and failures wait at
    /// most this long (plus the commit) before the processor sees them.
    #[arg(long, env = "VITALS_MERGER_INTERVAL_MS", default_value_t = 250)]
    interval_ms: u64,
    /// Failures of one endpoint per interval sent on one by one, across the whole fleet.
    #[arg(long, env = "VITALS_MERGER_FAILURE_CAP", default_value_t = 8)]
    failure_cap: u32,
    /// Endpoints with an open summary at most (memory bound); beyond, records go on as they came.
    #[arg(long, env = "VITALS_MERGER_MAX_OPEN", default_value_t = 1_000_000)]
    max_open: usize,
    /// The gateway name merged summaries carry.
    #[arg(long, env = "VITALS_MERGER_GATEWAY", default_value = "vitals-merger")]
    gateway: String,
    /// Create the input topic if it is missing.
    #[arg(long, env = "VITALS_MERGER_CREATE_TOPIC", default_value_t = true, action = clap::ArgAction::Set)]
    create_topic: bool,
    /// Partitions of the input topic when the merger creates it: at most this many mergers
    /// share the work.
    #[arg(long, env = "VITALS_MERGER_INPUT_PARTITIONS", default_value_t = 32)]
    input_partitions: i32,
    #[arg(long, env = "VITALS_REPLICATION_FACTOR", default_value_t = 1)]
    replication_factor: i32,
    /// Liveness, readiness and metrics.
    #[arg(long, env = "VITALS_MERGER_HTTP", default_value = "127.0.0.1:9468")]
    http_addr: String,
}

impl Config {
    fn settings(&self) -> anyhow::Result<Settings> {
        self.kafka.check().map_err(anyhow::Error::msg)?;
        if self.input_topic == self.signals_topic {
            anyhow::bail!(
                "--input-topic and --signals-topic must differ (both {})",
                self.input_topic
            );
        }
        if self.dlq_topic == self.input_topic || self.dlq_topic == self.signals_topic {
            anyhow::bail!(
                "--dlq-topic {} must differ from the input and signals topics",
                self.dlq_topic
            );
        }
        if !(10..=10_000).contains(&self.interval_ms) {
            anyhow::bail!("--interval-ms {} is outside 10..=10000", self.interval_ms);
        }
        if self.max_open == 0 {
            anyhow::bail!("--max-open must be above 0");
        }
        let transactional_id = match &self.transactional_id {
            Some(t) if !t.trim().is_empty() => t.clone(),
            Some(_) => anyhow::bail!("--transactional-id must not be empty"),
            None => {
                let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
                    .or_else(|_| std::env::var("HOSTNAME"))
                    .unwrap_or_else(|_| "local".into());
                format!("vitals-merger-{}", host.trim())
            }
        };
        Ok(Settings {
            kafka: self.kafka.clone(),
            input: self.input_topic.clone(),
            output: self.signals_topic.clone(),
            dlq: self.dlq_topic.clone(),
            group: self.group.clone(),
            transactional_id,
            interval: Duration::from_millis(self.interval_ms),
            failure_cap: self.failure_cap,
            max_open: self.max_open,
            gateway: self.gateway.clone(),
        })
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    shell::init_tracing();
    let cfg = Config::parse();
    shell::run("vitals-merger", Duration::from_secs(10), |cancel| async move {
        let settings = cfg.settings()?;
        tracing::info!(?settings, "starting");
        if cfg.create_topic {
            anyhow::ensure!(cfg.input_partitions >= 1, "--input-partitions must be at least 1");
            vitals_merger::run::ensure_input_topic(
                &cfg.kafka,
                &cfg.input_topic,
                cfg.input_partitions,
                cfg.replication_factor,
            )
            .await?;
        }
        let (stop, ready, counters) = (
            Arc::new(AtomicBool::new(false)),
            Arc::new(AtomicBool::new(false)),
            Arc::new(Counters::default()),
        );
        let worker = {
            let (stop, ready, counters) = (stop.clone(), ready.clone(), counters.clone());
            std::thread::Builder::new()
                .name("merger".into())
                .spawn(move || loop {
                    // A fatal error (fenced after a stop longer than the transaction timeout, a
                    // broker that cannot be reached) starts the merger over in this process, as a
                    // restart would: a new producer with the same transactional id fences what
                    // is left of the old one, and the consumer takes its partitions back.
                    match run(&settings, &stop, &counters, &ready) {
                        Ok(()) => return Ok(()),
                        Err(e) if stop.load(Relaxed) => return Err(e),
                        Err(e) => {
                            ready.store(false, Relaxed);
                            counters.restarts.inc();
                            tracing::error!(error = %format!("{e:#}"), "the merger starts over in 1 s");
                            std::thread::sleep(Duration::from_secs(1));
                        }
                    }
                })
                .context("starting the merger thread")?
        };
        let app = {
            let (ready, counters) = (ready.clone(), counters.clone());
            vitals_runtime::probes::router(
                move || ready.load(Relaxed),
                "not ready: transactions not initialised, or the committed offsets of partitions taken over not readable yet (a dead peer's transaction holds them until it times out)",
            )
                .route(
                    "/metrics",
                    get(move || std::future::ready(vitals_runtime::metrics::response(counters.registry()))),
                )
        };
        let listener = tokio::net::TcpListener::bind(&cfg.http_addr)
            .await
            .with_context(|| format!("binding {}", cfg.http_addr))?;
        tracing::info!(addr = %listener.local_addr()?, "serving metrics");
        let server = tokio::spawn(async move {
            axum::serve(listener, app)
                .with_graceful_shutdown(async move { cancel.cancelled().await })
                .await
        });
        // The merger thread ends on a fatal error, or when the server has stopped (a signal).
        let worker = tokio::task::spawn_blocking(move || worker.join());
        tokio::pin!(worker);
        let ended = tokio::select! {
            w = &mut worker => Some(w),
            _ = server => None,
        };
        stop.store(true, Relaxed);
        let joined = match ended {
            Some(w) => w,
            None => worker.await,
        };
        match joined {
            Ok(Ok(r)) => r,
            Ok(Err(_)) => Err(anyhow::anyhow!("the merger thread panicked")),
            Err(e) => Err(e.into()),
        }
    })
    .await
}
