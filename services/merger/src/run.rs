//! The merger's loop: consume an interval of the gateway-signals topic, merge it, and commit the
//! merged records with the offsets they consumed in one Kafka transaction.

use crate::{calls_in, Counters, Merge};
use anyhow::Context as _;
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext, Rebalance};
use rdkafka::error::KafkaError;
use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};
use rdkafka::topic_partition_list::{Offset, TopicPartitionList};
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::{ClientContext, Message};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::time::{Duration, Instant};
use vitals_contracts::clock::now_us;
use vitals_contracts::{decode_signal, encode_signal, validate_signal, Signal};
use vitals_runtime::args::KafkaArgs;
use vitals_runtime::kafka;
use vitals_runtime::produce;

/// What a merger reads, writes and how it sums.
#[derive(Clone, Debug)]
pub struct Settings {
    pub kafka: KafkaArgs,
    /// The gateway-signals topic (keyed by endpoint).
    pub input: String,
    /// The signals topic the processor reads.
    pub output: String,
    /// Where input that is no valid signal goes.
    pub dlq: String,
    pub group: String,
    /// Stable per merger instance (a pod's name): a restarted merger aborts what its previous
    /// run left open at once, instead of after the transaction timeout.
    pub transactional_id: String,
    /// One interval = one transaction.
    pub interval: Duration,
    /// Failures of one endpoint per interval sent one by one, whatever gateway reported them.
    pub failure_cap: u32,
    /// Endpoints with an open summary at most; beyond, records go on as they came.
    pub max_open: usize,
    /// The gateway name merged summaries carry.
    pub gateway: String,
}

/// Rebalances seen by the consumer: the transaction under way holds records of partitions
/// this merger may no longer own, so it is aborted.
struct Ctx {
    rebalanced: AtomicBool,
}

impl ClientContext for Ctx {}

impl ConsumerContext for Ctx {
    fn pre_rebalance(&self, _: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        tracing::info!(?rebalance, "rebalance");
        self.rebalanced.store(true, Relaxed);
    }
}

const TXN_TIMEOUT: Duration = Duration::from_secs(30);

/// Records taken without waiting between two reads of the clock.
const CLOCK_EVERY: u32 = 64;

