//! Current health: every pool with its endpoints, one pool, one endpoint with its latest evidence.

use crate::error::{ApiError, ErrorBody};
use crate::extract::{ApiPath, ApiQuery};
use crate::history::{state_column, StateName, TransitionItem};
use crate::AppState;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::Json;
use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::Row;
use utoipa::ToSchema;

#[derive(Serialize, ToSchema)]
pub struct EndpointHealth {
    pub endpoint: String,
    pub state: StateName,
    /// Routing weight 0..1; during slow start it rises to 1 over `ramp_ms` from `since`.
    pub weight: f64,
    pub ramp_ms: i64,
    pub score: f64,
    pub failure_rate: f64,
    pub since: DateTime<Utc>,
    /// The reason of the last transition ("first seen" before any).
    pub reason: String,
    /// Sequence number of the last transition (0: none yet).
    pub seq: i64,
    pub policy_version: i32,
}

#[derive(Serialize, ToSchema)]
pub struct PoolHealth {
    pub pool: String,
    pub endpoints: Vec<EndpointHealth>,
    pub healthy: usize,
    pub total: usize,
}

#[derive(Serialize, ToSchema)]
pub struct EndpointDetail {
    pub pool: String,
    #[serde(flatten)]
    pub current: EndpointHealth,
    /// The last transition with its full evidence, if there was one.
    pub last_transition: Option<TransitionItem>,
}

fn endpoint_health(r: &sqlx::postgres::PgRow) -> Result<EndpointHealth, ApiError> {
    Ok(EndpointHealth {
        endpoint: r.try_get("endpoint")?,
        state: state_column(r, "state")?,
        weight: r.try_get("weight")?,
        ramp_ms: r.try_get("ramp_ms")?,
        score: r.try_get("score")?,
        failure_rate: r.try_get("failure_rate")?,
        since: r.try_get("since")?,
        reason: r.try_get("reason")?,
        seq: r.try_get("seq")?,
        policy_version: r.try_get("policy_version")?,
    })
}

const STATE_COLUMNS: &str =
    "pool, endpoint, state, weight, ramp_ms, score, failure_rate, since, reason, seq, policy_version";

fn group(rows: &[sqlx::postgres::PgRow]) -> Result<Vec<PoolHealth>, ApiError> {
    let mut pools: Vec<PoolHealth> = Vec::new();
    for r in rows {
        let pool: String = r.try_get("pool")?;
        let e = endpoint_health(r)?;
        match pools.last_mut() {
            Some(p) if p.pool == pool => p.endpoints.push(e),
            _ => pools.push(PoolHealth {
                pool,
                endpoints: vec![e],
                healthy: 0,
                total: 0,
            }),
        }
    }
    for p in &mut pools {
        p.total = p.endpoints.len();
        p.healthy = p
            .endpoints
            .iter()
            .filter(|e| matches!(e.state, StateName::Healthy))
            .count();
    }
    Ok(pools)
}

/// A page of pools, in name order.
#[derive(Serialize, ToSchema)]
pub struct PoolPage {
    pub pools: Vec<PoolHealth>,
    /// Pass as `after` for the next page; absent on the last page.
    pub next_after: Option<String>,
}

#[derive(serde::Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[allow(dead_code)] // documents the parameters
pub struct PoolParams {
    /// Pools per page, 1 to 1000 (default 100).
    limit: Option<i64>,
    /// Only pools whose name sorts after this one: the `next_after` of the previous page.
    after: Option<String>,
}

const DEFAULT_POOLS: i64 = 100;
const MAX_POOLS: i64 = 1000;

#[utoipa::path(get, path = "/v1/pools", tag = "health", params(PoolParams),
    responses((status = 200, description = "A page of pools with their endpoints", body = PoolPage),
              (status = 400, description = "An invalid parameter", body = ErrorBody),
              (status = 401, description = "A token is required", body = ErrorBody),
              (status = 503, description = "Busy; retry after the Retry-After seconds", body = ErrorBody)))]
