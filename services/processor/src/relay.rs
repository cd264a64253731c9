//! The outbox relay: publishes the events of committed outbox rows to Kafka with an idempotent
//! producer, in id order (a row is a pack of events, in order), and deletes each row once Kafka has
//! acknowledged all of its events. One relay is active per database schema, by a lease in
//! `relay_lease` that its holder renews every second and that expires after [`LEASE`]: a frozen
//! or partitioned holder loses it and another processor's relay takes over. Events of one
//! endpoint leave in sequence order. Each publish round first checks that the lease is still
//! held (a holder that resumes after losing it stops instead of publishing once more). A crash
//! between publish and delete republishes; consumers drop duplicates by (endpoint, seq).

use crate::metrics::Metrics;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};
use sqlx::PgPool;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use vitals_runtime::produce;
use vitals_store::outbox;

/// How long a lease lasts without renewal, and how often the holder renews it.
pub const LEASE: Duration = Duration::from_secs(3);
const RENEW_EVERY: Duration = Duration::from_millis(1000);

pub struct Relay {
    pub pool: PgPool,
    pub producer: FutureProducer,
    pub batch: i64,
    pub metrics: Arc<Metrics>,
    pub wake: Arc<Notify>,
    pub cancel: CancellationToken,
    pub retention: vitals_store::months::Retention,
    /// How often retention runs.
    pub retention_every: Duration,
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
        let _ = outbox::release_lease(&mut conn, &self.holder).await;
        result
    }

    /// Take or renew the lease; false while someone else holds a live one.
    async fn lease(&self, conn: &mut sqlx::PgConnection) -> anyhow::Result<bool> {
        Ok(outbox::take_lease(conn, &self.holder, LEASE).await?)
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
        let mut last_retention: Option<std::time::Instant> = None;
        loop {
            let published = self.publish_round(conn).await?;
            if last_retention.is_none_or(|t| t.elapsed() >= self.retention_every) {
                self.retention(conn).await?;
                last_retention = Some(std::time::Instant::now());
            }
            if last_backlog.elapsed() > Duration::from_secs(5) {
                self.metrics.outbox_backlog.set(outbox::backlog(conn).await?);
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

    /// Keep the audit log bounded, if configured: months that ended before the retention are
    /// dropped whole.
    async fn retention(&self, conn: &mut sqlx::PgConnection) -> anyhow::Result<()> {
        let dropped = outbox::retention(conn, self.retention).await?;
        if !dropped.is_empty() {
            tracing::info!(?dropped, "retention: old months of the audit log dropped");
        }
        Ok(())
    }

    /// Publish one round of unpublished rows; the number of events published.
    async fn publish_round(&self, conn: &mut sqlx::PgConnection) -> anyhow::Result<usize> {
        let fetching = std::time::Instant::now();
        let rows = outbox::unpublished(conn, self.batch).await?;
        self.metrics.spent("relay_fetch", fetching.elapsed());
        if rows.is_empty() {
            return Ok(0);
        }
        // A relay that was frozen (or cut off) may have lost the lease since it last renewed
        // it: another relay then publishes these rows, and publishing them here too would be a
        // duplicate on the changes topic without any crash. Still ours, renewed: go on.
        anyhow::ensure!(
            outbox::hold_lease(conn, &self.holder, LEASE).await?,
            "lost the relay lease before a publish round; another relay publishes"
        );
        let publishing = std::time::Instant::now();
        let ids: Vec<i64> = rows.iter().map(|r| r.id).collect();
        let events: usize = rows.iter().map(|r| r.events.len()).sum();
        let mut deliveries = Vec::with_capacity(events);
        for row in &rows {
            let id = row.id;
            for e in &row.events {
                let mut h = OwnedHeaders::new_with_capacity(e.headers.len());
                for (k, v) in &e.headers {
                    h = h.insert(Header {
                        key: k,
                        value: Some(v.as_bytes()),
                    });
                }
                let mut record = FutureRecord::to(&e.topic).payload(&e.payload).headers(h);
                if let Some(k) = &e.key {
                    record = record.key(k);
                }
                // Queue them all, then wait: the producer batches, and order per partition
                // holds. A full queue is waited on; any other error ends the round (retried
                // after a pause: an event the broker refuses as such is named, not spun on).
                let delivery = produce::queue(&self.producer, record, None).await.map_err(|err| {
                    anyhow::anyhow!(
                        "cannot publish event {} (outbox row {id}) to {}: {err}",
                        e.dedup_key,
                        e.topic
                    )
                })?;
                deliveries.push((id, &e.dedup_key, delivery));
            }
        }
        for (id, dedup_key, d) in deliveries {
            produce::delivered(d)
                .await
                .map_err(|e| anyhow::anyhow!("event {dedup_key} (outbox row {id}) not delivered: {e}"))?;
        }
        let deleting = std::time::Instant::now();
        self.metrics.spent("relay_publish", deleting - publishing);
        outbox::published(conn, &ids).await?;
        self.metrics.spent("relay_delete", deleting.elapsed());
        self.metrics.published.inc_by(events as u64);
        Ok(events)
    }
}
