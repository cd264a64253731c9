//! The prober as a service: configuration, reload, sharing and the schedule, until cancelled.

use crate::config::{parse, Target};
use crate::metrics::Metrics;
use crate::probe::Clients;
use crate::schedule::{Context, Scheduler};
use crate::shard::Ownership;
use crate::sink::{KafkaSink, Sink};
use crate::view::CadenceView;
use anyhow::Context as _;
use clap::Parser;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use vitals_contracts::topics;
use vitals_runtime::args::KafkaArgs;

#[derive(Parser, Clone)]
#[command(
    name = "vitals-prober",
    about = "Active probes of upstream endpoints, published as ProbeResults"
)]
pub struct Config {
    /// The targets file (TOML): `[defaults]` and `[[target]]` tables. Reloaded on SIGHUP and
    /// when it changes; a file with an error is refused and the running targets stay.
    #[arg(long, env = "VITALS_PROBER_CONFIG")]
    pub config: PathBuf,
    /// This instance's name, in every result it publishes.
    #[arg(long, env = "VITALS_PROBER_NAME", default_value_t = hostname())]
    pub name: String,
    /// Where this instance probes from: instances of one location share the targets, each
    /// location probes every target.
    #[arg(long, env = "VITALS_PROBER_LOCATION", default_value = "local")]
    pub location: String,
    #[command(flatten)]
    pub kafka: KafkaArgs,
    #[arg(long, env = "VITALS_SIGNALS_TOPIC", default_value = topics::SIGNALS)]
    pub signals_topic: String,
    /// The compacted endpoint-state topic: the adaptive cadence follows it.
    #[arg(long, env = "VITALS_STATE_TOPIC", default_value = topics::HEALTH_STATE)]
    pub state_topic: String,
    /// The topic whose partitions are the shards (nothing is written to it).
    #[arg(long, env = "VITALS_PROBER_SHARD_TOPIC", default_value = "vitals.prober-shards.v1")]
    pub shard_topic: String,
    /// Shards when the shard topic is created (an existing topic keeps its count).
    #[arg(long, env = "VITALS_PROBER_SHARDS", default_value_t = 64)]
    pub shards: u32,
    /// Liveness, readiness, metrics and the heartbeat route.
    #[arg(long, env = "VITALS_PROBER_HTTP", default_value = "127.0.0.1:9465")]
    pub http_addr: SocketAddr,
    /// Tokens that may push heartbeats (the API's file format; a reporter bound with
    /// `;gateways=` to the endpoints and `;pools=` to the pools it may speak for), read again
    /// when the file changes. Without it heartbeats are taken only while --http-addr is a
    /// loopback address.
    #[arg(long, env = "VITALS_PROBER_TOKENS_FILE")]
    pub tokens_file: Option<std::path::PathBuf>,
    /// How often the targets file is looked at for changes.
    #[arg(long, env = "VITALS_PROBER_RELOAD_POLL_MS", default_value_t = 1000)]
    pub reload_poll_ms: u64,
    /// Follow the gateways' calls on the signals topic: healthy endpoints that carry traffic are
    /// probed at their traffic interval, and synthetic completions are skipped while real calls
    /// bring first-token times.
    #[arg(long, env = "VITALS_PROBER_FOLLOW_TRAFFIC", default_value_t = true, action = clap::ArgAction::Set)]
    pub follow_traffic: bool,
    /// Time for probes in flight to finish at shutdown.
    #[arg(long, env = "VITALS_PROBER_SHUTDOWN_GRACE_SECS", default_value_t = 10)]
    pub shutdown_grace_secs: u64,
}

fn hostname() -> String {
    std::fs::read_to_string("/etc/hostname")
        .ok()
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "prober".into())
}

