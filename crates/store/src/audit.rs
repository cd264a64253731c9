//! The write side: claiming a partition (with its snapshot), and the one transaction per batch
//! that makes the processor exactly-once. Every insert is idempotent, so a replayed batch is a
//! no-op.

use crate::months::{Months, Retention};
use crate::{timestamp, StoreError};
use sqlx::{PgPool, Postgres, Row, Transaction};
use std::time::{Duration, Instant};
use vitals_contracts::batch::{BatchWrite, Counted, OutboxRow, PartitionWrite, PolicyInForce, Rollup, Snapshot};
use vitals_contracts::scope::ends_scoped;
use vitals_contracts::{EndpointState, HealthChanged, PoolHealthChanged};
use vitals_contracts::{Micros, Requests};

/// Where a batch transaction spent its time, statement by statement (wall time, including the
/// round trip to Postgres).
#[derive(Debug, Default, Clone, Copy)]
pub struct StatementTimes {
    pub begin: Duration,
    pub offsets: Duration,
    pub discovered: Duration,
    pub transitions: Duration,
    pub states: Duration,
    pub pool_events: Duration,
    pub outbox: Duration,
    pub snapshots: Duration,
    pub requests: Duration,
    pub commit: Duration,
}

impl StatementTimes {
    /// (statement, seconds), in the order the transaction runs them.
    pub fn named(&self) -> [(&'static str, Duration); 10] {
        [
            ("begin", self.begin),
            ("offsets", self.offsets),
            ("discovered", self.discovered),
            ("transitions", self.transitions),
            ("states", self.states),
            ("pool_events", self.pool_events),
            ("outbox", self.outbox),
            ("snapshots", self.snapshots),
            ("requests", self.requests),
            ("commit", self.commit),
        ]
    }
}

/// A stopwatch that hands out the time since its last lap.
struct Lap(Instant);

impl Lap {
    fn next(&mut self) -> Duration {
        let now = Instant::now();
        let d = now - self.0;
        self.0 = now;
        d
    }
}

/// Whether a batch may be in the audit log already: [`AuditLog::write_batch`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Attempt {
    /// Its first write: nothing of it can be there.
    First,
    /// Written again after an error: the commit before may have gone through.
    Retry,
}

/// What a written batch did: where its time went, and the audit rows it did not write because
/// retention no longer keeps their month.
#[derive(Debug, Default, Clone, Copy)]
pub struct Written {
    pub times: StatementTimes,
    pub expired_rows: u64,
}

/// A claimed partition: its ownership epoch, its offsets and its stored snapshot (the
/// processor restores its engine from it; the store never links the engine).
pub struct Claimed {
    /// The stored snapshot, if the partition has one.
    pub snapshot: Option<StoredSnapshot>,
    /// First offset not yet in the database (records between the snapshot's offset and this
    /// are replayed, and every write of the replay is a no-op).
    pub committed_offset: Option<i64>,
    pub epoch: i64,
    /// The first offset whose calls are not counted in the request rollups yet.
    pub requests_offset: i64,
}

/// A partition's snapshot as stored: where it resumes, its stream time and its pools' states.
pub struct StoredSnapshot {
    /// First offset to read: the first record not applied to it.
    pub offset: i64,
    pub stream_time: i64,
    /// Each pool's stored state, in pool order.
    pub pools: Vec<Vec<u8>>,
}

/// The audit log of one consumer group reading one signals topic.
#[derive(Clone)]
pub struct AuditLog {
    pub pool: PgPool,
    pub group: String,
    pub topic: String,
    /// The audit log's months this writer knows exist (it creates the ones it lacks).
    pub months: Months,
}

