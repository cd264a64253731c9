//! `vitals-otlp`: an OpenTelemetry trace receiver that makes any gateway or client emitting OTLP
//! a vitals producer with no plug-in. The upstream calls among the spans (the table in
//! `vitals_spans::map`) become call reports, sent through the reporter (summaries, idempotent
//! Kafka producer keyed by pool).
//!
//! - [`receiver`]: one export request → reports, with back-pressure and counters.
//! - [`serve`]: OTLP/HTTP (`POST /v1/traces`) and OTLP/gRPC (`TraceService/Export`) on one router.
//! - [`rpc`]: the `google.rpc.Status` and `RetryInfo` messages OTLP answers with.
//! - [`trust`]: who sent a request (its bearer token), what it may report for, its budget.
//! - [`listen`]: the accept loop: TLS, a connection cap and read timeouts.

pub mod listen;
pub mod receiver;
pub mod rpc;
pub mod serve;
pub mod trust;

use anyhow::Context as _;
use clap::Parser;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use vitals_runtime::args::KafkaArgs;
use vitals_spans::decode::Limits;
use vitals_spans::Map;

#[derive(Parser, Debug, Clone)]
#[command(
    name = "vitals-otlp",
    about = "Receives OpenTelemetry traces (OTLP over HTTP and gRPC) and reports the upstream calls among their spans to vitals"
)]
pub struct Config {
    /// OTLP/HTTP (and /metrics, /healthz, /readyz): the collector's port is 4318.
    #[arg(long, env = "VITALS_OTLP_HTTP", default_value = "127.0.0.1:4318")]
    pub http_addr: String,
    /// OTLP/gRPC: the collector's port is 4317. The same router serves both; empty: none.
    #[arg(long, env = "VITALS_OTLP_GRPC", default_value = "127.0.0.1:4317")]
    pub grpc_addr: String,
    /// Serve /metrics (and /healthz, /readyz) here too, to anyone who reaches it: a port for
    /// Prometheus that the exporters do not reach. On the OTLP ports /metrics needs a token
    /// that may read, when requests are authenticated. Empty: none.
    #[arg(long, env = "VITALS_OTLP_METRICS_ADDR", default_value = "")]
    pub metrics_addr: String,
    /// The span → call table (TOML; see deploy/otlp/map.toml). Default: HTTP client spans and
    /// gateway spans naming their upstream.
    #[arg(long, env = "VITALS_OTLP_MAP")]
    pub map: Option<PathBuf>,
    /// A request body's bytes, after decompression, at most.
    #[arg(long, env = "VITALS_OTLP_MAX_BODY_BYTES", default_value_t = 8 << 20)]
    pub max_body_bytes: usize,
    /// Span ids remembered so that a retried export is reported once (for two minutes, at most
    /// this many: 16 bytes each); 0: none.
    #[arg(long, env = "VITALS_OTLP_REMEMBER_SPANS", default_value_t = 262_144)]
    pub remember_spans: usize,
    /// Spans in one request, at most (counted before decoding).
    #[arg(long, env = "VITALS_OTLP_MAX_SPANS", default_value_t = 50_000)]
    pub max_spans: usize,
    /// JSON objects in one OTLP/JSON request, at most (counted before parsing).
    #[arg(long, env = "VITALS_OTLP_MAX_JSON_OBJECTS", default_value_t = 1_000_000)]
    pub max_json_objects: usize,
    /// Requests decoded at once (each on a blocking thread); the rest wait.
    #[arg(long, env = "VITALS_OTLP_DECODERS", default_value_t = 2)]
    pub decoders: usize,
    /// Call reports waiting to be sent; beyond, the reports of a request are dropped and
    /// counted. Requests are refused (429, RESOURCE_EXHAUSTED with a RetryInfo) once it is
    /// three quarters full, so that senders hold their spans and send again.
    #[arg(long, env = "VITALS_OTLP_QUEUE", default_value_t = 65_536)]
    pub queue: usize,
    /// What a busy answer tells the client to wait, in seconds.
    #[arg(long, env = "VITALS_OTLP_RETRY_AFTER_SECS", default_value_t = 1)]
    pub retry_after_secs: u64,
    /// Calls are summed per endpoint over this many milliseconds (failures still go one by one,
    /// up to 8 an interval); 0 sends one record per call.
    #[arg(long, env = "VITALS_OTLP_SUMMARIZE_MS", default_value_t = 250)]
    pub summarize_ms: u64,
    /// Tokens that may report (`name:role:secret`, role reporter, writer or admin; a reporter
    /// bound to what it may speak for: `name:reporter;gateways=edge-eu-*;pools=chat:secret`),
    /// repeatable or comma-separated. Prefer --tokens-file: a flag shows in `ps`.
    #[arg(long = "token", env = "VITALS_OTLP_TOKENS", value_delimiter = ',')]
    pub tokens: Vec<String>,
    /// A file of tokens in the API's format (one a line; `#` comments), read again whenever it
    /// changes: a token is added or revoked without a restart.
    #[arg(long, env = "VITALS_OTLP_TOKENS_FILE")]
    pub tokens_file: Option<PathBuf>,
    /// Take exports without a token (every request is the reporter `anonymous`): for
    /// development on one machine; refused unless both ports listen on loopback addresses.
    #[arg(long, env = "VITALS_OTLP_NO_AUTH", default_value_t = false, action = clap::ArgAction::Set)]
    pub no_auth: bool,
    /// Spans a second one reporter (token) may send, on average (two seconds' worth at once);
    /// beyond, its requests are answered 429 / RESOURCE_EXHAUSTED with when to send again. A
    /// collector forwarding a fleet's spans under one token needs its fleet's rate.
    #[arg(long, env = "VITALS_OTLP_REPORTER_SPANS_PER_SEC", default_value_t = 100_000)]
    pub reporter_spans_per_sec: u64,
    /// Distinct (pool, endpoint) pairs one reporter may report in a minute; a request that
    /// would go beyond is refused whole (429) until the minute ends.
    #[arg(long, env = "VITALS_OTLP_REPORTER_ENDPOINTS_PER_MIN", default_value_t = 2_000)]
    pub reporter_endpoints_per_min: usize,
    #[command(flatten)]
    pub listen: listen::ListenArgs,
    #[command(flatten)]
    pub kafka: KafkaArgs,
    #[arg(long, env = "VITALS_SIGNALS_TOPIC", default_value = vitals_contracts::topics::SIGNALS)]
    pub signals_topic: String,
    /// Report to a merge stage on this topic, keyed by endpoint, instead of to the signals
    /// topic: for a fleet where every replica calls every endpoint (docs/fleet.md).
    #[arg(long, env = "VITALS_MERGER_TOPIC")]
    pub merger_topic: Option<String>,
}

