//! The health view from Kafka, with no consumer group (every instance reads everything): the
//! compacted state topic from its beginning (the latest state of every endpoint), then followed;
//! and the call outcomes on the signals topic from its end.

use crate::metrics::Metrics;
use crate::view::CadenceView;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::{ClientConfig, Message, Offset, TopicPartitionList};
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use vitals_contracts::codec::peek_kind;
use vitals_contracts::{decode, decode_signal, EndpointState, OutcomeClass, SchemaKind, Signal};

/// Assign every partition of `topic` at `from`; false if the topic has none (yet).
fn assign_all(consumer: &BaseConsumer, topic: &str, from: Offset) -> bool {
    match vitals_runtime::kafka::partitions(consumer, topic, Duration::from_secs(5)) {
        Ok(parts) => {
            let mut tpl = TopicPartitionList::new();
            for p in parts {
                let _ = tpl.add_partition_offset(topic, p, from);
            }
            tpl.count() > 0 && consumer.assign(&tpl).is_ok()
        }
        Err(e) => {
            tracing::warn!(error = %e, topic = %topic, "metadata");
            false
        }
    }
}

/// Read every partition of `topic` from `from` until `cancel`, handing each payload to `each`.
fn follow_topic(
    config: ClientConfig,
    topic: String,
    from: Offset,
    mut each: impl FnMut(&[u8]) + Send + 'static,
    cancel: CancellationToken,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let consumer: BaseConsumer = match config.create() {
            Ok(c) => c,
            Err(e) => {
                tracing::error!(error = %e, topic = %topic, "cannot create a consumer");
                return;
            }
        };
        let mut assigned = false;
        while !cancel.is_cancelled() {
            if !assigned {
                assigned = assign_all(&consumer, &topic, from);
                if !assigned {
                    std::thread::sleep(Duration::from_millis(500));
                }
                continue;
            }
            match consumer.poll(Duration::from_millis(200)) {
                Some(Ok(m)) => {
                    if let Some(p) = m.payload() {
                        each(p);
                    }
                }
                Some(Err(e)) => tracing::warn!(error = %e, topic = %topic, "consumer"),
                None => {}
            }
        }
    })
}

/// Follow the gateways' call outcomes on the signals topic (from its end): which endpoints carry
/// traffic, and which get first-token times from it. Probe results (ours) are skipped by their
/// schema fingerprint before any decoding.
pub fn follow_traffic(
    config: ClientConfig,
    topic: String,
    view: Arc<CadenceView>,
    cancel: CancellationToken,
) -> std::thread::JoinHandle<()> {
    let each = move |p: &[u8]| {
        if peek_kind(p) != Ok(SchemaKind::CallOutcome) {
            return;
        }
        if let Ok(Signal::Call(c)) = decode_signal(p) {
            let with_ttft = c.ttft_us.is_some() && c.outcome == OutcomeClass::Success;
            view.saw_call(&c.pool, &c.endpoint, with_ttft);
        }
    };
    follow_topic(config, topic, Offset::End, each, cancel)
}

/// Follow the compacted state topic from its beginning: every endpoint's latest state, then
/// each change.
pub fn follow(
    config: ClientConfig,
    topic: String,
    view: Arc<CadenceView>,
    metrics: Arc<Metrics>,
    cancel: CancellationToken,
) -> std::thread::JoinHandle<()> {
    let each = move |p: &[u8]| {
        if let Ok(state) = decode::<EndpointState>(p) {
            view.set(&state.pool, &state.endpoint, state.state);
            metrics.fast_endpoints.set(view.fast_count() as i64);
        }
    };
    follow_topic(config, topic, Offset::Beginning, each, cancel)
}
