//! The vitals stream processor as a library: `run(config)` until the cancellation token fires.
//! The binary in `main.rs` adds signal handling and logging.

pub mod config;
pub mod consumer;
pub mod http;
pub mod kafka;
pub mod lanes;
pub mod metrics;
pub mod progress;
pub mod receiver;
pub mod relay;
pub mod ticker;
pub mod writer;

use anyhow::Context;
use config::Config;
use rdkafka::producer::FutureProducer;
use std::sync::Arc;
use std::time::Duration;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

/// Start everything and run until `cancel` fires or a task fails (which cancels the rest).
pub async fn run(cfg: Config, cancel: CancellationToken) -> anyhow::Result<()> {
    cfg.validate()?;
    tracing::info!(config = ?cfg, "starting vitals-processor");
    if cfg.create_topics {
        kafka::ensure_topics(&cfg).await.context("creating topics")?;
    }
    kafka::check_stamp(&cfg).await?;
    // Each lane's writer holds a connection while it writes and its rebalance callback one while
    // it restores; the relay, the progress monitor and /readyz share the rest.
    let connections = 6 + 2 * cfg.lanes as u32;
    let pool = vitals_store::connect_owner(&cfg.db.database_url, &cfg.db.db_schema, connections)
        .await
        .with_context(|| format!("connecting to {}", cfg.db.shown()))?;
    let metrics = Arc::new(metrics::Metrics::default());
    let wake = Arc::new(tokio::sync::Notify::new());
    let producer: FutureProducer = kafka::producer_config(&cfg)
        .create()
        .context("creating the Kafka producer")?;
    let retention = vitals_store::months::Retention {
        days: cfg.audit_retention_days,
    };
    let database = vitals_store::audit::AuditLog {
        pool: pool.clone(),
        group: cfg.group.clone(),
        topic: cfg.topics.signals_topic.clone(),
        months: vitals_store::months::Months::new(retention),
    };
    let ready = Arc::new(lanes::Readiness::new(cfg.lanes));
    let restore = Arc::new(receiver::RestoreStatus::default());
    let progress = Arc::new(progress::Progress::new(Duration::from_secs(cfg.stall_after_secs)));

    let listener = tokio::net::TcpListener::bind(cfg.http_addr)
        .await
        .with_context(|| format!("binding {}", cfg.http_addr))?;
    tracing::info!(addr = %listener.local_addr()?, "health and metrics endpoint");
    let app = http::router(http::Health {
        metrics: metrics.clone(),
        pool: pool.clone(),
        ready: ready.clone(),
        progress: progress.clone(),
        restore: restore.clone(),
    });

    let mut tasks = JoinSet::new();
    {
        let cancel = cancel.clone();
        tasks.spawn(async move {
            axum::serve(listener, app)
                .with_graceful_shutdown(cancel.cancelled_owned())
                .await
                .context("http server")
        });
    }
    {
        let relay = relay::Relay {
            pool: pool.clone(),
            producer: producer.clone(),
            batch: cfg.relay_batch,
            metrics: metrics.clone(),
            wake: wake.clone(),
            cancel: cancel.clone(),
            retention,
            retention_every: Duration::from_secs(cfg.audit_retention_every_secs),
            holder: format!(
                "processor-{}-{}",
                std::process::id(),
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map(|d| d.as_micros())
                    .unwrap_or(0)
            ),
        };
        tasks.spawn(async move {
            relay.run().await;
            Ok(())
        });
    }
    if cfg.tick_interval_ms > 0 {
        let name = format!("processor-{}", std::process::id());
        let every = Duration::from_millis(cfg.tick_interval_ms);
        let fut = ticker::run(
            producer.clone(),
            cfg.topics.signals_topic.clone(),
            every,
            name,
            || true,
            cancel.clone(),
        );
        tasks.spawn(async move {
            fut.await;
            Ok(())
        });
    }
    if cfg.view_tick_interval_ms > 0 {
        let name = format!("processor-{}", std::process::id());
        let every = Duration::from_millis(cfg.view_tick_interval_ms);
        let (ready, progress) = (ready.clone(), progress.clone());
        let alive = move || ready.all() && progress.stalled().is_empty();
        let fut = ticker::run(
            producer.clone(),
            cfg.topics.changes_topic.clone(),
            every,
            name,
            alive,
            cancel.clone(),
        );
        tasks.spawn(async move {
            fut.await;
            Ok(())
        });
    }
    {
        let client = kafka::base_config(&cfg)
            .create()
            .context("creating the watermark client")?;
        let offsets = progress::GroupOffsets {
            pool: pool.clone(),
            group: cfg.group.clone(),
        };
        let fut = progress::monitor(
            progress.clone(),
            client,
            cfg.topics.signals_topic.clone(),
            offsets,
            cancel.clone(),
        );
        tasks.spawn(async move {
            fut.await;
            Ok(())
        });
    }
    for lane in 0..cfg.lanes {
        let processor = consumer::Processor::new(
            lane,
            cfg.clone(),
            database.clone(),
            metrics.clone(),
            wake.clone(),
            cancel.clone(),
            ready.clone(),
            progress.clone(),
            restore.clone(),
        )
        .with_context(|| format!("creating the Kafka consumer of lane {lane}"))?;
        let span = tracing::info_span!("lane", lane);
        tasks.spawn(
            async move { processor.run().await.with_context(|| format!("processor lane {lane}")) }.instrument(span),
        );
    }

    let mut result = Ok(());
    while let Some(joined) = tasks.join_next().await {
        let r = joined.map_err(anyhow::Error::from).and_then(|r| r);
        if let Err(e) = r {
            tracing::error!(error = %format!("{e:#}"), "task failed; shutting down");
            cancel.cancel();
            if result.is_ok() {
                result = Err(e);
            }
        } else if !cancel.is_cancelled() {
            // A task ended on its own: nothing should, so stop the rest too.
            cancel.cancel();
        }
    }
    result
}