/// Run until `stop`; an error is a fatal one (the producer fenced by a newer merger with the
/// same transactional id, the broker unreachable at start).
pub fn run(s: &Settings, stop: &AtomicBool, counters: &Counters, ready: &AtomicBool) -> anyhow::Result<()> {
    let ctx = Ctx {
        rebalanced: AtomicBool::new(false),
    };
    let consumer: BaseConsumer<Ctx> = kafka::consumer(
        &s.kafka,
        &s.group,
        &[
            ("isolation.level", "read_committed"),
            ("auto.offset.reset", "earliest"),
            // Static membership: a restarted merger takes its partitions back at once; one that
            // does not come back gives them up after 6 s (the broker's minimum), during which
            // its endpoints' records wait.
            ("group.instance.id", &s.transactional_id),
            ("session.timeout.ms", "6000"),
            // Fetch in larger pieces at a steady rate: a response waits for 64 KiB or 20 ms
            // (under a tenth of an interval), where each record could wake the merger alone.
            ("fetch.min.bytes", "65536"),
            ("fetch.wait.max.ms", "20"),
        ],
    )
    .create_with_context(ctx)
    .context("creating the consumer")?;
    consumer.subscribe(&[&s.input]).context("subscribing")?;
    // A transaction outlives a stuck merger by at most this long (the processor's partitions
    // wait behind an open transaction).
    let producer: ThreadedProducer<DefaultProducerContext> = kafka::producer(
        &s.kafka,
        &[
            ("transactional.id", &s.transactional_id),
            ("transaction.timeout.ms", "10000"),
            // Nothing produced is read before the commit (the processor reads committed
            // records), which sends what waits: records wait for a fuller batch at no cost
            // to anyone, and each batch begins an LZ4 frame (a 64 KiB table cleared: at 5 ms,
            // 4 % of the merger's instructions).
            ("linger.ms", "100"),
            ("compression.type", "lz4"),
            // A failed delivery fails the commit; a delivered record needs no report.
            ("delivery.report.only.error", "true"),
        ],
    )
    .create()
    .context("creating the transactional producer")?;
    producer
        .init_transactions(TXN_TIMEOUT)
        .context("initialising transactions (is the broker up?)")?;
    ready.store(true, Relaxed);
    // Ids unique to this run: a restarted merger must not reuse its predecessor's.
    let instance = format!("{}.{:x}", s.transactional_id, now_us());
    let mut out = Vec::new();
    // One merge for the run: each commit flushes it (the endpoints' map keeps its room), an
    // abort starts it again. Input offsets of the transaction, by partition of `s.input`.
    let mut merge = Merge::new(s.failure_cap, s.max_open, &instance, &s.gateway);
    let mut positions: BTreeMap<i32, i64> = BTreeMap::new();
    // The gateways' clocks against this merger's, for the run (a rebalance keeps them).
    let mut clocks = vitals_contracts::lateness::Clocks::default();
    while !stop.load(Relaxed) {
        producer.begin_transaction().context("beginning a transaction")?;
        positions.clear();
        // The transaction's time: the merge's intervals are cut by commits, not by it, and the
        // summaries take their times from the calls.
        let now = now_us();
        let began = Instant::now();
        let end = began + s.interval;
        let mut rebalanced = false;
        // While records come, they are taken without waiting, and the clock is read once in
        // `CLOCK_EVERY` of them: a poll that may wait reads librdkafka's clock too, and clock
        // reads were 8 % of the merger's CPU when every record had its own.
        let (mut at_poll, mut unclocked, mut flowing) = (began, 0u32, false);
        loop {
            // The wall time a gateway's clock is judged against is the transaction's start plus
            // the monotonic time since, read before and after a poll that may wait, and then
            // once in `CLOCK_EVERY` records taken without waiting (early by their handling, far
            // under the 10 s a clock must be off by).
            if !flowing || unclocked >= CLOCK_EVERY {
                at_poll = Instant::now();
                unclocked = 0;
            }
            unclocked += 1;
            let left = end.saturating_duration_since(at_poll);
            if left.is_zero() || stop.load(Relaxed) {
                break;
            }
            let wall = now.saturating_add(i64::try_from((at_poll - began).as_micros()).unwrap_or(i64::MAX));
            let polled = if flowing {
                consumer.poll(Duration::ZERO)
            } else {
                // The next record is judged after this wait.
                unclocked = CLOCK_EVERY;
                consumer.poll(left)
            };
            flowing = matches!(polled, Some(Ok(_)));
            if consumer.context().rebalanced.swap(false, Relaxed) {
                rebalanced = true;
            }
            match polled {
                None => {}
                Some(Err(e)) => tracing::warn!(error = %e, "consumer"),
                Some(Ok(m)) => {
                    positions.insert(m.partition(), m.offset() + 1);
                    counters.records_in.inc();
                    // Checked as the processor checks it (against the record's time), so that
                    // one bad record is dead-lettered alone, not merged into a summary that
                    // the processor would refuse whole.
                    let at = m.timestamp().to_millis().map_or(now, |ms| ms.saturating_mul(1000));
                    match admit(m.payload().unwrap_or_default(), at) {
                        Ok(mut sig) => {
                            counters.calls_in.inc_by(calls_in(&sig));
                            if let Some(change) = crate::in_time(&mut clocks, &mut sig, wall) {
                                counters.clock(&change);
                            }
                            merge.take(sig, now, &mut out);
                        }
                        Err((code, why)) => {
                            let counter = match code {
                                "invalid_value" => &counters.invalid,
                                _ => &counters.undecodable,
                            };
                            counter.inc();
                            dead_letter(&producer, s, &m, code, &why)?;
                        }
                    }
                    send_all(&producer, &s.output, &mut out, counters)?;
                }
            }
            if rebalanced {
                break;
            }
        }
        if rebalanced {
            merge = Merge::new(s.failure_cap, s.max_open, &instance, &s.gateway);
            abort_and_rewind(&producer, &consumer, counters, ready)?;
            continue;
        }
        counters.open_endpoints.set(merge.open() as i64);
        merge.flush(&mut out);
        send_all(&producer, &s.output, &mut out, counters)?;
        match commit(&producer, &consumer, &s.input, &positions) {
            Ok(()) => {
                counters.transactions.inc();
                counters.last_commit_seconds.set(now_us() / 1_000_000);
            }
            Err(KafkaError::Transaction(e)) if e.is_fatal() => {
                return Err(anyhow::anyhow!(
                    "fatal transaction error (fenced by another merger?): {e}"
                ));
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot commit; aborting the interval and reading it again");
                abort_and_rewind(&producer, &consumer, counters, ready)?;
            }
        }
    }
    // Stopping: what is open is aborted (nothing committed is lost; the next merger reads it).
    let _ = producer.abort_transaction(TXN_TIMEOUT);
    Ok(())
}

