//! The health view from the compacted state topic: every partition read from its beginning (the
//! latest state of every endpoint), then followed. No consumer group: every instance reads all.

use crate::metrics::Metrics;
use crate::view::HealthView;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::{ClientConfig, Message, Offset, TopicPartitionList};
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use vitals_contracts::{decode, EndpointState};

pub fn follow(
    config: ClientConfig,
    topic: String,
    view: Arc<HealthView>,
    metrics: Arc<Metrics>,
    cancel: CancellationToken,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let consumer: BaseConsumer = match config.create() {
            Ok(c) => c,
            Err(e) => {
                tracing::error!(error = %e, "cannot create the state consumer");
                return;
            }
        };
        let mut assigned = false;
        while !cancel.is_cancelled() {
            if !assigned {
                match consumer.fetch_metadata(Some(&topic), Duration::from_secs(5)) {
                    Ok(md) => {
                        let mut tpl = TopicPartitionList::new();
                        for t in md.topics().iter().filter(|t| t.name() == topic) {
                            for p in t.partitions() {
                                let _ = tpl.add_partition_offset(&topic, p.id(), Offset::Beginning);
                            }
                        }
                        if tpl.count() > 0 && consumer.assign(&tpl).is_ok() {
                            assigned = true;
                        } else {
                            std::thread::sleep(Duration::from_millis(500));
                        }
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, topic = %topic, "state topic metadata");
                        std::thread::sleep(Duration::from_millis(500));
                    }
                }
                continue;
            }
            match consumer.poll(Duration::from_millis(200)) {
                Some(Ok(m)) => {
                    if let Some(state) = m.payload().and_then(|p| decode::<EndpointState>(p).ok()) {
                        view.set(&state.pool, &state.endpoint, state.state);
                        metrics.fast_endpoints.set(view.fast_count() as i64);
                    }
                }
                Some(Err(e)) => tracing::warn!(error = %e, "state consumer"),
                None => {}
            }
        }
    })
}