impl AuditLog {
    /// Take ownership of a partition (bumping its epoch fences the previous owner) and load its
    /// snapshot. The row lock on the offsets row waits for the previous owner's last batch.
    pub async fn claim_partition(&self, partition: i32) -> Result<Claimed, StoreError> {
        let mut tx = self.pool.begin().await?;
        let row = sqlx::query(
            "INSERT INTO consumer_offsets (consumer_group, topic, partition, next_offset, epoch, requests_offset)
             VALUES ($1, $2, $3, -1, 1, 0)
             ON CONFLICT (consumer_group, topic, partition) DO UPDATE SET epoch = consumer_offsets.epoch + 1,
                 requests_offset = CASE WHEN consumer_offsets.requests_offset < 0
                                        THEN GREATEST(consumer_offsets.next_offset, 0)
                                        ELSE consumer_offsets.requests_offset END
             RETURNING next_offset, epoch, requests_offset",
        )
        .bind(&self.group)
        .bind(&self.topic)
        .bind(partition)
        .fetch_one(&mut *tx)
        .await?;
        let committed: i64 = row.get(0);
        let snap = sqlx::query(
            "SELECT snapshot_offset, stream_time FROM partition_snapshots
             WHERE consumer_group = $1 AND topic = $2 AND partition = $3",
        )
        .bind(&self.group)
        .bind(&self.topic)
        .bind(partition)
        .fetch_optional(&mut *tx)
        .await?;
        let snapshot = match snap {
            None => None,
            Some(snap) => Some(StoredSnapshot {
                offset: snap.get(0),
                stream_time: snap.get(1),
                pools: sqlx::query_scalar(
                    "SELECT state FROM engine_snapshots WHERE consumer_group = $1 AND topic = $2 AND partition = $3
                     ORDER BY pool",
                )
                .bind(&self.group)
                .bind(&self.topic)
                .bind(partition)
                .fetch_all(&mut *tx)
                .await?,
            }),
        };
        tx.commit().await?;
        Ok(Claimed {
            snapshot,
            committed_offset: (committed >= 0).then_some(committed),
            epoch: row.get(1),
            requests_offset: row.get(2),
        })
    }

    /// The policies in force of pools restored from a snapshot, for pools whose policy changed
    /// before `pool_policies` existed; a row already there is as new or newer (it was written by
    /// the batch that applied it) and stays.
    pub async fn record_policies(&self, rows: &[PolicyInForce]) -> Result<(), StoreError> {
        if rows.is_empty() {
            return Ok(());
        }
        let mut tx = self.pool.begin().await?;
        upsert_policies(&mut tx, rows).await?;
        tx.commit().await?;
        Ok(())
    }

