//! The outbox as the relay sees it: a lease that makes one relay active per schema, the rows to
//! publish in id order (each a pack of events, or one event as processors before migration 0017
//! wrote them), deleting them once published, and retention of the audit log.

pub use crate::pack::Event;
use crate::StoreError;
use sqlx::{PgConnection, Row};
use std::collections::BTreeMap;
use std::time::Duration;

/// An outbox row to publish: its events, in order. The row leaves once all of them are
/// acknowledged.
pub struct Pending {
    pub id: i64,
    pub events: Vec<Event>,
}

/// Take or renew the relay lease for `lease`; false while someone else holds a live one.
pub async fn take_lease(conn: &mut PgConnection, holder: &str, lease: Duration) -> Result<bool, sqlx::Error> {
    let got: Option<String> = sqlx::query_scalar(
        "INSERT INTO relay_lease (name, holder, expires_at)
         VALUES ('outbox', $1, clock_timestamp() + make_interval(secs => $2))
         ON CONFLICT (name) DO UPDATE SET holder = excluded.holder, expires_at = excluded.expires_at
         WHERE relay_lease.holder = excluded.holder OR relay_lease.expires_at < clock_timestamp()
         RETURNING holder",
    )
    .bind(holder)
    .bind(lease.as_secs_f64())
    .fetch_optional(&mut *conn)
    .await?;
    Ok(got.is_some())
}

/// Renew the lease only if `holder` still holds it and it has not run out: whether nobody else
/// can have published since `holder` last renewed it. (`take_lease` would take an expired lease
/// back, and with it hide that another relay held it in between.)
pub async fn hold_lease(conn: &mut PgConnection, holder: &str, lease: Duration) -> Result<bool, sqlx::Error> {
    let held: Option<String> = sqlx::query_scalar(
        "UPDATE relay_lease SET expires_at = clock_timestamp() + make_interval(secs => $2)
         WHERE name = 'outbox' AND holder = $1 AND expires_at >= clock_timestamp()
         RETURNING holder",
    )
    .bind(holder)
    .bind(lease.as_secs_f64())
    .fetch_optional(&mut *conn)
    .await?;
    Ok(held.is_some())
}

/// Give the lease up at once rather than after it runs out.
pub async fn release_lease(conn: &mut PgConnection, holder: &str) -> Result<(), sqlx::Error> {
    sqlx::query("UPDATE relay_lease SET expires_at = now() WHERE name = 'outbox' AND holder = $1")
        .bind(holder)
        .execute(&mut *conn)
        .await?;
    Ok(())
}

/// The oldest rows to publish, in id order, with up to `limit` events in all (at least one row,
/// whatever its size). A pack that cannot be read is [`StoreError::Corrupt`], naming its row.
pub async fn unpublished(conn: &mut PgConnection, limit: i64) -> Result<Vec<Pending>, StoreError> {
    // The head of the queue by id, each row with the events before it: rows are taken while
    // those stay under the limit (the first always).
    let rows = sqlx::query(
        "WITH head AS (
             SELECT id, sum(events) OVER (ORDER BY id) - events AS before
             FROM (SELECT id, events FROM outbox ORDER BY id LIMIT $1) h
         )
         SELECT o.id, o.events, o.messages, o.dedup_key, o.topic, o.key, o.payload, o.headers
         FROM head JOIN outbox o USING (id)
         WHERE head.before < $1
         ORDER BY o.id",
    )
    .bind(limit.max(1))
    .fetch_all(&mut *conn)
    .await?;
    rows.into_iter()
        .map(|r| {
            let id: i64 = r.try_get(0)?;
            let events = match r.try_get::<Option<Vec<u8>>, _>(2)? {
                Some(pack) => crate::pack::unpack(&pack, r.try_get(1)?)
                    .map_err(|e| StoreError::Corrupt(format!("outbox row {id}: {e}")))?,
                None => vec![Event {
                    dedup_key: r.try_get(3)?,
                    topic: r.try_get(4)?,
                    key: r.try_get(5)?,
                    payload: r.try_get(6)?,
                    headers: r.try_get::<sqlx::types::Json<BTreeMap<String, String>>, _>(7)?.0,
                }],
            };
            Ok(Pending { id, events })
        })
        .collect()
}

/// Rows Kafka has acknowledged leave the outbox. The delete does not wait for its WAL to reach
/// the disk (`synchronous_commit = off` for this transaction alone): lost in a crash, its rows
/// are published again, which consumers drop by seq, as they drop a relay's republish after a
/// lease changes hands; waiting stalled the relay behind the writer's commits under a burst.
pub async fn published(conn: &mut PgConnection, ids: &[i64]) -> Result<(), sqlx::Error> {
    let mut tx = sqlx::Connection::begin(&mut *conn).await?;
    sqlx::query("SET LOCAL synchronous_commit TO off")
        .execute(&mut *tx)
        .await?;
    sqlx::query("DELETE FROM outbox WHERE id = ANY($1)")
        .bind(ids)
        .execute(&mut *tx)
        .await?;
    tx.commit().await
}

/// Events not yet published. Rows are packs of up to 500 events, so this reads ~1,600 rows for
/// 820,000 events (where counting rows of one event each read them all: 63 ms on a quiet
/// machine, every 5 s).
pub async fn backlog(conn: &mut PgConnection) -> Result<i64, sqlx::Error> {
    sqlx::query_scalar("SELECT coalesce(sum(events), 0)::int8 FROM outbox")
        .fetch_one(&mut *conn)
        .await
}

/// Keep the audit log bounded when the retention has days: the months of transitions and pool events
/// that ended more than its days ago (by stream time) are dropped whole, so a row is kept at
/// least that long and at most a month longer. The tables dropped.
/// The cut-off is the one the writer skips rows by ([`crate::months::Retention`]).
pub async fn retention(
    conn: &mut PgConnection,
    retention: crate::months::Retention,
) -> Result<Vec<String>, sqlx::Error> {
    match retention.cutoff(chrono::Utc::now()) {
        None => Ok(Vec::new()),
        Some(cutoff) => crate::months::drop_months_before(conn, cutoff).await,
    }
}
