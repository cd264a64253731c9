//! Sharing the targets between running instances: every instance of one location joins one
//! consumer group on the shard topic (a topic nobody writes to; its partitions are the shards),
//! and probes the targets whose shard it is assigned. When an instance stops, or its session
//! times out, the group gives its shards to the others within seconds. Instances of different
//! locations use different groups, so each location probes every target once.

use crate::config::Target;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext, Rebalance};
use rdkafka::error::RDKafkaErrorCode;
use rdkafka::{ClientConfig, ClientContext};
use std::collections::BTreeSet;
use std::time::Duration;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// The shard of a target: stable for its id, whichever instance computes it.
pub fn shard_of(id: &str, shards: u32) -> u32 {
    (crate::fnv(&[id.as_bytes()]) % u64::from(shards.max(1))) as u32
}

/// The shards this instance owns, and how many there are.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Ownership {
    pub shards: u32,
    pub owned: BTreeSet<u32>,
    /// The group has assigned this instance its shards at least once.
    pub assigned: bool,
}

impl Ownership {
    /// Everything (one instance without a group).
    pub fn all() -> Ownership {
        Ownership {
            shards: 1,
            owned: [0].into(),
            assigned: true,
        }
    }

    pub fn owns(&self, t: &Target) -> bool {
        self.assigned && self.owned.contains(&shard_of(&t.id, self.shards))
    }
}

struct Ctx {
    tx: watch::Sender<Ownership>,
    shards: u32,
}

impl ClientContext for Ctx {}

impl ConsumerContext for Ctx {
    fn post_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        if let Rebalance::Error(e) = rebalance {
            tracing::warn!(error = %e, "shard rebalance failed");
            return;
        }
        // The whole assignment after the change, whichever protocol the group uses.
        let owned: BTreeSet<u32> = consumer
            .assignment()
            .map(|tpl| {
                tpl.elements()
                    .iter()
                    .filter_map(|e| u32::try_from(e.partition()).ok())
                    .collect()
            })
            .unwrap_or_default();
        tracing::info!(shards = ?owned, "shards assigned");
        self.tx.send_replace(Ownership {
            shards: self.shards,
            owned,
            assigned: true,
        });
    }
}

/// Create the shard topic with `partitions` if it does not exist; returns its partition count.
pub async fn ensure_topic(config: &ClientConfig, topic: &str, partitions: u32) -> anyhow::Result<u32> {
    let admin: AdminClient<_> = config.create()?;
    let new = NewTopic::new(topic, partitions as i32, TopicReplication::Fixed(-1));
    let opts = AdminOptions::new().operation_timeout(Some(Duration::from_secs(10)));
    for r in admin.create_topics([&new], &opts).await? {
        match r {
            Ok(_) | Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
            Err((t, e)) => anyhow::bail!("creating topic {t}: {e}"),
        }
    }
    let consumer: BaseConsumer = config.create()?;
    let topic_name = topic.to_owned();
    let count = tokio::task::spawn_blocking(move || -> anyhow::Result<u32> {
        for _ in 0..50 {
            let parts = vitals_runtime::kafka::partitions(&consumer, &topic_name, Duration::from_secs(5))?;
            if !parts.is_empty() {
                return Ok(parts.len() as u32);
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        anyhow::bail!("topic {topic_name} has no partitions")
    })
    .await??;
    Ok(count)
}

/// Join the group and follow its assignment until `cancel`; the consumer leaves the group when
/// this returns (so the others take the shards at once).
pub fn follow(
    mut config: ClientConfig,
    topic: String,
    shards: u32,
    tx: watch::Sender<Ownership>,
    cancel: CancellationToken,
) -> std::thread::JoinHandle<()> {
    config
        .set("partition.assignment.strategy", "cooperative-sticky")
        .set("session.timeout.ms", "6000")
        .set("heartbeat.interval.ms", "1000")
        .set("enable.auto.commit", "false");
    std::thread::spawn(move || {
        let consumer: BaseConsumer<Ctx> = match config.create_with_context(Ctx { tx, shards }) {
            Ok(c) => c,
            Err(e) => {
                tracing::error!(error = %e, "cannot create the shard consumer");
                return;
            }
        };
        if let Err(e) = consumer.subscribe(&[&topic]) {
            tracing::error!(error = %e, "cannot join the shard group");
            return;
        }
        while !cancel.is_cancelled() {
            // Nothing is ever written to the shard topic: polling serves the group's callbacks.
            if let Some(Err(e)) = consumer.poll(Duration::from_millis(200)) {
                tracing::warn!(error = %e, "shard consumer");
            }
        }
        consumer.unsubscribe();
        let _ = consumer.poll(Duration::from_millis(100));
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shards_spread_targets_evenly_and_stably() {
        let mut counts = [0u32; 16];
        for i in 0..16_000 {
            counts[shard_of(&format!("target-{i}"), 16) as usize] += 1;
        }
        assert!(counts.iter().all(|c| (800..1200).contains(c)), "{counts:?}");
        assert_eq!(shard_of("a", 64), shard_of("a", 64));
    }
}
