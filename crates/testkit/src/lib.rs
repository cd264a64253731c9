//! What every integration test and benchmark needs, once: the local stack from the environment
//! (`scripts/stack.sh` starts it; `scripts/test.sh` exports where it is), unique names so that
//! tests run in parallel, bounded waits instead of sleeps, topics, producing and reading, a
//! schema migrated by the owner role, and a handle on a started service binary.

pub mod uptime;

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::message::{Headers, Message, OwnedMessage};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::ClientConfig;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::PgPool;
use std::future::Future;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::str::FromStr;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

/// Stop a test that cannot reach the local stack, saying how to start it.
#[track_caller]
pub fn no_stack(what: &str, e: impl std::fmt::Display) -> ! {
    panic!(
        "{what}: {e}\nThese tests need the local stack (Kafka at {}, Postgres at {}): run scripts/test.sh, \
         which starts it and runs them (or scripts/stack.sh up, then cargo test)",
        brokers(),
        database_url().split('@').next_back().unwrap_or("?")
    )
}

/// The Kafka bootstrap servers of the local stack.
pub fn brokers() -> String {
    std::env::var("VITALS_TEST_KAFKA").unwrap_or_else(|_| "127.0.0.1:9092".into())
}

/// The Postgres URL of the owner role (creates and migrates schemas).
pub fn database_url() -> String {
    std::env::var("VITALS_TEST_DATABASE_URL")
        .unwrap_or_else(|_| "postgres://vitals:vitals@127.0.0.1:5432/vitals".into())
}

/// The Postgres URL of the read-only role (created by scripts/stack.sh).
pub fn reader_url() -> String {
    std::env::var("VITALS_TEST_READER_DATABASE_URL")
        .unwrap_or_else(|_| "postgres://vitals_reader:vitals_reader@127.0.0.1:5432/vitals".into())
}

/// A name no other test of any process uses: for topics, groups and schemas (letters, digits
/// and _ only, so it is a valid schema name).
pub fn unique(name: &str) -> String {
    static N: AtomicU32 = AtomicU32::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .subsec_nanos();
    format!(
        "t_{name}_{}_{}_{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed),
        nanos % 100_000
    )
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

/// How the signals topic stamps its records.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Stamp {
    /// The producer's timestamps: a test controls stream time, and a rerun sees the same input.
    CreateTime,
    /// The broker's append time, as in production.
    LogAppendTime,
}

/// The four topics of one test.
#[derive(Clone, Debug)]
pub struct Topics {
    pub signals: String,
    pub changes: String,
    pub state: String,
    pub dlq: String,
    pub partitions: i32,
    /// How the signals topic stamps its records.
    pub stamp: Stamp,
}

/// Delete topics, best effort (a benchmark that made them leaves the broker as it found it).
pub async fn delete_topics(names: &[&str]) {
    let Ok(admin) = ClientConfig::new()
        .set("bootstrap.servers", brokers())
        .create::<AdminClient<DefaultClientContext>>()
    else {
        return;
    };
    let opts = AdminOptions::new().operation_timeout(Some(Duration::from_secs(30)));
    let _ = admin.delete_topics(names, &opts).await;
}

impl Topics {
    /// Create `{prefix}.signals`, `.changes`, `.state` (compacted) and `.dlq`.
    pub async fn create(prefix: &str, partitions: i32, stamp: Stamp) -> Topics {
        let t = Topics {
            signals: format!("{prefix}.signals"),
            changes: format!("{prefix}.changes"),
            state: format!("{prefix}.state"),
            dlq: format!("{prefix}.dlq"),
            partitions,
            stamp,
        };
        let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
            .set("bootstrap.servers", brokers())
            .create()
            .expect("admin client");
        let r = || TopicReplication::Fixed(1);
        let ts = match stamp {
            Stamp::CreateTime => "CreateTime",
            Stamp::LogAppendTime => "LogAppendTime",
        };
        // Test records carry 2023 timestamps: without retention.ms=-1 the broker's time-based
        // retention would delete them while a test runs.
        let topics = [
            NewTopic::new(&t.signals, partitions, r())
                .set("message.timestamp.type", ts)
                .set("retention.ms", "-1"),
            NewTopic::new(&t.changes, partitions, r()),
            NewTopic::new(&t.state, partitions, r()).set("cleanup.policy", "compact"),
            NewTopic::new(&t.dlq, 1, r()),
        ];
        let opts = AdminOptions::new().operation_timeout(Some(Duration::from_secs(30)));
        let created = match admin.create_topics(&topics, &opts).await {
            Ok(c) => c,
            Err(e) => no_stack("creating test topics", e),
        };
        for res in created {
            res.expect("topic created");
        }
        t
    }