    /// The batch, in one transaction: offsets (fenced by epoch), first-seen endpoints,
    /// transitions, the endpoint-state projection, pool events, outbox rows and snapshots.
    /// Returns where the time went.
    ///
    /// `attempt` says whether the batch may be in the log already. A first attempt inserts its
    /// transitions and pool events plainly: a restored partition emits nothing for the records
    /// below its committed offset, and the epoch fence keeps two owners from committing the same
    /// offsets, so only a retry can meet its own rows (a commit whose answer was lost). Should a
    /// first attempt meet one all the same, it fails as [`StoreError::AlreadyWritten`], and the
    /// retry inserts with `ON CONFLICT DO NOTHING`, as every retry does. `ON CONFLICT` makes each
    /// insert speculative (the arbiter index is searched first, and the insert confirmed after):
    /// 30,000 transitions took 12-20 µs of backend CPU a row plainly, 17-25 with it.
    pub async fn write_batch(&self, b: &BatchWrite, attempt: Attempt) -> Result<Written, StoreError> {
        let mut t = StatementTimes::default();
        let mut lap = Lap(Instant::now());
        // Rows of months that retention no longer keeps are not written (the relay would drop
        // them, and a month created again for them would be dropped again): counted instead.
        // Their events are still published, and the state projection still follows them.
        let cutoff = self.months.retention.cutoff(chrono::Utc::now());
        let transitions: Vec<&(HealthChanged, i32, i64)> = b
            .transitions
            .iter()
            .filter(|(h, _, _)| Retention::keeps(cutoff, h.stream_time))
            .collect();
        let pool_events: Vec<&(PoolHealthChanged, i32, i64)> = b
            .pool_events
            .iter()
            .filter(|(p, _, _)| Retention::keeps(cutoff, p.stream_time))
            .collect();
        let expired = (b.transitions.len() - transitions.len()) + (b.pool_events.len() - pool_events.len());
        let counted: Vec<&Counted> = b.partitions.iter().filter_map(|p| p.requests.as_ref()).collect();
        let minutes: Vec<Micros> = counted
            .iter()
            .flat_map(|c| c.rollups.iter().map(|r| r.minute))
            .filter(|m| Retention::keeps(cutoff, *m))
            .collect();
        let times = transitions.iter().map(|(h, _, _)| h.stream_time);
        self.months
            .ensure(
                &self.pool,
                times
                    .chain(pool_events.iter().map(|(p, _, _)| p.stream_time))
                    .chain(minutes.iter().copied()),
            )
            .await?;
        let mut tx = self.pool.begin().await?;
        t.begin = lap.next();
        // One statement for every partition of the batch; a partition whose epoch moved on
        // (another processor claimed it) is not updated, and the batch is refused.
        // The counted offset moves with the next offset; `old` is the row as it was, so that
        // counts a committed batch already added (a retried write) are not added again.
        let updated: Vec<(i32, i64)> = sqlx::query_as(
            "UPDATE consumer_offsets c SET next_offset = GREATEST(c.next_offset, u.next_offset),
                 requests_offset = GREATEST(c.requests_offset, u.counted_to)
             FROM UNNEST($3::int4[], $4::int8[], $5::int8[], $6::int8[]) AS u(partition, next_offset, epoch, counted_to),
                  consumer_offsets old
             WHERE c.consumer_group = $1 AND c.topic = $2 AND c.partition = u.partition AND c.epoch = u.epoch
               AND old.consumer_group = c.consumer_group AND old.topic = c.topic AND old.partition = c.partition
             RETURNING c.partition, old.requests_offset",
        )
        .bind(&self.group)
        .bind(&self.topic)
        .bind(column(&b.partitions, |p| p.partition))
        .bind(column(&b.partitions, |p| p.next_offset))
        .bind(column(&b.partitions, |p| p.epoch))
        .bind(column(&b.partitions, |p| p.requests.as_ref().map_or(-1, |c| c.to)))
        .fetch_all(&mut *tx)
        .await?;
        let counted_before: std::collections::HashMap<i32, i64> = updated.iter().copied().collect();
        let fenced: Vec<i32> = b
            .partitions
            .iter()
            .map(|p| p.partition)
            .filter(|p| !counted_before.contains_key(p))
            .collect();
        if !fenced.is_empty() {
            tx.rollback().await?;
            return Err(StoreError::Fenced(fenced));
        }
        t.offsets = lap.next();
        let discovered: Vec<&EndpointState> = b.discovered.iter().map(|(s, _)| s).collect();
        if !discovered.is_empty() {
            write_states(&mut tx, &discovered, Conflict::Keep).await?;
        }
        t.discovered = lap.next();
        if !transitions.is_empty() {
            insert_transitions(&mut tx, &transitions, attempt)
                .await
                .map_err(|e| self.insert_failed(e))?;
        }
        write_scoped_states(&mut tx, &transitions).await?;
        t.transitions = lap.next();
        let latest: Vec<EndpointState> = b.latest_states().into_iter().map(EndpointState::from_change).collect();
        if !latest.is_empty() {
            write_states(&mut tx, &latest.iter().collect::<Vec<_>>(), Conflict::Newer).await?;
        }
        t.states = lap.next();
        if !pool_events.is_empty() {
            insert_pool_events(&mut tx, &pool_events, attempt)
                .await
                .map_err(|e| self.insert_failed(e))?;
        }
        t.pool_events = lap.next();
        if !b.outbox.is_empty() {
            insert_outbox(&mut tx, &b.outbox).await?;
        }
        t.outbox = lap.next();
        if !b.policies.is_empty() {
            upsert_policies(&mut tx, &b.policies).await?;
        }
        for p in &b.partitions {
            if let Some(s) = &p.snapshot {
                self.write_snapshot(&mut tx, p, s).await?;
            }
        }
        t.snapshots = lap.next();
        let rollups: Vec<&Rollup> = b
            .partitions
            .iter()
            .filter_map(|p| p.requests.as_ref().map(|c| (p.partition, c)))
            .filter(|(p, c)| counted_before.get(p).is_some_and(|before| *before < c.to))
            .flat_map(|(_, c)| c.rollups.iter())
            .filter(|r| Retention::keeps(cutoff, r.minute))
            .collect();
        if !rollups.is_empty() {
            write_rollups(&mut tx, &rollups)
                .await
                .map_err(|e| self.month_missing(e))?;
        }
        t.requests = lap.next();
        tx.commit().await?;
        t.commit = lap.next();
        Ok(Written {
            times: t,
            expired_rows: expired as u64,
        })
    }

