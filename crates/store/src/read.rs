//! The read side: transition history with keyset pagination, and the endpoint-state
//! projection. Rows come back as the contract types (`HealthChanged`, `EndpointState`); a value
//! this build does not know is an error, never a default.

use crate::StoreError;
use chrono::{DateTime, Utc};
use sqlx::postgres::PgRow;
use sqlx::{PgPool, Postgres, QueryBuilder, Row};
use vitals_contracts::{EndpointState, Evidence, HealthChanged, HealthState, ReasonCode};

/// The columns a transition is read from, in one place.
const TRANSITION_COLUMNS: &str = "pool, endpoint, seq, transition_id, from_state, to_state, weight, ramp_ms, \
     retry_at, reason_code, reason, policy_version, trigger_ids, evidence, stream_time, scope";

const STATE_COLUMNS: &str =
    "pool, endpoint, state, weight, ramp_ms, score, failure_rate, since, reason, seq, policy_version";

/// Which transitions, newest first.
#[derive(Debug, Default, Clone)]
pub struct TransitionFilter {
    pub pool: Option<String>,
    /// Requires `pool`.
    pub endpoint: Option<String>,
    /// At or after.
    pub from: Option<DateTime<Utc>>,
    /// Before.
    pub to: Option<DateTime<Utc>>,
    /// Into this state.
    pub state: Option<HealthState>,
    pub reason: Option<ReasonCode>,
    /// Of this scope only: `Some(None)` the fleet's transitions, `Some(Some("gateway=g1"))` one
    /// scope's.
    pub scope: Option<Option<String>>,
    /// Strictly older than this position (the last item of the previous page).
    pub before: Option<Position>,
}

/// A transition's place in the newest-first order.
#[derive(Debug, Clone, PartialEq)]
pub struct Position {
    pub stream_time: DateTime<Utc>,
    pub pool: String,
    pub endpoint: String,
    pub seq: i64,
}

/// Up to `limit` transitions matching `f`, newest first.
pub async fn transitions(db: &PgPool, f: &TransitionFilter, limit: i64) -> Result<Vec<HealthChanged>, StoreError> {
    let mut sql = QueryBuilder::<Postgres>::new(format!("SELECT {TRANSITION_COLUMNS} FROM transitions WHERE true"));
    if let Some(p) = &f.pool {
        sql.push(" AND pool = ").push_bind(p);
    }
    if let Some(e) = &f.endpoint {
        sql.push(" AND endpoint = ").push_bind(e);
    }
    if let Some(t) = f.from {
        sql.push(" AND stream_time >= ").push_bind(t);
    }
    if let Some(t) = f.to {
        sql.push(" AND stream_time < ").push_bind(t);
    }
    if let Some(s) = f.state {
        sql.push(" AND to_state = ").push_bind(s.as_str());
    }
    if let Some(r) = f.reason {
        sql.push(" AND reason_code = ").push_bind(r.as_str());
    }
    match &f.scope {
        None => {}
        Some(None) => {
            sql.push(" AND scope IS NULL");
        }
        Some(Some(scope)) => {
            sql.push(" AND scope = ").push_bind(scope.clone());
        }
    }
    // The keyset condition follows the index of each kind of query, so it is a range scan.
    if let Some(c) = &f.before {
        match (&f.pool, &f.endpoint) {
            (Some(_), Some(_)) => {
                sql.push(" AND (stream_time, seq) < (")
                    .push_bind(c.stream_time)
                    .push(", ")
                    .push_bind(c.seq)
                    .push(")");
            }
            (Some(_), None) => {
                sql.push(" AND (stream_time, endpoint, seq) < (")
                    .push_bind(c.stream_time)
                    .push(", ")
                    .push_bind(c.endpoint.clone())
                    .push(", ")
                    .push_bind(c.seq)
                    .push(")");
            }
            _ => {
                sql.push(" AND (stream_time, pool, endpoint, seq) < (")
                    .push_bind(c.stream_time)
                    .push(", ")
                    .push_bind(c.pool.clone())
                    .push(", ")
                    .push_bind(c.endpoint.clone())
                    .push(", ")
                    .push_bind(c.seq)
                    .push(")");
            }
        }
    }
    sql.push(" ORDER BY stream_time DESC, pool DESC, endpoint DESC, seq DESC LIMIT ")
        .push_bind(limit);
    let rows = sql.build().fetch_all(db).await?;
    rows.iter().map(transition).collect()
}

/// The last transition of an endpoint: the newest in stream time (an endpoint's seq grows with
/// its stream time), which its history index (the unique key) reads first.
pub async fn last_transition(db: &PgPool, pool: &str, endpoint: &str) -> Result<Option<HealthChanged>, StoreError> {
    let row = sqlx::query(&format!(
        "SELECT {TRANSITION_COLUMNS} FROM transitions WHERE pool = $1 AND endpoint = $2
         ORDER BY stream_time DESC, seq DESC LIMIT 1"
    ))
    .bind(pool)
    .bind(endpoint)
    .fetch_optional(db)
    .await?;
    row.as_ref().map(transition).transpose()
}

