//! The audit log's months: `transitions` and `pool_events` are partitioned by month of stream
//! time (migration 0011). The writer creates a month before the first batch with rows in it (and
//! the month after, ahead of time), in its own short transaction: never inside a batch, where
//! the DDL's lock on the parent table would wait on other processors' batches while holding
//! ours. Retention (the processor's relay) drops whole months.

use crate::{timestamp, StoreError};
use chrono::{Datelike, TimeZone, Utc};
use sqlx::{PgConnection, PgPool};
use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use vitals_contracts::Micros;

/// A month as a number: year × 12 + month − 1 (UTC).
pub type Month = i64;

/// The month a stream time falls in (clamped as rows are, see [`timestamp`]).
pub fn month_of(t: Micros) -> Month {
    let d = timestamp(t);
    i64::from(d.year()) * 12 + i64::from(d.month0())
}

/// The instant a month starts.
pub fn month_start(m: Month) -> chrono::DateTime<Utc> {
    let (y, m0) = (m.div_euclid(12), m.rem_euclid(12));
    Utc.with_ymd_and_hms(y as i32, m0 as u32 + 1, 1, 0, 0, 0)
        .single()
        .unwrap_or_default()
}

/// Create every month of the audit log from the one holding `from` to the one holding `to`
/// (those that exist are left alone); returns how many tables were created. Loaders that write
/// rows without the processor call this first.
pub async fn create_months(
    db: &PgPool,
    from: chrono::DateTime<Utc>,
    to: chrono::DateTime<Utc>,
) -> Result<i32, StoreError> {
    Ok(sqlx::query_scalar("SELECT vitals_month_partitions($1, $2)")
        .bind(from)
        .bind(to)
        .fetch_one(db)
        .await?)
}

/// Retention: drop every month that ended by `cutoff`; returns the tables dropped.
pub async fn drop_months_before(
    conn: &mut PgConnection,
    cutoff: chrono::DateTime<Utc>,
) -> Result<Vec<String>, sqlx::Error> {
    sqlx::query_scalar("SELECT vitals_drop_months_before($1)")
        .bind(cutoff)
        .fetch_all(conn)
        .await
}

/// The months this writer knows exist.
#[derive(Clone, Default)]
pub struct Months(Arc<Mutex<BTreeSet<Month>>>);

impl Months {
    /// Make sure the months of these stream times exist: each new month and the one after it.
    pub async fn ensure(&self, db: &PgPool, times: impl IntoIterator<Item = Micros>) -> Result<(), StoreError> {
        let missing: BTreeSet<Month> = {
            let known = self.0.lock().expect("months lock");
            times.into_iter().map(month_of).filter(|m| !known.contains(m)).collect()
        };
        for m in missing {
            let made = create_months(db, month_start(m), month_start(m + 1)).await?;
            if made > 0 {
                tracing::info!(month = %month_start(m).format("%Y-%m"), tables = made, "created audit-log months");
            }
            self.0.lock().expect("months lock").extend([m, m + 1]);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn months_count_from_year_zero_and_start_at_midnight_utc() {
        let t = Utc.with_ymd_and_hms(2026, 12, 1, 20, 0, 0).unwrap().timestamp_micros();
        let m = month_of(t);
        assert_eq!(m, 2026 * 12 + 11);
        assert_eq!(month_start(m).to_rfc3339(), "2026-12-01T00:00:00+00:00");
        assert_eq!(month_start(m + 1).to_rfc3339(), "2027-01-01T00:00:00+00:00");
        assert_eq!(month_of(-5), month_of(0), "clamped as rows are");
        assert_eq!(
            month_start(month_of(i64::MAX)).to_rfc3339(),
            "9999-12-01T00:00:00+00:00"
        );
    }
}