/// An input record as a signal the processor accepts, or why not: (the dead-letter code the
/// processor would give it, the reason).
pub fn admit(payload: &[u8], at: vitals_contracts::Micros) -> Result<Signal, (&'static str, String)> {
    let sig = decode_signal(payload).map_err(|e| (e.code(), e.to_string()))?;
    validate_signal(&sig, Some(at)).map_err(|e| ("invalid_value", e.to_string()))?;
    Ok(sig)
}

/// An input record that is no valid signal: to the dead-letter topic, in the transaction that
/// consumes it, with its origin and the reason in the processor's headers.
fn dead_letter(
    producer: &ThreadedProducer<DefaultProducerContext>,
    s: &Settings,
    m: &rdkafka::message::BorrowedMessage<'_>,
    code: &str,
    why: &str,
) -> anyhow::Result<()> {
    use rdkafka::message::{Header, OwnedHeaders};
    let (partition, offset) = (m.partition().to_string(), m.offset().to_string());
    let why: String = why.chars().take(1000).collect();
    let headers = OwnedHeaders::new()
        .insert(Header {
            key: "vitals-origin-topic",
            value: Some(s.input.as_str()),
        })
        .insert(Header {
            key: "vitals-origin-partition",
            value: Some(partition.as_str()),
        })
        .insert(Header {
            key: "vitals-origin-offset",
            value: Some(offset.as_str()),
        })
        .insert(Header {
            key: "vitals-error-code",
            value: Some(code),
        })
        .insert(Header {
            key: "vitals-error",
            value: Some(why.as_str()),
        });
    let payload = m.payload().unwrap_or_default();
    let mut record = BaseRecord::to(&s.dlq).payload(payload).headers(headers);
    if let Some(k) = m.key() {
        record = record.key(k);
    }
    send_waiting(producer, record).context("producing a dead letter")
}

/// Send one record, waiting while the producer's queue is full: the merger reads no faster than
/// the broker takes. Any other error ends the transaction (the caller aborts or restarts).
fn send_waiting<K: rdkafka::message::ToBytes + ?Sized, P: rdkafka::message::ToBytes + ?Sized>(
    producer: &ThreadedProducer<DefaultProducerContext>,
    record: BaseRecord<'_, K, P>,
) -> Result<(), KafkaError> {
    produce::queue_blocking(producer, record, None).map_err(|e| e.error)
}

/// Send the merged records of the transaction, keyed by pool (the signals topic's key). A full
/// producer queue makes the merger wait: it reads no faster than the broker takes.
fn send_all(
    producer: &ThreadedProducer<DefaultProducerContext>,
    topic: &str,
    out: &mut Vec<Signal>,
    counters: &Counters,
) -> anyhow::Result<()> {
    for sig in out.drain(..) {
        let bytes = encode_signal(&sig).context("encoding a merged record")?;
        let mut record = BaseRecord::to(topic).payload(&bytes);
        if let Some(pool) = sig.pool() {
            record = record.key(pool.as_bytes());
        }
        send_waiting(producer, record).context("producing a merged record")?;
        counters.records_out.inc();
        counters.calls_out.inc_by(calls_in(&sig));
        if matches!(sig, Signal::Summary(_)) {
            counters.summaries_out.inc();
        }
    }
    Ok(())
}

