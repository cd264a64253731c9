//! Postgres: connection with the configured schema, migrations, restoring a partition, and the
//! one transaction per batch that makes the processor exactly-once.

use crate::batch::{BatchWrite, OutboxRow, PartitionWrite};
use chrono::{DateTime, Utc};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{PgPool, Postgres, QueryBuilder, Row};
use std::str::FromStr;
use std::time::Duration;
use vitals_contracts::{HealthChanged, Micros, Policy, PoolHealthChanged};
use vitals_engine::Engine;

pub static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("../../migrations");

/// Rows per INSERT statement (Postgres allows 65,535 bind parameters per statement).
const CHUNK: usize = 500;

#[derive(Debug, thiserror::Error)]
pub enum DbError {
    #[error("database: {0}")]
    Sql(#[from] sqlx::Error),
    #[error("migrations: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    #[error("stored engine snapshot of partition {partition} is unreadable: {message}")]
    Snapshot { partition: i32, message: String },
    #[error("partitions {0:?} were claimed by another processor (epoch changed)")]
    Fenced(Vec<i32>),
    #[error("the batch writer failed: {0}")]
    Task(String),
}

impl DbError {
    /// Connection loss, restarts, timeouts, lock waits and serialization failures go away by
    /// themselves: the batch is retried. A data error (SQLSTATE class 22, e.g. "timestamp out of
    /// range"), a constraint or a privilege error (23, 42) and every decode error are permanent:
    /// the same batch would fail the same way forever.
    pub fn is_retryable(&self) -> bool {
        match self {
            DbError::Sql(e) => sql_retryable(e),
            _ => false,
        }
    }
}

fn sql_retryable(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::Database(d) => d.code().is_some_and(|c| sqlstate_retryable(&c)),
        sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::Protocol(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::WorkerCrashed => true,
        _ => false,
    }
}

/// Classes that are transient: connection exceptions (08), transaction rollbacks such as
/// serialization failures and deadlocks (40), insufficient resources (53), lock not available
/// (55P03) and other object-state errors (55), operator intervention such as a cancelled
/// statement, an admin shutdown or an idle-session timeout (57), system errors (58).
/// Also 25P03, idle-in-transaction timeout: the server ended a session that a frozen process
/// left open (the SESSION_LIMITS below), and the batch is simply retried on a new one.
pub fn sqlstate_retryable(code: &str) -> bool {
    code == "25P03" || matches!(code.get(..2), Some("08" | "40" | "53" | "55" | "57" | "58"))
}

/// Session settings that bound every wait on the database: a frozen or partitioned processor
/// must not hold row locks (and so the next owner's claim) for longer than
/// `idle_in_transaction_session_timeout`; no statement or lock wait runs unbounded; the server
/// notices a vanished client by TCP keepalive.
const SESSION_LIMITS: [(&str, &str); 6] = [
    ("idle_in_transaction_session_timeout", "5s"),
    ("lock_timeout", "3s"),
    ("statement_timeout", "60s"),
    ("tcp_keepalives_idle", "5"),
    ("tcp_keepalives_interval", "2"),
    ("tcp_keepalives_count", "3"),
];

/// Connect with `search_path` set to `schema`, create the schema and run the migrations.
pub async fn connect(url: &str, schema: &str) -> Result<PgPool, DbError> {
    let opts = PgConnectOptions::from_str(url)?
        .options([("search_path", schema)])
        .options(SESSION_LIMITS);
    let pool = PgPoolOptions::new()
        .max_connections(8)
        .acquire_timeout(Duration::from_secs(5))
        .connect_with(opts)
        .await?;
    // Two processors starting at once race inside CREATE SCHEMA IF NOT EXISTS (a unique
    // violation on pg_namespace); the loser finds the schema there, which is all it wanted.
    if let Err(e) = sqlx::query(&format!("CREATE SCHEMA IF NOT EXISTS \"{schema}\""))
        .execute(&pool)
        .await
    {
        let raced = matches!(&e, sqlx::Error::Database(d) if matches!(d.code().as_deref(), Some("23505" | "42P06")));
        if !raced {
            return Err(e.into());
        }
    }
    MIGRATOR.run(&pool).await?;
    Ok(pool)
}

/// A stream time as a Postgres timestamp, clamped to years 1970..=9999 (the engine saturates
/// instead of wrapping, and a saturated time must not become a row Postgres refuses).
pub fn timestamp(us: Micros) -> DateTime<Utc> {
    const MAX_US: Micros = 253_402_300_799_999_999; // 9999-12-31T23:59:59.999999Z
    DateTime::from_timestamp_micros(us.clamp(0, MAX_US)).unwrap_or_default()
}

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

#[derive(Clone)]
pub struct Db {
    pub pool: PgPool,
    pub group: String,
    pub topic: String,
}

impl Db {
    /// Take ownership of a partition (bumping its epoch fences the previous owner) and load its
    /// snapshot. The row lock on the offsets row waits for the previous owner's last batch.
    pub async fn claim_partition(&self, partition: i32, default_policy: &Policy) -> Result<Restored, DbError> {
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
        let mut engine = Engine::new(default_policy.clone());
        let mut start_offset = None;
        let mut pools = 0;
        if let Some(snap) = snap {
            start_offset = Some(snap.get::<i64, _>(0));
            let rows = sqlx::query(
                "SELECT state FROM engine_snapshots WHERE consumer_group = $1 AND topic = $2 AND partition = $3
                 ORDER BY pool",
            )
            .bind(&self.group)
            .bind(&self.topic)
            .bind(partition)
            .fetch_all(&mut *tx)
            .await?;
            for r in rows {
                let bytes: Vec<u8> = r.get(0);
                engine.restore_pool(&bytes).map_err(|e| DbError::Snapshot {
                    partition,
                    message: e.to_string(),
                })?;
                pools += 1;
            }
            engine.now = snap.get::<i64, _>(1);
        }
        tx.commit().await?;
        Ok(Restored {
            engine,
            start_offset,
            committed_offset: (committed >= 0).then_some(committed),
            epoch,
            pools,
        })
    }

