//! Current health: every pool with its endpoints, one pool, one endpoint with its latest evidence.

use crate::auth::Reader;
use crate::error::{ApiError, BadParameter, BadPath, Busy, ErrorBody, NeedsToken};
use crate::extract::{ApiPath, ApiQuery};
use crate::params::{int_or, After, Int, Name};
use crate::AppState;
use axum::extract::State;
use axum::Json;
use vitals_contracts::view::{self, EndpointDetail, PoolHealth, PoolPage};
use vitals_contracts::{EndpointState, HealthState};
use vitals_store::read;

/// Pools with their counts and flags, each with the endpoints given (in (pool, endpoint)
/// order), `per_pool` of them at most; `next_after` is set on a pool that has more.
async fn assemble(
    app: &AppState,
    names: &[String],
    endpoints: Vec<EndpointState>,
    per_pool: usize,
    counts: Option<Counts>,
) -> Result<Vec<PoolHealth>, ApiError> {
    let mut counts = match counts {
        Some(c) => c,
        None => read::state_counts(&app.db, names).await?,
    };
    let flags = read::pool_flags(&app.db, names).await?;
    let mut rows = endpoints.into_iter().peekable();
    let mut pools = Vec::with_capacity(names.len());
    for name in names {
        let mut page = Vec::new();
        while let Some(r) = rows.next_if(|r| &r.pool == name) {
            page.push(view::EndpointHealth::from(r));
        }
        let by_state = counts.remove(name).unwrap_or_default();
        let total: usize = by_state.values().sum();
        let next_after = (page.len() >= per_pool && total > page.len())
            .then(|| page.last().map(|e| e.endpoint.clone()))
            .flatten();
        let (panic, correlated_outage) = flags.get(name).copied().unwrap_or_default();
        pools.push(PoolHealth {
            pool: name.clone(),
            healthy: by_state.get(HealthState::Healthy.as_str()).copied().unwrap_or(0),
            total,
            by_state,
            endpoints: page,
            next_after,
            panic,
            correlated_outage,
        });
    }
    Ok(pools)
}

type Counts = std::collections::HashMap<String, std::collections::BTreeMap<String, usize>>;

/// How many pools, in order, a page holds when each lists `listed` endpoints and a page lists
/// at most `budget` in all: one at least.
fn pools_that_fit(listed: impl Iterator<Item = usize>, budget: usize) -> usize {
    let mut sum = 0usize;
    let mut n = 0;
    for l in listed {
        sum = sum.saturating_add(l);
        if sum > budget && n > 0 {
            break;
        }
        n += 1;
    }
    n
}

#[derive(serde::Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct PoolParams {
    /// Pools per page, 1 to 1000 (default 100). A page also ends before its endpoints would
    /// pass 5,000 in all, so it may hold fewer pools; follow `next_after`.
    #[param(inline)]
    limit: Option<PoolsLimit>,
    /// Only pools whose name sorts after this one: the `next_after` of the previous page.
    #[param(inline)]
    after: Option<After>,
    /// Endpoints listed per pool, 0 to 1000 (default 50); the counts cover all of them, and a
    /// pool with more has its own `next_after` for `GET /v1/pools/{pool}`.
    #[param(inline)]
    endpoints: Option<PoolEndpoints>,
}

/// Parameter types (aliases: the OpenAPI derive reads a type without const arguments).
type PoolsLimit = Int<1, MAX_POOLS>;
type PoolEndpoints = Int<0, MAX_POOL_ENDPOINTS>;
type EndpointsLimit = Int<1, MAX_POOL_ENDPOINTS>;

const DEFAULT_POOLS: i64 = 100;
const MAX_POOLS: i64 = 1000;
const DEFAULT_POOL_ENDPOINTS: i64 = 50;
const MAX_POOL_ENDPOINTS: i64 = 1000;
/// The most endpoints one response lists (about 200 bytes each).
pub const MAX_PAGE_ENDPOINTS: usize = 5_000;

#[utoipa::path(get, path = "/v1/pools", tag = "health", params(PoolParams),
    responses((status = 200, description = "A page of pools, each with counts by state and its first endpoints", body = PoolPage),
              BadParameter, NeedsToken, Busy))]
pub async fn pools(
    State(app): State<AppState>,
    _: Reader,
    ApiQuery(q): ApiQuery<PoolParams>,
) -> Result<Json<PoolPage>, ApiError> {
    let limit = int_or(q.limit, DEFAULT_POOLS);
    let per_pool = int_or(q.endpoints, DEFAULT_POOL_ENDPOINTS);
    let after = q.after.unwrap_or_default().0;
    let mut names = read::pool_names_after(&app.db, &after, limit + 1).await?;
    let mut more = names.len() as i64 > limit;
    names.truncate(limit as usize);
    // The page ends before the endpoints it lists pass the budget (one pool at least): what
    // each pool holds, not what was asked for per pool (a page of small pools is not cut short).
    let counts = read::state_counts(&app.db, &names).await?;
    let listed = names.iter().map(|n| {
        let total: usize = counts.get(n).map_or(0, |c| c.values().sum());
        total.min(per_pool as usize)
    });
    let fit = pools_that_fit(listed, MAX_PAGE_ENDPOINTS);
    if names.len() > fit {
        names.truncate(fit);
        more = true;
    }
    let endpoints = if per_pool > 0 {
        read::first_endpoints(&app.db, &names, per_pool).await?
    } else {
        Vec::new()
    };
    let pools = assemble(&app, &names, endpoints, per_pool as usize, Some(counts)).await?;
    let next_after = more.then(|| names.last().cloned()).flatten();
    Ok(Json(PoolPage { pools, next_after }))
}

