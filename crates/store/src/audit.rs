//! The write side: claiming a partition (with its snapshot), and the one transaction per batch
//! that makes the processor exactly-once. Every insert is idempotent, so a replayed batch is a
//! no-op.

use crate::{timestamp, StoreError};
use sqlx::{PgPool, Postgres, QueryBuilder, Row, Transaction};
use vitals_contracts::{EndpointState, HealthChanged, Policy, PoolHealthChanged};
use vitals_engine::Engine;
use vitals_pipeline::{BatchWrite, OutboxRow, PartitionWrite, Snapshot};

/// Rows per INSERT statement (Postgres allows 65,535 bind parameters per statement).
const CHUNK: usize = 500;

/// Where a partition resumes: its engine and the offset to read from.
pub struct Restored {
    pub engine: Engine,
    /// First offset to read: the snapshot's, or None for the beginning of the partition.
    pub start_offset: Option<i64>,
    /// First offset not yet in the database (records between start and this are replayed,
    /// and every write of the replay is a no-op).
    pub committed_offset: Option<i64>,
    pub epoch: i64,
    pub pools: usize,
}

/// The audit log of one consumer group reading one signals topic.
#[derive(Clone)]
pub struct AuditLog {
    pub pool: PgPool,
    pub group: String,
    pub topic: String,
}

impl AuditLog {
    /// Take ownership of a partition (bumping its epoch fences the previous owner) and load its
    /// snapshot. The row lock on the offsets row waits for the previous owner's last batch.
    pub async fn claim_partition(&self, partition: i32, default_policy: &Policy) -> Result<Restored, StoreError> {
        let mut tx = self.pool.begin().await?;
        let row = sqlx::query(
            "INSERT INTO consumer_offsets (consumer_group, topic, partition, next_offset, epoch)
             VALUES ($1, $2, $3, -1, 1)
             ON CONFLICT (consumer_group, topic, partition) DO UPDATE SET epoch = consumer_offsets.epoch + 1
             RETURNING next_offset, epoch",
        )
        .bind(&self.group)
        .bind(&self.topic)
        .bind(partition)
        .fetch_one(&mut *tx)
        .await?;
        let committed: i64 = row.get(0);
        let epoch: i64 = row.get(1);
        let snap = sqlx::query(
            "SELECT snapshot_offset, stream_time FROM partition_snapshots
             WHERE consumer_group = $1 AND topic = $2 AND partition = $3",
        )
        .bind(&self.group)
        .bind(&self.topic)
        .bind(partition)
        .fetch_optional(&mut *tx)
        .await?;
        let (engine, start_offset, pools) = match snap {
            None => (Engine::new(default_policy.clone()), None, 0),
            Some(snap) => {
                let rows: Vec<Vec<u8>> = sqlx::query_scalar(
                    "SELECT state FROM engine_snapshots WHERE consumer_group = $1 AND topic = $2 AND partition = $3
                     ORDER BY pool",
                )
                .bind(&self.group)
                .bind(&self.topic)
                .bind(partition)
                .fetch_all(&mut *tx)
                .await?;
                let engine = Engine::from_snapshot(
                    default_policy.clone(),
                    snap.get::<i64, _>(1),
                    rows.iter().map(Vec::as_slice),
                )
                .map_err(|e| StoreError::Snapshot {
                    partition,
                    message: e.to_string(),
                })?;
                (engine, Some(snap.get::<i64, _>(0)), rows.len())
            }
        };
        tx.commit().await?;
        Ok(Restored {
            engine,
            start_offset,
            committed_offset: (committed >= 0).then_some(committed),
            epoch,
            pools,
        })
    }

