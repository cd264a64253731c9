//! One builder of librdkafka settings: brokers, then our defaults for the client's role, then
//! the user's pass-through options (security, tuning), which win over the defaults.

use crate::args::KafkaArgs;
use rdkafka::consumer::{Consumer, ConsumerContext};
use rdkafka::error::KafkaResult;
use rdkafka::ClientConfig;
use std::time::Duration;

/// Settings with `defaults` for this client's role.
pub fn config(kafka: &KafkaArgs, defaults: &[(&str, &str)]) -> ClientConfig {
    let mut c = ClientConfig::new();
    c.set("bootstrap.servers", &kafka.brokers);
    for (k, v) in defaults.iter().copied().chain(kafka.pairs()) {
        c.set(k, v);
    }
    c
}

/// The defaults of an idempotent producer: retries never duplicate or reorder within a
/// partition, and a record counts as written when every in-sync replica has it.
const IDEMPOTENT_PRODUCER: [(&str, &str); 3] = [("enable.idempotence", "true"), ("acks", "all"), ("linger.ms", "2")];

/// An idempotent producer with `extra` defaults (timeouts, queue sizes, compression).
pub fn producer(kafka: &KafkaArgs, extra: &[(&str, &str)]) -> ClientConfig {
    let defaults: Vec<(&str, &str)> = IDEMPOTENT_PRODUCER.iter().chain(extra).copied().collect();
    config(kafka, &defaults)
}

/// A consumer that never commits to Kafka (positions live elsewhere: Postgres, or the client's
/// `Last-Event-ID`), with `extra` defaults; `group` is its group id.
pub fn consumer(kafka: &KafkaArgs, group: &str, extra: &[(&str, &str)]) -> ClientConfig {
    let mut defaults = vec![("enable.auto.commit", "false"), ("enable.auto.offset.store", "false")];
    defaults.extend_from_slice(extra);
    let mut c = config(kafka, &defaults);
    c.set("group.id", group);
    c
}

/// Create `topics` where they are missing (one that exists is left as it is).
/// A topic's configuration value (`message.timestamp.type`, …) as the broker reports it; `None`
/// when the topic does not exist or the broker does not say.
pub async fn topic_config(kafka: &KafkaArgs, topic: &str, name: &str) -> anyhow::Result<Option<String>> {
    use rdkafka::admin::{AdminClient, AdminOptions, ResourceSpecifier};
    use rdkafka::client::DefaultClientContext;
    let admin: AdminClient<DefaultClientContext> = config(kafka, &[]).create()?;
    let opts = AdminOptions::new().request_timeout(Some(Duration::from_secs(30)));
    let described = admin
        .describe_configs([&ResourceSpecifier::Topic(topic)], &opts)
        .await?;
    Ok(described
        .into_iter()
        .filter_map(Result::ok)
        .find_map(|r| r.get(name).and_then(|e| e.value.clone())))
}

pub async fn create_topics(kafka: &KafkaArgs, topics: &[&rdkafka::admin::NewTopic<'_>]) -> anyhow::Result<()> {
    use rdkafka::admin::{AdminClient, AdminOptions};
    use rdkafka::client::DefaultClientContext;
    use rdkafka::types::RDKafkaErrorCode;
    let admin: AdminClient<DefaultClientContext> = config(kafka, &[]).create()?;
    let opts = AdminOptions::new().operation_timeout(Some(Duration::from_secs(30)));
    for r in admin.create_topics(topics.iter().copied(), &opts).await? {
        match r {
            Ok(t) => tracing::info!(topic = %t, "created topic"),
            Err((t, RDKafkaErrorCode::TopicAlreadyExists)) => tracing::debug!(topic = %t, "topic exists"),
            Err((t, e)) => anyhow::bail!("cannot create topic {t}: {e}"),
        }
    }
    Ok(())
}

/// The partitions of `topic` as the broker knows them (none if it does not know the topic).
/// A blocking call: from async code, run it with `spawn_blocking`.
pub fn partitions<C: ConsumerContext>(
    consumer: &impl Consumer<C>,
    topic: &str,
    timeout: Duration,
) -> KafkaResult<Vec<i32>> {
    let md = consumer.fetch_metadata(Some(topic), timeout)?;
    Ok(md
        .topics()
        .iter()
        .filter(|t| t.name() == topic)
        .flat_map(|t| t.partitions().iter().map(|p| p.id()))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_users_options_win_over_the_defaults() {
        let k = KafkaArgs {
            brokers: "b:9092".into(),
            kafka_options: vec!["acks=1".into(), "security.protocol=SASL_SSL".into()],
        };
        let c = producer(&k, &[("linger.ms", "5")]);
        assert_eq!(c.get("bootstrap.servers"), Some("b:9092"));
        assert_eq!(c.get("acks"), Some("1"));
        assert_eq!(c.get("enable.idempotence"), Some("true"));
        assert_eq!(c.get("linger.ms"), Some("5"));
        assert_eq!(c.get("security.protocol"), Some("SASL_SSL"));
        let c = consumer(&k, "g", &[]);
        assert_eq!(
            (c.get("group.id"), c.get("enable.auto.commit")),
            (Some("g"), Some("false"))
        );
    }
}