    /// Delete the four topics (a benchmark's, when it is done): best effort.
    pub async fn delete(&self) {
        delete_topics(&[&self.signals, &self.changes, &self.state, &self.dlq]).await;
    }

    /// The flags that point a service at these topics.
    pub fn args(&self) -> Vec<String> {
        [
            ("--signals-topic", &self.signals),
            ("--changes-topic", &self.changes),
            ("--state-topic", &self.state),
            ("--dlq-topic", &self.dlq),
        ]
        .iter()
        .flat_map(|(k, v)| [k.to_string(), v.to_string()])
        .collect()
    }
}

/// One input record: its partition (None: by key), timestamp and bytes.
#[derive(Clone, Debug)]
pub struct Input {
    pub partition: Option<i32>,
    pub ts_ms: i64,
    pub key: Option<String>,
    pub bytes: Vec<u8>,
}

pub fn producer() -> FutureProducer {
    ClientConfig::new()
        .set("bootstrap.servers", brokers())
        .set("enable.idempotence", "true")
        .set("linger.ms", "5")
        .set("queue.buffering.max.messages", "1000000")
        .create()
        .expect("producer")
}

/// Produce in order and wait for every acknowledgement; progress on stderr every 100,000.
pub async fn produce(p: &FutureProducer, topic: &str, inputs: impl IntoIterator<Item = Input>) {
    let mut pending = Vec::with_capacity(10_000);
    for (n, i) in inputs.into_iter().enumerate() {
        let mut r: FutureRecord<'_, str, [u8]> = FutureRecord::to(topic).timestamp(i.ts_ms).payload(&i.bytes);
        if let Some(p) = i.partition {
            r = r.partition(p);
        }
        if let Some(k) = &i.key {
            r = r.key(k.as_str());
        }
        pending.push(p.send_result(r).map_err(|(e, _)| e).expect("queued"));
        if pending.len() >= 10_000 {
            for d in pending.drain(..) {
                d.await.expect("delivered").map_err(|(e, _)| e).expect("acknowledged");
            }
        }
        if n % 100_000 == 99_999 {
            eprintln!("  produced {}", n + 1);
        }
    }
    for d in pending {
        d.await.expect("delivered").map_err(|(e, _)| e).expect("acknowledged");
    }
}

/// A consumer from the earliest offset that reads committed records only.
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
    c.subscribe(&[topic]).expect("subscribe");
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

/// A header of a message as text.
pub fn header(m: &OwnedMessage, name: &str) -> Option<String> {
    let h = m.headers()?;
    (0..h.count())
        .map(|i| h.get(i))
        .find(|h| h.key == name)
        .and_then(|h| h.value.map(|v| String::from_utf8_lossy(v).into_owned()))
}

/// A pool of owner sessions on `schema` (it need not exist yet).
pub async fn schema_pool(schema: &str) -> PgPool {
    let opts = PgConnectOptions::from_str(&database_url())
        .expect("database URL")
        .options([("search_path", schema)]);
    PgPoolOptions::new()
        .max_connections(3)
        .acquire_timeout(Duration::from_secs(10))
        .connect_with(opts)
        .await
        .unwrap_or_else(|e| no_stack("connecting to Postgres", e))
}

/// Create and migrate `schema` as the owner role does (the processor does this at start).
pub async fn migrated_schema(schema: &str) -> PgPool {
    vitals_store::connect_owner(&database_url(), schema, 3)
        .await
        .expect("schema migrated by the owner role")
}

