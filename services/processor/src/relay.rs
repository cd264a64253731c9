//! The outbox relay: publishes committed outbox rows to Kafka with an idempotent producer, in
//! id order, and marks them published. One relay is active per database schema, by a lease in
//! `relay_lease` that its holder renews every second and that expires after [`LEASE`]: a frozen
//! or partitioned holder loses it and another processor's relay takes over. Events of one
//! endpoint leave in sequence order. A crash between publish and mark, or a holder that resumes
//! after losing its lease, republishes; consumers drop duplicates by (endpoint, seq).

use crate::metrics::Metrics;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};
use sqlx::{PgPool, Row};
use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

/// How long a lease lasts without renewal, and how often the holder renews it.
pub const LEASE: Duration = Duration::from_secs(3);
const RENEW_EVERY: Duration = Duration::from_millis(1000);

pub struct Relay {
    pub pool: PgPool,
    pub schema: String,
    pub producer: FutureProducer,
    pub batch: i64,
    pub metrics: Arc<Metrics>,
    pub wake: Arc<Notify>,
    pub cancel: CancellationToken,
    pub outbox_retention_hours: i64,
    pub audit_retention_days: i64,
    /// Who holds the lease: unique per process (host, pid, start time).
    pub holder: String,
}

impl Relay {
    pub async fn run(self) {
        let mut backoff = Duration::from_millis(100);
        while !self.cancel.is_cancelled() {
            match self.lead().await {
                Ok(()) => backoff = Duration::from_millis(100),
                Err(e) => {
                    tracing::warn!(error = %e, retry_in = ?backoff, "outbox relay error");
                    tokio::select! {
                        _ = self.cancel.cancelled() => {}
                        _ = tokio::time::sleep(backoff) => {}
                    }
                    backoff = (backoff * 2).min(Duration::from_secs(5));
                }
            }
        }
    }

    /// Take the lease (waiting while another holder keeps it alive) and publish until cancelled,
    /// an error, or the lease is lost.
    async fn lead(&self) -> anyhow::Result<()> {
        let mut conn = self.pool.acquire().await?;
        while !self.lease(&mut conn).await? {
            tokio::select! {
                _ = self.cancel.cancelled() => return Ok(()),
                _ = tokio::time::sleep(LEASE / 6) => {}
            }
        }
        tracing::info!(holder = %self.holder, "outbox relay is active");
        // The lease is renewed beside the publishing, so a slow round (a busy broker) does not
        // let it lapse; a frozen process stops both, and the lease runs out.
        let result = tokio::select! {
            r = self.publish_until_cancelled(&mut conn) => r,
            r = self.keep_lease() => r,
        };
        // Hand over at once rather than after the lease runs out.
        let _ = sqlx::query("UPDATE relay_lease SET expires_at = now() WHERE name = 'outbox' AND holder = $1")
            .bind(&self.holder)
            .execute(&mut *conn)
            .await;
        result
    }

    /// Take or renew the lease; false while someone else holds a live one.
    async fn lease(&self, conn: &mut sqlx::PgConnection) -> anyhow::Result<bool> {
        let got: Option<String> = sqlx::query_scalar(
            "INSERT INTO relay_lease (name, holder, expires_at)
             VALUES ('outbox', $1, clock_timestamp() + make_interval(secs => $2))
             ON CONFLICT (name) DO UPDATE SET holder = excluded.holder, expires_at = excluded.expires_at
             WHERE relay_lease.holder = excluded.holder OR relay_lease.expires_at < clock_timestamp()
             RETURNING holder",
        )
        .bind(&self.holder)
        .bind(LEASE.as_secs_f64())
        .fetch_optional(&mut *conn)
        .await?;
        Ok(got.is_some())
    }

    /// Renew the lease every [`RENEW_EVERY`] on a connection of its own; an error once it is
    /// lost (or cannot be renewed before it runs out).
    async fn keep_lease(&self) -> anyhow::Result<()> {
        let mut renewed = std::time::Instant::now();
        loop {
            tokio::time::sleep(RENEW_EVERY).await;
            let attempt = async {
                let mut conn = self.pool.acquire().await?;
                self.lease(&mut conn).await
            };
            match tokio::time::timeout(LEASE / 2, attempt).await {
                Ok(Ok(true)) => renewed = std::time::Instant::now(),
                Ok(Ok(false)) => anyhow::bail!("lost the relay lease to another processor"),
                Ok(Err(e)) => tracing::warn!(error = %e, "cannot renew the relay lease"),
                Err(_) => tracing::warn!("renewing the relay lease timed out"),
            }
            anyhow::ensure!(
                renewed.elapsed() < LEASE,
                "the relay lease ran out before it could be renewed"
            );
        }
    }