    /// An audit row the first attempt of a batch could not insert because it is there already
    /// (SQLSTATE 23505): the batch is retried as a replay. Anything else as [`Self::month_missing`].
    fn insert_failed(&self, e: sqlx::Error) -> StoreError {
        match &e {
            sqlx::Error::Database(d) if d.code().as_deref() == Some("23505") => {
                StoreError::AlreadyWritten(e.to_string())
            }
            _ => self.month_missing(e),
        }
    }

    /// A row with no month to go to: the month was dropped after this writer last saw it
    /// (retention racing the batch, or by hand). Not a data error: forget the months, and the
    /// retried batch creates what it needs or skips what retention no longer keeps.
    fn month_missing(&self, e: sqlx::Error) -> StoreError {
        let missing = matches!(&e, sqlx::Error::Database(d)
            if d.code().as_deref() == Some("23514") && d.message().starts_with("no partition of relation"));
        if missing {
            self.months.forget();
            StoreError::MonthMissing(e.to_string())
        } else {
            StoreError::Sql(e)
        }
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
        sqlx::query(
            "INSERT INTO engine_snapshots (consumer_group, topic, partition, pool, state)
             SELECT $1, $2, $3, pool, state FROM UNNEST($4::text[], $5::bytea[]) AS u(pool, state)
             ON CONFLICT (consumer_group, topic, partition, pool) DO UPDATE SET state = excluded.state",
        )
        .bind(&self.group)
        .bind(&self.topic)
        .bind(p.partition)
        .bind(column(&s.pools, |(pool, _)| pool.as_str()))
        .bind(column(&s.pools, |(_, state)| state.as_slice()))
        .execute(&mut **tx)
        .await?;
        Ok(())
    }
}

// Every insert below is one fixed statement over column arrays (`UNNEST`), so Postgres parses
// and plans it once per connection whatever the number of rows; a statement built with one
// placeholder per value was a new statement for every batch size, planned again each time.

/// The statement for this attempt: the insert as it is on a first write, with its `ON CONFLICT`
/// clause on a retry ([`AuditLog::write_batch`]). Both are fixed strings, prepared once each.
macro_rules! by_attempt {
    ($attempt:expr, $insert:literal, $on_conflict:literal) => {
        match $attempt {
            Attempt::First => $insert,
            Attempt::Retry => concat!($insert, " ", $on_conflict),
        }
    };
}