/// Up to `limit` pool names that sort after `after`, in name order. One index probe per pool
/// (a loose index scan), however many endpoints each holds.
pub async fn pool_names_after(db: &PgPool, after: &str, limit: i64) -> Result<Vec<String>, StoreError> {
    let names: Vec<String> = sqlx::query_scalar(
        "WITH RECURSIVE p(pool, n) AS (
           (SELECT pool, 1 FROM endpoint_state WHERE pool > $1 ORDER BY pool LIMIT 1)
           UNION ALL
           SELECT (SELECT e.pool FROM endpoint_state e WHERE e.pool > p.pool ORDER BY e.pool LIMIT 1), p.n + 1
           FROM p WHERE p.pool IS NOT NULL AND p.n < $2
         )
         SELECT pool FROM p WHERE pool IS NOT NULL ORDER BY pool",
    )
    .bind(after)
    .bind(limit)
    .fetch_all(db)
    .await?;
    Ok(names)
}

/// The first `per_pool` endpoints (in name order) of each pool named, in (pool, endpoint) order.
pub async fn first_endpoints(db: &PgPool, pools: &[String], per_pool: i64) -> Result<Vec<EndpointState>, StoreError> {
    let rows = sqlx::query(&format!(
        "SELECT {STATE_COLUMNS} FROM unnest($1::text[]) AS p(name)
         CROSS JOIN LATERAL (SELECT * FROM endpoint_state e WHERE e.pool = p.name COLLATE \"C\"
                             ORDER BY e.endpoint LIMIT $2) s
         ORDER BY pool, endpoint"
    ))
    .bind(pools)
    .bind(per_pool)
    .fetch_all(db)
    .await?;
    rows.iter().map(state).collect()
}

/// How many endpoints of each pool named are in each state: pool → state → count.
pub async fn state_counts(
    db: &PgPool,
    pools: &[String],
) -> Result<std::collections::HashMap<String, std::collections::BTreeMap<String, usize>>, StoreError> {
    let rows: Vec<(String, String, i64)> =
        sqlx::query_as("SELECT pool, state, count(*) FROM endpoint_state WHERE pool = ANY($1) GROUP BY pool, state")
            .bind(pools)
            .fetch_all(db)
            .await?;
    let mut out: std::collections::HashMap<String, std::collections::BTreeMap<String, usize>> = Default::default();
    for (pool, state, n) in rows {
        out.entry(pool)
            .or_default()
            .insert(state, usize::try_from(n).unwrap_or(0));
    }
    Ok(out)
}

/// A pool's policy in force and its version: the last policy change applied to it, else the
/// default (version 0) for a pool the processor has seen; None for a pool it has not.
pub async fn pool_policy(db: &PgPool, pool: &str) -> Result<Option<(i64, vitals_contracts::Policy)>, StoreError> {
    let row: Option<(i64, sqlx::types::Json<vitals_contracts::Policy>)> =
        sqlx::query_as("SELECT version, policy FROM pool_policies WHERE pool = $1")
            .bind(pool)
            .fetch_optional(db)
            .await?;
    if let Some((version, policy)) = row {
        return Ok(Some((version, policy.0)));
    }
    let known = pool_known(db, pool).await?;
    Ok(known.then(|| (0, vitals_contracts::Policy::default())))
}

/// Whether the processor has seen the pool (it has an endpoint).
pub async fn pool_known(db: &PgPool, pool: &str) -> Result<bool, StoreError> {
    Ok(
        sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM endpoint_state WHERE pool = $1)")
            .bind(pool)
            .fetch_one(db)
            .await?,
    )
}

/// Each pool's latest decision flags: (panic mode, correlated outage), for the pools asked.
pub async fn pool_flags(
    db: &PgPool,
    pools: &[String],
) -> Result<std::collections::HashMap<String, (bool, bool)>, StoreError> {
    let rows: Vec<(String, bool, bool)> = sqlx::query_as(
        "SELECT DISTINCT ON (pool) pool, panic, correlated_outage FROM pool_events
         WHERE pool = ANY($1) ORDER BY pool, seq DESC",
    )
    .bind(pools)
    .fetch_all(db)
    .await?;
    Ok(rows
        .into_iter()
        .map(|(p, panic, outage)| (p, (panic, outage)))
        .collect())
}

