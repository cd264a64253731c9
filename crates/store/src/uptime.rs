//! What uptime reads from the audit log: each endpoint's history around a range (one index
//! probe for its state at the start, one range scan of its transitions) and the pool's flags.
//! The figures themselves are `vitals-uptime`'s.

use crate::{timestamp, StoreError};
use chrono::{DateTime, Utc};
use sqlx::{PgPool, Row};
use vitals_contracts::{Evidence, HealthState, Micros, Requests};
use vitals_uptime::{Change, History, PoolFlags, Range};

fn state(s: &str) -> Result<HealthState, StoreError> {
    HealthState::parse(s).ok_or_else(|| StoreError::Corrupt(format!("unknown state {s:?}")))
}

/// The histories of a pool's endpoints (or of one) that were first seen before `to`: their
/// transitions before `to`, from the last one before `from` — and, when that left the endpoint
/// anything but healthy, from its last departure from healthy, so that an incident under way at
/// `from` is read whole.
pub async fn histories(
    db: &PgPool,
    pool: &str,
    endpoint: Option<&str>,
    from: Micros,
    to: Micros,
) -> Result<Vec<History>, StoreError> {
    // A custom plan for each range: a generic plan cannot use the range's bounds against the
    // index (and the endpoint filter may be absent).
    let mut tx = db.begin().await?;
    sqlx::query("SET LOCAL plan_cache_mode = force_custom_plan")
        .execute(&mut *tx)
        .await?;
    let rows = sqlx::query(
        "WITH eps AS (
           SELECT e.endpoint,
                  COALESCE(e.first_seen,
                           (SELECT min(t.stream_time) FROM transitions t WHERE t.pool = e.pool AND t.endpoint = e.endpoint),
                           e.since) AS seen,
                  CASE WHEN b.to_state IS NULL THEN $2
                       WHEN b.to_state = 'healthy' THEN b.stream_time
                       ELSE COALESCE((SELECT max(t.stream_time) FROM transitions t
                                      WHERE t.pool = e.pool AND t.endpoint = e.endpoint
                                        AND t.stream_time < $2 AND t.from_state = 'healthy'), b.stream_time)
                  END AS origin
           FROM endpoint_state e
           LEFT JOIN LATERAL (
             SELECT t.stream_time, t.to_state FROM transitions t
             WHERE t.pool = e.pool AND t.endpoint = e.endpoint AND t.stream_time < $2
             ORDER BY t.stream_time DESC, t.seq DESC LIMIT 1) b ON true
           WHERE e.pool = $1 AND ($4::text IS NULL OR e.endpoint = $4)
         )
         SELECT eps.endpoint, eps.seen, x.stream_time, x.seq, x.from_state, x.to_state, x.weight, x.reason_code,
                x.window_calls
         FROM eps
         LEFT JOIN LATERAL (
           SELECT t.stream_time, t.seq, t.from_state, t.to_state, t.weight, t.reason_code, t.window_calls
           FROM transitions t
           WHERE t.pool = $1 AND t.endpoint = eps.endpoint AND t.stream_time >= eps.origin AND t.stream_time < $3
           ORDER BY t.stream_time, t.seq) x ON true
         WHERE eps.seen < $3
         ORDER BY eps.endpoint, x.stream_time, x.seq",
    )
    .bind(pool)
    .bind(timestamp(from))
    .bind(timestamp(to))
    .bind(endpoint)
    .fetch_all(&mut *tx)
    .await?;
    tx.commit().await?;
    // Columns by position: this loop runs once per transition of the range.
    let mut out: Vec<History> = Vec::new();
    for r in rows {
        let name: String = r.try_get(0)?;
        if out.last().is_none_or(|h| h.endpoint != name) {
            let seen: DateTime<Utc> = r.try_get(1)?;
            out.push(History {
                requests: Vec::new(),
                endpoint: name,
                seen: seen.timestamp_micros(),
                changes: Vec::new(),
            });
        }
        let Some(at) = r.try_get::<Option<DateTime<Utc>>, _>(2)? else {
            continue;
        };
        let h = out.last_mut().expect("pushed above");
        h.changes.push(Change {
            at: at.timestamp_micros(),
            seq: r.try_get(3)?,
            from: state(r.try_get(4)?)?,
            to: state(r.try_get(5)?)?,
            weight: r.try_get(6)?,
            code: r.try_get(7)?,
            calls: r.try_get(8)?,
        });
    }
    Ok(out)
}

