//! Kafka client settings and topic creation.

use crate::config::Config;
use rdkafka::admin::{NewTopic, TopicReplication};
use rdkafka::ClientConfig;
use vitals_runtime::kafka;

pub fn base_config(cfg: &Config) -> ClientConfig {
    kafka::config(&cfg.kafka, &[])
}

/// The idempotent producer of the relay and the ticker.
pub fn producer_config(cfg: &Config) -> ClientConfig {
    kafka::producer(
        &cfg.kafka,
        &[("message.timeout.ms", "30000"), ("compression.type", "lz4")],
    )
}

/// Bytes per partition in one fetch response.
pub const FETCH_BYTES_PER_PARTITION: &str = "8388608";

/// The consumer of the signals topic for lane `lane`. Offsets live in Postgres and nothing is
/// committed to Kafka; lag is measured from the write path (`progress`), so no statistics are
/// requested.
pub fn consumer_config(cfg: &Config, lane: usize) -> ClientConfig {
    let c = kafka::consumer(
        &cfg.kafka,
        &cfg.group,
        &[
            ("auto.offset.reset", "earliest"),
            // Eager rebalancing: every assignment restores from Postgres, so a full revoke is
            // simple and safe; the cooperative protocol would only save work.
            ("partition.assignment.strategy", "range"),
            ("session.timeout.ms", "10000"),
            ("heartbeat.interval.ms", "1000"),
            ("max.poll.interval.ms", "300000"),
            ("fetch.wait.max.ms", "20"),
            // 8 MB per partition and fetch (librdkafka's default is 1 MB): with 1 MB the loop
            // waited for fetches once the topic was large (e2e-bench, 5 M signals: 156 K
            // signals/s with 1 MB, 228–241 K with 8 MB).
            ("max.partition.fetch.bytes", FETCH_BYTES_PER_PARTITION),
        ],
    );
    crate::lanes::lane_config(c, lane, cfg.lanes)
}

/// Whether a signals topic's timestamp type may be run on: LogAppendTime always (the broker's
/// clock is stream time), CreateTime only when the operator said so; the error names the
/// setting and both ways out.
pub fn stamp_allowed(topic: &str, stamp: Option<&str>, accept_create_time: bool) -> Result<(), String> {
    match stamp {
        None | Some("LogAppendTime") => Ok(()),
        Some(s) if accept_create_time => {
            tracing::warn!(topic, stamp = s, "the signals topic's records carry their producers' timestamps (--accept-create-time)");
            Ok(())
        }
        Some(s) => Err(format!(
            "the signals topic {topic} has message.timestamp.type={s}: stream time would follow the reporters' clocks \
             (one record stamped an hour ahead moves its partition's clock an hour on, and isolations end an hour early). \
             Set message.timestamp.type=LogAppendTime on the topic (kafka-configs.sh --alter --entity-type topics \
             --entity-name {topic} --add-config message.timestamp.type=LogAppendTime), or start with \
             --accept-create-time true (VITALS_ACCEPT_CREATE_TIME) to run on it anyway"
        )),
    }
}

/// Refuse a signals topic that does not stamp records with the broker's time, unless accepted.
/// A topic that does not exist yet (or a broker that does not describe it) is not refused here.
pub async fn check_stamp(cfg: &Config) -> anyhow::Result<()> {
    let topic = &cfg.topics.signals_topic;
    let stamp = kafka::topic_config(&cfg.kafka, topic, "message.timestamp.type")
        .await
        .unwrap_or_else(|e| {
            tracing::warn!(topic, error = %e, "cannot read the signals topic's configuration");
            None
        });
    stamp_allowed(topic, stamp.as_deref(), cfg.accept_create_time).map_err(anyhow::Error::msg)
}

/// Create the signals, changes, state (compacted) and dead-letter topics if missing.
pub async fn ensure_topics(cfg: &Config) -> anyhow::Result<()> {
    let replication = || TopicReplication::Fixed(cfg.replication_factor);
    let signals = NewTopic::new(&cfg.topics.signals_topic, cfg.partitions, replication())
        // Stream time is the broker's append time: the log, not a gateway's clock, orders time.
        .set("message.timestamp.type", "LogAppendTime");
    let changes = NewTopic::new(&cfg.topics.changes_topic, cfg.partitions, replication());
    let state = NewTopic::new(&cfg.topics.state_topic, cfg.partitions, replication()).set("cleanup.policy", "compact");
    let dlq = NewTopic::new(&cfg.topics.dlq_topic, 1, replication()).set("retention.ms", "1209600000");
    kafka::create_topics(&cfg.kafka, &[&signals, &changes, &state, &dlq]).await
}

#[cfg(test)]
mod tests {
    use super::stamp_allowed;

    #[test]
    fn only_the_brokers_time_is_stream_time_unless_the_operator_accepts_the_producers() {
        assert_eq!(stamp_allowed("s", Some("LogAppendTime"), false), Ok(()));
        assert_eq!(stamp_allowed("s", None, false), Ok(()), "a topic not there yet");
        let e = stamp_allowed("sig", Some("CreateTime"), false).unwrap_err();
        assert!(
            e.contains("the signals topic sig has message.timestamp.type=CreateTime"),
            "{e}"
        );
        assert!(
            e.contains("message.timestamp.type=LogAppendTime") && e.contains("--accept-create-time true"),
            "{e}"
        );
        assert_eq!(stamp_allowed("s", Some("CreateTime"), true), Ok(()));
    }
}