    async fn publish_until_cancelled(&self, conn: &mut sqlx::PgConnection) -> anyhow::Result<()> {
        let mut last_backlog = std::time::Instant::now() - Duration::from_secs(10);
        let mut last_retention = std::time::Instant::now() - Duration::from_secs(3600);
        loop {
            let published = self.publish_round(conn).await?;
            if last_retention.elapsed() > Duration::from_secs(600) {
                self.retention(conn).await?;
                last_retention = std::time::Instant::now();
            }
            if last_backlog.elapsed() > Duration::from_secs(5) {
                let n: i64 = sqlx::query_scalar("SELECT count(*) FROM outbox WHERE published_at IS NULL")
                    .fetch_one(&mut *conn)
                    .await?;
                self.metrics.outbox_backlog.store(n, Ordering::Relaxed);
                last_backlog = std::time::Instant::now();
            }
            if published > 0 {
                continue;
            }
            if self.cancel.is_cancelled() {
                return Ok(());
            }
            tokio::select! {
                _ = self.cancel.cancelled() => {}
                _ = self.wake.notified() => {}
                _ = tokio::time::sleep(Duration::from_millis(200)) => {}
            }
        }
    }

    /// Keep the database bounded: published outbox rows, and (if configured) old audit rows, are
    /// deleted in chunks so that no single statement holds locks for long.
    async fn retention(&self, conn: &mut sqlx::PgConnection) -> anyhow::Result<()> {
        let mut deleted = 0;
        loop {
            let r = sqlx::query(
                "DELETE FROM outbox WHERE id IN (SELECT id FROM outbox
                 WHERE published_at < now() - make_interval(hours => $1::int) LIMIT 10000)",
            )
            .bind(self.outbox_retention_hours as i32)
            .execute(&mut *conn)
            .await?;
            deleted += r.rows_affected();
            if r.rows_affected() < 10_000 {
                break;
            }
        }
        if self.audit_retention_days > 0 {
            for table in ["transitions", "pool_events"] {
                loop {
                    let q = format!(
                        "DELETE FROM {table} WHERE ctid IN (SELECT ctid FROM {table}
                         WHERE stream_time < now() - make_interval(days => $1::int) LIMIT 10000)"
                    );
                    let r = sqlx::query(&q)
                        .bind(self.audit_retention_days as i32)
                        .execute(&mut *conn)
                        .await?;
                    deleted += r.rows_affected();
                    if r.rows_affected() < 10_000 {
                        break;
                    }
                }
            }
        }
        if deleted > 0 {
            tracing::info!(deleted, "retention: old rows deleted");
        }
        Ok(())
    }

    /// Publish one round of unpublished rows; the number published.
    async fn publish_round(&self, conn: &mut sqlx::PgConnection) -> anyhow::Result<usize> {
        let rows = sqlx::query(
            "SELECT id, topic, key, payload, headers FROM outbox WHERE published_at IS NULL ORDER BY id LIMIT $1",
        )
        .bind(self.batch)
        .fetch_all(&mut *conn)
        .await?;
        if rows.is_empty() {
            return Ok(0);
        }
        let mut ids = Vec::with_capacity(rows.len());
        let mut deliveries = Vec::with_capacity(rows.len());
        for r in &rows {
            let id: i64 = r.get(0);
            let topic: String = r.get(1);
            let key: Option<Vec<u8>> = r.get(2);
            let payload: Vec<u8> = r.get(3);
            let headers: sqlx::types::Json<BTreeMap<String, String>> = r.get(4);
            let mut h = OwnedHeaders::new_with_capacity(headers.0.len());
            for (k, v) in &headers.0 {
                h = h.insert(Header {
                    key: k,
                    value: Some(v.as_bytes()),
                });
            }
            let mut record = FutureRecord::to(&topic).payload(&payload).headers(h);
            if let Some(k) = &key {
                record = record.key(k);
            }
            // Queue them all, then wait: the producer batches, and order per partition holds.
            let delivery = loop {
                match self.producer.send_result(record) {
                    Ok(d) => break d,
                    Err((e, r)) => {
                        tracing::debug!(error = %e, "producer queue full; waiting");
                        record = r;
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                }
            };
            deliveries.push(delivery);
            ids.push(id);
        }
        for d in deliveries {
            match d.await {
                Ok(Ok(_)) => {}
                Ok(Err((e, _))) => anyhow::bail!("publish failed: {e}"),
                Err(_) => anyhow::bail!("publish cancelled"),
            }
        }
        sqlx::query("UPDATE outbox SET published_at = now() WHERE id = ANY($1)")
            .bind(&ids)
            .execute(&mut *conn)
            .await?;
        self.metrics.published.fetch_add(ids.len() as u64, Ordering::Relaxed);
        Ok(ids.len())
    }
}
