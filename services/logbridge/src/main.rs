use anyhow::Context as _;
use axum::routing::get;
use axum::Router;
use clap::Parser;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use vitals_gateways::map::Map;
use vitals_logbridge::bridge::Bridge;
use vitals_logbridge::inputs::{self, Input, SocketOptions};
use vitals_runtime::args::KafkaArgs;
use vitals_runtime::shell;

#[derive(Parser)]
#[command(
    name = "vitals-logbridge",
    about = "Turns HAProxy and nginx access logs into vitals CallOutcomes"
)]
struct Config {
    /// Syslog over UDP: an address to listen on (repeatable or comma-separated).
    #[arg(long, env = "VITALS_LOGBRIDGE_UDP", value_delimiter = ',')]
    udp: Vec<String>,
    /// Senders the UDP inputs take datagrams from: networks (`10.0.0.0/8`) or addresses,
    /// repeatable or comma-separated; without, loopback only (`0.0.0.0/0,::/0`: anyone). Others
    /// are dropped unread and counted (`vitals_logbridge_refused_total`).
    #[arg(long, env = "VITALS_LOGBRIDGE_UDP_ALLOW_FROM", value_delimiter = ',')]
    udp_allow_from: Vec<String>,
    /// Syslog over a Unix datagram socket: a path the bridge creates (repeatable).
    #[arg(long, env = "VITALS_LOGBRIDGE_UNIX", value_delimiter = ',')]
    unix: Vec<PathBuf>,
    /// A log file to follow like `tail -F` (repeatable).
    #[arg(long, env = "VITALS_LOGBRIDGE_FILE", value_delimiter = ',')]
    file: Vec<PathBuf>,
    /// Read followed files from their start (default: from their end).
    #[arg(long, env = "VITALS_LOGBRIDGE_FROM_START")]
    from_start: bool,
    /// A rotated file is read until it has been quiet this long after the new one appeared (the
    /// gateway writes to it until it reopens its log), then the new one.
    #[arg(long, env = "VITALS_LOGBRIDGE_ROTATED_QUIET_MS", default_value_t = 2000)]
    rotated_quiet_ms: u64,
    /// Mode of the Unix sockets the bridge creates (octal), so that the gateway's user can write.
    #[arg(long, env = "VITALS_LOGBRIDGE_UNIX_MODE", default_value = "660", value_parser = octal)]
    unix_mode: u32,
    /// Receive buffer asked of the kernel per socket, in bytes (capped by net.core.rmem_max):
    /// it absorbs bursts; beyond it the kernel drops datagrams (counted).
    #[arg(long, env = "VITALS_LOGBRIDGE_RECV_BUFFER_BYTES", default_value_t = 4 << 20)]
    recv_buffer_bytes: usize,
    /// The backend → pool, server → endpoint table (TOML; see deploy/haproxy/map.toml).
    #[arg(long, env = "VITALS_LOGBRIDGE_MAP")]
    map: Option<PathBuf>,
    /// The gateway name on reports when neither the map nor the syslog header gives one.
    #[arg(long, env = "VITALS_LOGBRIDGE_GATEWAY", default_value = "logbridge")]
    gateway: String,
    /// Lines (datagrams) longer than this many bytes are counted and dropped.
    #[arg(long, env = "VITALS_LOGBRIDGE_MAX_LINE_BYTES", default_value_t = 16_384)]
    max_line_bytes: usize,
    /// Bad lines written to the log per minute, at most (the rest are only counted).
    #[arg(long, env = "VITALS_LOGBRIDGE_BAD_LINES_LOGGED_PER_MIN", default_value_t = 10)]
    bad_lines_logged_per_min: u32,
    #[command(flatten)]
    kafka: KafkaArgs,
    #[arg(long, env = "VITALS_SIGNALS_TOPIC", default_value = vitals_contracts::topics::SIGNALS)]
    signals_topic: String,
    /// Report over the API's HTTP ingest at this URL instead of Kafka.
    #[arg(long, env = "VITALS_LOGBRIDGE_INGEST_URL")]
    ingest_url: Option<String>,
    /// A writer token for HTTP ingest.
    #[arg(long, env = "VITALS_LOGBRIDGE_INGEST_TOKEN")]
    ingest_token: Option<String>,
    /// Reports waiting to be sent; beyond, dropped and counted.
    #[arg(long, env = "VITALS_LOGBRIDGE_QUEUE", default_value_t = 65_536)]
    queue: usize,
    /// Liveness, readiness and metrics.
    #[arg(long, env = "VITALS_LOGBRIDGE_HTTP", default_value = "127.0.0.1:9466")]
    http_addr: String,
    /// Calls are summed per endpoint over this many milliseconds (failures still go one by
    /// one, up to 8 an interval); 0 sends one record per call.
    #[arg(long, env = "VITALS_LOGBRIDGE_SUMMARIZE_MS", default_value_t = 250)]
    summarize_ms: u64,
    /// Report to a merge stage on this topic (vitals.gateway-signals.v1), keyed by endpoint,
    /// instead of to the signals topic: for a fleet where every replica calls every endpoint
    /// (docs/fleet.md).
    #[arg(long, env = "VITALS_MERGER_TOPIC")]
    merger_topic: Option<String>,
}

