//! The consumer loop: signals → engine → one Postgres transaction per batch.
//!
//! States of a partition: *unassigned* → (rebalance callback: claim in Postgres, load snapshot,
//! seek to the snapshot offset) → *consuming* → (revoke) → *unassigned*. Records of the
//! in-flight batch of a revoked partition are abandoned: they are not in Postgres, so the next
//! owner reads them again. A batch goes to the writer when its first record has waited
//! `batch_max_ms` and the writer is free, or when it is full (then consumption waits for the
//! writer); offsets live in Postgres and nothing is committed to Kafka.
//!
//! Two threads share the work: the *receiver* ([`receive`], a thread of its own) polls the
//! Kafka consumer, runs the rebalance callback, and hands records over in chunks; the *loop*
//! (a task) runs the record step, batches, and the writer beside it. Polling librdkafka and the
//! record step took about the same time per record; one thread doing both was the processor's
//! limit on two cores. Rebalances travel in the same channel as records, so the loop sees them
//! in the order the consumer did.

use crate::config::Config;
use crate::metrics::Metrics;
use crate::progress::Progress;
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext};
use rdkafka::error::KafkaError;
use rdkafka::topic_partition_list::{Offset, TopicPartitionList};
use rdkafka::types::RDKafkaRespErr;
use rdkafka::{ClientContext, Message};
use rustc_hash::FxHashMap as HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, Notify};
use tokio_util::sync::CancellationToken;
use vitals_contracts::Policy;
use vitals_pipeline::{BatchWrite, Partition, Topics};
use vitals_store::audit::{AuditLog, Restored};
use vitals_store::StoreError;

/// Why the consumer loop stopped.
#[derive(Debug, thiserror::Error)]
pub enum LoopError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("the batch writer failed: {0}")]
    Task(String),
    #[error("the Kafka receiver thread stopped")]
    Receiver,
}

/// What the rebalance callback hands to the loop.
enum Rebalanced {
    Assigned(Vec<(i32, Restored)>),
    Revoked(Vec<i32>),
}

pub struct ProcessorContext {
    db: AuditLog,
    topic: String,
    policy: Policy,
    handle: tokio::runtime::Handle,
    cancel: CancellationToken,
    events: Mutex<Vec<Rebalanced>>,
    /// `events` has something: the receiver looks at it only then (not a lock per poll).
    pending: AtomicBool,
    /// True while the consumer holds an assignment whose partitions are all restored (an
    /// empty assignment counts: that processor is ready, with nothing to do).
    ready: Arc<AtomicBool>,
    progress: Arc<Progress>,
}

// Lag comes from the write path (`progress`), not from librdkafka's statistics.
impl ClientContext for ProcessorContext {}

impl ConsumerContext for ProcessorContext {
    fn rebalance(&self, consumer: &BaseConsumer<Self>, err: RDKafkaRespErr, tpl: &mut TopicPartitionList) {
        let partitions: Vec<i32> = tpl
            .elements_for_topic(&self.topic)
            .iter()
            .map(|e| e.partition())
            .collect();
        match err {
            RDKafkaRespErr::RD_KAFKA_RESP_ERR__ASSIGN_PARTITIONS => {
                // Restore before consuming: claim each partition in Postgres and load its snapshot,
                // then assign at the snapshot's offset. This runs inside the consumer's poll, on a
                // runtime worker; block_in_place lets the database calls run there.
                let restored = tokio::task::block_in_place(|| self.handle.block_on(self.claim_all(&partitions)));
                let Some(restored) = restored else {
                    tracing::warn!("shutting down during assignment; not assigning");
                    return;
                };
                for (p, r) in &restored {
                    self.progress.assigned(*p, r.committed_offset);
                    let offset = r.start_offset.map_or(Offset::Beginning, Offset::Offset);
                    if let Err(e) = tpl.set_partition_offset(&self.topic, *p, offset) {
                        tracing::error!(partition = p, error = %e, "cannot set start offset");
                    }
                }
                if let Err(e) = consumer.assign(tpl) {
                    tracing::error!(error = %e, "assign failed");
                }
                self.rebalanced(Rebalanced::Assigned(restored));
                self.ready.store(true, Ordering::Relaxed);
            }
            RDKafkaRespErr::RD_KAFKA_RESP_ERR__REVOKE_PARTITIONS => {
                tracing::info!(?partitions, "partitions revoked");
                partitions.iter().for_each(|p| self.progress.revoked(*p));
                self.ready.store(false, Ordering::Relaxed);
                self.rebalanced(Rebalanced::Revoked(partitions));
                if let Err(e) = consumer.unassign() {
                    tracing::error!(error = %e, "unassign failed");
                }
            }
            other => {
                tracing::error!(error = ?other, "rebalance error; dropping assignment");
                partitions.iter().for_each(|p| self.progress.revoked(*p));
                self.rebalanced(Rebalanced::Revoked(partitions));
                let _ = consumer.unassign();
            }
        }
    }
}

