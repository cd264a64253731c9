//! Test harness: real Kafka, real Postgres, the real processor binary. Every test gets its own
//! topics, consumer group and database schema, so tests run in parallel.
#![allow(dead_code)]

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::message::{Headers, OwnedMessage};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::{ClientConfig, Message};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::PgPool;
use std::collections::BTreeMap;
use std::future::Future;
use std::process::{Child, Command, Stdio};
use std::str::FromStr;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};
use vitals_contracts::*;

pub const T0_MS: i64 = 1_700_000_000_000;

pub fn brokers() -> String {
    std::env::var("VITALS_TEST_KAFKA").unwrap_or_else(|_| "127.0.0.1:9092".into())
}

pub fn database_url() -> String {
    std::env::var("VITALS_TEST_DATABASE_URL")
        .unwrap_or_else(|_| "postgres://vitals:vitals@127.0.0.1:5432/vitals".into())
}

/// Wait for `cond` with a deadline; panics with `what` if it never holds.
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

/// A unique name for this test's topics, group and schema.
pub fn unique(name: &str) -> String {
    static N: AtomicU32 = AtomicU32::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    format!(
        "t_{name}_{}_{}_{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed),
        nanos % 100_000
    )
}

pub struct Topics {
    pub signals: String,
    pub changes: String,
    pub state: String,
    pub dlq: String,
    pub partitions: i32,
}

/// Create the four topics. Signals keep the producer's timestamps (CreateTime) so that a test
/// controls stream time and a rerun sees identical input.
pub async fn create_topics(prefix: &str, partitions: i32) -> Topics {
    let t = Topics {
        signals: format!("{prefix}.signals"),
        changes: format!("{prefix}.changes"),
        state: format!("{prefix}.state"),
        dlq: format!("{prefix}.dlq"),
        partitions,
    };
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", brokers())
        .create()
        .expect("admin client");
    let r = TopicReplication::Fixed(1);
    // Test records carry 2023 timestamps: without retention.ms=-1 the broker's time-based
    // retention would delete them while a test runs.
    let topics = [
        NewTopic::new(&t.signals, partitions, r)
            .set("message.timestamp.type", "CreateTime")
            .set("retention.ms", "-1"),
        NewTopic::new(&t.changes, partitions, TopicReplication::Fixed(1)),
        NewTopic::new(&t.state, partitions, TopicReplication::Fixed(1)).set("cleanup.policy", "compact"),
        NewTopic::new(&t.dlq, 1, TopicReplication::Fixed(1)),
    ];
    for res in admin
        .create_topics(&topics, &AdminOptions::new())
        .await
        .expect("create topics")
    {
        res.expect("topic created");
    }
    t
}

/// One input record: its partition, timestamp and bytes.
#[derive(Clone)]
pub struct Input {
    pub partition: i32,
    pub ts_ms: i64,
    pub key: Option<String>,
    pub bytes: Vec<u8>,
}

pub fn producer() -> FutureProducer {
    ClientConfig::new()
        .set("bootstrap.servers", brokers())
        .set("enable.idempotence", "true")
        .set("linger.ms", "5")
        .create()
        .expect("producer")
}

/// Produce in order and wait for every acknowledgement.
pub async fn produce(topic: &str, inputs: &[Input]) {
    let p = producer();
    let mut pending = Vec::new();
    for i in inputs {
        let mut r: FutureRecord<'_, str, [u8]> = FutureRecord::to(topic)
            .partition(i.partition)
            .timestamp(i.ts_ms)
            .payload(&i.bytes);
        if let Some(k) = &i.key {
            r = r.key(k.as_str());
        }
        pending.push(p.send_result(r).map_err(|(e, _)| e).expect("queued"));
    }
    for d in pending {
        d.await.expect("delivered").map_err(|(e, _)| e).expect("acknowledged");
    }
}

/// The partition of a pool: a fixed hash, so that two topics get the same layout.
pub fn partition_of(pool: &str, partitions: i32) -> i32 {
    (vitals_contracts::codec::crc64_avro(pool.as_bytes()) % partitions as u64) as i32
}

pub fn signal_input(s: &Signal, ts_ms: i64, partitions: i32) -> Input {
    let pool = s.pool().expect("a pool signal").to_string();
    Input {
        partition: partition_of(&pool, partitions),
        ts_ms,
        key: Some(pool),
        bytes: encode_signal(s).unwrap(),
    }
}

pub fn ticks(ts_ms: i64, partitions: i32) -> Vec<Input> {
    (0..partitions)
        .map(|p| Input {
            partition: p,
            ts_ms,
            key: None,
            bytes: encode(&Tick {
                ticker: "test".into(),
                emitted_at: ts_ms * 1000,
            })
            .unwrap(),
        })
        .collect()
}

pub fn call(pool: &str, ep: &str, id: u64, outcome: OutcomeClass, ttft_ms: Option<i64>, ts_ms: i64) -> Signal {
    Signal::Call(CallOutcome {
        event_id: format!("{pool}-{ep}-{id}"),
        pool: pool.into(),
        endpoint: ep.into(),
        gateway: "gw-test".into(),
        occurred_at: ts_ms * 1000,
        outcome,
        http_status: None,
        latency_us: 50_000,
        ttft_us: ttft_ms.map(|t| t * 1000),
        tpot_us: None,
        attributes: Default::default(),
        model: None,
    })
}