fn octal(s: &str) -> Result<u32, String> {
    u32::from_str_radix(s.trim_start_matches("0o"), 8)
        .ok()
        .filter(|m| *m <= 0o777)
        .ok_or_else(|| format!("{s:?} is not a file mode in octal (e.g. 660)"))
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    shell::init_tracing();
    let cfg = Config::parse();
    shell::run("vitals-logbridge", Duration::from_secs(10), |cancel| async move {
        cfg.kafka.check().map_err(anyhow::Error::msg)?;
        let inputs: Vec<Input> = cfg
            .udp
            .iter()
            .cloned()
            .map(Input::Udp)
            .chain(cfg.unix.iter().cloned().map(Input::Unix))
            .chain(cfg.file.iter().cloned().map(Input::File))
            .collect();
        if inputs.is_empty() {
            anyhow::bail!("no input: give at least one --udp, --unix or --file");
        }
        let map = match &cfg.map {
            Some(p) => {
                let text = std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?;
                Map::parse(&text).map_err(|e| anyhow::anyhow!("{}: {e}", p.display()))?
            }
            None => Map::default(),
        };
        let mut rc = match &cfg.ingest_url {
            Some(url) => vitals_reporter::Config::http(url.clone(), cfg.ingest_token.clone()),
            None => vitals_reporter::Config::new(cfg.kafka.brokers.clone()),
        };
        rc.topic = cfg.signals_topic.clone();
        rc.queue_capacity = cfg.queue;
        rc.summarize = vitals_reporter::summaries_every_ms(cfg.summarize_ms);
        if let Some(topic) = &cfg.merger_topic {
            anyhow::ensure!(
                cfg.ingest_url.is_none(),
                "--merger-topic and --ingest-url cannot go together"
            );
            rc.topic = topic.clone();
            rc.keyed_by_endpoint = true;
        }
        rc.kafka_options = cfg.kafka.pairs().map(|(k, v)| (k.to_owned(), v.to_owned())).collect();
        let reporter = Arc::new(vitals_reporter::Reporter::new(rc)?);
        let bridge = Arc::new(Bridge::new(
            map,
            cfg.gateway.clone(),
            cfg.max_line_bytes,
            cfg.bad_lines_logged_per_min,
            reporter.clone(),
        ));
        let stop = Arc::new(AtomicBool::new(false));
        let opts = SocketOptions {
            unix_mode: cfg.unix_mode,
            from_start: cfg.from_start,
            recv_buffer: cfg.recv_buffer_bytes,
            rotated_quiet: Duration::from_millis(cfg.rotated_quiet_ms),
        };
        let senders = inputs::Senders::parse(&cfg.udp_allow_from)?;
        let mut running = Vec::new();
        for i in &inputs {
            running.push(inputs::start(i, bridge.clone(), stop.clone(), opts, senders.clone())?);
            tracing::info!(input = %i.name(), "reading");
        }
        let running = Arc::new(running);
        let metrics = {
            let (bridge, reporter, running) = (bridge.clone(), reporter.clone(), running.clone());
            move || {
                let named: Vec<_> = running.iter().map(|r| (r.name.clone(), r.counters.clone())).collect();
                for r in running.iter() {
                    r.refresh_drops();
                }
                bridge.prometheus(&named) + &reporter.counters().prometheus()
            }
        };
        let app = Router::new()
            .route("/healthz", get(|| async { "ok" }))
            .route("/readyz", get(|| async { "ready" }))
            .route("/metrics", get(move || std::future::ready(metrics())));
        let listener = tokio::net::TcpListener::bind(&cfg.http_addr)
            .await
            .with_context(|| format!("binding {}", cfg.http_addr))?;
        tracing::info!(addr = %listener.local_addr()?, "serving metrics");
        axum::serve(listener, app)
            .with_graceful_shutdown(async move { cancel.cancelled().await })
            .await?;
        stop.store(true, Ordering::Relaxed);
        let r = reporter.clone();
        let flushed = tokio::task::spawn_blocking(move || {
            if let Ok(running) = Arc::try_unwrap(running) {
                for i in running {
                    let _ = i.thread.join();
                }
            }
            r.flush(Duration::from_secs(5))
        })
        .await?;
        let c = reporter.counters();
        tracing::info!(flushed, reported = c.reported, delivered = c.delivered, "stopped");
        Ok(())
    })
    .await
}