impl ProcessorContext {
    /// Hand a rebalance to the receiver, which passes it on to the loop before any later record.
    fn rebalanced(&self, e: Rebalanced) {
        self.events.lock().expect("not poisoned").push(e);
        self.pending.store(true, Ordering::Release);
    }

    /// Claim every partition, retrying while Postgres is unreachable. None if shutdown came first.
    async fn claim_all(&self, partitions: &[i32]) -> Option<Vec<(i32, Restored)>> {
        let mut out = Vec::new();
        for &p in partitions {
            let mut backoff = Duration::from_millis(100);
            loop {
                match self.db.claim_partition(p, &self.policy).await {
                    Ok(r) => {
                        tracing::info!(
                            partition = p,
                            epoch = r.epoch,
                            pools = r.pools,
                            start = ?r.start_offset,
                            committed = ?r.committed_offset,
                            "partition restored"
                        );
                        out.push((p, r));
                        break;
                    }
                    Err(e) => {
                        tracing::warn!(partition = p, error = %e, "cannot restore partition; retrying");
                        if self.cancel.is_cancelled() {
                            return None;
                        }
                        tokio::time::sleep(backoff).await;
                        backoff = (backoff * 2).min(Duration::from_secs(5));
                    }
                }
            }
        }
        Some(out)
    }
}

pub struct Processor {
    cfg: Config,
    /// Records and rebalances from the receiver thread, in the consumer's order.
    feed: mpsc::Receiver<Feed>,
    receiver: Option<std::thread::JoinHandle<()>>,
    db: AuditLog,
    topics: Topics,
    metrics: Arc<Metrics>,
    relay_wake: Arc<Notify>,
    cancel: CancellationToken,
    partitions: HashMap<i32, Partition>,
    batch: BatchWrite,
    batch_started: Option<Instant>,
    /// The previous batch, being written while this one fills.
    in_flight: InFlight,
    /// A batch was abandoned at shutdown: the engines are ahead of Postgres, so no later batch
    /// may commit (its offsets and snapshots would skip the abandoned records for good).
    abandoned: bool,
    progress: Arc<Progress>,
    /// Time in the record step and waiting for records from the receiver since the last flush
    /// (added to the metrics once per batch, not once per record).
    step_time: Duration,
    recv_time: Duration,
}

impl Processor {
    pub fn new(
        cfg: Config,
        db: AuditLog,
        metrics: Arc<Metrics>,
        relay_wake: Arc<Notify>,
        cancel: CancellationToken,
        ready: Arc<AtomicBool>,
        progress: Arc<Progress>,
    ) -> Result<Processor, KafkaError> {
        let ctx = ProcessorContext {
            db: db.clone(),
            topic: cfg.topics.signals_topic.clone(),
            policy: Policy::default(),
            handle: tokio::runtime::Handle::current(),
            cancel: cancel.clone(),
            events: Mutex::new(Vec::new()),
            pending: AtomicBool::new(false),
            ready,
            progress: progress.clone(),
        };
        let consumer: BaseConsumer<ProcessorContext> = crate::kafka::consumer_config(&cfg).create_with_context(ctx)?;
        consumer.subscribe(&[&cfg.topics.signals_topic])?;
        let (tx, feed) = mpsc::channel(FEED_CHUNKS);
        let receiver = std::thread::Builder::new()
            .name("kafka-receiver".into())
            .spawn(move || receive(consumer, tx))
            .map_err(|e| KafkaError::Subscription(format!("cannot start the receiver thread: {e}")))?;
        let topics = Topics {
            signals: cfg.topics.signals_topic.clone(),
            changes: cfg.topics.changes_topic.clone(),
            state: cfg.topics.state_topic.clone(),
            dlq: cfg.topics.dlq_topic.clone(),
        };
        Ok(Processor {
            cfg,
            feed,
            receiver: Some(receiver),
            db,
            topics,
            metrics,
            relay_wake,
            cancel,
            partitions: HashMap::default(),
            batch: BatchWrite::default(),
            batch_started: None,
            in_flight: None,
            abandoned: false,
            progress,
            step_time: Duration::ZERO,
            recv_time: Duration::ZERO,
        })
    }