/// Add each endpoint's calls in the range to its history: the minutes that start in `[from,
/// to)`, summed by the range's bucket in Postgres (one row per endpoint and bucket). Whole hours
/// are read from the hourly rollups and only the minutes at the edges from the minute rollups,
/// so a month costs hundreds of rows per endpoint, not tens of thousands.
pub async fn with_requests(
    db: &PgPool,
    pool: &str,
    endpoint: Option<&str>,
    range: &Range,
    histories: &mut [History],
) -> Result<(), StoreError> {
    const HOUR: Micros = crate::audit::HOUR_US;
    if histories.is_empty() || range.from >= range.to {
        return Ok(());
    }
    // Hours that lie wholly inside the range, and the minutes around them.
    let first_hour = (range.from + HOUR - 1).div_euclid(HOUR) * HOUR;
    let last_hour = range.to.div_euclid(HOUR) * HOUR;
    let (hours, edges) = if first_hour < last_hour {
        (
            (first_hour, last_hour),
            [(range.from, first_hour), (last_hour, range.to)],
        )
    } else {
        ((0, 0), [(range.from, range.to), (0, 0)])
    };
    let rows: Vec<(String, DateTime<Utc>, i64, i64, i64, i64)> = sqlx::query_as(
        "SELECT endpoint,
                CASE WHEN $9::int8 IS NULL THEN $3
                     ELSE GREATEST($3, date_bin(make_interval(secs => $9::int8 / 1e6), at, TIMESTAMPTZ 'epoch')) END,
                sum(succeeded)::int8, sum(failed)::int8, sum(rate_limited)::int8, sum(neutral)::int8
         FROM (SELECT endpoint, minute AS at, succeeded, failed, rate_limited, neutral FROM request_rollups
               WHERE pool = $1 AND ($2::text IS NULL OR endpoint = $2)
                 AND ((minute >= $3 AND minute < $4) OR (minute >= $5 AND minute < $6))
               UNION ALL
               SELECT endpoint, hour, succeeded, failed, rate_limited, neutral FROM request_rollups_hourly
               WHERE pool = $1 AND ($2::text IS NULL OR endpoint = $2) AND hour >= $7 AND hour < $8) x
         GROUP BY 1, 2",
    )
    .bind(pool)
    .bind(endpoint)
    .bind(timestamp(edges[0].0))
    .bind(timestamp(edges[0].1))
    .bind(timestamp(edges[1].0))
    .bind(timestamp(edges[1].1))
    .bind(timestamp(hours.0))
    .bind(timestamp(hours.1))
    .bind(range.bucket.filter(|w| *w > 0))
    .fetch_all(db)
    .await?;
    let index: std::collections::HashMap<String, usize> = histories
        .iter()
        .enumerate()
        .map(|(i, h)| (h.endpoint.clone(), i))
        .collect();
    for (name, at, succeeded, failed, rate_limited, neutral) in rows {
        if let Some(i) = index.get(&name) {
            histories[*i].requests.push((
                at.timestamp_micros(),
                Requests {
                    succeeded,
                    failed,
                    rate_limited,
                    neutral,
                },
            ));
        }
    }
    Ok(())
}

/// The pool's panic and correlated-outage flags at `from` and each decision before `to`.
pub async fn pool_flags(db: &PgPool, pool: &str, from: Micros, to: Micros) -> Result<PoolFlags, StoreError> {
    let initial: Option<(bool, bool)> = sqlx::query_as(
        "SELECT panic, correlated_outage FROM pool_events WHERE pool = $1 AND stream_time < $2
         ORDER BY stream_time DESC, seq DESC LIMIT 1",
    )
    .bind(pool)
    .bind(timestamp(from))
    .fetch_optional(db)
    .await?;
    let rows: Vec<(DateTime<Utc>, bool, bool)> = sqlx::query_as(
        "SELECT stream_time, panic, correlated_outage FROM pool_events
         WHERE pool = $1 AND stream_time >= $2 AND stream_time < $3 ORDER BY stream_time, seq",
    )
    .bind(pool)
    .bind(timestamp(from))
    .bind(timestamp(to))
    .fetch_all(db)
    .await?;
    Ok(PoolFlags {
        initial: initial.unwrap_or_default(),
        changes: rows
            .into_iter()
            .map(|(at, p, o)| (at.timestamp_micros(), p, o))
            .collect(),
    })
}

/// The reason and evidence of the transitions (endpoint, seq) of a pool.
pub async fn evidence(
    db: &PgPool,
    pool: &str,
    keys: &[(String, i64)],
) -> Result<std::collections::HashMap<(String, i64), (String, Evidence)>, StoreError> {
    let (endpoints, seqs): (Vec<String>, Vec<i64>) = keys.iter().cloned().unzip();
    let rows: Vec<(String, i64, String, sqlx::types::Json<Evidence>)> = sqlx::query_as(
        "SELECT t.endpoint, t.seq, t.reason, t.evidence FROM transitions t
         JOIN unnest($2::text[], $3::int8[]) AS k(endpoint, seq) ON t.endpoint = k.endpoint COLLATE \"C\" AND t.seq = k.seq
         WHERE t.pool = $1",
    )
    .bind(pool)
    .bind(endpoints)
    .bind(seqs)
    .fetch_all(db)
    .await?;
    Ok(rows
        .into_iter()
        .map(|(e, s, reason, ev)| ((e, s), (reason, ev.0)))
        .collect())
}
