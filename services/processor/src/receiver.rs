//! The receiver thread: it polls the Kafka consumer, runs the rebalance callback (which claims
//! each assigned partition in Postgres and restores its engine before the consumer reads from
//! it), and hands records over to the record loop in chunks, rebalances in the same channel, so
//! that the loop sees them in the order the consumer did. Polling librdkafka and the record
//! step took about the same time per record; one thread doing both was the processor's limit
//! on two cores.

use crate::lanes::LaneReady;
use crate::progress::Progress;
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext};
use rdkafka::topic_partition_list::{Offset, TopicPartitionList};
use rdkafka::types::RDKafkaRespErr;
use rdkafka::{ClientContext, Message};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use vitals_contracts::Policy;
use vitals_engine::Engine;
use vitals_pipeline::PolicyInForce;
use vitals_store::audit::AuditLog;
use vitals_store::StoreError;

/// Why assigned partitions are not being consumed, for `/readyz` and the metrics: partitions
/// whose restore failed with an error retrying cannot fix (left unconsumed, the rest go on), and
/// the error each lane's restore is retrying through — one slot per lane, so that one lane's
/// finished restore does not hide another's that still retries.
#[derive(Default)]
pub struct RestoreStatus {
    failed: Mutex<std::collections::BTreeMap<i32, String>>,
    retrying: Mutex<std::collections::BTreeMap<usize, String>>,
}

/// One lane's view of the restore status: what its rebalance callback reports through.
pub(crate) struct LaneRestore {
    all: Arc<RestoreStatus>,
    lane: usize,
}

impl LaneRestore {
    fn retrying(&self, error: Option<String>) {
        let mut retrying = self.all.retrying.lock().expect("not poisoned");
        match error {
            Some(e) => retrying.insert(self.lane, e),
            None => retrying.remove(&self.lane),
        };
    }
}

impl RestoreStatus {
    /// What is wrong, in a line; None when nothing is.
    pub fn problem(&self) -> Option<String> {
        let failed = self.failed.lock().expect("not poisoned");
        if !failed.is_empty() {
            let each: Vec<String> = failed.iter().map(|(p, e)| format!("partition {p}: {e}")).collect();
            return Some(format!(
                "cannot restore (not consumed until fixed and reassigned): {}",
                each.join("; ")
            ));
        }
        let retrying = self.retrying.lock().expect("not poisoned");
        if retrying.is_empty() {
            return None;
        }
        let each: Vec<String> = retrying.iter().map(|(lane, e)| format!("lane {lane}: {e}")).collect();
        Some(format!("restoring partitions, retrying: {}", each.join("; ")))
    }

    pub fn failed(&self) -> usize {
        self.failed.lock().expect("not poisoned").len()
    }

    /// The handle lane `lane` reports its restores through.
    pub(crate) fn lane(self: &Arc<Self>, lane: usize) -> LaneRestore {
        LaneRestore {
            all: self.clone(),
            lane,
        }
    }
}

/// Where a partition resumes: its engine and the offset to read from.
pub(crate) struct Restored {
    pub engine: Engine,
    /// First offset to read: the snapshot's, or None for the beginning of the partition.
    pub start_offset: Option<i64>,
    /// First offset not yet in the database (records between start and this are replayed,
    /// and every write of the replay is a no-op).
    pub committed_offset: Option<i64>,
    pub epoch: i64,
    pub pools: usize,
    /// The first offset whose calls are not counted in the request rollups yet.
    pub requests_offset: i64,
}

