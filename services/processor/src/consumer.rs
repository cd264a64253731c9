//! The consumer loop: signals → engine → one Postgres transaction per batch.
//!
//! States of a partition: *unassigned* → (rebalance callback: claim in Postgres, load snapshot,
//! seek to the snapshot offset) → *consuming* → (revoke) → *unassigned*. Records of the
//! in-flight batch of a revoked partition are abandoned: they are not in Postgres, so the next
//! owner reads them again. A batch is written when it is full or its first record has waited
//! `batch_max_ms`; offsets live in Postgres and nothing is committed to Kafka.

use crate::batch::{BatchWrite, Discovered, PartitionWrite, Snapshot, Topics};
use crate::config::Config;
use crate::db::{Db, DbError, Restored};
use crate::metrics::Metrics;
use crate::progress::Progress;
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext, StreamConsumer};
use rdkafka::error::KafkaError;
use rdkafka::topic_partition_list::{Offset, TopicPartitionList};
use rdkafka::types::RDKafkaRespErr;
use rdkafka::{ClientContext, Message};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use vitals_contracts::{decode_signal, validate_signal, Policy, Signal};
use vitals_engine::Engine;

/// What the rebalance callback hands to the loop.
enum Rebalanced {
    Assigned(Vec<(i32, Restored)>),
    Revoked(Vec<i32>),
}

pub struct ProcessorContext {
    db: Db,
    topic: String,
    policy: Policy,
    handle: tokio::runtime::Handle,
    cancel: CancellationToken,
    events: Mutex<Vec<Rebalanced>>,
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
                self.events
                    .lock()
                    .expect("not poisoned")
                    .push(Rebalanced::Assigned(restored));
                self.ready.store(true, Ordering::Relaxed);
            }
            RDKafkaRespErr::RD_KAFKA_RESP_ERR__REVOKE_PARTITIONS => {
                tracing::info!(?partitions, "partitions revoked");
                partitions.iter().for_each(|p| self.progress.revoked(*p));
                self.ready.store(false, Ordering::Relaxed);
                self.events
                    .lock()
                    .expect("not poisoned")
                    .push(Rebalanced::Revoked(partitions));
                if let Err(e) = consumer.unassign() {
                    tracing::error!(error = %e, "unassign failed");
                }
            }
            other => {
                tracing::error!(error = ?other, "rebalance error; dropping assignment");
                partitions.iter().for_each(|p| self.progress.revoked(*p));
                self.events
                    .lock()
                    .expect("not poisoned")
                    .push(Rebalanced::Revoked(partitions));
                let _ = consumer.unassign();
            }
        }
    }
}

impl ProcessorContext {
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

struct PartitionState {
    engine: Engine,
    epoch: i64,
    /// The next offset this partition's engine expects; earlier records are stale duplicates.
    next_offset: Option<i64>,
    since_snapshot: u64,
}

pub struct Processor {
    cfg: Config,
    consumer: StreamConsumer<ProcessorContext>,
    db: Db,
    topics: Topics,
    metrics: Arc<Metrics>,
    relay_wake: Arc<Notify>,
    cancel: CancellationToken,
    partitions: HashMap<i32, PartitionState>,
    batch: BatchWrite,
    batch_started: Option<Instant>,
    /// Offsets consumed in the current batch, per partition: the next offset to read.
    pending: HashMap<i32, i64>,
    decisions: Vec<vitals_engine::Decision>,
    /// The previous batch, being written while this one fills.
    in_flight: InFlight,
    /// A batch was abandoned at shutdown: the engines are ahead of Postgres, so no later batch
    /// may commit (its offsets and snapshots would skip the abandoned records for good).
    abandoned: bool,
    progress: Arc<Progress>,
}

impl Processor {
    pub fn new(
        cfg: Config,
        db: Db,
        metrics: Arc<Metrics>,
        relay_wake: Arc<Notify>,
        cancel: CancellationToken,
        ready: Arc<AtomicBool>,
        progress: Arc<Progress>,
    ) -> Result<Processor, KafkaError> {
        let ctx = ProcessorContext {
            db: db.clone(),
            topic: cfg.signals_topic.clone(),
            policy: Policy::default(),
            handle: tokio::runtime::Handle::current(),
            cancel: cancel.clone(),
            events: Mutex::new(Vec::new()),
            ready,
            progress: progress.clone(),
        };
        let consumer: StreamConsumer<ProcessorContext> =
            crate::kafka::consumer_config(&cfg).create_with_context(ctx)?;
        consumer.subscribe(&[&cfg.signals_topic])?;
        let topics = Topics {
            signals: cfg.signals_topic.clone(),
            changes: cfg.changes_topic.clone(),
            state: cfg.state_topic.clone(),
            dlq: cfg.dlq_topic.clone(),
        };
        Ok(Processor {
            cfg,
            consumer,
            db,
            topics,
            metrics,
            relay_wake,
            cancel,
            partitions: HashMap::new(),
            batch: BatchWrite::default(),
            batch_started: None,
            pending: HashMap::new(),
            decisions: Vec::new(),
            in_flight: None,
            abandoned: false,
            progress,
        })
    }

