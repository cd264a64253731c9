//! `vitals-reporter`: what a Rust gateway links to report its calls to vitals.
//!
//! [`Reporter::report`] never blocks and never fails the caller's request: it puts the outcome
//! on a bounded queue and returns. A background thread encodes each outcome (Avro single-object
//! encoding, the contracts' `CallOutcome`) and hands it to an idempotent, batching, compressing
//! Kafka producer keyed by pool. When the queue is full, or the producer's own bounded queue is
//! (Kafka down), the outcome is dropped and counted: memory stays bounded whatever happens.
//! [`Reporter::flush`] at shutdown delivers what is queued. [`CallTimer`] measures a call for the
//! caller (start → first token → end) and classifies its outcome.

mod timer;

pub use timer::{CallResult, CallTimer};

use rdkafka::config::ClientConfig;
use rdkafka::error::KafkaError;
use rdkafka::producer::{BaseRecord, DeliveryResult, Producer, ProducerContext, ThreadedProducer};
use rdkafka::ClientContext;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, SyncSender, TryRecvError, TrySendError};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;
use vitals_contracts::{encode, CallOutcome};

/// How a reporter connects and how much it may hold.
#[derive(Debug, Clone)]
pub struct Config {
    /// Kafka bootstrap servers.
    pub brokers: String,
    /// Extra librdkafka settings (security, tuning); they win over the defaults.
    pub kafka_options: Vec<(String, String)>,
    /// The signals topic.
    pub topic: String,
    /// Outcomes waiting to be encoded; beyond, `report` drops and counts.
    pub queue_capacity: usize,
    /// Encoded outcomes the producer may hold while Kafka is slow or down; beyond, dropped and
    /// counted.
    pub producer_queue_messages: u32,
}

impl Config {
    pub fn new(brokers: impl Into<String>) -> Config {
        Config {
            brokers: brokers.into(),
            kafka_options: Vec::new(),
            topic: vitals_contracts::topics::SIGNALS.to_owned(),
            queue_capacity: 65_536,
            producer_queue_messages: 100_000,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("invalid reporter configuration: {0}")]
    Config(String),
    #[error("cannot create the Kafka producer: {0}")]
    Kafka(#[from] KafkaError),
}

/// What happened to the outcomes reported so far.
#[derive(Debug, Default)]
pub struct Counters {
    /// Accepted by `report`.
    pub reported: AtomicU64,
    /// Dropped by `report`: the queue was full.
    pub dropped_queue_full: AtomicU64,
    /// Dropped after the queue: the producer's queue was full (Kafka slow or down).
    pub dropped_producer_full: AtomicU64,
    /// Dropped: not encodable (a value outside the contract).
    pub dropped_invalid: AtomicU64,
    /// Confirmed by the broker.
    pub delivered: AtomicU64,
    /// Failed after retries (Kafka unreachable for longer than the message timeout).
    pub delivery_failed: AtomicU64,
}

/// A point-in-time copy of the counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Snapshot {
    pub reported: u64,
    pub dropped_queue_full: u64,
    pub dropped_producer_full: u64,
    pub dropped_invalid: u64,
    pub delivered: u64,
    pub delivery_failed: u64,
}

impl Counters {
    pub fn snapshot(&self) -> Snapshot {
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        Snapshot {
            reported: g(&self.reported),
            dropped_queue_full: g(&self.dropped_queue_full),
            dropped_producer_full: g(&self.dropped_producer_full),
            dropped_invalid: g(&self.dropped_invalid),
            delivered: g(&self.delivered),
            delivery_failed: g(&self.delivery_failed),
        }
    }
}

struct Deliveries(Arc<Counters>);

impl ClientContext for Deliveries {}

impl ProducerContext for Deliveries {
    type DeliveryOpaque = ();

