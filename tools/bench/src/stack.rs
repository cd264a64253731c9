//! Helpers for the benchmarks that run against the local stack: topics, producing, and the
//! processor binary.

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::ClientConfig;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use vitals_contracts::{encode_signal, Signal};

pub struct Env {
    pub brokers: String,
    pub database_url: String,
}

impl Env {
    pub fn from_env() -> Env {
        Env {
            brokers: std::env::var("VITALS_KAFKA_BROKERS").unwrap_or_else(|_| "127.0.0.1:9092".into()),
            database_url: std::env::var("VITALS_DATABASE_URL")
                .unwrap_or_else(|_| "postgres://vitals:vitals@127.0.0.1:5432/vitals".into()),
        }
    }
}

pub fn unique(name: &str) -> String {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_millis();
    format!("bench_{name}_{t}")
}

/// Create signals/changes/state/dlq topics named after `prefix`.
pub async fn create_topics(
    env: &Env,
    prefix: &str,
    partitions: i32,
    log_append_time: bool,
) -> anyhow::Result<[String; 4]> {
    let names = [
        format!("{prefix}.signals"),
        format!("{prefix}.changes"),
        format!("{prefix}.state"),
        format!("{prefix}.dlq"),
    ];
    let admin: AdminClient<DefaultClientContext> =
        ClientConfig::new().set("bootstrap.servers", &env.brokers).create()?;
    let ts = if log_append_time { "LogAppendTime" } else { "CreateTime" };
    let topics = [
        // The generated signals carry 2023 timestamps: keep them whatever their age.
        NewTopic::new(&names[0], partitions, TopicReplication::Fixed(1))
            .set("message.timestamp.type", ts)
            .set("retention.ms", "-1"),
        NewTopic::new(&names[1], partitions, TopicReplication::Fixed(1)),
        NewTopic::new(&names[2], partitions, TopicReplication::Fixed(1)).set("cleanup.policy", "compact"),
        NewTopic::new(&names[3], 1, TopicReplication::Fixed(1)),
    ];
    for r in admin.create_topics(&topics, &AdminOptions::new()).await? {
        r.map_err(|(t, e)| anyhow::anyhow!("create {t}: {e}"))?;
    }
    Ok(names)
}

pub fn producer(env: &Env) -> anyhow::Result<FutureProducer> {
    Ok(ClientConfig::new()
        .set("bootstrap.servers", &env.brokers)
        .set("enable.idempotence", "true")
        .set("linger.ms", "5")
        .set("queue.buffering.max.messages", "1000000")
        .create()?)
}

/// Produce signals keyed by pool with their stream times; waits for every acknowledgement.
pub async fn produce_all(p: &FutureProducer, topic: &str, signals: &[(i64, Signal)]) -> anyhow::Result<()> {
    let mut pending = Vec::with_capacity(10_000);
    for (i, (t, s)) in signals.iter().enumerate() {
        let bytes = encode_signal(s)?;
        let key = s.pool().unwrap_or("");
        let rec: FutureRecord<'_, str, [u8]> = if key.is_empty() {
            FutureRecord::to(topic)
                .partition((i % 8) as i32)
                .timestamp(t / 1000)
                .payload(&bytes)
        } else {
            FutureRecord::to(topic).key(key).timestamp(t / 1000).payload(&bytes)
        };
        pending.push(p.send_result(rec).map_err(|(e, _)| e)?);
        if pending.len() >= 10_000 {
            for d in pending.drain(..) {
                d.await?.map_err(|(e, _)| e)?;
            }
        }
        if i % 100_000 == 99_999 {
            eprintln!("  produced {}", i + 1);
        }
    }
    for d in pending {
        d.await?.map_err(|(e, _)| e)?;
    }
    Ok(())
}

/// The processor binary next to this one (both are built by `cargo build --release`).
pub fn processor_binary() -> anyhow::Result<PathBuf> {
    let me = std::env::current_exe()?;
    let p = me.with_file_name("vitals-processor");
    anyhow::ensure!(
        p.exists(),
        "{} not found: run `cargo build --release -p vitals-processor` first",
        p.display()
    );
    Ok(p)
}

pub fn spawn_processor(env: &Env, topics: &[String; 4], group: &str, extra: &[&str]) -> anyhow::Result<Child> {
    Ok(Command::new(processor_binary()?)
        .args(["--brokers", &env.brokers, "--database-url", &env.database_url])
        .args(["--signals-topic", &topics[0], "--changes-topic", &topics[1]])
        .args(["--state-topic", &topics[2], "--dlq-topic", &topics[3]])
        .args(["--group", group, "--db-schema", group, "--create-topics", "false"])
        .args(["--http-addr", "127.0.0.1:0"])
        .args(extra)
        .env("VITALS_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .spawn()?)
}