fn commit(
    producer: &ThreadedProducer<DefaultProducerContext>,
    consumer: &BaseConsumer<Ctx>,
    topic: &str,
    positions: &BTreeMap<i32, i64>,
) -> Result<(), KafkaError> {
    if !positions.is_empty() {
        let mut tpl = TopicPartitionList::new();
        for (p, o) in positions {
            tpl.add_partition_offset(topic, *p, Offset::Offset(*o))?;
        }
        let cgm = consumer
            .group_metadata()
            .ok_or(KafkaError::MessageConsumption(RDKafkaErrorCode::UnknownGroup))?;
        producer.send_offsets_to_transaction(&tpl, &cgm, TXN_TIMEOUT)?;
    }
    producer.commit_transaction(TXN_TIMEOUT)
}

/// Abort the transaction and read again from the committed offsets: the records consumed in
/// it were merged into output that is now discarded.
fn abort_and_rewind(
    producer: &ThreadedProducer<DefaultProducerContext>,
    consumer: &BaseConsumer<Ctx>,
    counters: &Counters,
    ready: &AtomicBool,
) -> anyhow::Result<()> {
    counters.aborted.inc();
    retry_timeouts(
        "aborting the transaction",
        COMMITTED_TRIES,
        || producer.abort_transaction(TXN_TIMEOUT),
        |_| ready.store(false, Relaxed),
    )
    .context("aborting a transaction")?;
    let assigned = consumer.assignment().context("reading the assignment")?;
    if assigned.count() == 0 {
        return Ok(());
    }
    // A peer that died mid-transaction holds its partitions' offsets until its transaction is
    // aborted (by the transaction timeout): reading them times out meanwhile. That is waited
    // out, not fatal.
    let committed = retry_timeouts(
        "reading the committed offsets",
        COMMITTED_TRIES,
        || consumer.committed_offsets(assigned.clone(), Duration::from_secs(10)),
        |_| ready.store(false, Relaxed),
    )
    .context("reading committed offsets")?;
    ready.store(true, Relaxed);
    let mut rewind = TopicPartitionList::new();
    for e in committed.elements() {
        let at = match e.offset() {
            Offset::Offset(o) => Offset::Offset(o),
            _ => Offset::Beginning,
        };
        rewind.add_partition_offset(e.topic(), e.partition(), at)?;
    }
    let sought = consumer
        .seek_partitions(rewind, Duration::from_secs(10))
        .context("rewinding to the committed offsets")?;
    for e in sought.elements() {
        if let Err(err) = e.error() {
            anyhow::bail!(
                "cannot rewind {}[{}] to its committed offset: {err}",
                e.topic(),
                e.partition()
            );
        }
    }
    Ok(())
}

/// Tries of reading the committed offsets, 10 s each: longer than a dead peer's transaction
/// holds them (`transaction.timeout.ms` 10 s) several times over.
const COMMITTED_TRIES: u32 = 12;

/// Run `op` until it succeeds, retrying a timeout (or a transactional error librdkafka calls
/// retriable) up to `tries` times in all (`waiting` is told of each); any other error, or the
/// last try's, is returned.
pub fn retry_timeouts<T>(
    what: &str,
    tries: u32,
    mut op: impl FnMut() -> Result<T, KafkaError>,
    mut waiting: impl FnMut(u32),
) -> Result<T, KafkaError> {
    let mut tried = 0;
    loop {
        tried += 1;
        match op() {
            Err(e) if tried < tries && is_timeout(&e) => {
                tracing::warn!(error = %e, tried, "{what}: timed out; trying again");
                waiting(tried);
            }
            other => return other,
        }
    }
}