/// Transitions with the input record that caused each, (partition, offset). A retry is
/// idempotent by (pool, endpoint, seq, stream_time): a replay makes the same seq at the same
/// stream time.
async fn insert_transitions(
    tx: &mut Transaction<'_, Postgres>,
    rows: &[&(HealthChanged, i32, i64)],
    attempt: Attempt,
) -> Result<(), sqlx::Error> {
    sqlx::query(by_attempt!(
        attempt,
        "INSERT INTO transitions (pool, endpoint, seq, transition_id, from_state, to_state, weight, ramp_ms,
         retry_at, reason_code, reason, window_calls, trigger_ids, policy_version, evidence, stream_time,
         source_partition, source_offset, scope)
         SELECT pool, endpoint, seq, transition_id, from_state, to_state, weight, ramp_ms, retry_at, reason_code,
         reason, window_calls, trigger_ids::text[], policy_version, evidence::json, stream_time, source_partition,
         source_offset, scope
         FROM UNNEST($1::text[], $2::text[], $3::int8[], $4::text[], $5::text[], $6::text[], $7::float8[],
         $8::int8[], $9::timestamptz[], $10::text[], $11::text[], $12::int8[], $13::text[], $14::int4[], $15::text[],
         $16::timestamptz[], $17::int4[], $18::int8[], $19::text[])
         AS u(pool, endpoint, seq, transition_id, from_state, to_state, weight, ramp_ms, retry_at, reason_code,
         reason, window_calls, trigger_ids, policy_version, evidence, stream_time, source_partition, source_offset,
         scope)",
        "ON CONFLICT (pool, endpoint, seq, stream_time) DO NOTHING"
    ))
    .bind(column(rows, |(h, _, _)| h.pool.as_str()))
    .bind(column(rows, |(h, _, _)| h.endpoint.as_str()))
    .bind(column(rows, |(h, _, _)| h.seq))
    .bind(column(rows, |(h, _, _)| h.transition_id.as_str()))
    .bind(column(rows, |(h, _, _)| h.from_state.as_str()))
    .bind(column(rows, |(h, _, _)| h.to_state.as_str()))
    .bind(column(rows, |(h, _, _)| h.weight))
    .bind(column(rows, |(h, _, _)| h.ramp_ms))
    .bind(column(rows, |(h, _, _)| h.retry_at.map(timestamp)))
    .bind(column(rows, |(h, _, _)| h.reason_code.as_str()))
    .bind(column(rows, |(h, _, _)| h.reason.as_str()))
    .bind(column(rows, |(h, _, _)| h.evidence.decisive_calls()))
    .bind(column(rows, |(h, _, _)| array_literal(&h.trigger_ids)))
    .bind(column(rows, |(h, _, _)| h.policy_version))
    .bind(column(rows, |(h, _, _)| json_text(&h.evidence)))
    .bind(column(rows, |(h, _, _)| timestamp(h.stream_time)))
    .bind(column(rows, |(_, p, _)| *p))
    .bind(column(rows, |(_, _, o)| *o))
    .bind(column(rows, |(h, _, _)| h.scope.as_deref()))
    .execute(&mut **tx)
    .await?;
    Ok(())
}

/// The scoped-state projection after the batch's transitions, in their order: a scoped
/// transition out of rotation is its scope's row, one back in rotation deletes it, and a fleet
/// transition out of rotation deletes the endpoint's older rows. Rows of an older seq never
/// replace newer ones (a replay).
async fn write_scoped_states(
    tx: &mut Transaction<'_, Postgres>,
    rows: &[&(HealthChanged, i32, i64)],
) -> Result<(), sqlx::Error> {
    let ended: Vec<&HealthChanged> = rows
        .iter()
        .map(|(h, _, _)| h)
        .filter(|h| h.scope.is_none() && ends_scoped(h.to_state))
        .collect();
    if !ended.is_empty() {
        sqlx::query(
            "DELETE FROM scoped_state s USING UNNEST($1::text[], $2::text[], $3::int8[]) AS u(pool, endpoint, seq)
             WHERE s.pool = u.pool AND s.endpoint = u.endpoint AND s.seq < u.seq",
        )
        .bind(column(&ended, |h| h.pool.as_str()))
        .bind(column(&ended, |h| h.endpoint.as_str()))
        .bind(column(&ended, |h| h.seq))
        .execute(&mut **tx)
        .await?;
    }
    let mut last: std::collections::BTreeMap<(&str, &str, &str), &HealthChanged> = Default::default();
    for (h, _, _) in rows {
        if let Some(scope) = &h.scope {
            let e = last.entry((&h.pool, &h.endpoint, scope)).or_insert(h);
            if e.seq < h.seq {
                *e = h;
            }
        }
    }
    let (out, back): (Vec<&HealthChanged>, Vec<&HealthChanged>) =
        last.into_values().partition(|h| ends_scoped(h.to_state));
    if !back.is_empty() {
        sqlx::query(
            "DELETE FROM scoped_state s USING UNNEST($1::text[], $2::text[], $3::text[], $4::int8[])
             AS u(pool, endpoint, scope, seq)
             WHERE s.pool = u.pool AND s.endpoint = u.endpoint AND s.scope = u.scope AND s.seq < u.seq",
        )
        .bind(column(&back, |h| h.pool.as_str()))
        .bind(column(&back, |h| h.endpoint.as_str()))
        .bind(column(&back, |h| h.scope.as_deref().unwrap_or_default()))
        .bind(column(&back, |h| h.seq))
        .execute(&mut **tx)
        .await?;
    }
    if !out.is_empty() {
        sqlx::query(
            "INSERT INTO scoped_state (pool, endpoint, scope, seq, state, weight, retry_at, since, reason)
             SELECT * FROM UNNEST($1::text[], $2::text[], $3::text[], $4::int8[], $5::text[], $6::float8[],
             $7::timestamptz[], $8::timestamptz[], $9::text[])
             ON CONFLICT (pool, endpoint, scope) DO UPDATE SET seq = excluded.seq, state = excluded.state,
             weight = excluded.weight, retry_at = excluded.retry_at, since = excluded.since, reason = excluded.reason
             WHERE scoped_state.seq < excluded.seq",
        )
        .bind(column(&out, |h| h.pool.as_str()))
        .bind(column(&out, |h| h.endpoint.as_str()))
        .bind(column(&out, |h| h.scope.as_deref().unwrap_or_default()))
        .bind(column(&out, |h| h.seq))
        .bind(column(&out, |h| h.to_state.as_str()))
        .bind(column(&out, |h| h.weight))
        .bind(column(&out, |h| h.retry_at.map(timestamp)))
        .bind(column(&out, |h| timestamp(h.stream_time)))
        .bind(column(&out, |h| h.reason.as_str()))
        .execute(&mut **tx)
        .await?;
    }
    Ok(())
}

