//! The benchmarks' view of the local stack: everything comes from `vitals-testkit` (the same
//! names, topics and started binaries as the integration tests); this file only turns the
//! benchmarks' generated signals into input records.

use vitals_contracts::{encode_signal, Signal};
pub use vitals_testkit::{brokers, database_url, producer, start_processor, unique, Service, Stamp, Topics};

/// The signals as input records: keyed by pool (ticks, which have no pool, round-robin over 8
/// partitions), stamped with their stream time.
pub fn inputs(signals: &[(i64, Signal)]) -> impl Iterator<Item = vitals_testkit::Input> + '_ {
    signals.iter().enumerate().map(|(i, (t, s))| {
        let key = s.pool().filter(|k| !k.is_empty()).map(str::to_owned);
        vitals_testkit::Input {
            partition: key.is_none().then_some((i % 8) as i32),
            ts_ms: t / 1000,
            key,
            bytes: encode_signal(s).expect("generated signals encode"),
        }
    })
}

/// When each endpoint's first health change that `keep` accepts became visible to a
/// `read_committed` consumer of `changes_topic` (what a router sees), filled as they arrive.
pub fn first_changes(
    changes_topic: &str,
    group: &str,
    keep: fn(&vitals_contracts::HealthChanged) -> bool,
) -> anyhow::Result<std::sync::Arc<std::sync::Mutex<std::collections::HashMap<String, std::time::Instant>>>> {
    use rdkafka::consumer::{Consumer, StreamConsumer};
    use rdkafka::Message;
    let c: StreamConsumer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", brokers())
        .set("group.id", group)
        .set("auto.offset.reset", "earliest")
        .set("isolation.level", "read_committed")
        .set("fetch.wait.max.ms", "10")
        .create()?;
    c.subscribe(&[changes_topic])?;
    let seen: std::sync::Arc<std::sync::Mutex<std::collections::HashMap<String, std::time::Instant>>> =
        Default::default();
    let filled = seen.clone();
    tokio::spawn(async move {
        while let Ok(m) = c.recv().await {
            let at = std::time::Instant::now();
            if let Ok(h) = vitals_contracts::decode::<vitals_contracts::HealthChanged>(m.payload().unwrap_or_default())
            {
                if keep(&h) {
                    filled
                        .lock()
                        .expect("first changes")
                        .entry(h.endpoint.clone())
                        .or_insert(at);
                }
            }
        }
    });
    Ok(seen)
}

/// The partition of a pool's records among `partitions`: the fixed hash the tests use, so a
/// benchmark knows which partition a pool is on.
pub fn partition_of(pool: &str, partitions: i32) -> i32 {
    (vitals_contracts::codec::crc64_avro(pool.as_bytes()) % partitions as u64) as i32
}
