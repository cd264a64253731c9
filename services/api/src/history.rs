//! Transition history: by endpoint, by pool, or fleet-wide; newest first; keyset pagination.

use crate::error::{ApiError, ErrorBody};
use crate::extract::ApiQuery;
use crate::AppState;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::Json;
use base64::Engine as _;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use sqlx::{Postgres, QueryBuilder, Row};
use std::collections::HashMap;
use utoipa::{IntoParams, ToSchema};
use vitals_contracts::{Evidence, HealthState};

pub const DEFAULT_LIMIT: i64 = 50;
pub const MAX_LIMIT: i64 = 500;

/// Query parameters of `GET /v1/transitions`.
#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[allow(dead_code)] // documents the parameters; they are parsed by hand for per-field errors
pub struct HistoryParams {
    /// Only this pool.
    pool: Option<String>,
    /// Only this endpoint (requires `pool`).
    endpoint: Option<String>,
    /// Transitions at or after this time (RFC 3339).
    from: Option<DateTime<Utc>>,
    /// Transitions before this time (RFC 3339).
    to: Option<DateTime<Utc>>,
    /// Only transitions into this state.
    state: Option<StateName>,
    /// Only this reason code (e.g. `ejected`, `degraded`, `recovered`, `forced_unhealthy`).
    reason: Option<String>,
    /// Page size, 1 to 500 (default 50).
    limit: Option<i64>,
    /// `next_cursor` of the previous page.
    cursor: Option<String>,
}

/// A health state, as the API writes it.
#[derive(Serialize, Deserialize, ToSchema, Clone, Copy)]
#[serde(rename_all = "snake_case")]
pub enum StateName {
    Healthy,
    Suspect,
    Degraded,
    Unhealthy,
    Recovering,
    Maintenance,
}

/// One transition with its evidence.
#[derive(Serialize, ToSchema)]
pub struct TransitionItem {
    pub pool: String,
    pub endpoint: String,
    pub seq: i64,
    pub transition_id: String,
    pub from_state: StateName,
    pub to_state: StateName,
    pub weight: f64,
    pub ramp_ms: i64,
    pub retry_at: Option<DateTime<Utc>>,
    pub reason_code: String,
    /// One line a person can read.
    pub reason: String,
    pub policy_version: i32,
    pub trigger_ids: Vec<String>,
    pub evidence: Evidence,
    pub stream_time: DateTime<Utc>,
}

#[derive(Serialize, ToSchema)]
pub struct HistoryPage {
    pub items: Vec<TransitionItem>,
    /// Pass as `cursor` for the next (older) page; absent on the last page.
    pub next_cursor: Option<String>,
}

/// Position of the last item of a page: (stream_time µs, pool, endpoint, seq).
#[derive(Serialize, Deserialize, PartialEq, Debug)]
struct Cursor {
    t: i64,
    p: String,
    e: String,
    s: i64,
}

impl Cursor {
    fn encode(&self) -> String {
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(serde_json::to_vec(self).unwrap_or_default())
    }

    fn decode(s: &str) -> Result<Cursor, ApiError> {
        let bad = || ApiError::invalid("cursor", "not a cursor from a previous page");
        let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(s)
            .map_err(|_| bad())?;
        let c: Cursor = serde_json::from_slice(&bytes).map_err(|_| bad())?;
        crate::extract::no_control("cursor", &c.p)?;
        crate::extract::no_control("cursor", &c.e)?;
        Ok(c)
    }
}

pub(crate) fn state_name(s: &str) -> Option<StateName> {
    Some(match HealthState::parse(s)? {
        HealthState::Healthy => StateName::Healthy,
        HealthState::Suspect => StateName::Suspect,
        HealthState::Degraded => StateName::Degraded,
        HealthState::Unhealthy => StateName::Unhealthy,
        HealthState::Recovering => StateName::Recovering,
        HealthState::Maintenance => StateName::Maintenance,
    })
}

fn time_param(q: &HashMap<String, String>, name: &'static str) -> Result<Option<DateTime<Utc>>, ApiError> {
    q.get(name)
        .map(|v| {
            DateTime::parse_from_rfc3339(v)
                .map(|t| t.with_timezone(&Utc))
                .map_err(|_| ApiError::invalid(name, format!("{v:?} is not an RFC 3339 time")))
        })
        .transpose()
}

const MAX_NAME: usize = 256;

fn name_param<'a>(q: &'a HashMap<String, String>, name: &'static str) -> Result<Option<&'a str>, ApiError> {
    match q.get(name) {
        Some(v) if v.is_empty() || v.len() > MAX_NAME => {
            Err(ApiError::invalid(name, format!("must be 1 to {MAX_NAME} characters")))
        }
        Some(v) => Ok(Some(v.as_str())),
        None => Ok(None),
    }
}