/// Claim a partition and restore its engine from the stored snapshot (a snapshot the engine
/// cannot read is [`StoreError::Snapshot`], which retrying cannot fix).
async fn restore(db: &AuditLog, partition: i32, default_policy: &Policy) -> Result<Restored, StoreError> {
    let claimed = db.claim_partition(partition).await?;
    let (engine, start_offset, pools) = match claimed.snapshot {
        None => (Engine::new(default_policy.clone()), None, 0),
        Some(s) => {
            let engine =
                Engine::from_snapshot(default_policy.clone(), s.stream_time, s.pools.iter().map(Vec::as_slice))
                    .map_err(|e| StoreError::Snapshot {
                        partition,
                        message: e.to_string(),
                    })?;
            let lossy = engine.lossy_restores();
            if lossy > 0 {
                tracing::warn!(
                    partition,
                    endpoints = lossy,
                    "restored endpoints whose stored flags their phase cannot hold (an older build's leftovers); dropped"
                );
            }
            (engine, Some(s.offset), s.pools.len())
        }
    };
    // Pools whose policy changed before `pool_policies` existed get their row now.
    let changed: Vec<PolicyInForce> = engine
        .pools()
        .filter(|p| p.policy().version > 0)
        .map(|p| PolicyInForce {
            pool: p.name().to_owned(),
            policy: p.policy().clone(),
            stream_time: engine.now(),
            partition,
        })
        .collect();
    db.record_policies(&changed).await?;
    Ok(Restored {
        engine,
        start_offset,
        committed_offset: claimed.committed_offset,
        epoch: claimed.epoch,
        pools,
        requests_offset: claimed.requests_offset,
    })
}

/// What the rebalance callback hands to the loop.
pub(crate) enum Rebalanced {
    Assigned(Vec<(i32, Restored)>),
    Revoked(Vec<i32>),
}

/// The consumer's context: its rebalance callback claims and restores partitions.
pub struct ProcessorContext {
    db: AuditLog,
    topic: String,
    policy: Policy,
    handle: tokio::runtime::Handle,
    cancel: CancellationToken,
    events: Mutex<Vec<Rebalanced>>,
    /// `events` has something: the receiver looks at it only then (not a lock per poll).
    pending: AtomicBool,
    /// This consumer's lane's readiness.
    ready: LaneReady,
    progress: Arc<Progress>,
    restore: LaneRestore,
    unrestorable: vitals_runtime::metrics::Gauge,
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
                // then assign at the snapshot's offset. This runs inside the consumer's poll, on
                // the receiver thread (not a runtime worker), which waits on the runtime for the
                // database calls.
                let restored = self.handle.block_on(self.claim_all(&partitions));
                let Some(restored) = restored else {
                    tracing::warn!("shutting down during assignment; not assigning");
                    return;
                };
                // Only the partitions restored are consumed: one that cannot be restored stays
                // unread (and named in /readyz) while the others go on.
                let mut assign = TopicPartitionList::with_capacity(restored.len());
                for (p, r) in &restored {
                    self.progress.assigned(*p, r.committed_offset);
                    let offset = r.start_offset.map_or(Offset::Beginning, Offset::Offset);
                    if let Err(e) = assign.add_partition_offset(&self.topic, *p, offset) {
                        tracing::error!(partition = p, error = %e, "cannot set start offset");
                    }
                }
                if let Err(e) = consumer.assign(&assign) {
                    tracing::error!(error = %e, "assign failed");
                }
                self.rebalanced(Rebalanced::Assigned(restored));
                self.ready.set(true);
            }
            RDKafkaRespErr::RD_KAFKA_RESP_ERR__REVOKE_PARTITIONS => {
                tracing::info!(?partitions, "partitions revoked");
                partitions.iter().for_each(|p| self.progress.revoked(*p));
                self.forget_failed(&partitions);
                self.ready.set(false);
                self.rebalanced(Rebalanced::Revoked(partitions));
                if let Err(e) = consumer.unassign() {
                    tracing::error!(error = %e, "unassign failed");
                }
            }
            other => {
                tracing::error!(error = ?other, "rebalance error; dropping assignment");
                partitions.iter().for_each(|p| self.progress.revoked(*p));
                self.forget_failed(&partitions);
                self.rebalanced(Rebalanced::Revoked(partitions));
                let _ = consumer.unassign();
            }
        }
    }
}

impl ProcessorContext {
    pub(crate) fn new(
        db: AuditLog,
        topic: String,
        cancel: CancellationToken,
        ready: LaneReady,
        progress: Arc<Progress>,
        restore: LaneRestore,
        unrestorable: vitals_runtime::metrics::Gauge,
    ) -> ProcessorContext {
        ProcessorContext {
            db,
            topic,
            policy: Policy::default(),
            handle: tokio::runtime::Handle::current(),
            cancel,
            events: Mutex::new(Vec::new()),
            pending: AtomicBool::new(false),
            ready,
            progress,
            restore,
            unrestorable,
        }
    }