pub async fn pools(
    State(app): State<AppState>,
    headers: HeaderMap,
    ApiQuery(q): ApiQuery<std::collections::HashMap<String, String>>,
) -> Result<Json<PoolPage>, ApiError> {
    app.authorize_read(&headers)?;
    let limit = crate::extract::limit_param(&q, DEFAULT_POOLS, MAX_POOLS)?;
    let after = q.get("after").cloned().unwrap_or_default();
    let rows = sqlx::query(&format!(
        "SELECT {STATE_COLUMNS} FROM endpoint_state WHERE pool IN
           (SELECT DISTINCT pool FROM endpoint_state WHERE pool > $1 ORDER BY pool LIMIT $2)
         ORDER BY pool, endpoint"
    ))
    .bind(&after)
    .bind(limit + 1)
    .fetch_all(&app.db)
    .await?;
    let mut pools = group(&rows)?;
    let next_after = if pools.len() as i64 > limit {
        pools.truncate(limit as usize);
        pools.last().map(|p| p.pool.clone())
    } else {
        None
    };
    Ok(Json(PoolPage { pools, next_after }))
}

#[utoipa::path(get, path = "/v1/pools/{pool}", tag = "health",
    params(("pool" = String, Path, description = "Pool name")),
    responses((status = 200, description = "One pool", body = PoolHealth),
              (status = 400, description = "An invalid path parameter", body = ErrorBody),
              (status = 404, description = "No such pool", body = ErrorBody),
              (status = 401, description = "A token is required", body = ErrorBody),
              (status = 503, description = "Busy; retry after the Retry-After seconds", body = ErrorBody)))]
pub async fn pool(
    State(app): State<AppState>,
    headers: HeaderMap,
    ApiPath(pool): ApiPath<String>,
) -> Result<Json<PoolHealth>, ApiError> {
    app.authorize_read(&headers)?;
    let rows = sqlx::query(&format!(
        "SELECT {STATE_COLUMNS} FROM endpoint_state WHERE pool = $1 ORDER BY endpoint"
    ))
    .bind(&pool)
    .fetch_all(&app.db)
    .await?;
    group(&rows)?
        .pop()
        .map(Json)
        .ok_or_else(|| ApiError::NotFound(format!("pool {pool:?}")))
}

#[utoipa::path(get, path = "/v1/pools/{pool}/endpoints/{endpoint}", tag = "health",
    params(("pool" = String, Path, description = "Pool name"), ("endpoint" = String, Path, description = "Endpoint name")),
    responses((status = 200, description = "One endpoint with its latest evidence", body = EndpointDetail),
              (status = 400, description = "An invalid path parameter", body = ErrorBody),
              (status = 404, description = "No such endpoint", body = ErrorBody),
              (status = 401, description = "A token is required", body = ErrorBody),
              (status = 503, description = "Busy; retry after the Retry-After seconds", body = ErrorBody)))]
pub async fn endpoint(
    State(app): State<AppState>,
    headers: HeaderMap,
    ApiPath((pool, endpoint)): ApiPath<(String, String)>,
) -> Result<Json<EndpointDetail>, ApiError> {
    app.authorize_read(&headers)?;
    let row = sqlx::query(&format!(
        "SELECT {STATE_COLUMNS} FROM endpoint_state WHERE pool = $1 AND endpoint = $2"
    ))
    .bind(&pool)
    .bind(&endpoint)
    .fetch_optional(&app.db)
    .await?
    .ok_or_else(|| ApiError::NotFound(format!("endpoint {endpoint:?} of pool {pool:?}")))?;
    let current = endpoint_health(&row)?;
    let last = sqlx::query(
        "SELECT pool, endpoint, seq, transition_id, from_state, to_state, weight, ramp_ms, retry_at, reason_code,
         reason, policy_version, trigger_ids, evidence, stream_time FROM transitions
         WHERE pool = $1 AND endpoint = $2 ORDER BY seq DESC LIMIT 1",
    )
    .bind(&pool)
    .bind(&endpoint)
    .fetch_optional(&app.db)
    .await?;
    let last_transition = last.as_ref().map(crate::history::transition_item).transpose()?;
    Ok(Json(EndpointDetail {
        pool,
        current,
        last_transition,
    }))
}