pub async fn drop_schema(db: &PgPool, schema: &str) {
    let _ = sqlx::query(&format!("DROP SCHEMA IF EXISTS \"{schema}\" CASCADE"))
        .execute(db)
        .await;
}

/// A binary of this workspace, built by the same cargo invocation as the running test or
/// benchmark (it sits next to this executable, or one directory up from a test's `deps/`).
pub fn binary(name: &str) -> PathBuf {
    let me = std::env::current_exe().expect("current executable");
    let dir = me.parent().expect("a directory");
    let candidates = [dir.join(name), dir.parent().map(|d| d.join(name)).unwrap_or_default()];
    candidates.iter().find(|p| p.is_file()).cloned().unwrap_or_else(|| {
        panic!(
            "{name} not found next to {}: build the workspace first (cargo build --release, or cargo test --workspace)",
            me.display()
        )
    })
}

/// A started service binary; killed when dropped. Its stderr goes to a log file in the temp
/// directory (named after `label`), which is printed when a test fails to say why.
pub struct Service {
    pub child: Child,
    pub log: PathBuf,
}

impl Service {
    pub fn start(binary_name: &str, label: &str, args: &[String]) -> Service {
        Service::start_program(&binary(binary_name), label, args)
    }

    /// A program of the system (e.g. `/usr/bin/prometheus-alertmanager`), started the same way.
    pub fn start_program(program: &std::path::Path, label: &str, args: &[String]) -> Service {
        static STARTED: AtomicU32 = AtomicU32::new(0);
        let log = std::env::temp_dir().join(format!(
            "{label}-{}-{}.log",
            std::process::id(),
            STARTED.fetch_add(1, Ordering::Relaxed)
        ));
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .expect("log file");
        let child = Command::new(program)
            .args(args)
            .env("VITALS_LOG", "info,rdkafka=warn,sqlx=warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::from(file))
            .spawn()
            .unwrap_or_else(|e| panic!("{} starts: {e}", program.display()));
        Service { child, log }
    }

    /// SIGKILL: no shutdown at all.
    pub fn kill9(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Send a signal (`"-STOP"`, `"-CONT"`, …) with `kill`, and check that it was sent.
    pub fn signal(&self, sig: &str) {
        let pid = self.child.id();
        let ok = Command::new("kill")
            .args([sig, &pid.to_string()])
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "kill {sig} {pid}");
    }

    /// SIGTERM and wait for the exit.
    pub fn terminate(&mut self) -> std::process::ExitStatus {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        self.child.wait().expect("the service exits")
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Start the processor binary on `topics` with its own group and schema, as the owner role, and
/// no topic creation; by default no ticks (on either topic) and an ephemeral HTTP port, unless `extra` (appended)
/// sets them.
pub fn start_processor(topics: &Topics, group: &str, schema: &str, extra: &[&str]) -> Service {
    let mut args: Vec<String> = ["--brokers", &brokers(), "--database-url", &database_url()]
        .iter()
        .map(|s| s.to_string())
        .collect();
    args.extend(topics.args());
    let accept = if topics.stamp == Stamp::CreateTime {
        "true"
    } else {
        "false"
    };
    let fixed = [
        ("--group", group),
        ("--db-schema", schema),
        ("--create-topics", "false"),
    ];
    let defaults = [
        // A test that controls stream time writes its own timestamps.
        ("--accept-create-time", accept),
        ("--tick-interval-ms", "0"),
        ("--view-tick-interval-ms", "0"),
        ("--http-addr", "127.0.0.1:0"),
    ];
    for (flag, value) in fixed
        .into_iter()
        .chain(defaults.into_iter().filter(|(f, _)| !extra.contains(f)))
    {
        args.extend([flag.to_string(), value.to_string()]);
    }
    args.extend(extra.iter().map(|s| s.to_string()));
    Service::start("vitals-processor", group, &args)
}

/// Start the API binary on `topics` and `schema` (read with the reader role), listening on
/// `port`, with `tokens` (`name:role:secret`); returns once it answers `/healthz`.
pub async fn start_api(topics: &Topics, schema: &str, port: u16, tokens: &[&str]) -> Service {
    let mut args: Vec<String> = [
        "--http-addr",
        &format!("127.0.0.1:{port}"),
        "--db-schema",
        schema,
        "--database-url",
        &reader_url(),
        "--brokers",
        &brokers(),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    for t in tokens {
        args.extend(["--token".to_string(), t.to_string()]);
    }
    args.extend(topics.args());
    let api = Service::start("vitals-api", &format!("api-{schema}"), &args);
    let log = api.log.display().to_string();
    wait_until(&format!("the API up ({log})"), Duration::from_secs(30), || async move {
        http_get(port, "/healthz").await.is_some()
    })
    .await;
    api
}

/// A port that was free a moment ago, and not handed out before by this process: two services a
/// test starts one after the other (a processor's and a prober's health endpoints) were once given
/// the same port, since neither had bound it yet.
pub fn free_port() -> u16 {
    static GIVEN: std::sync::Mutex<Vec<u16>> = std::sync::Mutex::new(Vec::new());
    loop {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .expect("a free port");
        let mut given = GIVEN.lock().unwrap_or_else(|e| e.into_inner());
        if !given.contains(&port) {
            given.push(port);
            return port;
        }
    }
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

/// A sample's value from a service's /metrics (`name` with its labels, if any).
pub async fn metric(port: u16, name: &str) -> Option<f64> {
    let body = http_get(port, "/metrics").await?;
    body.lines()
        .find_map(|l| l.strip_prefix(name).and_then(|v| v.trim().parse().ok()))
}

/// A real Alertmanager on 127.0.0.1:`port` with `config`, its data in a new folder, started by
/// the stack script (`scripts/stack.sh am-run`, which execs it: the returned process is the
/// Alertmanager, to kill or restart).
pub fn alertmanager(config: &std::path::Path, port: u16) -> Service {
    let storage = std::env::temp_dir().join(unique("am-data"));
    let args: Vec<String> = vec![
        stack_script().display().to_string(),
        "am-run".into(),
        config.display().to_string(),
        port.to_string(),
        storage.display().to_string(),
    ];
    Service::start_program(std::path::Path::new("/bin/bash"), "alertmanager", &args)
}

/// A health change of `pool`/`endpoint` (its `seq`-th) to `to`, as the processor would emit it:
/// weight 0 out of rotation and 1 otherwise, reason code `ejected` or `readmitted`, no
/// evidence, stream time 1. Tests change what they look at with `..health_changed(…)`.
pub fn health_changed(
    pool: &str,
    endpoint: &str,
    seq: i64,
    to: vitals_contracts::HealthState,
) -> vitals_contracts::HealthChanged {
    use vitals_contracts::HealthState;
    let out = matches!(to, HealthState::Unhealthy | HealthState::Maintenance);
    vitals_contracts::HealthChanged {
        weight: if out { 0.0 } else { 1.0 },
        reason_code: if out { "ejected" } else { "readmitted" }.into(),
        ..vitals_contracts::HealthChanged::new(pool, endpoint, seq, HealthState::Healthy, to, 1)
    }
}

/// `scripts/stack.sh` of this checkout.
fn stack_script() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/stack.sh")
}

/// Run a stack script command (scripts/stack.sh kafka-down, pg-up, ...).
pub fn stack(cmd: &str) {
    let script = stack_script();
    let status = Command::new("bash")
        .arg(script)
        .arg(cmd)
        .status()
        .expect("stack script runs");
    assert!(status.success(), "scripts/stack.sh {cmd} failed");
}

/// Run a binary of this workspace to its end with `args`: its exit code and its output (stderr,
/// then stdout), for tests of configuration errors.
pub fn run_to_end(binary_name: &str, args: &[&str]) -> (i32, String) {
    let out = Command::new(binary(binary_name))
        .args(args)
        .env("VITALS_LOG", "warn")
        .output()
        .unwrap_or_else(|e| panic!("{binary_name} runs: {e}"));
    let text = String::from_utf8_lossy(&out.stderr).into_owned() + &String::from_utf8_lossy(&out.stdout);
    (out.status.code().unwrap_or(-1), text)
}