#[utoipa::path(
    get, path = "/v1/transitions", tag = "history", params(HistoryParams),
    responses(
        (status = 200, description = "A page of transitions, newest first", body = HistoryPage),
        (status = 400, description = "An invalid parameter", body = ErrorBody),
        (status = 401, description = "A token is required", body = ErrorBody),
        (status = 503, description = "Busy; retry after the Retry-After seconds", body = ErrorBody),
    )
)]
pub async fn history(
    State(app): State<AppState>,
    headers: HeaderMap,
    ApiQuery(q): ApiQuery<HashMap<String, String>>,
) -> Result<Json<HistoryPage>, ApiError> {
    app.authorize_read(&headers)?;
    let pool = name_param(&q, "pool")?;
    let endpoint = name_param(&q, "endpoint")?;
    if endpoint.is_some() && pool.is_none() {
        return Err(ApiError::invalid("endpoint", "needs pool as well"));
    }
    let from = time_param(&q, "from")?;
    let to = time_param(&q, "to")?;
    let state = match q.get("state") {
        Some(s) => Some(
            state_name(s)
                .map(|_| s.to_ascii_lowercase())
                .ok_or_else(|| ApiError::invalid("state", format!("{s:?} is not a health state")))?,
        ),
        None => None,
    };
    let reason = name_param(&q, "reason")?;
    let limit = crate::extract::limit_param(&q, DEFAULT_LIMIT, MAX_LIMIT)?;
    let cursor = q.get("cursor").map(|c| Cursor::decode(c)).transpose()?;
    let after = cursor
        .as_ref()
        .map(|c| DateTime::from_timestamp_micros(c.t).unwrap_or_default());

    let mut sql = QueryBuilder::<Postgres>::new(
        "SELECT pool, endpoint, seq, transition_id, from_state, to_state, weight, ramp_ms, retry_at, reason_code,
         reason, policy_version, trigger_ids, evidence, stream_time FROM transitions WHERE true",
    );
    if let Some(p) = pool {
        sql.push(" AND pool = ").push_bind(p);
    }
    if let Some(e) = endpoint {
        sql.push(" AND endpoint = ").push_bind(e);
    }
    if let Some(f) = from {
        sql.push(" AND stream_time >= ").push_bind(f);
    }
    if let Some(t) = to {
        sql.push(" AND stream_time < ").push_bind(t);
    }
    if let Some(s) = &state {
        sql.push(" AND to_state = ").push_bind(s.as_str());
    }
    if let Some(r) = reason {
        sql.push(" AND reason_code = ").push_bind(r);
    }
    // The keyset condition follows the index of each kind of query, so it is a range scan.
    if let (Some(c), Some(t)) = (&cursor, after) {
        match (pool, endpoint) {
            (Some(_), Some(_)) => {
                sql.push(" AND (stream_time, seq) < (")
                    .push_bind(t)
                    .push(", ")
                    .push_bind(c.s)
                    .push(")");
            }
            (Some(_), None) => {
                sql.push(" AND (stream_time, endpoint, seq) < (")
                    .push_bind(t)
                    .push(", ")
                    .push_bind(c.e.clone())
                    .push(", ")
                    .push_bind(c.s)
                    .push(")");
            }
            _ => {
                sql.push(" AND (stream_time, pool, endpoint, seq) < (")
                    .push_bind(t)
                    .push(", ")
                    .push_bind(c.p.clone())
                    .push(", ")
                    .push_bind(c.e.clone())
                    .push(", ")
                    .push_bind(c.s)
                    .push(")");
            }
        }
    }
    sql.push(" ORDER BY stream_time DESC, pool DESC, endpoint DESC, seq DESC LIMIT ")
        .push_bind(limit + 1);
    let rows = sql.build().fetch_all(&app.db).await?;
    let mut items = Vec::with_capacity(rows.len());
    for r in rows.iter().take(limit as usize) {
        items.push(transition_item(r)?);
    }
    let next_cursor = (rows.len() as i64 > limit).then(|| {
        let last = items.last().expect("a full page has a last item");
        Cursor {
            t: last.stream_time.timestamp_micros(),
            p: last.pool.clone(),
            e: last.endpoint.clone(),
            s: last.seq,
        }
        .encode()
    });
    Ok(Json(HistoryPage { items, next_cursor }))
}

/// A state column of a row; an unknown value is a defect of the database, not of the request.
pub(crate) fn state_column(r: &sqlx::postgres::PgRow, col: &str) -> Result<StateName, ApiError> {
    let s: String = r.try_get(col)?;
    state_name(&s).ok_or_else(|| ApiError::Internal(anyhow::anyhow!("unknown state {s:?} in column {col}")))
}

pub(crate) fn transition_item(r: &sqlx::postgres::PgRow) -> Result<TransitionItem, ApiError> {
    let state = |col: &str| state_column(r, col);
    let evidence: sqlx::types::Json<Evidence> = r.try_get("evidence")?;
    Ok(TransitionItem {
        pool: r.try_get("pool")?,
        endpoint: r.try_get("endpoint")?,
        seq: r.try_get("seq")?,
        transition_id: r.try_get("transition_id")?,
        from_state: state("from_state")?,
        to_state: state("to_state")?,
        weight: r.try_get("weight")?,
        ramp_ms: r.try_get("ramp_ms")?,
        retry_at: r.try_get("retry_at")?,
        reason_code: r.try_get("reason_code")?,
        reason: r.try_get("reason")?,
        policy_version: r.try_get("policy_version")?,
        trigger_ids: r.try_get("trigger_ids")?,
        evidence: evidence.0,
        stream_time: r.try_get("stream_time")?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cursors_round_trip_and_garbage_is_refused() {
        let c = Cursor {
            t: 1_700_000_000_000_001,
            p: "pool/ü".into(),
            e: "ep".into(),
            s: 9,
        };
        assert_eq!(Cursor::decode(&c.encode()).unwrap(), c);
        assert!(matches!(Cursor::decode("%%%"), Err(ApiError::Invalid { .. })));
        assert!(matches!(Cursor::decode("aGVsbG8"), Err(ApiError::Invalid { .. })));
    }
}