    pub async fn run(mut self) -> Result<(), LoopError> {
        // Shutdown: write what was consumed, with a snapshot of every partition; then (after a
        // failure too) let the receiver leave the group.
        let result = match self.consume().await {
            Ok(()) => self.flush(true).await,
            failed => failed,
        };
        self.feed.close();
        if let Some(receiver) = self.receiver.take() {
            let _ = tokio::task::spawn_blocking(move || receiver.join()).await;
        }
        result
    }

    async fn consume(&mut self) -> Result<(), LoopError> {
        // The loop's futures live across iterations: creating a cancellation waiter and a timer
        // for every record cost more than the record step itself.
        let cancelled = self.cancel.clone().cancelled_owned();
        tokio::pin!(cancelled);
        // Armed when a batch takes its first record; polled only while a batch waits.
        let linger = tokio::time::sleep(Duration::ZERO);
        tokio::pin!(linger);
        loop {
            let waiting = Instant::now();
            tokio::select! {
                biased;
                _ = &mut cancelled => return Ok(()),
                // A finished write is handled at once, not at the next flush: a permanent error
                // must stop the processor even when no more input arrives. A batch that came due
                // while the writer was busy goes at once.
                done = join_in_flight(&mut self.in_flight), if self.in_flight.is_some() => {
                    self.in_flight = None;
                    self.written(done)?;
                    if self.batch_due() {
                        self.flush(false).await?;
                    }
                }
                // A batch whose first record has waited long enough goes when the writer is
                // free; while it is busy the batch keeps growing (group commit), so that the
                // slower the database, the fewer and larger the transactions.
                _ = &mut linger, if self.batch_started.is_some() && self.in_flight.is_none() => {
                    self.flush(false).await?;
                }
                feed = self.feed.recv() => {
                    self.recv_time += waiting.elapsed();
                    match feed.ok_or(LoopError::Receiver)? {
                        Feed::Rebalanced(events) => apply_rebalance(events, &mut self.partitions, &mut self.batch),
                        Feed::Records(chunk) => {
                            // Timed per chunk, not per record (a clock read per record showed
                            // in profiles).
                            let mut stepping = Instant::now();
                            for r in chunk.records() {
                                match self.partitions.get_mut(&r.partition) {
                                    Some(ps) => {
                                        if ps.step(r.offset, r.timestamp, r.key, r.payload, &self.topics, &mut self.batch)
                                            && self.batch_started.is_none()
                                        {
                                            let now = Instant::now();
                                            self.batch_started = Some(now);
                                            let due = now + self.cfg.batch_max_wait();
                                            linger.as_mut().reset(tokio::time::Instant::from_std(due));
                                        }
                                    }
                                    // Not ours (any more); the owner reads it. Counted: a
                                    // processor that keeps fetching records it drops has lost
                                    // track of its assignment.
                                    None => {
                                        self.metrics.not_ours.inc();
                                    }
                                }
                                // A full batch waits for the writer: this is the only place
                                // where the database holds back consumption.
                                if self.batch_full() {
                                    self.step_time += stepping.elapsed();
                                    self.flush(false).await?;
                                    stepping = Instant::now();
                                }
                            }
                            self.step_time += stepping.elapsed();
                        }
                    }
                }
            }
        }
    }

    fn batch_full(&self) -> bool {
        self.batch.records as usize >= self.cfg.batch_max_records
    }

    /// The batch is full, or its first record has waited `batch_max_ms`.
    fn batch_due(&self) -> bool {
        self.batch_full()
            || self
                .batch_started
                .is_some_and(|t| t.elapsed() >= self.cfg.batch_max_wait())
    }

