//! Where probe results go: the signals topic (Avro, keyed by pool, idempotent producer), or a
//! channel in tests.

use crate::metrics::Metrics;
use rdkafka::producer::{FutureProducer, FutureRecord};
use std::sync::Arc;
use vitals_contracts::{encode, ProbeResult};

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

/// Whether results reach the broker: what `/readyz` reads. Not ready when the latest delivery
/// failed (a timeout counts), or when results have waited for the broker longer than
/// [`Deliveries::PATIENCE`] with none delivered.
#[derive(Default)]
pub struct Deliveries {
    pending: std::sync::atomic::AtomicI64,
    /// Unix ms of the latest delivered result, of the latest failure, and of when results
    /// started waiting (pending went from 0).
    last_ok: std::sync::atomic::AtomicI64,
    last_failed: std::sync::atomic::AtomicI64,
    waiting_since: std::sync::atomic::AtomicI64,
    /// Unix ms of the latest failure logged (at most one line every 10 s).
    logged: std::sync::atomic::AtomicI64,
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

impl Deliveries {
    pub const PATIENCE: std::time::Duration = std::time::Duration::from_secs(15);

    pub fn queued(&self) {
        use std::sync::atomic::Ordering::Relaxed;
        if self.pending.fetch_add(1, Relaxed) == 0 {
            self.waiting_since.store(now_ms(), Relaxed);
        }
    }

    pub fn delivered(&self) {
        use std::sync::atomic::Ordering::Relaxed;
        self.pending.fetch_sub(1, Relaxed);
        self.last_ok.store(now_ms(), Relaxed);
        self.waiting_since.store(now_ms(), Relaxed);
    }

    pub fn failed(&self, error: &dyn std::fmt::Display) {
        use std::sync::atomic::Ordering::Relaxed;
        self.pending.fetch_sub(1, Relaxed);
        let now = now_ms();
        self.last_failed.store(now, Relaxed);
        let logged = self.logged.load(Relaxed);
        if now - logged >= 10_000 && self.logged.compare_exchange(logged, now, Relaxed, Relaxed).is_ok() {
            tracing::warn!(error = %error, "probe results are not delivered to the broker");
        }
    }

    /// Why results are not being delivered, if they are not.
    pub fn problem(&self) -> Option<&'static str> {
        use std::sync::atomic::Ordering::Relaxed;
        let (ok, failed) = (self.last_ok.load(Relaxed), self.last_failed.load(Relaxed));
        if failed > ok {
            return Some("probe results are not delivered: the latest delivery to the broker failed");
        }
        let waiting = now_ms() - self.waiting_since.load(Relaxed).max(ok);
        (self.pending.load(Relaxed) > 0 && waiting > Self::PATIENCE.as_millis() as i64)
            .then_some("probe results have waited for the broker for over 15 s")
    }
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
        match self.producer.send_result(record) {
            Ok(delivery) => {
                let metrics = self.metrics.clone();
                metrics.deliveries.queued();
                tokio::spawn(async move {
                    match delivery.await {
                        Ok(Ok(_)) => {
                            metrics.published.inc();
                            metrics.deliveries.delivered();
                        }
                        Ok(Err((e, _))) => {
                            metrics.publish_failed.inc();
                            metrics.deliveries.failed(&e);
                        }
                        Err(_) => {
                            metrics.publish_failed.inc();
                            metrics.deliveries.failed(&"the delivery was cancelled");
                        }
                    }
                });
            }
            Err((e, _)) => {
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

#[cfg(test)]
mod tests {
    use super::Deliveries;

    #[test]
    fn readiness_follows_the_latest_delivery() {
        let d = Deliveries::default();
        assert_eq!(d.problem(), None, "nothing sent yet");
        d.queued();
        assert_eq!(d.problem(), None, "waiting, not for long");
        d.failed(&"Local: Message timed out");
        assert!(d.problem().unwrap().contains("failed"));
        d.queued();
        d.delivered();
        assert_eq!(d.problem(), None, "delivered again");
    }
}
