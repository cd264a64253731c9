//! The outbox as the relay sees it: a lease that makes one relay active per schema, the rows to
//! publish in id order, deleting them once published, and retention of the audit log.

use sqlx::{PgConnection, Row};
use std::collections::BTreeMap;
use std::time::Duration;

/// An event to publish.
pub struct Pending {
    pub id: i64,
    pub topic: String,
    pub key: Option<Vec<u8>>,
    pub payload: Vec<u8>,
    pub headers: BTreeMap<String, String>,
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

/// Up to `limit` rows to publish, oldest first.
pub async fn unpublished(conn: &mut PgConnection, limit: i64) -> Result<Vec<Pending>, sqlx::Error> {
    let rows = sqlx::query("SELECT id, topic, key, payload, headers FROM outbox ORDER BY id LIMIT $1")
        .bind(limit)
        .fetch_all(&mut *conn)
        .await?;
    Ok(rows
        .into_iter()
        .map(|r| Pending {
            id: r.get(0),
            topic: r.get(1),
            key: r.get(2),
            payload: r.get(3),
            headers: r.get::<sqlx::types::Json<BTreeMap<String, String>>, _>(4).0,
        })
        .collect())
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

/// Rows not yet published, about: the span of the ids still there (two index probes, where
/// `count(*)` read every row: 63 ms at 820,000 rows on a quiet machine, every 5 s). Ids a
/// rolled-back batch took make it an upper bound.
pub async fn backlog(conn: &mut PgConnection) -> Result<i64, sqlx::Error> {
    sqlx::query_scalar("SELECT coalesce(max(id) - min(id) + 1, 0) FROM outbox")
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
