//! Transition history: by endpoint, by pool, or fleet-wide; newest first; keyset pagination.

use crate::error::{ApiError, ErrorBody};
use crate::extract::ApiQuery;
use crate::AppState;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::Json;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use utoipa::IntoParams;
use vitals_contracts::view::HistoryPage;
use vitals_contracts::{self as c, view};
use vitals_store::read::{self, Position, TransitionFilter};

pub const DEFAULT_LIMIT: i64 = 50;
pub const MAX_LIMIT: i64 = 500;

/// Query parameters of `GET /v1/transitions`.
#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[allow(dead_code)] // documents the parameters; they are parsed by hand for per-field errors
pub struct HistoryParams {
    /// Only this pool.
    #[param(min_length = 1, max_length = 256)]
    pool: Option<String>,
    /// Only this endpoint (requires `pool`).
    #[param(min_length = 1, max_length = 256)]
    endpoint: Option<String>,
    /// Transitions at or after this time (RFC 3339).
    from: Option<DateTime<Utc>>,
    /// Transitions before this time (RFC 3339).
    to: Option<DateTime<Utc>>,
    /// Only transitions into this state.
    state: Option<view::StateName>,
    /// Only this reason code.
    reason: Option<view::ReasonCode>,
    /// Page size, 1 to 500 (default 50).
    #[param(minimum = 1, maximum = 500)]
    limit: Option<i64>,
    /// `next_cursor` of the previous page.
    cursor: Option<String>,
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
        crate::extract::encode_cursor(self)
    }

    fn decode(s: &str) -> Result<Cursor, ApiError> {
        let c: Cursor = crate::extract::decode_cursor(s)?;
        crate::extract::no_control("cursor", &c.p)?;
        crate::extract::no_control("cursor", &c.e)?;
        Ok(c)
    }
}

pub(crate) fn time_param(q: &HashMap<String, String>, name: &'static str) -> Result<Option<DateTime<Utc>>, ApiError> {
    q.get(name)
        .map(|v| {
            DateTime::parse_from_rfc3339(v)
                .map(|t| t.with_timezone(&Utc))
                .map_err(|_| ApiError::invalid(name, format!("{v:?} is not an RFC 3339 time")))
        })
        .transpose()
}

const MAX_NAME: usize = 256;

pub(crate) fn name_param<'a>(q: &'a HashMap<String, String>, name: &'static str) -> Result<Option<&'a str>, ApiError> {
    match q.get(name) {
        Some(v) if v.is_empty() || v.len() > MAX_NAME => Err(ApiError::invalid(
            name,
            format!("must be 1 to {MAX_NAME} bytes (UTF-8)"),
        )),
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
        Some(s) => Some(c::HealthState::parse(s).ok_or_else(|| {
            ApiError::invalid(
                "state",
                format!("{s:?} is not a health state ({})", c::HealthState::names().join(", ")),
            )
        })?),
        None => None,
    };
    let reason = match name_param(&q, "reason")? {
        Some(r) => Some(c::ReasonCode::parse(r).ok_or_else(|| {
            ApiError::invalid(
                "reason",
                format!("{r:?} is not a reason code ({})", c::ReasonCode::names().join(", ")),
            )
        })?),
        None => None,
    };
    let limit = crate::extract::limit_param(&q, DEFAULT_LIMIT, MAX_LIMIT)?;
    let cursor = q.get("cursor").map(|c| Cursor::decode(c)).transpose()?;
    let filter = TransitionFilter {
        pool: pool.map(str::to_owned),
        endpoint: endpoint.map(str::to_owned),
        from,
        to,
        state,
        reason,
        before: cursor.map(|c| Position {
            stream_time: view::time(c.t),
            pool: c.p,
            endpoint: c.e,
            seq: c.s,
        }),
    };
    let rows = read::transitions(&app.db, &filter, limit + 1).await?;
    let more = rows.len() as i64 > limit;
    let mut items = Vec::with_capacity(rows.len());
    for h in rows.into_iter().take(limit as usize) {
        items.push(transition(h)?);
    }
    let next_cursor = more.then(|| {
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

/// A stored transition as the API shows it; a reason code this build does not know is a defect
/// of the deployment (an older API on a newer processor), not of the request.
pub(crate) fn transition(h: c::HealthChanged) -> Result<view::Transition, ApiError> {
    view::Transition::try_from(h).map_err(|e| ApiError::Internal(e.into()))
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
