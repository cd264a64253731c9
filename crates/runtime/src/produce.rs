//! One way to produce to Kafka, for every vitals program that does (the API's operator actions
//! and ingest, the merger, the reporter, the processor's relay and ticker, the prober).
//!
//! librdkafka's errors fall in three kinds, as Vector's Kafka sink sorts them
//! (`src/sinks/kafka/service.rs`): the producer's own queue is full (wait for room: nothing is
//! wrong but load); Kafka cannot take the record now (retry later); or Kafka refuses this
//! record as such, or the producer can never produce again (retrying cannot help: say so, count
//! it, never spin on it). [`classify`] is that rule, in one place; [`queue`],
//! [`queue_blocking`] and [`delivered`] apply it.

use rdkafka::error::{KafkaError, RDKafkaErrorCode as Code};
use rdkafka::message::ToBytes;
use rdkafka::producer::{BaseRecord, DeliveryFuture, FutureProducer, FutureRecord, ProducerContext, ThreadedProducer};
use std::time::{Duration, Instant};

/// What a failed produce means for the record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    /// The producer's local queue is full: wait for room, then send again.
    QueueFull,
    /// Kafka cannot take it now (unreachable, timed out, a leader moving, the delivery
    /// cancelled by a closing producer): retry later.
    Retriable,
    /// Kafka refuses this record as such (too large, invalid, not authorized), or the producer
    /// is fenced or failed for good: retrying the same record cannot help.
    Final,
}

/// A produce that failed: its kind, and librdkafka's error (for the log, never for clients).
#[derive(Debug)]
pub struct ProduceError {
    pub failure: Failure,
    pub error: KafkaError,
}

impl std::fmt::Display for ProduceError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({})", self.advice(), self.error)
    }
}

impl std::error::Error for ProduceError {}

impl From<KafkaError> for ProduceError {
    fn from(error: KafkaError) -> ProduceError {
        ProduceError {
            failure: classify(&error),
            error,
        }
    }
}

impl ProduceError {
    /// Whether sending the same record again may succeed.
    pub fn is_retriable(&self) -> bool {
        self.failure != Failure::Final
    }

    /// What a client is told: what to do about it, in our words, not librdkafka's.
    pub fn advice(&self) -> &'static str {
        match (self.failure, self.error.rdkafka_error_code()) {
            (Failure::QueueFull, _) => "the producer queue is full; retry",
            (Failure::Final, Some(c)) if record_refused(c) => "the broker refuses this record; do not retry it",
            (Failure::Final, _) => "Kafka refuses this producer; do not retry until it is fixed",
            (Failure::Retriable, Some(Code::MessageTimedOut | Code::RequestTimedOut)) => {
                "Kafka did not answer in time; retry"
            }
            (Failure::Retriable, _) => "Kafka is unavailable; retry",
        }
    }
}

/// The codes with which the broker refuses a record for what it is.
fn record_refused(c: Code) -> bool {
    matches!(
        c,
        Code::MessageSizeTooLarge
            | Code::InvalidMessageSize
            | Code::InvalidMessage
            | Code::InvalidRecord
            | Code::MessageBatchTooLarge
            | Code::InvalidRequiredAcks
    )
}

/// The kind of a produce error (see [`Failure`]).
pub fn classify(e: &KafkaError) -> Failure {
    if let KafkaError::Transaction(t) = e {
        return if t.is_fatal() {
            Failure::Final
        } else {
            Failure::Retriable
        };
    }
    if matches!(e, KafkaError::Canceled) {
        return Failure::Retriable;
    }
    match e.rdkafka_error_code() {
        Some(Code::QueueFull) => Failure::QueueFull,
        Some(c) if record_refused(c) => Failure::Final,
        Some(
            Code::TopicAuthorizationFailed
            | Code::ClusterAuthorizationFailed
            | Code::TransactionalIdAuthorizationFailed
            | Code::ProducerFenced
            | Code::InvalidProducerEpoch
            | Code::Fenced
            | Code::Fatal
            | Code::UnsupportedVersion
            | Code::UnsupportedForMessageFormat,
        ) => Failure::Final,
        _ => Failure::Retriable,
    }
}

/// How long to wait for room in a full producer queue: `None` as long as it takes (a stage
/// that reads no faster than the broker takes), or up to a time (a caller that must answer).
fn room_left(deadline: Option<Instant>) -> bool {
    deadline.is_none_or(|d| Instant::now() < d)
}

