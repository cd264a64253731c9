//! Transition history: by endpoint, by pool, or fleet-wide; newest first; keyset pagination.

use crate::auth::Reader;
use crate::error::{ApiError, BadParameter, Busy, NeedsToken};
use crate::extract::ApiQuery;
use crate::params::{int_or, Int, Name, Reason, Scope, State as StateParam, Time};
use crate::AppState;
use axum::extract::State;
use axum::Json;
use serde::{Deserialize, Serialize};
use utoipa::IntoParams;
use vitals_contracts::view::HistoryPage;
use vitals_contracts::{self as c, view};
use vitals_store::read::{self, Position, TransitionFilter};

pub const DEFAULT_LIMIT: i64 = 50;
pub const MAX_LIMIT: i64 = 500;
/// A page size (an alias: the OpenAPI derive reads a type without const arguments).
pub type PageLimit = Int<1, MAX_LIMIT>;

/// Query parameters of `GET /v1/transitions`.
#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct HistoryParams {
    /// Only this pool.
    #[param(inline)]
    pool: Option<Name>,
    /// Only this endpoint (requires `pool`).
    #[param(inline)]
    endpoint: Option<Name>,
    /// Transitions at or after this time (RFC 3339).
    #[param(inline)]
    from: Option<Time>,
    /// Transitions before this time (RFC 3339).
    #[param(inline)]
    to: Option<Time>,
    /// Only transitions into this state.
    #[param(inline)]
    state: Option<StateParam>,
    /// Only this reason code.
    #[param(inline)]
    reason: Option<Reason>,
    /// Only the transitions of this scope of reporters (`gateway=g1`, `location=eu`, `key=k1`),
    /// or `fleet` for the fleet-wide ones.
    #[param(inline)]
    scope: Option<Scope>,
    /// Page size, 1 to 500 (default 50).
    #[param(inline)]
    limit: Option<PageLimit>,
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

#[utoipa::path(
    get, path = "/v1/transitions", tag = "history", params(HistoryParams),
    responses(
        (status = 200, description = "A page of transitions, newest first", body = HistoryPage),
        BadParameter, NeedsToken, Busy,
    )
)]
pub async fn history(
    State(app): State<AppState>,
    _: Reader,
    ApiQuery(q): ApiQuery<HistoryParams>,
) -> Result<Json<HistoryPage>, ApiError> {
    if q.endpoint.is_some() && q.pool.is_none() {
        return Err(ApiError::invalid("endpoint", "needs pool as well"));
    }
    let limit = int_or(q.limit, DEFAULT_LIMIT);
    let cursor = q.cursor.as_deref().map(Cursor::decode).transpose()?;
    let filter = TransitionFilter {
        pool: q.pool.map(|n| n.0),
        endpoint: q.endpoint.map(|n| n.0),
        from: q.from.map(|t| t.0),
        to: q.to.map(|t| t.0),
        state: q.state.map(|s| s.0),
        reason: q.reason.map(|r| r.0),
        scope: q.scope.map(|s| s.0),
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