impl Config {
    pub fn validate(&self) -> anyhow::Result<()> {
        self.kafka.check().map_err(anyhow::Error::msg)?;
        for (flag, v) in [("--name", &self.name), ("--location", &self.location)] {
            vitals_contracts::validate_name("name", v).map_err(|e| anyhow::anyhow!("{flag}: {}", e.message))?;
        }
        if !(1..=10_000).contains(&self.shards) {
            anyhow::bail!("--shards must be within 1..=10000");
        }
        Ok(())
    }
}

fn modified(path: &Path) -> Option<SystemTime> {
    std::fs::metadata(path).and_then(|m| m.modified()).ok()
}

/// Read and check the targets file.
pub fn load(path: &Path) -> anyhow::Result<Vec<Target>> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    parse(&text).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))
}

/// Reload the targets on SIGHUP and whenever the file changes; a bad file keeps the old set.
async fn watch_file(
    path: PathBuf,
    poll: Duration,
    tx: watch::Sender<Arc<Vec<Target>>>,
    metrics: Arc<Metrics>,
    cancel: CancellationToken,
) {
    let mut hup = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()) {
        Ok(s) => Some(s),
        Err(e) => {
            tracing::warn!(error = %e, "no SIGHUP handler; the file is still polled");
            None
        }
    };
    let mut seen = modified(&path);
    loop {
        let hangup = async {
            match hup.as_mut() {
                Some(h) => {
                    h.recv().await;
                }
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = hangup => {}
            _ = tokio::time::sleep(poll) => {
                let now = modified(&path);
                if now == seen {
                    continue;
                }
            }
        }
        seen = modified(&path);
        match load(&path) {
            Ok(targets) => {
                tracing::info!(targets = targets.len(), "targets reloaded");
                metrics.reloads.get_or_create(&vec![("result", "ok".to_owned())]).inc();
                tx.send_replace(Arc::new(targets));
            }
            Err(e) => {
                tracing::error!(error = %e, "targets file refused; the running targets stay");
                metrics
                    .reloads
                    .get_or_create(&vec![("result", "error".to_owned())])
                    .inc();
            }
        }
    }
}