/// Serve until `cancel`; then flush the reports.
pub async fn run(cfg: Config, cancel: CancellationToken) -> anyhow::Result<()> {
    cfg.kafka.check().map_err(anyhow::Error::msg)?;
    anyhow::ensure!(cfg.queue >= 4, "--queue must be at least 4");
    anyhow::ensure!(
        cfg.reporter_spans_per_sec >= 1 && cfg.reporter_endpoints_per_min >= 1,
        "--reporter-spans-per-sec and --reporter-endpoints-per-min must be at least 1"
    );
    let tokens = cfg.authentication()?;
    let tls = cfg.listen.tls()?;
    let map = match &cfg.map {
        Some(p) => {
            let text = std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?;
            Map::parse(&text).map_err(|e| anyhow::anyhow!("{}: {e}", p.display()))?
        }
        None => Map::default(),
    };
    let mut rc = vitals_reporter::Config::new(cfg.kafka.brokers.clone());
    rc.topic = cfg.signals_topic.clone();
    rc.queue_capacity = cfg.queue;
    rc.summarize = vitals_reporter::summaries_every_ms(cfg.summarize_ms);
    if let Some(topic) = &cfg.merger_topic {
        rc.topic = topic.clone();
        rc.keyed_by_endpoint = true;
    }
    rc.kafka_options = cfg.kafka.pairs().map(|(k, v)| (k.to_owned(), v.to_owned())).collect();
    let reporter = Arc::new(vitals_reporter::Reporter::new(rc)?);
    let limits = Limits {
        max_body: cfg.max_body_bytes,
        max_spans: cfg.max_spans,
        max_json_objects: cfg.max_json_objects,
    };
    let mut receiver = receiver::Receiver::new(
        map,
        limits,
        reporter.clone(),
        (cfg.queue as u64) * 3 / 4,
        cfg.decoders,
        cfg.retry_after_secs,
        trust::Budgets::new(trust::Quota {
            spans_per_sec: cfg.reporter_spans_per_sec,
            endpoints_per_min: cfg.reporter_endpoints_per_min,
        }),
    );
    receiver.body_timeout = Duration::from_millis(cfg.listen.body_read_timeout_ms.max(1));
    receiver.recent = std::sync::Mutex::new(receiver::remembered_spans(cfg.remember_spans));
    if let Some(tokens) = tokens {
        tokio::spawn(tokens.clone().watch(Duration::from_secs(2), cancel.clone()));
        receiver = receiver.with_auth(tokens);
    }
    let receiver = Arc::new(receiver);
    let app = serve::router(receiver.clone());
    // A descriptor per connection: at systemd's default soft limit of 1,024, 1,100 idle clients
    // made good exports time out ("Too many open files").
    let open_files = vitals_runtime::shell::open_file_limit();
    tracing::info!(open_files, "open-file limit");
    let max_connections = cfg.listen.fit_connections(open_files)?;
    let limits = cfg.listen.limits(max_connections);
    let mut servers = Vec::new();
    for (what, addr) in [("OTLP/HTTP", &cfg.http_addr), ("OTLP/gRPC", &cfg.grpc_addr)] {
        if addr.is_empty() {
            continue;
        }
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .with_context(|| format!("binding {addr} ({what})"))?;
        tracing::info!(addr = %listener.local_addr()?, tls = tls.is_some(), "serving {what}");
        servers.push(tokio::spawn(listen::serve(
            listener,
            app.clone(),
            tls.clone(),
            limits.clone(),
            cancel.clone(),
        )));
    }
    if !cfg.metrics_addr.is_empty() {
        let listener = tokio::net::TcpListener::bind(&cfg.metrics_addr)
            .await
            .with_context(|| format!("binding {} (metrics)", cfg.metrics_addr))?;
        tracing::info!(addr = %listener.local_addr()?, "serving metrics");
        servers.push(tokio::spawn(listen::serve(
            listener,
            serve::metrics_router(receiver),
            None,
            limits.clone(),
            cancel.clone(),
        )));
    }
    for s in servers {
        s.await?;
    }
    let r = reporter.clone();
    let flushed = tokio::task::spawn_blocking(move || r.flush(Duration::from_secs(5))).await?;
    let c = reporter.counters();
    tracing::info!(flushed, reported = c.reported, delivered = c.delivered, "stopped");
    Ok(())
}