    fn delivery(&self, result: &DeliveryResult<'_>, _: ()) {
        let c = match result {
            Ok(_) => &self.0.delivered,
            Err(_) => &self.0.delivery_failed,
        };
        c.fetch_add(1, Ordering::Relaxed);
    }
}

/// How long the worker sleeps when the queue is empty.
const IDLE: Duration = Duration::from_millis(1);

enum Msg {
    Outcome(Box<CallOutcome>),
    Flush(Duration, SyncSender<bool>),
}

/// The reporter. Cheap to share (`Arc<Reporter>`); `report` takes `&self`.
pub struct Reporter {
    tx: SyncSender<Msg>,
    counters: Arc<Counters>,
    worker: Mutex<Option<JoinHandle<()>>>,
}

impl Reporter {
    pub fn new(cfg: Config) -> Result<Reporter, Error> {
        if cfg.queue_capacity == 0 || cfg.topic.is_empty() || cfg.brokers.is_empty() {
            return Err(Error::Config(
                "brokers and topic must be set and queue_capacity above 0".into(),
            ));
        }
        let counters = Arc::new(Counters::default());
        let mut c = ClientConfig::new();
        c.set("bootstrap.servers", &cfg.brokers)
            .set("enable.idempotence", "true")
            .set("acks", "all")
            .set("linger.ms", "5")
            .set("compression.type", "lz4")
            .set("queue.buffering.max.messages", cfg.producer_queue_messages.to_string())
            .set("message.timeout.ms", "30000");
        for (k, v) in &cfg.kafka_options {
            c.set(k, v);
        }
        let producer: ThreadedProducer<Deliveries> = c.create_with_context(Deliveries(counters.clone()))?;
        let (tx, rx) = mpsc::sync_channel(cfg.queue_capacity);
        let worker = {
            let counters = counters.clone();
            let topic = cfg.topic.clone();
            std::thread::Builder::new()
                .name("vitals-reporter".into())
                .spawn(move || work(rx, producer, topic, counters))
                .map_err(|e| Error::Config(format!("cannot start the reporter thread: {e}")))?
        };
        Ok(Reporter {
            tx,
            counters,
            worker: Mutex::new(Some(worker)),
        })
    }

    /// Queue an outcome for Kafka. Never blocks; when the queue is full the outcome is dropped
    /// and counted.
    pub fn report(&self, outcome: CallOutcome) {
        match self.tx.try_send(Msg::Outcome(Box::new(outcome))) {
            Ok(()) => self.counters.reported.fetch_add(1, Ordering::Relaxed),
            Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => {
                self.counters.dropped_queue_full.fetch_add(1, Ordering::Relaxed)
            }
        };
    }

    pub fn counters(&self) -> Snapshot {
        self.counters.snapshot()
    }

    /// Wait (up to `timeout`) until everything reported so far is delivered or has failed.
    /// Returns whether the producer's queue emptied in time.
    pub fn flush(&self, timeout: Duration) -> bool {
        let (ack, done) = mpsc::sync_channel(1);
        if self.tx.send(Msg::Flush(timeout, ack)).is_err() {
            return false;
        }
        done.recv_timeout(timeout + Duration::from_secs(1)).unwrap_or(false)
    }

    /// Flush, then stop the background thread (after it has delivered what is queued).
    pub fn close(self, timeout: Duration) -> bool {
        let flushed = self.flush(timeout);
        let Reporter { tx, worker, .. } = self;
        drop(tx);
        if let Some(w) = worker.into_inner().ok().flatten() {
            let _ = w.join();
        }
        flushed
    }
}

fn work(rx: Receiver<Msg>, producer: ThreadedProducer<Deliveries>, topic: String, counters: Arc<Counters>) {
    loop {
        // The worker never parks on the channel: a parked receiver makes every `report` wake it
        // (a futex call of several µs on the caller's path). It sleeps a millisecond when the
        // queue is empty instead; the producer lingers longer than that anyway.
        let msg = match rx.try_recv() {
            Ok(m) => m,
            Err(TryRecvError::Empty) => {
                std::thread::sleep(IDLE);
                continue;
            }
            Err(TryRecvError::Disconnected) => break,
        };
        match msg {
            Msg::Outcome(o) => {
                let bytes = match encode(o.as_ref()) {
                    Ok(b) => b,
                    Err(_) => {
                        counters.dropped_invalid.fetch_add(1, Ordering::Relaxed);
                        continue;
                    }
                };
                let record = BaseRecord::to(&topic).key(o.pool.as_bytes()).payload(&bytes);
                if producer.send(record).is_err() {
                    // The producer's queue is full (Kafka slow or down): drop rather than grow.
                    counters.dropped_producer_full.fetch_add(1, Ordering::Relaxed);
                }
            }
            Msg::Flush(timeout, ack) => {
                let ok = producer.flush(timeout).is_ok();
                let _ = ack.try_send(ok);
            }
        }
    }
    let _ = producer.flush(Duration::from_secs(5));
}