#[derive(serde::Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct PoolEndpointParams {
    /// Endpoints per page, 1 to 1000 (default 500).
    #[param(inline)]
    limit: Option<EndpointsLimit>,
    /// Only endpoints whose name sorts after this one: the pool's `next_after` of the previous page.
    #[param(inline)]
    after: Option<After>,
}

const DEFAULT_ENDPOINTS: i64 = 500;

#[utoipa::path(get, path = "/v1/pools/{pool}", tag = "health",
    params(("pool" = String, Path, description = "Pool name"), PoolEndpointParams),
    responses((status = 200, description = "One pool: counts by state over all its endpoints, and a page of them", body = PoolHealth),
              BadParameter,
              (status = 404, description = "No such pool", body = ErrorBody),
              NeedsToken, Busy))]
pub async fn pool(
    State(app): State<AppState>,
    _: Reader,
    ApiPath(Name(pool)): ApiPath<Name>,
    ApiQuery(q): ApiQuery<PoolEndpointParams>,
) -> Result<Json<PoolHealth>, ApiError> {
    let limit = int_or(q.limit, DEFAULT_ENDPOINTS);
    let after = q.after.unwrap_or_default().0;
    let mut endpoints = read::pool_endpoints(&app.db, &pool, &after, limit + 1).await?;
    let more = endpoints.len() as i64 > limit;
    endpoints.truncate(limit as usize);
    let names = [pool.clone()];
    let mut p = assemble(&app, &names, endpoints, usize::MAX, None)
        .await?
        .pop()
        .filter(|p| p.total > 0)
        .ok_or_else(|| ApiError::NotFound(format!("pool {pool:?}")))?;
    p.next_after = more.then(|| p.endpoints.last().map(|e| e.endpoint.clone())).flatten();
    Ok(Json(p))
}

#[utoipa::path(get, path = "/v1/pools/{pool}/endpoints/{endpoint}", tag = "health",
    params(("pool" = String, Path, description = "Pool name"), ("endpoint" = String, Path, description = "Endpoint name")),
    responses((status = 200, description = "One endpoint with its latest evidence", body = EndpointDetail),
              BadPath,
              (status = 404, description = "No such endpoint", body = ErrorBody),
              NeedsToken, Busy))]
pub async fn endpoint(
    State(app): State<AppState>,
    _: Reader,
    ApiPath((Name(pool), Name(endpoint))): ApiPath<(Name, Name)>,
) -> Result<Json<EndpointDetail>, ApiError> {
    let current = read::endpoint(&app.db, &pool, &endpoint)
        .await?
        .ok_or_else(|| ApiError::NotFound(format!("endpoint {endpoint:?} of pool {pool:?}")))?;
    let last = read::last_transition(&app.db, &pool, &endpoint).await?;
    let last_transition = last.map(crate::history::transition).transpose()?;
    let current = view::EndpointHealth::from(current);
    let scoped = read::scoped_states(&app.db, &pool, Some(&endpoint))
        .await?
        .into_iter()
        .map(|s| view::ScopedHealth {
            endpoint: s.endpoint,
            scope: s.scope,
            state: s.state.into(),
            weight: s.weight,
            retry_at: s.retry_at.map(view::time),
            since: view::time(s.since),
            reason: s.reason,
            seq: s.seq,
        })
        .collect();
    Ok(Json(EndpointDetail {
        pool,
        current,
        last_transition,
        scoped,
    }))
}

#[cfg(test)]
mod tests {
    use super::pools_that_fit;

    #[test]
    fn a_page_is_budgeted_by_the_endpoints_pools_hold_not_by_those_asked_for() {
        // 1,000 pools of one endpoint each, 1,000 asked per pool: all fit (5 did before).
        assert_eq!(pools_that_fit(std::iter::repeat_n(1, 1_000), 5_000), 1_000);
        assert_eq!(pools_that_fit([2_000, 2_000, 2_000].into_iter(), 5_000), 2);
        assert_eq!(pools_that_fit([9_000, 1].into_iter(), 5_000), 1, "one pool at least");
        assert_eq!(pools_that_fit(std::iter::empty(), 5_000), 0);
        assert_eq!(pools_that_fit([0, 0, 5_000, 1].into_iter(), 5_000), 3);
    }
}
