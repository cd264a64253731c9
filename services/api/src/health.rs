//! Current health: every pool with its endpoints, one pool, one endpoint with its latest evidence.

use crate::error::{ApiError, ErrorBody};
use crate::extract::{ApiPath, ApiQuery};
use crate::AppState;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::Json;
use vitals_contracts::view::{self, EndpointDetail, PoolHealth, PoolPage};
use vitals_contracts::{EndpointState, HealthState};
use vitals_store::read;

/// Fill in the pools' flags from their latest decisions.
async fn flag(app: &AppState, pools: &mut [PoolHealth]) -> Result<(), ApiError> {
    let names: Vec<String> = pools.iter().map(|p| p.pool.clone()).collect();
    let flags = read::pool_flags(&app.db, &names).await?;
    for p in pools {
        if let Some((panic, outage)) = flags.get(&p.pool) {
            p.panic = *panic;
            p.correlated_outage = *outage;
        }
    }
    Ok(())
}

/// Endpoint states in (pool, endpoint) order, grouped by pool.
fn group(rows: Vec<EndpointState>) -> Vec<PoolHealth> {
    let mut pools: Vec<PoolHealth> = Vec::new();
    for r in rows {
        let healthy = usize::from(r.state == HealthState::Healthy);
        let pool = r.pool.clone();
        let e = view::EndpointHealth::from(r);
        match pools.last_mut() {
            Some(p) if p.pool == pool => {
                p.endpoints.push(e);
                p.healthy += healthy;
            }
            _ => pools.push(PoolHealth {
                pool,
                endpoints: vec![e],
                healthy,
                total: 0,
                panic: false,
                correlated_outage: false,
            }),
        }
    }
    for p in &mut pools {
        p.total = p.endpoints.len();
    }
    pools
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
    let mut pools = group(read::pools_after(&app.db, &after, limit + 1).await?);
    let next_after = if pools.len() as i64 > limit {
        pools.truncate(limit as usize);
        pools.last().map(|p| p.pool.clone())
    } else {
        None
    };
    flag(&app, &mut pools).await?;
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
    let mut found = group(read::pool(&app.db, &pool).await?);
    flag(&app, &mut found).await?;
    found
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
    let current = read::endpoint(&app.db, &pool, &endpoint)
        .await?
        .ok_or_else(|| ApiError::NotFound(format!("endpoint {endpoint:?} of pool {pool:?}")))?;
    let last = read::last_transition(&app.db, &pool, &endpoint).await?;
    let last_transition = last.map(crate::history::transition).transpose()?;
    let current = view::EndpointHealth::from(current);
    Ok(Json(EndpointDetail {
        pool,
        current,
        last_transition,
    }))
}