/// An hour in µs.
pub const HOUR_US: Micros = 3_600_000_000;

/// The calls counted by minute, added to the minute and hour rows they fall in. Rows of one key
/// are summed first (one upsert may not touch a row twice, and a pool read from two partitions
/// gives one endpoint's minute twice).
async fn write_rollups(tx: &mut Transaction<'_, Postgres>, rows: &[&Rollup]) -> Result<(), sqlx::Error> {
    let mut minutes: std::collections::BTreeMap<(&str, &str, Micros), Requests> = Default::default();
    let mut hours: std::collections::BTreeMap<(&str, &str, Micros), Requests> = Default::default();
    for r in rows {
        let (p, e) = (r.pool.as_str(), r.endpoint.as_str());
        minutes.entry((p, e, r.minute)).or_default().merge(&r.requests);
        let hour = r.minute.div_euclid(HOUR_US) * HOUR_US;
        hours.entry((p, e, hour)).or_default().merge(&r.requests);
    }
    for (table, at, sums) in [
        ("request_rollups", "minute", &minutes),
        ("request_rollups_hourly", "hour", &hours),
    ] {
        let rows: Vec<(&(&str, &str, Micros), &Requests)> = sums.iter().collect();
        sqlx::query(&format!(
            "INSERT INTO {table} (pool, endpoint, {at}, succeeded, failed, rate_limited, neutral)
             SELECT * FROM UNNEST($1::text[], $2::text[], $3::timestamptz[], $4::int8[], $5::int8[], $6::int8[], $7::int8[])
             ON CONFLICT (pool, endpoint, {at}) DO UPDATE SET
                 succeeded = {table}.succeeded + excluded.succeeded,
                 failed = {table}.failed + excluded.failed,
                 rate_limited = {table}.rate_limited + excluded.rate_limited,
                 neutral = {table}.neutral + excluded.neutral"
        ))
        .bind(column(&rows, |(k, _)| k.0))
        .bind(column(&rows, |(k, _)| k.1))
        .bind(column(&rows, |(k, _)| timestamp(k.2)))
        .bind(column(&rows, |(_, r)| r.succeeded))
        .bind(column(&rows, |(_, r)| r.failed))
        .bind(column(&rows, |(_, r)| r.rate_limited))
        .bind(column(&rows, |(_, r)| r.neutral))
        .execute(&mut **tx)
        .await?;
    }
    Ok(())
}