    /// The batch, in one transaction: offsets (fenced by epoch), first-seen endpoints,
    /// transitions, the endpoint-state projection, pool events, outbox rows and snapshots.
    pub async fn write_batch(&self, b: &BatchWrite) -> Result<(), StoreError> {
        let mut tx = self.pool.begin().await?;
        let mut fenced = Vec::new();
        for p in &b.partitions {
            let r = sqlx::query(
                "UPDATE consumer_offsets SET next_offset = GREATEST(next_offset, $4)
                 WHERE consumer_group = $1 AND topic = $2 AND partition = $3 AND epoch = $5",
            )
            .bind(&self.group)
            .bind(&self.topic)
            .bind(p.partition)
            .bind(p.next_offset)
            .bind(p.epoch)
            .execute(&mut *tx)
            .await?;
            if r.rows_affected() == 0 {
                fenced.push(p.partition);
            }
        }
        if !fenced.is_empty() {
            tx.rollback().await?;
            return Err(StoreError::Fenced(fenced));
        }
        let discovered: Vec<&EndpointState> = b.discovered.iter().map(|(s, _)| s).collect();
        for chunk in discovered.chunks(CHUNK) {
            write_states(&mut tx, chunk, Conflict::Keep).await?;
        }
        for chunk in b.transitions.chunks(CHUNK) {
            insert_transitions(&mut tx, chunk).await?;
        }
        let latest: Vec<EndpointState> = b.latest_states().into_iter().map(EndpointState::from_change).collect();
        let latest: Vec<&EndpointState> = latest.iter().collect();
        for chunk in latest.chunks(CHUNK) {
            write_states(&mut tx, chunk, Conflict::Newer).await?;
        }
        for chunk in b.pool_events.chunks(CHUNK) {
            insert_pool_events(&mut tx, chunk).await?;
        }
        for chunk in b.outbox.chunks(CHUNK) {
            insert_outbox(&mut tx, chunk).await?;
        }
        for p in &b.partitions {
            if let Some(s) = &p.snapshot {
                self.write_snapshot(&mut tx, p, s).await?;
            }
        }
        tx.commit().await?;
        Ok(())
    }

    async fn write_snapshot(
        &self,
        tx: &mut Transaction<'_, Postgres>,
        p: &PartitionWrite,
        s: &Snapshot,
    ) -> Result<(), StoreError> {
        sqlx::query(
            "INSERT INTO partition_snapshots (consumer_group, topic, partition, snapshot_offset, stream_time)
             VALUES ($1, $2, $3, $4, $5)
             ON CONFLICT (consumer_group, topic, partition)
             DO UPDATE SET snapshot_offset = excluded.snapshot_offset, stream_time = excluded.stream_time",
        )
        .bind(&self.group)
        .bind(&self.topic)
        .bind(p.partition)
        .bind(s.offset)
        .bind(s.stream_time)
        .execute(&mut **tx)
        .await?;
        for chunk in s.pools.chunks(CHUNK) {
            let mut q = QueryBuilder::<Postgres>::new(
                "INSERT INTO engine_snapshots (consumer_group, topic, partition, pool, state) ",
            );
            q.push_values(chunk, |mut r, (pool, state)| {
                r.push_bind(&self.group)
                    .push_bind(&self.topic)
                    .push_bind(p.partition)
                    .push_bind(pool)
                    .push_bind(state);
            });
            q.push(" ON CONFLICT (consumer_group, topic, partition, pool) DO UPDATE SET state = excluded.state");
            q.build().execute(&mut **tx).await?;
        }
        Ok(())
    }
}

/// Transitions with the input record that caused each, (partition, offset). Idempotent by
/// (pool, endpoint, seq).
async fn insert_transitions(
    tx: &mut Transaction<'_, Postgres>,
    rows: &[(HealthChanged, i32, i64)],
) -> Result<(), sqlx::Error> {
    let mut q = QueryBuilder::<Postgres>::new(
        "INSERT INTO transitions (pool, endpoint, seq, transition_id, from_state, to_state, weight, ramp_ms,
         retry_at, reason_code, reason, failure_rate, score, window_calls, window_failures,
         consecutive_failures, consecutive_successes, ttft_p50_ms, ttft_p99_ms, thresholds, trigger_ids,
         policy_version, evidence, stream_time, source_partition, source_offset) ",
    );
    q.push_values(rows, |mut r, (h, partition, offset)| {
        let e = &h.evidence;
        r.push_bind(&h.pool)
            .push_bind(&h.endpoint)
            .push_bind(h.seq)
            .push_bind(&h.transition_id)
            .push_bind(h.from_state.as_str())
            .push_bind(h.to_state.as_str())
            .push_bind(h.weight)
            .push_bind(h.ramp_ms)
            .push_bind(h.retry_at.map(timestamp))
            .push_bind(&h.reason_code)
            .push_bind(&h.reason)
            .push_bind(e.failure_rate)
            .push_bind(e.score)
            .push_bind(e.decisive_calls())
            .push_bind(e.failures())
            .push_bind(e.consecutive_failures)
            .push_bind(e.consecutive_successes)
            .push_bind(e.ttft_p50_ms)
            .push_bind(e.ttft_p99_ms)
            .push_bind(&e.thresholds)
            .push_bind(&h.trigger_ids)
            .push_bind(h.policy_version)
            .push_bind(sqlx::types::Json(e))
            .push_bind(timestamp(h.stream_time))
            .push_bind(*partition)
            .push_bind(*offset);
    });
    q.push(" ON CONFLICT (pool, endpoint, seq) DO NOTHING");
    q.build().execute(&mut **tx).await?;
    Ok(())
}