/// Up to `limit` endpoints of a pool whose names sort after `after`, in endpoint order.
pub async fn pool_endpoints(
    db: &PgPool,
    pool: &str,
    after: &str,
    limit: i64,
) -> Result<Vec<EndpointState>, StoreError> {
    let rows = sqlx::query(&format!(
        "SELECT {STATE_COLUMNS} FROM endpoint_state WHERE pool = $1 AND endpoint > $2 ORDER BY endpoint LIMIT $3"
    ))
    .bind(pool)
    .bind(after)
    .bind(limit)
    .fetch_all(db)
    .await?;
    rows.iter().map(state).collect()
}

/// The current state of one endpoint.
pub async fn endpoint(db: &PgPool, pool: &str, endpoint: &str) -> Result<Option<EndpointState>, StoreError> {
    let row = sqlx::query(&format!(
        "SELECT {STATE_COLUMNS} FROM endpoint_state WHERE pool = $1 AND endpoint = $2"
    ))
    .bind(pool)
    .bind(endpoint)
    .fetch_optional(db)
    .await?;
    row.as_ref().map(state).transpose()
}

fn state_column(r: &PgRow, col: &str) -> Result<HealthState, StoreError> {
    let s: String = r.try_get(col)?;
    HealthState::parse(&s).ok_or_else(|| StoreError::Corrupt(format!("unknown state {s:?} in column {col}")))
}

fn micros(r: &PgRow, col: &str) -> Result<i64, StoreError> {
    Ok(r.try_get::<DateTime<Utc>, _>(col)?.timestamp_micros())
}

fn transition(r: &PgRow) -> Result<HealthChanged, StoreError> {
    let evidence: sqlx::types::Json<Evidence> = r.try_get("evidence")?;
    let retry_at: Option<DateTime<Utc>> = r.try_get("retry_at")?;
    Ok(HealthChanged {
        pool: r.try_get("pool")?,
        endpoint: r.try_get("endpoint")?,
        seq: r.try_get("seq")?,
        transition_id: r.try_get("transition_id")?,
        from_state: state_column(r, "from_state")?,
        to_state: state_column(r, "to_state")?,
        weight: r.try_get("weight")?,
        ramp_ms: r.try_get("ramp_ms")?,
        retry_at: retry_at.map(|t| t.timestamp_micros()),
        reason_code: r.try_get("reason_code")?,
        reason: r.try_get("reason")?,
        policy_version: r.try_get("policy_version")?,
        trigger_ids: r.try_get("trigger_ids")?,
        evidence: evidence.0,
        stream_time: micros(r, "stream_time")?,
        scope: r.try_get("scope")?,
    })
}

/// A scoped decision in force: the endpoint out for one scope of reporters.
#[derive(Debug, Clone, PartialEq)]
pub struct ScopedState {
    pub pool: String,
    pub endpoint: String,
    pub scope: String,
    pub seq: i64,
    pub state: HealthState,
    pub weight: f64,
    /// When the scope's trial is due (µs).
    pub retry_at: Option<i64>,
    /// µs.
    pub since: i64,
    pub reason: String,
}

/// The scoped decisions in force in `pool` (of `endpoint` only, if given), by endpoint and scope.
pub async fn scoped_states(db: &PgPool, pool: &str, endpoint: Option<&str>) -> Result<Vec<ScopedState>, StoreError> {
    let rows = sqlx::query(
        "SELECT pool, endpoint, scope, seq, state, weight, retry_at, since, reason FROM scoped_state
         WHERE pool = $1 AND ($2::text IS NULL OR endpoint = $2) ORDER BY endpoint, scope LIMIT 10000",
    )
    .bind(pool)
    .bind(endpoint)
    .fetch_all(db)
    .await?;
    rows.iter()
        .map(|r| {
            let retry_at: Option<DateTime<Utc>> = r.try_get("retry_at")?;
            Ok(ScopedState {
                pool: r.try_get("pool")?,
                endpoint: r.try_get("endpoint")?,
                scope: r.try_get("scope")?,
                seq: r.try_get("seq")?,
                state: state_column(r, "state")?,
                weight: r.try_get("weight")?,
                retry_at: retry_at.map(|t| t.timestamp_micros()),
                since: micros(r, "since")?,
                reason: r.try_get("reason")?,
            })
        })
        .collect()
}

fn state(r: &PgRow) -> Result<EndpointState, StoreError> {
    Ok(EndpointState {
        pool: r.try_get("pool")?,
        endpoint: r.try_get("endpoint")?,
        seq: r.try_get("seq")?,
        state: state_column(r, "state")?,
        weight: r.try_get("weight")?,
        ramp_ms: r.try_get("ramp_ms")?,
        score: r.try_get("score")?,
        failure_rate: r.try_get("failure_rate")?,
        since: micros(r, "since")?,
        reason: r.try_get("reason")?,
        policy_version: r.try_get("policy_version")?,
    })
}
