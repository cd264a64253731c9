//! API test harness: the API (and, where a test needs it, the processor) run in-process against
//! the real broker and the real database, each test with its own topics and schema.
#![allow(dead_code)]

pub use clap::Parser;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::ClientConfig;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::PgPool;
use std::future::Future;
pub use std::str::FromStr;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

pub const ADMIN: &str = "admin-secret-0000000001";
pub const WRITER: &str = "writer-secret-000000001";
pub const READER: &str = "reader-secret-000000001";

pub fn brokers() -> String {
    std::env::var("VITALS_TEST_KAFKA").unwrap_or_else(|_| "127.0.0.1:9092".into())
}

/// The read-only role the API runs as (created by scripts/stack.sh).
pub fn reader_url() -> String {
    std::env::var("VITALS_TEST_READER_DATABASE_URL")
        .unwrap_or_else(|_| "postgres://vitals_reader:vitals_reader@127.0.0.1:5432/vitals".into())
}

pub fn database_url() -> String {
    std::env::var("VITALS_TEST_DATABASE_URL")
        .unwrap_or_else(|_| "postgres://vitals:vitals@127.0.0.1:5432/vitals".into())
}

pub fn unique(name: &str) -> String {
    static N: AtomicU32 = AtomicU32::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    format!(
        "a_{name}_{}_{}_{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed),
        nanos % 100_000
    )
}

