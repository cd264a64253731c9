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
use vitals_contracts::{decode_signal, encode_signal, Signal};
use vitals_runtime::args::KafkaArgs;
use vitals_runtime::kafka;

/// What a merger reads, writes and how it sums.
#[derive(Clone, Debug)]
pub struct Settings {
    pub kafka: KafkaArgs,
    /// The gateway-signals topic (keyed by endpoint).
    pub input: String,
    /// The signals topic the processor reads.
    pub output: String,
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
            ("linger.ms", "5"),
            ("compression.type", "lz4"),
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
    while !stop.load(Relaxed) {
        producer.begin_transaction().context("beginning a transaction")?;
        positions.clear();
        // The transaction's time: the merge's intervals are cut by commits, not by it, and the
        // summaries take their times from the calls.
        let now = now_us();
        let end = Instant::now() + s.interval;
        let mut rebalanced = false;
        loop {
            let left = end.saturating_duration_since(Instant::now());
            if left.is_zero() || stop.load(Relaxed) {
                break;
            }
            let polled = consumer.poll(left);
            if consumer.context().rebalanced.swap(false, Relaxed) {
                rebalanced = true;
            }
            match polled {
                None => {}
                Some(Err(e)) => tracing::warn!(error = %e, "consumer"),
                Some(Ok(m)) => {
                    positions.insert(m.partition(), m.offset() + 1);
                    counters.records_in.inc();
                    match m.payload().map(decode_signal) {
                        Some(Ok(sig)) => {
                            counters.calls_in.inc_by(calls_in(&sig));
                            merge.take(sig, now, &mut out);
                        }
                        _ => {
                            counters.undecodable.inc();
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
            abort_and_rewind(&producer, &consumer, counters)?;
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
                abort_and_rewind(&producer, &consumer, counters)?;
            }
        }
    }
    // Stopping: what is open is aborted (nothing committed is lost; the next merger reads it).
    let _ = producer.abort_transaction(TXN_TIMEOUT);
    Ok(())
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
        loop {
            match producer.send(record) {
                Ok(()) => break,
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), r)) => {
                    record = r;
                    std::thread::sleep(Duration::from_millis(1));
                }
                Err((e, _)) => return Err(e).context("producing a merged record"),
            }
        }
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
) -> anyhow::Result<()> {
    counters.aborted.inc();
    producer
        .abort_transaction(TXN_TIMEOUT)
        .context("aborting a transaction")?;
    let assigned = consumer.assignment().context("reading the assignment")?;
    if assigned.count() == 0 {
        return Ok(());
    }
    let committed = consumer
        .committed_offsets(assigned, Duration::from_secs(10))
        .context("reading committed offsets")?;
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