/// A long, deterministic mixed workload: `pools` pools of 4 endpoints, one signal every 10 ms
/// of stream time, failure bursts, heartbeats, and ticks every second.
pub fn workload(pools: usize, n: usize, partitions: i32, seed: u64) -> Vec<Input> {
    let mut rng = seed;
    let mut next = || {
        rng = rng.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        rng >> 33
    };
    let mut out = Vec::with_capacity(n + n / 50);
    let mut burst: BTreeMap<(u64, u64), u32> = BTreeMap::new();
    for i in 0..n {
        let ts = T0_MS + i as i64 * 10;
        if i % 100 == 0 {
            out.extend(ticks(ts, partitions));
        }
        let p = next() % pools as u64;
        let e = next() % 4;
        if next() % 400 == 0 {
            burst.insert((p, e), 6 + (next() % 10) as u32);
        }
        let failing = burst.get_mut(&(p, e)).is_some_and(|left| {
            *left = left.saturating_sub(1);
            *left > 0
        });
        let roll = next() % 100;
        let outcome = if failing {
            OutcomeClass::Timeout
        } else if roll < 3 {
            OutcomeClass::ServerError
        } else if roll < 5 {
            OutcomeClass::ClientError
        } else {
            OutcomeClass::Success
        };
        let pool = format!("pool-{p}");
        let ep = format!("ep-{e}");
        let s = call(&pool, &ep, i as u64, outcome, Some(200 + (next() % 400) as i64), ts);
        out.push(signal_input(&s, ts, partitions));
    }
    out
}

pub struct Db {
    pub pool: PgPool,
    pub schema: String,
}

impl Db {
    pub async fn connect(schema: &str) -> Db {
        let opts = PgConnectOptions::from_str(&database_url())
            .unwrap()
            .options([("search_path", schema)]);
        let pool = PgPoolOptions::new()
            .max_connections(3)
            .connect_with(opts)
            .await
            .expect("postgres");
        Db {
            pool,
            schema: schema.into(),
        }
    }

    /// Whether the processor's tables exist yet (it migrates at start).
    pub async fn ready(&self) -> bool {
        sqlx::query_scalar::<_, bool>("SELECT to_regclass('consumer_offsets') IS NOT NULL")
            .fetch_one(&self.pool)
            .await
            .unwrap_or(false)
    }

    /// Records the group has durably consumed, over all partitions.
    pub async fn consumed(&self, group: &str) -> i64 {
        if !self.ready().await {
            return 0;
        }
        sqlx::query_scalar::<_, Option<i64>>(
            "SELECT sum(greatest(next_offset, 0))::bigint FROM consumer_offsets WHERE consumer_group = $1",
        )
        .bind(group)
        .fetch_one(&self.pool)
        .await
        .ok()
        .flatten()
        .unwrap_or(0)
    }

    pub async fn wait_consumed(&self, group: &str, n: i64, deadline: Duration) {
        wait_until(&format!("{n} records consumed by {group}"), deadline, || async {
            self.consumed(group).await >= n
        })
        .await;
    }

    /// A digest of the audit log: every deterministic column of every transition and pool
    /// event, in key order. `with_offsets` includes where each came from in the input.
    pub async fn digest(&self, with_offsets: bool) -> (i64, String) {
        let src = if with_offsets {
            "source_partition, source_offset"
        } else {
            "''"
        };
        let q = format!(
            "SELECT count(*), coalesce(md5(string_agg(concat_ws('|', pool, endpoint, seq, transition_id, from_state,
               to_state, weight, ramp_ms, retry_at, reason_code, reason, failure_rate, score, window_calls,
               window_failures, consecutive_failures, consecutive_successes, ttft_p50_ms, ttft_p99_ms,
               thresholds::text, trigger_ids::text, policy_version, evidence::text, stream_time, {src}),
               E'\\n' ORDER BY pool, endpoint, seq)), '') FROM transitions"
        );
        let (n, d): (i64, String) = sqlx::query_as(&q).fetch_one(&self.pool).await.expect("digest");
        let q = format!(
            "SELECT coalesce(md5(string_agg(concat_ws('|', pool, seq, endpoints, healthy, ejected, healthy_fraction,
               panic, correlated_outage, reason, policy_version, stream_time, {src}), E'\\n' ORDER BY pool, seq)), '')
             FROM pool_events"
        );
        let p: String = sqlx::query_scalar(&q).fetch_one(&self.pool).await.expect("digest");
        (n, format!("{d}/{p}"))
    }

    /// Endpoints whose sequence numbers have a gap or a double: (pool, endpoint, count, max seq).
    pub async fn sequence_gaps(&self) -> Vec<(String, String, i64, i64)> {
        sqlx::query_as(
            "SELECT pool, endpoint, count(*), max(seq) FROM transitions GROUP BY pool, endpoint
             HAVING count(*) <> max(seq) OR min(seq) <> 1",
        )
        .fetch_all(&self.pool)
        .await
        .expect("gaps")
    }

    pub async fn drop_schema(&self) {
        let _ = sqlx::query(&format!("DROP SCHEMA IF EXISTS \"{}\" CASCADE", self.schema))
            .execute(&self.pool)
            .await;
    }
}