    fn forget_failed(&self, partitions: &[i32]) {
        let mut failed = self.restore.all.failed.lock().expect("not poisoned");
        partitions.iter().for_each(|p| {
            failed.remove(p);
        });
        self.unrestorable.set(failed.len() as i64);
    }

    /// Hand a rebalance to the receiver, which passes it on to the loop before any later record.
    fn rebalanced(&self, e: Rebalanced) {
        self.events.lock().expect("not poisoned").push(e);
        self.pending.store(true, Ordering::Release);
    }

    /// Claim every partition, retrying while Postgres is unreachable (the writer's retry
    /// classes). A partition that fails with an error retrying cannot fix (an unreadable
    /// snapshot, a privilege) is left out, logged, counted and named in /readyz; the others are
    /// restored. None if shutdown came first.
    async fn claim_all(&self, partitions: &[i32]) -> Option<Vec<(i32, Restored)>> {
        let mut out = Vec::new();
        for &p in partitions {
            let mut backoff = Duration::from_millis(100);
            loop {
                match restore(&self.db, p, &self.policy).await {
                    Err(e) if !e.is_retryable() => {
                        tracing::error!(
                            partition = p,
                            error = %e,
                            "cannot restore partition (an error retrying cannot fix); leaving it unconsumed"
                        );
                        self.restore
                            .all
                            .failed
                            .lock()
                            .expect("not poisoned")
                            .insert(p, e.to_string());
                        break;
                    }
                    Ok(r) => {
                        self.forget_failed(&[p]);
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
                        self.restore.retrying(Some(format!("partition {p}: {e}")));
                        if self.cancel.is_cancelled() {
                            return None;
                        }
                        tokio::time::sleep(backoff).await;
                        backoff = (backoff * 2).min(Duration::from_secs(5));
                    }
                }
            }
        }
        self.restore.retrying(None);
        self.unrestorable.set(self.restore.all.failed() as i64);
        Some(out)
    }
}

/// Chunks in the channel between the receiver and the loop (each up to [`CHUNK_RECORDS`]).
pub(crate) const FEED_CHUNKS: usize = 16;
/// Records in one chunk at most. A chunk goes as soon as the consumer has nothing more ready,
/// so a lone record does not wait for others.
const CHUNK_RECORDS: usize = 512;

/// What the receiver hands to the loop.
pub(crate) enum Feed {
    Records(Chunk),
    Rebalanced(Vec<Rebalanced>),
}

/// Records copied out of librdkafka's buffers (a borrowed message cannot leave the thread that
/// polled it): their fields, and their keys and payloads end to end in one buffer.
pub(crate) struct Chunk {
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
pub(crate) struct Record<'a> {
    pub partition: i32,
    pub offset: i64,
    pub timestamp: Option<i64>,
    pub key: Option<&'a [u8]>,
    pub payload: Option<&'a [u8]>,
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

    pub(crate) fn records(&self) -> impl Iterator<Item = Record<'_>> {
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
pub(crate) fn receive(consumer: BaseConsumer<ProcessorContext>, tx: mpsc::Sender<Feed>) {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_lanes_finished_restore_does_not_hide_another_lanes_retry() {
        let status = Arc::new(RestoreStatus::default());
        let (a, b) = (status.lane(0), status.lane(1));
        a.retrying(Some("partition 3: connection refused".into()));
        b.retrying(Some("partition 4: connection refused".into()));
        b.retrying(None);
        let problem = status.problem().expect("lane 0 is still retrying");
        assert!(problem.contains("lane 0: partition 3"), "{problem}");
        assert!(!problem.contains("lane 1"), "{problem}");
        a.retrying(None);
        assert_eq!(status.problem(), None);
    }

    #[test]
    fn a_partition_that_cannot_be_restored_is_named_before_any_retry() {
        let status = Arc::new(RestoreStatus::default());
        status.lane(0).retrying(Some("partition 1: timeout".into()));
        status.failed.lock().unwrap().insert(2, "snapshot unreadable".into());
        let problem = status.problem().unwrap();
        assert!(
            problem.starts_with("cannot restore") && problem.contains("partition 2: snapshot unreadable"),
            "{problem}"
        );
    }
}
