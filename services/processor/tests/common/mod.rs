//! Test harness: real Kafka, real Postgres, the real processor binary. Every test gets its own
//! topics, consumer group and database schema, so tests run in parallel. The stack, names,
//! waits, topics and processes come from `vitals-testkit`; what is here is the processor's own:
//! its workloads, its audit-log digest and its process handle.
//!
//! Needs the local stack (Kafka and Postgres, started by `scripts/test.sh`): run `scripts/test.sh`.
#![allow(dead_code)]

use sqlx::PgPool;
use std::collections::BTreeMap;
use std::time::Duration;
use vitals_contracts::*;
#[allow(unused_imports)] // each test binary uses a different part
pub use vitals_testkit::{
    database_url, free_port, header, http_get, metric, read_n, stack, start_processor, unique, wait_until, Input,
    Topics,
};

pub const T0_MS: i64 = 1_700_000_000_000;

/// Create the four topics. Signals keep the producer's timestamps (CreateTime) so that a test
/// controls stream time and a rerun sees identical input.
pub async fn create_topics(prefix: &str, partitions: i32) -> Topics {
    Topics::create(prefix, partitions, vitals_testkit::Stamp::CreateTime).await
}

/// Produce in order and wait for every acknowledgement.
pub async fn produce(topic: &str, inputs: &[Input]) {
    vitals_testkit::produce(&vitals_testkit::producer(), topic, inputs.iter().cloned()).await
}

/// The partition of a pool: a fixed hash, so that two topics get the same layout.
pub fn partition_of(pool: &str, partitions: i32) -> i32 {
    (vitals_contracts::codec::crc64_avro(pool.as_bytes()) % partitions as u64) as i32
}

pub fn signal_input(s: &Signal, ts_ms: i64, partitions: i32) -> Input {
    let pool = s.pool().expect("a pool signal").to_string();
    Input {
        partition: Some(partition_of(&pool, partitions)),
        ts_ms,
        key: Some(pool),
        bytes: encode_signal(s).unwrap(),
    }
}

pub fn ticks(ts_ms: i64, partitions: i32) -> Vec<Input> {
    (0..partitions)
        .map(|p| Input {
            partition: Some(p),
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
        latency_us: 50_000,
        ttft_us: ttft_ms.map(|t| t * 1000),
        ..CallOutcome::new(format!("{pool}-{ep}-{id}"), pool, ep, "gw-test", ts_ms * 1000, outcome)
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
        Db {
            pool: vitals_testkit::schema_pool(schema).await,
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
        self.offsets_sum(group, "next_offset").await
    }

    /// Records whose calls the group has counted into the request rollups, over all partitions.
    pub async fn counted(&self, group: &str) -> i64 {
        self.offsets_sum(group, "requests_offset").await
    }

    /// The sum of an offset column of the group's partitions (0 before the tables exist).
    async fn offsets_sum(&self, group: &str, column: &str) -> i64 {
        if !self.ready().await {
            return 0;
        }
        sqlx::query_scalar::<_, Option<i64>>(&format!(
            "SELECT sum(greatest({column}, 0))::bigint FROM consumer_offsets WHERE consumer_group = $1"
        ))
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
               to_state, weight, ramp_ms, retry_at, reason_code, reason, window_calls,
               trigger_ids::text, policy_version, evidence::text, stream_time, {src}),
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

    /// The ids of every transition in the audit log.
    pub async fn transition_ids(&self) -> std::collections::HashSet<String> {
        sqlx::query_scalar("SELECT transition_id FROM transitions")
            .fetch_all(&self.pool)
            .await
            .unwrap()
            .into_iter()
            .collect()
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
        vitals_testkit::drop_schema(&self.pool, &self.schema).await
    }
}

/// A running processor process.
pub type Proc = vitals_testkit::Service;

/// Start with the health and metrics endpoint on a free port; the port.
pub fn start_serving(topics: &Topics, group: &str, schema: &str, extra: &[&str]) -> (Proc, u16) {
    let port = free_port();
    let http = format!("127.0.0.1:{port}");
    let mut args = extra.to_vec();
    args.extend(["--http-addr", &http]);
    (start_processor(topics, group, schema, &args), port)
}

/// Run a fresh processor (own group and schema) over `topics` to the end and return its digest.
pub async fn reference_digest(topics: &Topics, total: i64, with_offsets: bool) -> (i64, String) {
    let group = unique("ref");
    let db = Db::connect(&group).await;
    let mut p = start_processor(topics, &group, &group, &[]);
    db.wait_consumed(&group, total, Duration::from_secs(120)).await;
    p.terminate();
    let d = db.digest(with_offsets).await;
    db.drop_schema().await;
    d
}

/// Read the changes topic until every transition of the audit log has been seen on it (at least
/// once: the relay may publish twice); the ids seen.
pub async fn wait_published(db: &Db, changes: &str, deadline: Duration) -> std::collections::HashSet<String> {
    use rdkafka::consumer::Consumer;
    let want = db.transition_ids().await;
    let c = vitals_testkit::consumer(&unique("published"));
    c.subscribe(&[changes]).expect("subscribe");
    let mut seen = std::collections::HashSet::new();
    let end = std::time::Instant::now() + deadline;
    while !want.is_subset(&seen) {
        let left = end.saturating_duration_since(std::time::Instant::now());
        assert!(
            !left.is_zero(),
            "{} of {} transitions published to {changes}",
            want.intersection(&seen).count(),
            want.len()
        );
        if let Ok(Ok(m)) = tokio::time::timeout(left, c.recv()).await {
            let m = m.detach();
            if header(&m, "vitals-type").as_deref() == Some("HealthChanged") {
                let h = decode::<HealthChanged>(rdkafka::Message::payload(&m).unwrap()).unwrap();
                seen.insert(h.transition_id);
            }
        }
    }
    seen
}
