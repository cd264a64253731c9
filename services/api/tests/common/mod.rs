//! API test harness: the API (and, where a test needs it, the processor) run in-process against
//! the real broker and the real database, each test with its own topics and schema.
#![allow(dead_code)]

use clap::Parser;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::ClientConfig;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::PgPool;
use std::future::Future;
use std::str::FromStr;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

pub const ADMIN: &str = "admin-secret-0000000001";
pub const WRITER: &str = "writer-secret-000000001";
pub const READER: &str = "reader-secret-000000001";

pub fn brokers() -> String {
    std::env::var("VITALS_TEST_KAFKA").unwrap_or_else(|_| "127.0.0.1:9092".into())
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
        args.extend(["--brokers".into(), brokers(), "--database-url".into(), database_url()]);
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
