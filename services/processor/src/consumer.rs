//! The record loop: signals → engine → one Postgres transaction per batch.
//!
//! States of a partition: *unassigned* → (rebalance callback: claim in Postgres, load snapshot,
//! seek to the snapshot offset) → *consuming* → (revoke) → *unassigned*. Records of the
//! in-flight batch of a revoked partition are abandoned: they are not in Postgres, so the next
//! owner reads them again. A batch goes to the writer when its first record has waited
//! `batch_max_ms` and the writer is free, or when it is full (then consumption waits for the
//! writer); offsets live in Postgres and nothing is committed to Kafka.
//!
//! Three parts share the work: the *receiver* ([`crate::receiver`], a thread of its own) polls
//! the Kafka consumer, runs the rebalance callback, and hands records over in chunks; the
//! *loop* (this module, a task) runs the record step and batches; the *writer*
//! ([`crate::writer`], a task beside the loop) writes the previous batch while the next fills.

use crate::config::Config;
use crate::lanes::Readiness;
use crate::metrics::Metrics;
use crate::progress::Progress;
use crate::receiver::{receive, Chunk, Feed, ProcessorContext, Rebalanced, FEED_CHUNKS};
use crate::writer::{join_in_flight, InFlight, Writer, Written};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rustc_hash::FxHashMap as HashMap;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, Notify};
use tokio::time::Sleep;
use tokio_util::sync::CancellationToken;
use vitals_pipeline::{BatchWrite, Partition, Topics};
use vitals_store::audit::AuditLog;
use vitals_store::StoreError;

/// Why the consumer loop stopped.
#[derive(Debug, thiserror::Error)]
pub enum LoopError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("the batch writer failed: {0}")]
    Task(#[from] tokio::task::JoinError),
    #[error("the Kafka receiver thread stopped")]
    Receiver,
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
    /// When the counted calls were last written; they go with the next batch once
    /// `requests_flush_ms` has passed (and with every snapshot).
    requests_flushed: Instant,
}

impl Processor {
    /// Lane `lane` of the processor (see [`crate::lanes`]).
    #[allow(clippy::too_many_arguments)] // the shared handles of `run`, each used once here
    pub fn new(
        lane: usize,
        cfg: Config,
        db: AuditLog,
        metrics: Arc<Metrics>,
        relay_wake: Arc<Notify>,
        cancel: CancellationToken,
        ready: Arc<Readiness>,
        progress: Arc<Progress>,
        restore: Arc<crate::receiver::RestoreStatus>,
    ) -> Result<Processor, KafkaError> {
        let ctx = ProcessorContext::new(
            db.clone(),
            cfg.topics.signals_topic.clone(),
            cancel.clone(),
            ready.lane(lane),
            progress.clone(),
            restore.lane(lane),
            metrics.unrestorable.clone(),
        );
        let consumer: BaseConsumer<ProcessorContext> =
            crate::kafka::consumer_config(&cfg, lane).create_with_context(ctx)?;
        consumer.subscribe(&[&cfg.topics.signals_topic])?;
        let (tx, feed) = mpsc::channel(FEED_CHUNKS);
        let receiver = std::thread::Builder::new()
            .name(format!("kafka-receiver-{lane}"))
            .spawn(move || {
                // The rebalance callback runs on this thread: its logs name the lane too.
                let _lane = tracing::info_span!("lane", lane).entered();
                receive(consumer, tx)
            })
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
            requests_flushed: Instant::now(),
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
        // Due when the counted calls should be written: polled only while no batch is filling
        // (a batch takes them when it goes) and some partition has counted calls to write.
        let counts_due = tokio::time::sleep(self.cfg.requests_flush());
        tokio::pin!(counts_due);
        loop {
            let waiting = Instant::now();
            tokio::select! {
                biased;
                _ = &mut cancelled => return Ok(()),
                // A finished write is handled at once, not at the next flush: a permanent error
                // must stop the processor even when no more input arrives.
                done = join_in_flight(&mut self.in_flight), if self.in_flight.is_some() => {
                    self.write_finished(done).await?;
                }
                // A batch whose first record has waited long enough goes when the writer is
                // free; while it is busy the batch keeps growing (group commit), so that the
                // slower the database, the fewer and larger the transactions.
                _ = &mut linger, if self.batch_started.is_some() && self.in_flight.is_none() => {
                    self.flush(false).await?;
                }
                _ = &mut counts_due, if self.batch_started.is_none() && self.in_flight.is_none() && self.counting() => {
                    self.flush(false).await?;
                    let due = self.requests_flushed + self.cfg.requests_flush();
                    counts_due.as_mut().reset(tokio::time::Instant::from_std(due));
                }
                feed = self.feed.recv() => {
                    self.recv_time += waiting.elapsed();
                    match feed.ok_or(LoopError::Receiver)? {
                        Feed::Rebalanced(events) => apply_rebalance(events, &mut self.partitions, &mut self.batch, &self.cfg),
                        Feed::Records(chunk) => self.step_chunk(&chunk, linger.as_mut()).await?,
                    }
                }
            }
        }
    }

    /// The write in flight finished: take in what it found, and send a batch that came due
    /// while the writer was busy.
    async fn write_finished(
        &mut self,
        done: Result<Result<Written, StoreError>, tokio::task::JoinError>,
    ) -> Result<(), LoopError> {
        self.in_flight = None;
        self.written(done)?;
        if self.batch_due() {
            self.flush(false).await?;
        }
        Ok(())
    }

    /// Run the record step over a chunk from the receiver; the first record of a batch arms
    /// `linger`, a full batch goes to the writer.
    async fn step_chunk(&mut self, chunk: &Chunk, mut linger: Pin<&mut Sleep>) -> Result<(), LoopError> {
        // Timed per chunk, not per record (a clock read per record showed in profiles).
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
                // Not ours (any more); the owner reads it. Counted: a processor that keeps
                // fetching records it drops has lost track of its assignment.
                None => {
                    self.metrics.not_ours.inc();
                }
            }
            // A full batch waits for the writer: this is the only place where the database
            // holds back consumption.
            if self.batch_full() {
                self.step_time += stepping.elapsed();
                self.flush(false).await?;
                stepping = Instant::now();
            }
        }
        self.step_time += stepping.elapsed();
        Ok(())
    }

    /// Some partition has counted calls (or read records) that are not written yet.
    fn counting(&self) -> bool {
        self.partitions.values().any(Partition::counting)
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
        let counts = snapshot_all || self.requests_flushed.elapsed() >= self.cfg.requests_flush();
        if counts {
            self.requests_flushed = closing;
        }
        batch.partitions.extend(
            self.partitions
                .values_mut()
                .filter_map(|ps| ps.write(every, snapshot_all, counts)),
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
        let done = done??;
        self.abandoned |= done.abandoned;
        for p in drop_fenced(&mut self.partitions, &done.fenced) {
            self.batch.drop_partition(p);
        }
        Ok(())
    }
}

/// Take in what the rebalance callback did: revoked partitions go (with their part of the
/// batch), assigned ones start from their restored state.
fn apply_rebalance(
    events: Vec<Rebalanced>,
    partitions: &mut HashMap<i32, Partition>,
    batch: &mut BatchWrite,
    cfg: &Config,
) {
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
                        Partition::new(p, r.epoch, r.engine, r.start_offset, r.committed_offset)
                            .counting_from(r.requests_offset)
                            .with_max_pools(cfg.max_pools_per_partition)
                            .with_max_ahead(cfg.max_ahead())
                            .with_snapshot_budget(cfg.snapshot_bytes_per_record),
                    );
                }
            }
        }
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use vitals_contracts::Policy;

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