    pub async fn run(mut self) -> Result<(), DbError> {
        loop {
            let deadline = self
                .batch_started
                .map(|t| tokio::time::Instant::from_std(t + self.cfg.batch_max_wait()));
            tokio::select! {
                biased;
                _ = self.cancel.cancelled() => break,
                // A finished write is handled at once, not at the next flush: a permanent error
                // must stop the processor even when no more input arrives.
                done = join_in_flight(&mut self.in_flight), if self.in_flight.is_some() => {
                    self.in_flight = None;
                    self.written(done)?;
                }
                _ = sleep_until(deadline), if deadline.is_some() => self.flush(false).await?,
                msg = self.consumer.recv() => {
                    let msg = msg.map(|m| m.detach());
                    self.apply_rebalance();
                    match msg {
                        Ok(m) => {
                            let ts = m.timestamp().to_millis();
                            self.process(m.partition(), m.offset(), ts, m.key(), m.payload());
                            if self.batch.records as usize >= self.cfg.batch_max_records {
                                self.flush(false).await?;
                            }
                        }
                        Err(e) => {
                            tracing::warn!(error = %e, "consumer error");
                            tokio::time::sleep(Duration::from_millis(100)).await;
                        }
                    }
                }
            }
        }
        // Shutdown: write what was consumed, with a snapshot of every partition.
        self.flush(true).await?;
        self.consumer.unsubscribe();
        Ok(())
    }

    fn apply_rebalance(&mut self) {
        let events = std::mem::take(&mut *self.consumer.context().events.lock().expect("not poisoned"));
        for e in events {
            match e {
                Rebalanced::Revoked(ps) => {
                    for p in ps {
                        self.partitions.remove(&p);
                        self.pending.remove(&p);
                        self.batch.drop_partition(p);
                    }
                }
                Rebalanced::Assigned(rs) => {
                    for (p, r) in rs {
                        self.partitions.insert(
                            p,
                            PartitionState {
                                engine: r.engine,
                                epoch: r.epoch,
                                next_offset: r.start_offset,
                                since_snapshot: 0,
                            },
                        );
                    }
                }
            }
        }
    }

    fn process(&mut self, partition: i32, offset: i64, ts_ms: Option<i64>, key: Option<&[u8]>, payload: Option<&[u8]>) {
        let Some(ps) = self.partitions.get_mut(&partition) else {
            // Not ours (any more); the owner reads it. Counted: a processor that keeps fetching
            // records it drops has lost track of its assignment.
            self.metrics.not_ours.fetch_add(1, Ordering::Relaxed);
            return;
        };
        if ps.next_offset.is_some_and(|n| offset < n) {
            return; // already applied: a stale fetch from before a seek
        }
        ps.next_offset = Some(offset + 1);
        ps.since_snapshot += 1;
        self.batch.records += 1;
        self.pending.insert(partition, offset + 1);
        self.batch_started.get_or_insert_with(Instant::now);
        let at = ts_ms.map_or(ps.engine.now, |ms| ms.saturating_mul(1000));
        let payload = payload.unwrap_or_default();
        let signal = match decode_signal(payload) {
            Ok(s) => s,
            Err(e) => {
                self.batch
                    .dead_letter(&self.topics, partition, offset, key, payload, e.code(), &e.to_string());
                return;
            }
        };
        if let Err(e) = validate_signal(&signal, Some(at)) {
            self.batch.dead_letter(
                &self.topics,
                partition,
                offset,
                key,
                payload,
                "invalid_value",
                &e.to_string(),
            );
            return;
        }
        let first_seen = endpoint_of(&signal)
            .filter(|(pool, ep)| {
                ps.engine
                    .pools
                    .get(*pool)
                    .is_none_or(|p| !p.endpoints.contains_key(*ep))
            })
            .map(|(pool, ep)| (pool.to_owned(), ep.to_owned()));
        ps.engine.apply(at, &signal, &mut self.decisions);
        if let Some((pool, endpoint)) = first_seen {
            let policy_version = ps.engine.pools.get(&pool).map_or(0, |p| p.policy.version);
            self.batch.discover(
                &self.topics,
                Discovered {
                    pool,
                    endpoint,
                    stream_time: at,
                    policy_version,
                    partition,
                },
            );
        }
        for d in self.decisions.drain(..) {
            self.batch.add_decision(&self.topics, d, partition, offset);
        }
    }

    /// Hand the batch to the writer. The write runs while the next batch fills; at most one is
    /// in flight, so batches commit in order and at most two are held in memory. A batch is
    /// one transaction, retried through database outages.
    async fn flush(&mut self, snapshot_all: bool) -> Result<(), DbError> {
        let started = self.batch_started.take();
        let mut batch = std::mem::take(&mut self.batch);
        let pending = std::mem::take(&mut self.pending);
        for (&p, ps) in self.partitions.iter_mut() {
            let next = match (pending.get(&p), ps.next_offset) {
                (Some(n), _) => *n,
                (None, Some(n)) if snapshot_all => n,
                _ => continue,
            };
            let snapshot = (snapshot_all || ps.since_snapshot >= self.cfg.snapshot_every).then(|| {
                ps.since_snapshot = 0;
                let mut pools: Vec<(String, Vec<u8>)> = ps
                    .engine
                    .pools
                    .keys()
                    .filter_map(|name| ps.engine.pool_snapshot(name).map(|s| (name.clone(), s)))
                    .collect();
                pools.sort_by(|a, b| a.0.cmp(&b.0));
                Snapshot {
                    offset: next,
                    stream_time: ps.engine.now,
                    pools,
                }
            });
            batch.partitions.push(PartitionWrite {
                partition: p,
                epoch: ps.epoch,
                next_offset: next,
                snapshot,
            });
        }
        self.finish_write().await?;
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
        if snapshot_all {
            self.finish_write().await?;
        }
        Ok(())
    }

