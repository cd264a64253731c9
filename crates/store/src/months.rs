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

/// How long the audit log keeps a month: whole months that ended more than `days` ago (by
/// wall clock) are dropped by the relay and never written by a batch, so that a backlog, a replay
/// or a fresh group over an old topic agrees with what retention leaves. 0 keeps everything.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Retention {
    pub days: i64,
}

impl Retention {
    /// Months that ended by this instant are not kept (None: every month is).
    pub fn cutoff(&self, now: chrono::DateTime<Utc>) -> Option<chrono::DateTime<Utc>> {
        (self.days > 0).then(|| now - chrono::Duration::days(self.days.min(3_650_000)))
    }

    /// Whether a row at stream time `t` is kept under `cutoff`: its month ends after it.
    pub fn keeps(cutoff: Option<chrono::DateTime<Utc>>, t: Micros) -> bool {
        cutoff.is_none_or(|c| month_start(month_of(t) + 1) > c)
    }
}

/// The months this writer knows exist, and the retention it writes under.
#[derive(Clone, Default)]
pub struct Months {
    known: Arc<Mutex<BTreeSet<Month>>>,
    pub retention: Retention,
}

impl Months {
    pub fn new(retention: Retention) -> Months {
        Months {
            known: Default::default(),
            retention,
        }
    }

    /// Make sure the months of these stream times exist: each new month and the one after it.
    /// `known` holds the months whose successor exists too: a month created only as the one
    /// ahead is not among them, so that its first rows create the month after it in turn.
    pub async fn ensure(&self, db: &PgPool, times: impl IntoIterator<Item = Micros>) -> Result<(), StoreError> {
        let missing: BTreeSet<Month> = {
            let known = self.known.lock().expect("months lock");
            times.into_iter().map(month_of).filter(|m| !known.contains(m)).collect()
        };
        for m in missing {
            let made = create_months(db, month_start(m), month_start(m + 1)).await?;
            if made > 0 {
                tracing::info!(month = %month_start(m).format("%Y-%m"), tables = made, "created audit-log months");
            }
            self.known.lock().expect("months lock").insert(m);
        }
        Ok(())
    }

    /// Forget what is known: a month was dropped behind this writer's back (retention of
    /// another processor, an operator), and the next batch looks again.
    pub fn forget(&self) {
        self.known.lock().expect("months lock").clear();
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

    #[test]
    fn retention_keeps_a_row_while_its_month_has_not_ended_before_the_cutoff() {
        let at = |s: &str| chrono::DateTime::parse_from_rfc3339(s).unwrap().with_timezone(&Utc);
        let us = |s: &str| at(s).timestamp_micros();
        let now = at("2026-12-02T03:00:00Z");
        assert_eq!(Retention { days: 0 }.cutoff(now), None);
        assert!(Retention::keeps(None, 0), "no retention keeps everything");
        let cutoff = Retention { days: 30 }.cutoff(now);
        assert_eq!(cutoff, Some(at("2026-11-02T03:00:00Z")));
        assert!(
            !Retention::keeps(cutoff, us("2026-10-31T23:59:59Z")),
            "October ended before the cutoff"
        );
        assert!(Retention::keeps(cutoff, us("2026-11-01T00:00:00Z")), "November has not");
        assert!(Retention::keeps(cutoff, us("2027-03-01T00:00:00Z")));
        assert!(
            Retention { days: i64::MAX }.cutoff(now).is_some(),
            "a huge retention does not overflow"
        );
    }
}