pub async fn wait_until<F, Fut>(what: &str, deadline: Duration, mut cond: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let end = Instant::now() + deadline;
    while !cond().await {
        assert!(Instant::now() < end, "timed out after {deadline:?} waiting for {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

pub struct Api {
    pub name: String,
    pub base: String,
    pub port: u16,
    pub db: PgPool,
    pub http: reqwest::Client,
    pub cancel: CancellationToken,
    pub signals: String,
    pub changes: String,
}

impl Api {
    /// Start the API on a fresh schema and topics; `extra` flags are appended.
    pub async fn start(name: &str, extra: &[&str]) -> Api {
        let name = unique(name);
        let (signals, changes) = (format!("{name}.signals"), format!("{name}.changes"));
        let (state, dlq) = (format!("{name}.state"), format!("{name}.dlq"));
        let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
            .set("bootstrap.servers", brokers())
            .create()
            .unwrap();
        let topics = [
            NewTopic::new(&signals, 2, TopicReplication::Fixed(1)),
            NewTopic::new(&changes, 2, TopicReplication::Fixed(1)),
            NewTopic::new(&state, 2, TopicReplication::Fixed(1)),
            NewTopic::new(&dlq, 1, TopicReplication::Fixed(1)),
        ];
        for r in admin.create_topics(&topics, &AdminOptions::new()).await.unwrap() {
            r.unwrap();
        }
        let mut args: Vec<String> = [
            "vitals-api",
            "--http-addr",
            "127.0.0.1:0",
            "--db-schema",
            &name,
            "--signals-topic",
            &signals,
            "--changes-topic",
            &changes,
            "--token",
            &format!("ops:admin:{ADMIN}"),
            "--token",
            &format!("gw:writer:{WRITER}"),
            "--token",
            &format!("viewer:reader:{READER}"),
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        // The processor owns the schema (it creates and migrates it); the API reads it with the
        // read-only role.
        vitals_processor::db::connect(&database_url(), &name)
            .await
            .expect("schema migrated by the owner role");
        args.extend(["--brokers".into(), brokers(), "--database-url".into(), reader_url()]);
        args.extend(extra.iter().map(|s| s.to_string()));
        let cfg = vitals_api::config::Config::parse_from(args);
        let cancel = CancellationToken::new();
        let app = vitals_api::build(cfg, cancel.clone()).await.expect("api starts");
        let port = app.port();
        tokio::spawn(app.run());
        let opts = PgConnectOptions::from_str(&database_url())
            .unwrap()
            .options([("search_path", name.as_str())]);
        let db = PgPoolOptions::new()
            .max_connections(3)
            .connect_with(opts)
            .await
            .unwrap();
        Api {
            base: format!("http://127.0.0.1:{port}"),
            port,
            db,
            http: reqwest::Client::new(),
            cancel,
            signals,
            changes,
            name,
        }
    }

    /// Run the processor in-process on this API's topics and schema.
    pub fn start_processor(&self) {
        let n = &self.name;
        let cfg = vitals_processor::config::Config::parse_from([
            "vitals-processor".to_string(),
            "--brokers".into(),
            brokers(),
            "--database-url".into(),
            database_url(),
            "--db-schema".into(),
            n.clone(),
            "--group".into(),
            n.clone(),
            "--signals-topic".into(),
            self.signals.clone(),
            "--changes-topic".into(),
            self.changes.clone(),
            "--state-topic".into(),
            format!("{n}.state"),
            "--dlq-topic".into(),
            format!("{n}.dlq"),
            "--create-topics".into(),
            "false".into(),
            "--http-addr".into(),
            "127.0.0.1:0".into(),
            "--tick-interval-ms".into(),
            "0".into(),
        ]);
        let cancel = self.cancel.clone();
        tokio::spawn(async move {
            if let Err(e) = vitals_processor::run(cfg, cancel).await {
                eprintln!("processor failed: {e:#}");
            }
        });
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{}", self.base, path)
    }

    pub async fn get(&self, path: &str) -> (u16, serde_json::Value) {
        let r = self.http.get(self.url(path)).send().await.unwrap();
        let status = r.status().as_u16();
        (status, r.json().await.unwrap_or(serde_json::Value::Null))
    }

    pub async fn send(
        &self,
        method: reqwest::Method,
        path: &str,
        token: Option<&str>,
        body: String,
    ) -> (u16, serde_json::Value) {
        let mut req = self
            .http
            .request(method, self.url(path))
            .header("content-type", "application/json")
            .body(body);
        if let Some(t) = token {
            req = req.bearer_auth(t);
        }
        let r = req.send().await.unwrap();
        let status = r.status().as_u16();
        (status, r.json().await.unwrap_or(serde_json::Value::Null))
    }

    pub async fn drop_schema(&self) {
        self.cancel.cancel();
        let _ = sqlx::query(&format!("DROP SCHEMA IF EXISTS \"{}\" CASCADE", self.name))
            .execute(&self.db)
            .await;
    }
}

pub fn producer() -> FutureProducer {
    ClientConfig::new()
        .set("bootstrap.servers", brokers())
        .create()
        .unwrap()
}

pub async fn produce(p: &FutureProducer, topic: &str, key: &str, bytes: &[u8]) {
    p.send(FutureRecord::to(topic).key(key).payload(bytes), Duration::from_secs(10))
        .await
        .map_err(|(e, _)| e)
        .unwrap();
}

/// Insert a transition row directly, as the processor would.
pub async fn insert_transition(
    db: &PgPool,
    pool: &str,
    endpoint: &str,
    seq: i64,
    to: &str,
    reason_code: &str,
    t_us: i64,
) {
    let evidence = serde_json::json!({
        "window_ms": 30000, "success": 3, "timeout": 5, "connect_error": 0, "connection_dropped": 0,
        "rate_limited": 0, "server_error": 0, "client_error": 0, "invalid_response": 0, "cancelled": 0,
        "failure_rate": 0.625, "score": 40.0, "ttft_p50_ms": 250.0, "ttft_p99_ms": null,
        "latency_ewma_ms": null, "pool_latency_median_ms": null, "consecutive_failures": 5,
        "consecutive_successes": 0, "consecutive_hard_failures": 5, "isolations": 1,
        "thresholds": ["consecutive_failures>=5"]
    });
    sqlx::query(
        "INSERT INTO transitions (pool, endpoint, seq, transition_id, from_state, to_state, weight, ramp_ms,
         reason_code, reason, failure_rate, score, window_calls, window_failures, consecutive_failures,
         consecutive_successes, thresholds, trigger_ids, policy_version, evidence, stream_time, source_partition, source_offset)
         VALUES ($1, $2, $3, $1 || '/' || $2 || '/' || $3, 'healthy', $4, 0, 0, $5, 'test reason ' || $3, 0.625, 40, 8, 5, 5, 0,
         ARRAY['consecutive_failures>=5'], ARRAY['sig-' || $3], 0, $6, to_timestamp($7::double precision / 1e6), 0, $3)",
    )
    .bind(pool)
    .bind(endpoint)
    .bind(seq)
    .bind(to)
    .bind(reason_code)
    .bind(evidence)
    .bind(t_us)
    .execute(db)
    .await
    .unwrap();
}

/// A Server-Sent Events client over the API's live stream.
pub struct Sse {
    body: std::pin::Pin<Box<dyn futures::Stream<Item = reqwest::Result<bytes::Bytes>> + Send>>,
    buf: String,
}

#[derive(Debug, Clone)]
pub struct Ev {
    pub id: String,
    pub event: String,
    pub data: String,
}

impl Sse {
    /// The live stream of pool `live`, resumed after `last_id` if given.
    pub async fn connect(api: &Api, last_id: Option<&str>) -> Sse {
        Sse::open(api, "/v1/stream?pool=live", last_id, None)
            .await
            .unwrap_or_else(|(s, b)| panic!("stream refused: {s} {b}"))
    }

    /// A stream at `path`, or the status and error body that refused it.
    pub async fn open(
        api: &Api,
        path: &str,
        last_id: Option<&str>,
        token: Option<&str>,
    ) -> Result<Sse, (u16, serde_json::Value)> {
        let mut req = api.http.get(api.url(path));
        if let Some(id) = last_id {
            req = req.header("Last-Event-ID", id);
        }
        if let Some(t) = token {
            req = req.bearer_auth(t);
        }
        let r = req.send().await.unwrap();
        let status = r.status().as_u16();
        if status != 200 {
            return Err((status, r.json().await.unwrap_or(serde_json::Value::Null)));
        }
        assert!(r.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/event-stream"));
        Ok(Sse {
            body: Box::pin(r.bytes_stream()),
            buf: String::new(),
        })
    }

    /// The next event (keep-alive comments skipped); None when the server ends the stream.
    pub async fn next_or_end(&mut self) -> Option<Ev> {
        use futures::StreamExt;
        loop {
            if let Some(end) = self.buf.find("\n\n") {
                let block: String = self.buf.drain(..end + 2).collect();
                let mut ev = Ev {
                    id: String::new(),
                    event: String::new(),
                    data: String::new(),
                };
                for line in block.lines() {
                    if let Some(v) = line.strip_prefix("id:") {
                        ev.id = v.trim().into();
                    } else if let Some(v) = line.strip_prefix("event:") {
                        ev.event = v.trim().into();
                    } else if let Some(v) = line.strip_prefix("data:") {
                        ev.data.push_str(v.trim());
                    }
                }
                if ev.event.is_empty() {
                    continue; // a keep-alive comment
                }
                return Some(ev);
            }
            let chunk = tokio::time::timeout(Duration::from_secs(30), self.body.next())
                .await
                .expect("an event or the end within 30 s")?;
            self.buf.push_str(&String::from_utf8_lossy(&chunk.ok()?));
        }
    }

    pub async fn next(&mut self) -> Ev {
        self.next_or_end().await.expect("the stream stays open")
    }
}