fn is_timeout(e: &KafkaError) -> bool {
    if let KafkaError::Transaction(t) = e {
        if t.is_fatal() || t.txn_requires_abort() {
            return false;
        }
        if t.is_retriable() {
            return true;
        }
    }
    matches!(
        e.rdkafka_error_code(),
        Some(RDKafkaErrorCode::OperationTimedOut | RDKafkaErrorCode::RequestTimedOut)
    )
}

/// Create the gateway-signals topic if it is missing: `partitions` of them, so that the merge
/// spreads over as many mergers (keyed by endpoint, the hot pool's endpoints land apart).
pub async fn ensure_input_topic(
    kafka: &KafkaArgs,
    topic: &str,
    partitions: i32,
    replication: i32,
) -> anyhow::Result<()> {
    use rdkafka::admin::{NewTopic, TopicReplication};
    let new = NewTopic::new(topic, partitions, TopicReplication::Fixed(replication));
    kafka::create_topics(kafka, &[&new]).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    #[test]
    fn timeouts_are_retried_up_to_the_bound_and_other_errors_are_not() {
        let timeout = || KafkaError::OffsetFetch(RDKafkaErrorCode::OperationTimedOut);
        // Two timeouts (a dead peer's open transaction), then the offsets.
        let (calls, waited) = (Cell::new(0), Cell::new(0));
        let r = retry_timeouts(
            "t",
            5,
            || {
                calls.set(calls.get() + 1);
                if calls.get() < 3 {
                    Err(timeout())
                } else {
                    Ok(7)
                }
            },
            |_| waited.set(waited.get() + 1),
        );
        assert_eq!((r.unwrap(), calls.get(), waited.get()), (7, 3, 2));
        // Timeouts past the bound: the last one is the error.
        let calls = Cell::new(0);
        let r: Result<(), _> = retry_timeouts(
            "t",
            4,
            || {
                calls.set(calls.get() + 1);
                Err(timeout())
            },
            |_| {},
        );
        assert!(r.is_err());
        assert_eq!(calls.get(), 4);
        // Anything else at once.
        let calls = Cell::new(0);
        let r: Result<(), _> = retry_timeouts(
            "t",
            4,
            || {
                calls.set(calls.get() + 1);
                Err(KafkaError::OffsetFetch(RDKafkaErrorCode::UnknownTopicOrPartition))
            },
            |_| {},
        );
        assert!(r.is_err());
        assert_eq!(calls.get(), 1);
    }

    #[test]
    fn input_the_processor_would_refuse_is_named_with_its_code() {
        use vitals_contracts::{CallOutcome, CallSummary, OutcomeClass};
        let at = 1_700_000_000_000_000;
        let ok = Signal::Call(CallOutcome::new("c", "p", "a", "g", at, OutcomeClass::Success));
        assert!(admit(&encode_signal(&ok).unwrap(), at).is_ok());
        assert_eq!(admit(b"not a record", at).unwrap_err().0, "bad_magic");
        let mut long = CallSummary::new("s".into(), "p", "a", "g", at);
        long.add(&CallOutcome::new(
            "1",
            "p",
            "a",
            "g",
            at - 120_000_000,
            OutcomeClass::Success,
        ));
        long.add(&CallOutcome::new("2", "p", "a", "g", at, OutcomeClass::Success));
        let (code, why) = admit(&encode_signal(&Signal::Summary(long)).unwrap(), at).unwrap_err();
        assert_eq!(code, "invalid_value");
        assert!(why.contains("within a minute"), "{why}");
        // A day off the record's time: refused as the processor refuses it.
        let late = Signal::Call(CallOutcome::new(
            "c",
            "p",
            "a",
            "g",
            at - 25 * 3_600_000_000,
            OutcomeClass::Success,
        ));
        assert_eq!(
            admit(&encode_signal(&late).unwrap(), at).unwrap_err().0,
            "invalid_value"
        );
    }
}