/// What a state row does when the endpoint already has one.
enum Conflict {
    /// A first-seen state never overwrites.
    Keep,
    /// A transition's state replaces an older one.
    Newer,
}

async fn write_states(
    tx: &mut Transaction<'_, Postgres>,
    rows: &[&EndpointState],
    conflict: Conflict,
) -> Result<(), sqlx::Error> {
    let mut q = QueryBuilder::<Postgres>::new(
        "INSERT INTO endpoint_state (pool, endpoint, seq, state, weight, ramp_ms, score, failure_rate, since,
         reason, policy_version) ",
    );
    q.push_values(rows, |mut r, s| {
        r.push_bind(&s.pool)
            .push_bind(&s.endpoint)
            .push_bind(s.seq)
            .push_bind(s.state.as_str())
            .push_bind(s.weight)
            .push_bind(s.ramp_ms)
            .push_bind(s.score)
            .push_bind(s.failure_rate)
            .push_bind(timestamp(s.since))
            .push_bind(&s.reason)
            .push_bind(s.policy_version);
    });
    q.push(match conflict {
        Conflict::Keep => " ON CONFLICT (pool, endpoint) DO NOTHING",
        Conflict::Newer => {
            " ON CONFLICT (pool, endpoint) DO UPDATE SET seq = excluded.seq, state = excluded.state,
              weight = excluded.weight, ramp_ms = excluded.ramp_ms, score = excluded.score,
              failure_rate = excluded.failure_rate, since = excluded.since, reason = excluded.reason,
              policy_version = excluded.policy_version
              WHERE endpoint_state.seq < excluded.seq"
        }
    });
    q.build().execute(&mut **tx).await?;
    Ok(())
}

async fn insert_pool_events(
    tx: &mut Transaction<'_, Postgres>,
    rows: &[(PoolHealthChanged, i32, i64)],
) -> Result<(), sqlx::Error> {
    let mut q = QueryBuilder::<Postgres>::new(
        "INSERT INTO pool_events (pool, seq, endpoints, healthy, ejected, healthy_fraction, panic,
         correlated_outage, reason, policy_version, stream_time, source_partition, source_offset) ",
    );
    q.push_values(rows, |mut r, (p, partition, offset)| {
        r.push_bind(&p.pool)
            .push_bind(p.seq)
            .push_bind(p.endpoints)
            .push_bind(p.healthy)
            .push_bind(p.ejected)
            .push_bind(p.healthy_fraction)
            .push_bind(p.panic)
            .push_bind(p.correlated_outage)
            .push_bind(&p.reason)
            .push_bind(p.policy_version)
            .push_bind(timestamp(p.stream_time))
            .push_bind(*partition)
            .push_bind(*offset);
    });
    q.push(" ON CONFLICT (pool, seq) DO NOTHING");
    q.build().execute(&mut **tx).await?;
    Ok(())
}

async fn insert_outbox(tx: &mut Transaction<'_, Postgres>, rows: &[OutboxRow]) -> Result<(), sqlx::Error> {
    let mut q = QueryBuilder::<Postgres>::new("INSERT INTO outbox (dedup_key, topic, key, payload, headers) ");
    q.push_values(rows, |mut r, o| {
        r.push_bind(&o.dedup_key)
            .push_bind(&o.topic)
            .push_bind(&o.key)
            .push_bind(&o.payload)
            .push_bind(sqlx::types::Json(&o.headers));
    });
    q.push(" ON CONFLICT (dedup_key) DO NOTHING");
    q.build().execute(&mut **tx).await?;
    Ok(())
}