/// Run until `cancel`: probe the owned targets, follow reloads and the shard group.
pub async fn run(cfg: Config, cancel: CancellationToken) -> anyhow::Result<()> {
    cfg.validate()?;
    let targets = load(&cfg.config)?;
    let prober = format!("{}/{}", cfg.location, cfg.name);
    tracing::info!(prober = %prober, targets = targets.len(), "starting vitals-prober");
    let metrics = Arc::new(Metrics::default());
    let view = Arc::new(CadenceView::default());
    let producer = vitals_runtime::kafka::producer(&cfg.kafka, &[("linger.ms", "5"), ("message.timeout.ms", "30000")])
        .create()
        .context("creating the Kafka producer")?;
    // Publishing into a topic that does not exist (auto-create off) looked like running: refuse.
    for topic in [&cfg.signals_topic, &cfg.state_topic] {
        let probe: rdkafka::consumer::BaseConsumer =
            vitals_runtime::kafka::consumer(&cfg.kafka, "vitals-prober-check", &[])
                .create()
                .context("creating a Kafka client")?;
        let t = topic.clone();
        let parts =
            tokio::task::spawn_blocking(move || vitals_runtime::kafka::partitions(&probe, &t, Duration::from_secs(10)))
                .await?;
        match parts {
            Ok(p) if !p.is_empty() => {}
            Ok(_) => anyhow::bail!("the topic {topic} does not exist: create it (the processor does, with --create-topics) or fix the topic flags"),
            Err(e) => anyhow::bail!("cannot read the topic {topic} from the broker: {e}"),
        }
    }
    let sink: Arc<dyn Sink> = Arc::new(KafkaSink {
        producer,
        topic: cfg.signals_topic.clone(),
        metrics: metrics.clone(),
    });
    let ctx = Arc::new(Context::new(
        prober.clone(),
        Clients::new()?,
        sink,
        view.clone(),
        metrics.clone(),
    ));

    let admin = vitals_runtime::kafka::config(&cfg.kafka, &[]);
    let shards = crate::shard::ensure_topic(&admin, &cfg.shard_topic, cfg.shards)
        .await
        .with_context(|| format!("the shard topic {}", cfg.shard_topic))?;
    let (own_tx, mut own_rx) = watch::channel(Ownership {
        shards,
        ..Ownership::default()
    });
    let group = format!("vitals-prober-{}", cfg.location);
    let stop_threads = CancellationToken::new();
    let shard_thread = crate::shard::follow(
        vitals_runtime::kafka::consumer(&cfg.kafka, &group, &[]),
        cfg.shard_topic.clone(),
        shards,
        own_tx,
        stop_threads.clone(),
    );
    let view_group = format!("vitals-prober-view-{}", cfg.name);
    let view_thread = crate::follow::follow(
        vitals_runtime::kafka::consumer(&cfg.kafka, &view_group, &[]),
        cfg.state_topic.clone(),
        view.clone(),
        metrics.clone(),
        stop_threads.clone(),
    );

    let traffic_thread = cfg.follow_traffic.then(|| {
        crate::follow::follow_traffic(
            vitals_runtime::kafka::consumer(&cfg.kafka, &view_group, &[]),
            cfg.signals_topic.clone(),
            view.clone(),
            stop_threads.clone(),
        )
    });
    let listener = tokio::net::TcpListener::bind(cfg.http_addr)
        .await
        .with_context(|| format!("binding {}", cfg.http_addr))?;
    tracing::info!(addr = %listener.local_addr()?, "health, metrics and heartbeats");
    let tokens = match &cfg.tokens_file {
        Some(path) => {
            let w = Arc::new(vitals_runtime::tokens::Watched::open(Some(path), &[]).map_err(anyhow::Error::msg)?);
            tokio::spawn(w.clone().watch(Duration::from_secs(2), cancel.clone()));
            Some(w)
        }
        None => None,
    };
    let app = crate::http::router(crate::http::Shared {
        ctx: ctx.clone(),
        metrics: metrics.clone(),
        ownership: own_rx.clone(),
        tokens,
        loopback: cfg.http_addr.ip().is_loopback(),
    });
    let http_cancel = cancel.clone();
    let http = tokio::spawn(async move {
        axum::serve(listener, app)
            .with_graceful_shutdown(async move { http_cancel.cancelled().await })
            .await
    });

    let (targets_tx, mut targets_rx) = watch::channel(Arc::new(targets));
    let reload = tokio::spawn(watch_file(
        cfg.config.clone(),
        Duration::from_millis(cfg.reload_poll_ms),
        targets_tx,
        metrics.clone(),
        cancel.clone(),
    ));

    let mut scheduler = Scheduler::new(ctx.clone());
    loop {
        {
            let own = own_rx.borrow_and_update().clone();
            let targets = targets_rx.borrow_and_update().clone();
            scheduler.reconcile(&targets, |t| own.owns(t));
        }
        tokio::select! {
            _ = cancel.cancelled() => break,
            r = own_rx.changed() => if r.is_err() { break },
            r = targets_rx.changed() => if r.is_err() { break },
        }
    }
    tracing::info!("stopping: letting probes in flight finish");
    let grace = Duration::from_secs(cfg.shutdown_grace_secs);
    if tokio::time::timeout(grace, scheduler.stop()).await.is_err() {
        tracing::warn!("probes still in flight after the grace period");
    }
    stop_threads.cancel();
    let _ = tokio::task::spawn_blocking(move || {
        let _ = shard_thread.join();
        let _ = view_thread.join();
        if let Some(t) = traffic_thread {
            let _ = t.join();
        }
    })
    .await;
    reload.abort();
    let _ = http.await;
    // Deliver what is queued.
    let sink = ctx.sink.clone();
    let _ = tokio::task::spawn_blocking(move || sink.flush(Duration::from_secs(5))).await;
    Ok(())
}