/// Queue a record on an async producer (without waiting for its delivery: see [`delivered`]).
/// A full queue is waited on for up to `wait` (None: as long as it takes; `Some(ZERO)`: not
/// at all); any other error comes back at once, classified.
pub async fn queue<K, P>(
    producer: &FutureProducer,
    mut record: FutureRecord<'_, K, P>,
    wait: Option<Duration>,
) -> Result<DeliveryFuture, ProduceError>
where
    K: ToBytes + ?Sized,
    P: ToBytes + ?Sized,
{
    let deadline = wait.map(|w| Instant::now() + w);
    loop {
        match producer.send_result(record) {
            Ok(d) => return Ok(d),
            Err((e, r)) => {
                let e = ProduceError::from(e);
                if e.failure != Failure::QueueFull || !room_left(deadline) {
                    return Err(e);
                }
                record = r;
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
    }
}

/// Queue a record without waiting at all (from code that cannot await: the prober's sink).
pub fn try_queue<K, P>(
    producer: &FutureProducer,
    record: FutureRecord<'_, K, P>,
) -> Result<DeliveryFuture, ProduceError>
where
    K: ToBytes + ?Sized,
    P: ToBytes + ?Sized,
{
    producer.send_result(record).map_err(|(e, _)| ProduceError::from(e))
}

/// Where a queued record was written: (partition, offset), or why it was not.
pub async fn delivered(d: DeliveryFuture) -> Result<(i32, i64), ProduceError> {
    match d.await {
        Ok(Ok(d)) => Ok((d.partition, d.offset)),
        Ok(Err((e, _))) => Err(e.into()),
        Err(_) => Err(KafkaError::Canceled.into()),
    }
}

/// Queue a record on a producer with its own polling thread, from a thread that may block (the
/// reporter's worker, the merger's loop). A full queue is waited on as [`queue`] does.
pub fn queue_blocking<C, K, P>(
    producer: &ThreadedProducer<C>,
    mut record: BaseRecord<'_, K, P, C::DeliveryOpaque>,
    wait: Option<Duration>,
) -> Result<(), ProduceError>
where
    C: ProducerContext + 'static,
    K: ToBytes + ?Sized,
    P: ToBytes + ?Sized,
{
    let deadline = wait.map(|w| Instant::now() + w);
    loop {
        match producer.send(record) {
            Ok(()) => return Ok(()),
            Err((e, r)) => {
                let e = ProduceError::from(e);
                if e.failure != Failure::QueueFull || !room_left(deadline) {
                    return Err(e);
                }
                record = r;
                std::thread::sleep(Duration::from_millis(1));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_error_falls_in_one_kind_and_tells_the_client_what_to_do() {
        let p = |c: Code| ProduceError::from(KafkaError::MessageProduction(c));
        assert_eq!(p(Code::QueueFull).failure, Failure::QueueFull);
        assert!(p(Code::QueueFull).is_retriable());
        for c in [
            Code::MessageSizeTooLarge,
            Code::InvalidMessage,
            Code::MessageBatchTooLarge,
        ] {
            assert_eq!(p(c).failure, Failure::Final, "{c:?}");
            assert_eq!(p(c).advice(), "the broker refuses this record; do not retry it");
        }
        for c in [Code::TopicAuthorizationFailed, Code::ProducerFenced, Code::Fatal] {
            assert_eq!(p(c).failure, Failure::Final, "{c:?}");
            assert!(!p(c).is_retriable());
        }
        for c in [
            Code::MessageTimedOut,
            Code::BrokerTransportFailure,
            Code::AllBrokersDown,
            Code::NotLeaderForPartition,
            Code::UnknownTopicOrPartition,
        ] {
            assert_eq!(p(c).failure, Failure::Retriable, "{c:?}");
        }
        assert_eq!(p(Code::MessageTimedOut).advice(), "Kafka did not answer in time; retry");
        assert_eq!(p(Code::AllBrokersDown).advice(), "Kafka is unavailable; retry");
        assert_eq!(ProduceError::from(KafkaError::Canceled).failure, Failure::Retriable);
    }

    /// A real producer (no broker: nothing is sent) with a queue of one record: the second
    /// record finds it full, waits as long as it is told, then says so.
    #[tokio::test]
    async fn a_full_queue_is_waited_on_as_long_as_asked_then_reported() {
        let producer: FutureProducer = rdkafka::ClientConfig::new()
            .set("bootstrap.servers", "127.0.0.1:1")
            .set("queue.buffering.max.messages", "1")
            .set("message.timeout.ms", "60000")
            .create()
            .unwrap();
        let first = queue(
            &producer,
            FutureRecord::<(), _>::to("t").payload("a"),
            Some(Duration::ZERO),
        )
        .await;
        assert!(first.is_ok());
        let started = Instant::now();
        let second = queue(
            &producer,
            FutureRecord::<(), _>::to("t").payload("b"),
            Some(Duration::from_millis(50)),
        )
        .await;
        let e = second.err().expect("the queue holds one record");
        assert_eq!(e.failure, Failure::QueueFull);
        assert!(started.elapsed() >= Duration::from_millis(50), "waited for room first");
        let threaded: ThreadedProducer<rdkafka::producer::DefaultProducerContext> = rdkafka::ClientConfig::new()
            .set("bootstrap.servers", "127.0.0.1:1")
            .set("queue.buffering.max.messages", "1")
            .create()
            .unwrap();
        assert!(queue_blocking(
            &threaded,
            BaseRecord::<(), _>::to("t").payload("a"),
            Some(Duration::ZERO)
        )
        .is_ok());
        let e = queue_blocking(
            &threaded,
            BaseRecord::<(), _>::to("t").payload("b"),
            Some(Duration::ZERO),
        )
        .unwrap_err();
        assert_eq!(e.failure, Failure::QueueFull);
    }
}