impl Config {
    /// The tokens requests must carry, or `None` with `--no-auth` (loopback only); an error
    /// that says what to do when neither is given.
    pub fn authentication(&self) -> anyhow::Result<Option<Arc<vitals_runtime::tokens::Watched>>> {
        if self.no_auth {
            anyhow::ensure!(
                self.tokens.is_empty() && self.tokens_file.is_none(),
                "--no-auth with tokens: give one or the other"
            );
            for addr in [&self.http_addr, &self.grpc_addr] {
                if addr.is_empty() {
                    continue;
                }
                let loopback = addr
                    .parse::<std::net::SocketAddr>()
                    .map(|a| a.ip().is_loopback())
                    .unwrap_or_else(|_| addr.starts_with("localhost:"));
                anyhow::ensure!(
                    loopback,
                    "--no-auth takes exports from anyone who reaches {addr}: it is only for loopback addresses \
                     (127.0.0.1, ::1); give --tokens-file instead"
                );
            }
            tracing::warn!("--no-auth: exports are taken without a token (loopback only)");
            return Ok(None);
        }
        let w = vitals_runtime::tokens::Watched::open(self.tokens_file.as_deref(), &self.tokens)
            .map_err(anyhow::Error::msg)?;
        anyhow::ensure!(
            w.get().iter().any(|t| t.role.may(vitals_runtime::tokens::Need::Report)),
            "no token may report: give --tokens-file (a line `name:reporter:secret`, the API's format), \
             or --no-auth for development on loopback"
        );
        Ok(Some(Arc::new(w)))
    }
}