    /// Hand the batch to the writer, after the write in flight if there is one. The write runs
    /// while the next batch fills; at most one is in flight, so batches commit in order and at
    /// most two are held in memory. A batch is one transaction, retried through database
    /// outages.
    async fn flush(&mut self, snapshot_all: bool) -> Result<(), LoopError> {
        let started = self.batch_started.take();
        let mut batch = std::mem::take(&mut self.batch);
        let every = self.cfg.snapshot_every;
        let closing = Instant::now();
        batch.partitions.extend(
            self.partitions
                .values_mut()
                .filter_map(|ps| ps.write(every, snapshot_all)),
        );
        let waiting = Instant::now();
        self.finish_write().await?;
        let m = &self.metrics;
        m.spent("close", waiting - closing);
        m.spent("wait_write", waiting.elapsed());
        m.spent("step", std::mem::take(&mut self.step_time));
        m.spent("recv", std::mem::take(&mut self.recv_time));
        if self.abandoned {
            tracing::warn!(
                records = batch.records,
                "not writing a batch that follows an abandoned one; it will be replayed"
            );
            return Ok(());
        }
        if batch.is_empty() {
            return Ok(());
        }
        let writer = Writer {
            db: self.db.clone(),
            metrics: self.metrics.clone(),
            relay_wake: self.relay_wake.clone(),
            cancel: self.cancel.clone(),
            grace: Duration::from_secs(self.cfg.shutdown_grace_secs),
            progress: self.progress.clone(),
        };
        self.in_flight = Some(tokio::spawn(writer.write(batch, started)));
        // A task spawned from a worker waits in that worker's LIFO slot, which other workers do
        // not steal from, and this loop does not yield while records are buffered: without a
        // yield the write did not start until the batch after it was full. Yielding once lets
        // the write send its first statement; from then on Postgres' replies wake it wherever
        // a worker is free.
        tokio::task::yield_now().await;
        if snapshot_all {
            self.finish_write().await?;
        }
        Ok(())
    }

    /// Wait for the batch in flight and take in what it found.
    async fn finish_write(&mut self) -> Result<(), LoopError> {
        let Some(handle) = self.in_flight.take() else {
            return Ok(());
        };
        self.written(handle.await)
    }

    /// What a finished write means for the loop.
    fn written(&mut self, done: Result<Result<Written, StoreError>, tokio::task::JoinError>) -> Result<(), LoopError> {
        let done = done.map_err(|e| LoopError::Task(e.to_string()))??;
        self.abandoned |= done.abandoned;
        for p in drop_fenced(&mut self.partitions, &done.fenced) {
            self.batch.drop_partition(p);
        }
        Ok(())
    }
}

/// What a finished write reports back to the loop.
struct Written {
    /// (partition, epoch) that another processor had claimed: dropped from the batch, and to be
    /// dropped here if the loop still holds that epoch.
    fenced: Vec<(i32, i64)>,
    /// The batch was given up at shutdown: it will be replayed, and nothing after it may commit.
    abandoned: bool,
}

struct Writer {
    db: AuditLog,
    metrics: Arc<Metrics>,
    relay_wake: Arc<Notify>,
    cancel: CancellationToken,
    grace: Duration,
    progress: Arc<Progress>,
}