/// Each pool's policy in force; a row already there stays if it is newer. Several changes of one
/// pool in a batch come in log order and the last one is in force: one `ON CONFLICT DO UPDATE`
/// statement may not touch a row twice (Postgres refuses the whole statement), so only the last
/// of each pool is written.
async fn upsert_policies(tx: &mut Transaction<'_, Postgres>, rows: &[PolicyInForce]) -> Result<(), StoreError> {
    let rows = last_per_key(rows, |r| r.pool.as_str());
    sqlx::query(
        "INSERT INTO pool_policies (pool, version, policy, stream_time)
         SELECT * FROM UNNEST($1::text[], $2::int8[], $3::jsonb[], $4::timestamptz[])
         ON CONFLICT (pool) DO UPDATE SET version = excluded.version, policy = excluded.policy,
             stream_time = excluded.stream_time
         WHERE pool_policies.stream_time <= excluded.stream_time",
    )
    .bind(column(&rows, |r| r.pool.as_str()))
    .bind(column(&rows, |r| i64::from(r.policy.version)))
    .bind(column(&rows, |r| sqlx::types::Json(&r.policy)))
    .bind(column(&rows, |r| timestamp(r.stream_time)))
    .execute(&mut **tx)
    .await?;
    Ok(())
}

/// The last row of each key, in the order the rows came (an upsert of several rows with one key
/// in one statement is refused by Postgres: `ON CONFLICT DO UPDATE command cannot affect row a
/// second time`).
pub fn last_per_key<'a, R, K: std::hash::Hash + Eq>(rows: &'a [R], key: impl Fn(&'a R) -> K) -> Vec<&'a R> {
    let mut last: std::collections::HashMap<K, usize> = std::collections::HashMap::with_capacity(rows.len());
    for (i, r) in rows.iter().enumerate() {
        last.insert(key(r), i);
    }
    rows.iter()
        .enumerate()
        .filter(|(i, r)| last.get(&key(r)) == Some(i))
        .map(|(_, r)| r)
        .collect()
}

/// One column of a multi-row statement: `f` of every row, for `UNNEST`.
fn column<'a, R, T>(rows: &'a [R], f: impl Fn(&'a R) -> T) -> Vec<T> {
    rows.iter().map(f).collect()
}

/// A value as JSON text, for a `json` column (migration 0016: checked, not converted as jsonb was).
fn json_text<T: serde::Serialize>(value: &T) -> String {
    serde_json::to_string(value).expect("contract types always serialize")
}

/// A `text[]` value as Postgres array literal (`{"a","b"}`), so that an array column of many rows
/// travels as one text array (UNNEST cannot take an array of arrays of different lengths).
fn array_literal(items: &[String]) -> String {
    let mut s = String::from("{");
    for (i, item) in items.iter().enumerate() {
        if i > 0 {
            s.push(',');
        }
        s.push('"');
        for c in item.chars() {
            if c == '"' || c == '\\' {
                s.push('\\');
            }
            s.push(c);
        }
        s.push('"');
    }
    s.push('}');
    s
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
    let sql = format!(
        "INSERT INTO endpoint_state (pool, endpoint, seq, state, weight, ramp_ms, score, failure_rate, since,
         reason, policy_version, first_seen)
         SELECT u.*, u.since FROM UNNEST($1::text[], $2::text[], $3::int8[], $4::text[], $5::float8[], $6::int8[],
         $7::float8[], $8::float8[], $9::timestamptz[], $10::text[], $11::int4[])
         AS u(pool, endpoint, seq, state, weight, ramp_ms, score, failure_rate, since, reason, policy_version) {}",
        match conflict {
            Conflict::Keep => "ON CONFLICT (pool, endpoint) DO NOTHING",
            Conflict::Newer => {
                "ON CONFLICT (pool, endpoint) DO UPDATE SET seq = excluded.seq, state = excluded.state,
                 weight = excluded.weight, ramp_ms = excluded.ramp_ms, score = excluded.score,
                 failure_rate = excluded.failure_rate, since = excluded.since, reason = excluded.reason,
                 policy_version = excluded.policy_version
                 WHERE endpoint_state.seq < excluded.seq"
            }
        }
    );
    sqlx::query(&sql)
        .bind(column(rows, |s| s.pool.as_str()))
        .bind(column(rows, |s| s.endpoint.as_str()))
        .bind(column(rows, |s| s.seq))
        .bind(column(rows, |s| s.state.as_str()))
        .bind(column(rows, |s| s.weight))
        .bind(column(rows, |s| s.ramp_ms))
        .bind(column(rows, |s| s.score))
        .bind(column(rows, |s| s.failure_rate))
        .bind(column(rows, |s| timestamp(s.since)))
        .bind(column(rows, |s| s.reason.as_str()))
        .bind(column(rows, |s| s.policy_version))
        .execute(&mut **tx)
        .await?;
    Ok(())
}

