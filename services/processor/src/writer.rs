//! The batch writer: one batch, one Postgres transaction, retried through database outages
//! (with a backoff), partitions another processor took over dropped from it, given up only at
//! shutdown after the grace period (the batch is then replayed by the next owner, and nothing
//! after it may commit), stopped by an error retrying cannot fix.

use crate::metrics::Metrics;
use crate::progress::Progress;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use vitals_pipeline::BatchWrite;
use vitals_store::audit::{Attempt, AuditLog};
use vitals_store::StoreError;

/// What a finished write reports back to the loop.
pub(crate) struct Written {
    /// (partition, epoch) that another processor had claimed: dropped from the batch, and to be
    /// dropped here if the loop still holds that epoch.
    pub fenced: Vec<(i32, i64)>,
    /// The batch was given up at shutdown: it will be replayed, and nothing after it may commit.
    pub abandoned: bool,
}

pub(crate) struct Writer {
    pub db: AuditLog,
    pub metrics: Arc<Metrics>,
    pub relay_wake: Arc<Notify>,
    pub cancel: CancellationToken,
    pub grace: Duration,
    pub progress: Arc<Progress>,
}

impl Writer {
    pub(crate) async fn write(self, mut batch: BatchWrite, started: Option<Instant>) -> Result<Written, StoreError> {
        let mut fenced = Vec::new();
        let mut backoff = Duration::from_millis(50);
        let mut give_up_at: Option<Instant> = None;
        // Once a write has failed, its commit may have gone through all the same: every later
        // write of the batch is a replay (`Attempt::Retry`).
        let mut attempt = Attempt::First;
        loop {
            match self.db.write_batch(&batch, attempt).await {
                Ok(w) => {
                    for (statement, d) in w.times.named() {
                        self.metrics.spent(&format!("db_{statement}"), d);
                    }
                    self.metrics.audit_rows_expired.inc_by(w.expired_rows);
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
                Err(e @ StoreError::AlreadyWritten(_)) => {
                    // A first write that met its own rows: at once, as a replay.
                    self.metrics.db_retries.inc();
                    tracing::warn!(error = %e, "batch partly in the audit log already; writing it as a replay");
                    attempt = Attempt::Retry;
                }
                Err(e) if e.is_retryable() => {
                    attempt = Attempt::Retry;
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
        m.pools_refused.inc_by(batch.pools_refused);
        m.repeats.inc_by(batch.repeats);
        m.late.inc_by(batch.late);
        m.stamped_ahead.inc_by(batch.stamped_ahead);
        for (pool, change) in &batch.clocks {
            match change {
                vitals_engine::ClockChange::Off { reporter, offset } => {
                    tracing::warn!(pool, reporter, offset_s = offset / 1_000_000, "{}", change.reason());
                    let labels = vec![("pool", pool.clone()), ("reporter", reporter.clone())];
                    m.clock_offsets.get_or_create(&labels).set(offset / 1_000_000);
                }
                vitals_engine::ClockChange::Back { reporter } => {
                    tracing::info!(pool, reporter, "{}", change.reason());
                    m.clock_offsets
                        .remove(&vec![("pool", pool.clone()), ("reporter", reporter.clone())]);
                }
            }
        }
        if batch.encode_failures > 0 {
            tracing::error!(
                events = batch.encode_failures,
                "events could not be encoded (a bug); dead-lettered as JSON with the error instead"
            );
        }
        m.encode_failures.inc_by(batch.encode_failures);
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

pub(crate) type InFlight = Option<tokio::task::JoinHandle<Result<Written, StoreError>>>;

/// The result of the write in flight (pending forever when there is none).
pub(crate) async fn join_in_flight(h: &mut InFlight) -> Result<Result<Written, StoreError>, tokio::task::JoinError> {
    match h {
        Some(h) => h.await,
        None => std::future::pending().await,
    }
}