impl Writer {
    async fn write(self, mut batch: BatchWrite, started: Option<Instant>) -> Result<Written, StoreError> {
        let mut fenced = Vec::new();
        let mut backoff = Duration::from_millis(50);
        let mut give_up_at: Option<Instant> = None;
        loop {
            match self.db.write_batch(&batch).await {
                Ok(times) => {
                    for (statement, d) in times.named() {
                        self.metrics.spent(&format!("db_{statement}"), d);
                    }
                    break;
                }
                Err(StoreError::Fenced(ps)) => {
                    tracing::warn!(partitions = ?ps, "partitions taken over by another processor; dropping them");
                    for p in ps {
                        if let Some(pw) = batch.partitions.iter().find(|pw| pw.partition == p) {
                            fenced.push((p, pw.epoch));
                        }
                        batch.drop_partition(p);
                    }
                    if batch.is_empty() {
                        return Ok(Written {
                            fenced,
                            abandoned: false,
                        });
                    }
                }
                Err(e) if e.is_retryable() => {
                    self.metrics.db_retries.inc();
                    tracing::warn!(error = %e, retry_in = ?backoff, "batch not written; retrying");
                    if self.cancel.is_cancelled() {
                        let deadline = *give_up_at.get_or_insert_with(|| Instant::now() + self.grace);
                        if Instant::now() > deadline {
                            tracing::error!("giving up on the last batch at shutdown; it will be replayed");
                            return Ok(Written {
                                fenced,
                                abandoned: true,
                            });
                        }
                    }
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(5));
                }
                Err(e) => {
                    // Retrying cannot fix a data error; stopping (not ready, exit non-zero) is
                    // better than a writer that retries one batch forever while claiming to work.
                    self.metrics.permanent_errors.inc();
                    tracing::error!(error = %e, "batch failed with a permanent database error; stopping");
                    return Err(e);
                }
            }
        }
        let m = &self.metrics;
        m.signals.inc_by(batch.records);
        m.dead_lettered.inc_by(batch.dead_lettered);
        m.transitions.inc_by(batch.transitions.len() as u64);
        m.pool_events.inc_by(batch.pool_events.len() as u64);
        m.batches.inc();
        if let Some(t) = started {
            m.batch_seconds.observe(t.elapsed().as_secs_f64());
        }
        if !batch.outbox.is_empty() {
            self.relay_wake.notify_one();
        }
        let partitions: Vec<(i32, i64)> = batch.partitions.iter().map(|p| (p.partition, p.next_offset)).collect();
        self.progress.committed(&partitions);
        Ok(Written {
            fenced,
            abandoned: false,
        })
    }
}

/// Take in what the rebalance callback did: revoked partitions go (with their part of the
/// batch), assigned ones start from their restored state.
fn apply_rebalance(events: Vec<Rebalanced>, partitions: &mut HashMap<i32, Partition>, batch: &mut BatchWrite) {
    for e in events {
        match e {
            Rebalanced::Revoked(ps) => {
                for p in ps {
                    partitions.remove(&p);
                    batch.drop_partition(p);
                }
            }
            Rebalanced::Assigned(rs) => {
                for (p, r) in rs {
                    partitions.insert(
                        p,
                        Partition::new(p, r.epoch, r.engine, r.start_offset, r.committed_offset),
                    );
                }
            }
        }
    }
}

/// Chunks in the channel between the receiver and the loop (each up to [`CHUNK_RECORDS`]).
const FEED_CHUNKS: usize = 16;
/// Records in one chunk at most. A chunk goes as soon as the consumer has nothing more ready,
/// so a lone record does not wait for others.
const CHUNK_RECORDS: usize = 512;

/// What the receiver hands to the loop.
enum Feed {
    Records(Chunk),
    Rebalanced(Vec<Rebalanced>),
}

/// Records copied out of librdkafka's buffers (a borrowed message cannot leave the thread that
/// polled it): their fields, and their keys and payloads end to end in one buffer.
struct Chunk {
    records: Vec<Held>,
    bytes: Vec<u8>,
}

struct Held {
    partition: i32,
    offset: i64,
    timestamp: Option<i64>,
    key: Option<std::ops::Range<usize>>,
    payload: Option<std::ops::Range<usize>>,
}

/// One record of a chunk, as the record step takes it.
struct Record<'a> {
    partition: i32,
    offset: i64,
    timestamp: Option<i64>,
    key: Option<&'a [u8]>,
    payload: Option<&'a [u8]>,
}

impl Chunk {
    fn new() -> Chunk {
        Chunk {
            records: Vec::with_capacity(CHUNK_RECORDS),
            bytes: Vec::with_capacity(CHUNK_RECORDS * 128),
        }
    }

    fn push<M: Message>(&mut self, m: &M) {
        let mut hold = |b: Option<&[u8]>| {
            b.map(|b| {
                let start = self.bytes.len();
                self.bytes.extend_from_slice(b);
                start..self.bytes.len()
            })
        };
        let key = hold(m.key());
        let payload = hold(m.payload());
        self.records.push(Held {
            partition: m.partition(),
            offset: m.offset(),
            timestamp: m.timestamp().to_millis(),
            key,
            payload,
        });
    }

    fn len(&self) -> usize {
        self.records.len()
    }

    fn is_empty(&self) -> bool {
        self.records.is_empty()
    }