async fn insert_pool_events(
    tx: &mut Transaction<'_, Postgres>,
    rows: &[&(PoolHealthChanged, i32, i64)],
    attempt: Attempt,
) -> Result<(), sqlx::Error> {
    sqlx::query(by_attempt!(
        attempt,
        "INSERT INTO pool_events (pool, seq, endpoints, healthy, ejected, healthy_fraction, panic,
         correlated_outage, reason, policy_version, stream_time, source_partition, source_offset,
         faulty_reporters)
         SELECT pool, seq, endpoints, healthy, ejected, healthy_fraction, panic, correlated_outage, reason,
         policy_version, stream_time, source_partition, source_offset, faulty_reporters::text[]
         FROM UNNEST($1::text[], $2::int8[], $3::int4[], $4::int4[], $5::int4[], $6::float8[],
         $7::bool[], $8::bool[], $9::text[], $10::int4[], $11::timestamptz[], $12::int4[], $13::int8[], $14::text[])
         AS u(pool, seq, endpoints, healthy, ejected, healthy_fraction, panic, correlated_outage, reason,
         policy_version, stream_time, source_partition, source_offset, faulty_reporters)",
        "ON CONFLICT (pool, seq, stream_time) DO NOTHING"
    ))
    .bind(column(rows, |(p, _, _)| p.pool.as_str()))
    .bind(column(rows, |(p, _, _)| p.seq))
    .bind(column(rows, |(p, _, _)| p.endpoints))
    .bind(column(rows, |(p, _, _)| p.healthy))
    .bind(column(rows, |(p, _, _)| p.ejected))
    .bind(column(rows, |(p, _, _)| p.healthy_fraction))
    .bind(column(rows, |(p, _, _)| p.panic))
    .bind(column(rows, |(p, _, _)| p.correlated_outage))
    .bind(column(rows, |(p, _, _)| p.reason.as_str()))
    .bind(column(rows, |(p, _, _)| p.policy_version))
    .bind(column(rows, |(p, _, _)| timestamp(p.stream_time)))
    .bind(column(rows, |(_, part, _)| *part))
    .bind(column(rows, |(_, _, o)| *o))
    .bind(column(rows, |(p, _, _)| array_literal(&p.faulty_reporters)))
    .execute(&mut **tx)
    .await?;
    Ok(())
}

/// The batch's events, in order, as packs (their ids give the relay's publishing order, and
/// each pack keeps its events' order): [`crate::pack`].
async fn insert_outbox(tx: &mut Transaction<'_, Postgres>, rows: &[OutboxRow]) -> Result<(), sqlx::Error> {
    let packs = crate::pack::pack(rows);
    sqlx::query(
        "INSERT INTO outbox (events, messages)
         SELECT events, messages FROM UNNEST($1::int4[], $2::bytea[]) WITH ORDINALITY AS u(events, messages, n)
         ORDER BY n",
    )
    .bind(column(&packs, |(events, _)| *events))
    .bind(column(&packs, |(_, bytes)| bytes.as_slice()))
    .execute(&mut **tx)
    .await?;
    Ok(())
}