    /// The batch, in one transaction: offsets (fenced by epoch), transitions, pool events, the
    /// endpoint-state projection, snapshots and outbox rows. Every insert is idempotent.
    pub async fn write_batch(&self, b: &BatchWrite) -> Result<(), DbError> {
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
            return Err(DbError::Fenced(fenced));
        }
        for chunk in b.discovered.chunks(CHUNK) {
            insert_discovered(&mut tx, chunk).await?;
        }
        for chunk in b.transitions.chunks(CHUNK) {
            insert_transitions(&mut tx, chunk).await?;
        }
        let latest = b.latest_states();
        for chunk in latest.chunks(CHUNK) {
            upsert_states(&mut tx, chunk).await?;
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
        tx: &mut sqlx::Transaction<'_, Postgres>,
        p: &PartitionWrite,
        s: &crate::batch::Snapshot,
    ) -> Result<(), DbError> {
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

async fn insert_transitions(
    tx: &mut sqlx::Transaction<'_, Postgres>,
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
        let failures =
            e.timeout + e.connect_error + e.connection_dropped + e.rate_limited + e.server_error + e.invalid_response;
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
            .push_bind(e.success + failures)
            .push_bind(failures)
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

async fn upsert_states(tx: &mut sqlx::Transaction<'_, Postgres>, rows: &[&HealthChanged]) -> Result<(), sqlx::Error> {
    let mut q = QueryBuilder::<Postgres>::new(
        "INSERT INTO endpoint_state (pool, endpoint, seq, state, weight, ramp_ms, score, failure_rate, since,
         reason, policy_version) ",
    );
    q.push_values(rows, |mut r, h| {
        r.push_bind(&h.pool)
            .push_bind(&h.endpoint)
            .push_bind(h.seq)
            .push_bind(h.to_state.as_str())
            .push_bind(h.weight)
            .push_bind(h.ramp_ms)
            .push_bind(h.evidence.score)
            .push_bind(h.evidence.failure_rate)
            .push_bind(timestamp(h.stream_time))
            .push_bind(&h.reason)
            .push_bind(h.policy_version);
    });
    q.push(
        " ON CONFLICT (pool, endpoint) DO UPDATE SET seq = excluded.seq, state = excluded.state,
          weight = excluded.weight, ramp_ms = excluded.ramp_ms, score = excluded.score,
          failure_rate = excluded.failure_rate, since = excluded.since, reason = excluded.reason,
          policy_version = excluded.policy_version
          WHERE endpoint_state.seq < excluded.seq",
    );
    q.build().execute(&mut **tx).await?;
    Ok(())
}

async fn insert_discovered(
    tx: &mut sqlx::Transaction<'_, Postgres>,
    rows: &[crate::batch::Discovered],
) -> Result<(), sqlx::Error> {
    let mut q = QueryBuilder::<Postgres>::new(
        "INSERT INTO endpoint_state (pool, endpoint, seq, state, weight, ramp_ms, score, failure_rate, since,
         reason, policy_version) ",
    );
    q.push_values(rows, |mut r, d| {
        r.push_bind(&d.pool)
            .push_bind(&d.endpoint)
            .push_bind(0i64)
            .push_bind("healthy")
            .push_bind(1.0f64)
            .push_bind(0i64)
            .push_bind(100.0f64)
            .push_bind(0.0f64)
            .push_bind(timestamp(d.stream_time))
            .push_bind("first seen")
            .push_bind(d.policy_version);
    });
    q.push(" ON CONFLICT (pool, endpoint) DO NOTHING");
    q.build().execute(&mut **tx).await?;
    Ok(())
}

async fn insert_pool_events(
    tx: &mut sqlx::Transaction<'_, Postgres>,
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

async fn insert_outbox(tx: &mut sqlx::Transaction<'_, Postgres>, rows: &[OutboxRow]) -> Result<(), sqlx::Error> {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn data_errors_are_permanent_and_outages_are_not() {
        assert!(!sqlstate_retryable("22008"), "datetime field overflow");
        assert!(!sqlstate_retryable("22003"), "numeric value out of range");
        assert!(!sqlstate_retryable("23505"), "unique violation");
        assert!(!sqlstate_retryable("42501"), "insufficient privilege");
        assert!(sqlstate_retryable("40001"), "serialization failure");
        assert!(sqlstate_retryable("55P03"), "lock not available");
        assert!(sqlstate_retryable("57P01"), "admin shutdown");
        assert!(sqlstate_retryable("08006"), "connection failure");
        assert!(
            sqlstate_retryable("25P03"),
            "idle-in-transaction timeout of a frozen process"
        );
        assert!(!sqlstate_retryable("25P02"), "in failed transaction");
        assert!(DbError::Sql(sqlx::Error::PoolTimedOut).is_retryable());
        assert!(!DbError::Fenced(vec![1]).is_retryable());
    }
}