/// A running processor process.
pub struct Proc {
    pub child: Child,
}

impl Proc {
    pub fn start(topics: &Topics, group: &str, schema: &str, extra: &[&str]) -> Proc {
        static STARTED: AtomicU32 = AtomicU32::new(0);
        let log = std::env::temp_dir().join(format!(
            "{group}-{}-{}.log",
            std::process::id(),
            STARTED.fetch_add(1, Ordering::Relaxed)
        ));
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .expect("log file");
        let child = Command::new(env!("CARGO_BIN_EXE_vitals-processor"))
            .args(["--brokers", &brokers(), "--database-url", &database_url()])
            .args(["--signals-topic", &topics.signals, "--changes-topic", &topics.changes])
            .args(["--state-topic", &topics.state, "--dlq-topic", &topics.dlq])
            .args(["--group", group, "--db-schema", schema, "--create-topics", "false"])
            .args(["--tick-interval-ms", "0"])
            .args(if extra.contains(&"--http-addr") {
                &[][..]
            } else {
                &["--http-addr", "127.0.0.1:0"][..]
            })
            .args(extra)
            .env("VITALS_LOG", "info,rdkafka=warn,sqlx=warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::from(log))
            .spawn()
            .expect("processor starts");
        Proc { child }
    }

    /// Start with the health and metrics endpoint on a free port; the port.
    pub fn start_serving(topics: &Topics, group: &str, schema: &str, extra: &[&str]) -> (Proc, u16) {
        let port = free_port();
        let http = format!("127.0.0.1:{port}");
        let mut args = extra.to_vec();
        args.extend(["--http-addr", &http]);
        (Proc::start(topics, group, schema, &args), port)
    }

    pub fn kill9(&mut self) {
        let _ = self.child.kill(); // SIGKILL
        let _ = self.child.wait();
    }

    /// SIGTERM and wait for a clean exit.
    pub fn terminate(&mut self) -> std::process::ExitStatus {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        self.child.wait().expect("processor exits")
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Run a fresh processor (own group and schema) over `topics` to the end and return its digest.
pub async fn reference_digest(topics: &Topics, total: i64, with_offsets: bool) -> (i64, String) {
    let group = unique("ref");
    let db = Db::connect(&group).await;
    let mut p = Proc::start(topics, &group, &group, &[]);
    db.wait_consumed(&group, total, Duration::from_secs(120)).await;
    p.terminate();
    let d = db.digest(with_offsets).await;
    db.drop_schema().await;
    d
}

pub fn consumer(group: &str) -> StreamConsumer {
    ClientConfig::new()
        .set("bootstrap.servers", brokers())
        .set("group.id", group)
        .set("auto.offset.reset", "earliest")
        .set("isolation.level", "read_committed")
        .set("enable.auto.commit", "false")
        .create()
        .expect("consumer")
}

/// Read `n` messages from `topic`, or panic after `deadline`.
pub async fn read_n(topic: &str, n: usize, deadline: Duration) -> Vec<OwnedMessage> {
    let c = consumer(&unique("reader"));
    c.subscribe(&[topic]).unwrap();
    let mut out = Vec::new();
    let end = Instant::now() + deadline;
    while out.len() < n {
        let left = end.saturating_duration_since(Instant::now());
        assert!(!left.is_zero(), "read {} of {n} messages from {topic}", out.len());
        if let Ok(Ok(m)) = tokio::time::timeout(left, c.recv()).await {
            out.push(m.detach());
        }
    }
    out
}

pub fn header(m: &OwnedMessage, name: &str) -> Option<String> {
    let h = m.headers()?;
    (0..h.count())
        .map(|i| h.get(i))
        .find(|h| h.key == name)
        .and_then(|h| h.value.map(|v| String::from_utf8_lossy(v).into_owned()))
}

/// A port that was free a moment ago.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A minimal HTTP/1.1 GET over loopback; the body, if the server answered.
pub async fn http_get(port: u16, path: &str) -> Option<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port)).await.ok()?;
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n").as_bytes())
        .await
        .ok()?;
    let mut buf = String::new();
    s.read_to_string(&mut buf).await.ok()?;
    buf.split_once("\r\n\r\n").map(|(_, b)| b.to_string())
}

/// A counter's value from the processor's /metrics.
pub async fn metric(port: u16, name: &str) -> Option<f64> {
    let body = http_get(port, "/metrics").await?;
    body.lines()
        .find_map(|l| l.strip_prefix(name).and_then(|v| v.trim().parse().ok()))
}

/// Run a stack script command (scripts/stack.sh kafka-down, pg-up, ...).
pub fn stack(cmd: &str) {
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/stack.sh");
    let status = Command::new("bash")
        .arg(script)
        .arg(cmd)
        .status()
        .expect("stack script runs");
    assert!(status.success(), "scripts/stack.sh {cmd} failed");
}