    fn records(&self) -> impl Iterator<Item = Record<'_>> {
        self.records.iter().map(|h| Record {
            partition: h.partition,
            offset: h.offset,
            timestamp: h.timestamp,
            key: h.key.clone().map(|r| &self.bytes[r]),
            payload: h.payload.clone().map(|r| &self.bytes[r]),
        })
    }
}

/// The receiver thread: poll the consumer (which runs the rebalance callback), and hand records
/// and rebalances to the loop in the order they came. Ends when the loop closes the channel,
/// then leaves the group.
fn receive(consumer: BaseConsumer<ProcessorContext>, tx: mpsc::Sender<Feed>) {
    let ctx = consumer.context();
    let mut chunk = Chunk::new();
    // Hand the chunk over (false: the loop is gone).
    let hand_over = |chunk: &mut Chunk| {
        tx.blocking_send(Feed::Records(std::mem::replace(chunk, Chunk::new())))
            .is_ok()
    };
    loop {
        // Wait for records only when there is nothing to hand over: otherwise hand the chunk
        // over as soon as the consumer has nothing more ready.
        let timeout = if chunk.is_empty() {
            Duration::from_millis(100)
        } else {
            Duration::ZERO
        };
        let polled = consumer.poll(timeout);
        // The rebalance callback ran inside that poll: what it did comes before any record it
        // returned (records fetched under the old assignment were purged by librdkafka).
        if ctx.pending.swap(false, Ordering::AcqRel) {
            let events = std::mem::take(&mut *ctx.events.lock().expect("not poisoned"));
            if (!chunk.is_empty() && !hand_over(&mut chunk)) || tx.blocking_send(Feed::Rebalanced(events)).is_err() {
                break;
            }
        }
        // Whether the chunk goes now: it is full, or nothing more is ready.
        let now = match polled {
            Some(Ok(m)) => {
                chunk.push(&m);
                chunk.len() >= CHUNK_RECORDS
            }
            Some(Err(e)) => {
                tracing::warn!(error = %e, "consumer error");
                if chunk.is_empty() {
                    std::thread::sleep(Duration::from_millis(100));
                }
                !chunk.is_empty()
            }
            None if chunk.is_empty() && tx.is_closed() => break,
            None => !chunk.is_empty(),
        };
        if now && !hand_over(&mut chunk) {
            break;
        }
    }
    consumer.unsubscribe();
}

/// Forget the partitions a finished write found fenced, and return them. Only the state of the
/// fenced epoch goes: a rebalance may already have given the partition back to this processor
/// under a new epoch, and that state is live (removing it by number stopped the partition for
/// good: every later record was dropped as "not ours").
fn drop_fenced(partitions: &mut HashMap<i32, Partition>, fenced: &[(i32, i64)]) -> Vec<i32> {
    let mut dropped = Vec::new();
    for (p, epoch) in fenced {
        if partitions.get(p).is_some_and(|ps| ps.epoch() == *epoch) {
            partitions.remove(p);
            dropped.push(*p);
        }
    }
    dropped
}

type InFlight = Option<tokio::task::JoinHandle<Result<Written, StoreError>>>;

/// The result of the write in flight (pending forever when there is none).
async fn join_in_flight(h: &mut InFlight) -> Result<Result<Written, StoreError>, tokio::task::JoinError> {
    match h {
        Some(h) => h.await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(partition: i32, epoch: i64) -> Partition {
        Partition::new(
            partition,
            epoch,
            vitals_engine::Engine::new(Policy::default()),
            Some(10),
            Some(10),
        )
    }

    #[test]
    fn a_fenced_batch_drops_only_the_epoch_it_was_written_under() {
        // Partition 0 was given back under epoch 3 before the zombie batch of epoch 2 reported
        // it fenced; partition 1 is still the fenced epoch.
        let mut parts: HashMap<i32, Partition> = [(0, state(0, 3)), (1, state(1, 2))].into_iter().collect();
        let dropped = drop_fenced(&mut parts, &[(0, 2), (1, 2), (7, 2)]);
        assert_eq!(dropped, vec![1]);
        assert_eq!(parts.keys().copied().collect::<Vec<_>>(), vec![0]);
        assert_eq!(parts[&0].epoch(), 3, "the live state of the new assignment stays");
    }
}
