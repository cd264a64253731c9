//! Where probe results go: the signals topic (Avro, keyed by pool, idempotent producer), or a
//! channel in tests.

use crate::metrics::Metrics;
use rdkafka::producer::{FutureProducer, FutureRecord};
use std::sync::Arc;
use vitals_contracts::{encode, ProbeResult};
use vitals_runtime::produce;

pub trait Sink: Send + Sync + 'static {
    fn publish(&self, result: ProbeResult);
    /// Wait up to `timeout` for what is queued to be delivered.
    fn flush(&self, _timeout: std::time::Duration) {}
}

pub struct KafkaSink {
    pub producer: FutureProducer,
    pub topic: String,
    pub metrics: Arc<Metrics>,
}

impl Sink for KafkaSink {
    fn publish(&self, r: ProbeResult) {
        let bytes = match encode(&r) {
            Ok(b) => b,
            Err(e) => {
                tracing::error!(error = %e, target = %r.probe_id, "cannot encode a probe result");
                self.metrics.publish_failed.inc();
                return;
            }
        };
        let record = FutureRecord::to(&self.topic).key(r.pool.as_bytes()).payload(&bytes);
        match produce::try_queue(&self.producer, record) {
            Ok(delivery) => {
                let metrics = self.metrics.clone();
                metrics.deliveries.queued();
                tokio::spawn(async move {
                    match produce::delivered(delivery).await {
                        Ok(_) => {
                            metrics.published.inc();
                            metrics.deliveries.delivered();
                        }
                        Err(e) => {
                            metrics.publish_failed.inc();
                            metrics.deliveries.failed(&e);
                        }
                    }
                });
            }
            Err(e) => {
                tracing::warn!(error = %e, "probe result not queued");
                self.metrics.publish_failed.inc();
            }
        }
    }

    fn flush(&self, timeout: std::time::Duration) {
        use rdkafka::producer::Producer;
        if let Err(e) = self.producer.flush(timeout) {
            tracing::warn!(error = %e, "probe results not delivered at shutdown");
        }
    }
}

/// A sink for tests: every result into a channel.
pub struct ChannelSink(pub tokio::sync::mpsc::UnboundedSender<ProbeResult>);

impl Sink for ChannelSink {
    fn publish(&self, r: ProbeResult) {
        let _ = self.0.send(r);
    }
}