    /// Wait for the batch in flight and take in what it found.
    async fn finish_write(&mut self) -> Result<(), DbError> {
        let Some(handle) = self.in_flight.take() else {
            return Ok(());
        };
        self.written(handle.await)
    }

    /// What a finished write means for the loop.
    fn written(&mut self, done: Result<Result<Written, DbError>, tokio::task::JoinError>) -> Result<(), DbError> {
        let done = done.map_err(|e| DbError::Task(e.to_string()))??;
        self.abandoned |= done.abandoned;
        for p in drop_fenced(&mut self.partitions, &done.fenced) {
            self.pending.remove(&p);
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
    db: Db,
    metrics: Arc<Metrics>,
    relay_wake: Arc<Notify>,
    cancel: CancellationToken,
    grace: Duration,
    progress: Arc<Progress>,
}

impl Writer {
    async fn write(self, mut batch: BatchWrite, started: Option<Instant>) -> Result<Written, DbError> {
        let mut fenced = Vec::new();
        let mut backoff = Duration::from_millis(50);
        let mut give_up_at: Option<Instant> = None;
        loop {
            match self.db.write_batch(&batch).await {
                Ok(()) => break,
                Err(DbError::Fenced(ps)) => {
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
                    self.metrics.db_retries.fetch_add(1, Ordering::Relaxed);
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
                    self.metrics.permanent_errors.fetch_add(1, Ordering::Relaxed);
                    tracing::error!(error = %e, "batch failed with a permanent database error; stopping");
                    return Err(e);
                }
            }
        }
        let m = &self.metrics;
        m.signals.fetch_add(batch.records, Ordering::Relaxed);
        m.dead_lettered.fetch_add(batch.dead_lettered, Ordering::Relaxed);
        m.transitions
            .fetch_add(batch.transitions.len() as u64, Ordering::Relaxed);
        m.pool_events
            .fetch_add(batch.pool_events.len() as u64, Ordering::Relaxed);
        m.batches.fetch_add(1, Ordering::Relaxed);
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

/// Forget the partitions a finished write found fenced, and return them. Only the state of the
/// fenced epoch goes: a rebalance may already have given the partition back to this processor
/// under a new epoch, and that state is live (removing it by number stopped the partition for
/// good: every later record was dropped as "not ours").
fn drop_fenced(partitions: &mut HashMap<i32, PartitionState>, fenced: &[(i32, i64)]) -> Vec<i32> {
    let mut dropped = Vec::new();
    for (p, epoch) in fenced {
        if partitions.get(p).is_some_and(|ps| ps.epoch == *epoch) {
            partitions.remove(p);
            dropped.push(*p);
        }
    }
    dropped
}

/// The endpoint a signal is about, if any.
fn endpoint_of(s: &Signal) -> Option<(&str, &str)> {
    match s {
        Signal::Call(c) => Some((&c.pool, &c.endpoint)),
        Signal::Probe(p) => Some((&p.pool, &p.endpoint)),
        Signal::Override(o) => Some((&o.pool, &o.endpoint)),
        Signal::Tick(_) | Signal::Policy(_) => None,
    }
}

type InFlight = Option<tokio::task::JoinHandle<Result<Written, DbError>>>;

/// The result of the write in flight (pending forever when there is none).
async fn join_in_flight(h: &mut InFlight) -> Result<Result<Written, DbError>, tokio::task::JoinError> {
    match h {
        Some(h) => h.await,
        None => std::future::pending().await,
    }
}

async fn sleep_until(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(epoch: i64) -> PartitionState {
        PartitionState {
            engine: Engine::new(Policy::default()),
            epoch,
            next_offset: Some(10),
            since_snapshot: 0,
        }
    }

    #[test]
    fn a_fenced_batch_drops_only_the_epoch_it_was_written_under() {
        // Partition 0 was given back under epoch 3 before the zombie batch of epoch 2 reported
        // it fenced; partition 1 is still the fenced epoch.
        let mut parts: HashMap<i32, PartitionState> = [(0, state(3)), (1, state(2))].into_iter().collect();
        let dropped = drop_fenced(&mut parts, &[(0, 2), (1, 2), (7, 2)]);
        assert_eq!(dropped, vec![1]);
        assert_eq!(parts.keys().copied().collect::<Vec<_>>(), vec![0]);
        assert_eq!(parts[&0].epoch, 3, "the live state of the new assignment stays");
    }
}
