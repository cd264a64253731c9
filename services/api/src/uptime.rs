//! Uptime and incidents over a range, with the definitions of `vitals-uptime`.

use crate::auth::Reader;
use crate::error::{ApiError, BadParameter, Busy, ErrorBody, NeedsToken};
use crate::extract::{ApiPath, ApiQuery};
use crate::params::{int_or, Bucket, Int, Name, Time};
use crate::AppState;
use axum::extract::State;
use axum::Json;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use utoipa::IntoParams;
use vitals_contracts::view::{Incident, IncidentPage, PoolUptime};
use vitals_contracts::Micros;
use vitals_store::read::pool_known;
use vitals_store::uptime as store;
use vitals_uptime::Range;

const HOUR_US: Micros = 3_600_000_000;
const DAY_US: Micros = 24 * HOUR_US;
/// The longest range one request may ask for.
pub const MAX_RANGE_DAYS: i64 = 92;
/// The longest range hourly buckets may cover.
pub const MAX_HOURLY_DAYS: i64 = 31;
const DEFAULT_RANGE_DAYS: i64 = 7;

/// `from` and `to` from the query: `to` defaults to now and is clipped to it, `from` to seven
/// days before `to`; 400 naming the parameter for a range that is empty, reversed or too long.
fn range(from: Option<Time>, to: Option<Time>, now: DateTime<Utc>) -> Result<(Micros, Micros), ApiError> {
    let to = to.map_or(now, |t| t.0).min(now).timestamp_micros();
    let from = match from {
        Some(f) => f.0.timestamp_micros(),
        None => to - DEFAULT_RANGE_DAYS * DAY_US,
    };
    if from >= now.timestamp_micros() {
        return Err(ApiError::invalid("from", "is not in the past"));
    }
    if from >= to {
        return Err(ApiError::invalid("to", "must be after from"));
    }
    if to - from > MAX_RANGE_DAYS * DAY_US {
        return Err(ApiError::invalid(
            "from",
            format!("the range may cover at most {MAX_RANGE_DAYS} days"),
        ));
    }
    Ok((from, to))
}

/// Query parameters of `GET /v1/pools/{pool}/uptime`.
#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct UptimeParams {
    /// Start of the range (RFC 3339); default seven days before `to`. At most 92 days.
    #[param(inline)]
    from: Option<Time>,
    /// End of the range (RFC 3339); default now, and never later than now.
    #[param(inline)]
    to: Option<Time>,
    /// `hour` (ranges of up to 31 days) or `day`: figures per UTC-aligned bucket as well.
    #[param(inline)]
    bucket: Option<Bucket>,
    /// Endpoints per page, worst first, 1 to 1000 (default 100). A page also ends before its
    /// endpoints' buckets pass 5,000 in all (6 endpoints a page of 31 days hourly); follow
    /// `next_cursor`. The pool's figures are on every page.
    #[param(inline)]
    limit: Option<UptimeLimit>,
    /// `next_cursor` of the previous page.
    cursor: Option<String>,
}

const DEFAULT_UPTIME_ENDPOINTS: i64 = 100;
const MAX_UPTIME_ENDPOINTS: i64 = 1000;
/// Endpoints per page (an alias: the OpenAPI derive reads a type without const arguments).
type UptimeLimit = Int<1, MAX_UPTIME_ENDPOINTS>;
/// The most buckets the endpoints of one page list (about 150 bytes each).
pub const MAX_PAGE_BUCKETS: usize = 5_000;

/// Position of the last endpoint of an uptime page, in worst-first order: its availability
/// (none: nothing observed, last), incidents and name.
#[derive(Serialize, Deserialize, PartialEq, Debug, Clone)]
struct UptimeCursor {
    a: Option<f64>,
    i: usize,
    e: String,
}

impl UptimeCursor {
    fn of(e: &vitals_contracts::view::EndpointUptime) -> UptimeCursor {
        UptimeCursor {
            a: e.availability,
            i: e.incidents,
            e: e.endpoint.clone(),
        }
    }

    /// Worst first, as `vitals_uptime::worst_first` sorts.
    fn cmp(&self, other: &UptimeCursor) -> std::cmp::Ordering {
        vitals_uptime::worst_first_order((self.a, self.i, &self.e), (other.a, other.i, &other.e))
    }
}

/// How many endpoints a page holds: `limit`, and no more than fit the bucket budget (one at least).
fn uptime_page_len(limit: i64, buckets_each: usize) -> usize {
    let fit = MAX_PAGE_BUCKETS / buckets_each.max(1);
    (limit as usize).min(fit.max(1))
}

#[utoipa::path(get, path = "/v1/pools/{pool}/uptime", tag = "history",
    params(("pool" = String, Path, description = "Pool name"), UptimeParams),
    responses((status = 200, description = "Availability of the pool and each endpoint, worst first (definitions: docs/uptime.md)", body = PoolUptime),
              BadParameter,
              (status = 404, description = "No such pool", body = ErrorBody),
              NeedsToken, Busy))]
pub async fn uptime(
    State(app): State<AppState>,
    _: Reader,
    ApiPath(Name(pool)): ApiPath<Name>,
    ApiQuery(q): ApiQuery<UptimeParams>,
) -> Result<Json<PoolUptime>, ApiError> {
    let (from, to) = range(q.from, q.to, Utc::now())?;
    let bucket = match q.bucket {
        None => None,
        Some(Bucket::Day) => Some(DAY_US),
        Some(Bucket::Hour) if to - from <= MAX_HOURLY_DAYS * DAY_US => Some(HOUR_US),
        Some(Bucket::Hour) => {
            return Err(ApiError::invalid(
                "bucket",
                format!("hourly buckets cover at most {MAX_HOURLY_DAYS} days; use day"),
            ))
        }
    };
    let limit = int_or(q.limit, DEFAULT_UPTIME_ENDPOINTS);
    let cursor: Option<UptimeCursor> = q
        .cursor
        .as_deref()
        .map(|c| {
            let c: UptimeCursor = crate::extract::decode_cursor(c)?;
            crate::extract::no_control("cursor", &c.e)?;
            Ok::<_, ApiError>(c)
        })
        .transpose()?;
    if !pool_known(&app.db, &pool).await? {
        return Err(ApiError::NotFound(format!("pool {pool:?}")));
    }
    let r = Range { from, to, bucket };
    let mut histories = store::histories(&app.db, &pool, None, from, to).await?;
    store::with_requests(&app.db, &pool, None, &r, &mut histories).await?;
    let flags = store::pool_flags(&app.db, &pool, from, to).await?;
    // Every endpoint's figures without buckets (to order them and for the pool's), then the
    // buckets of the page's endpoints only: a 1,000-endpoint pool over 31 days hourly was a
    // 107 MB answer.
    let (figures, all) = vitals_uptime::uptime_without_endpoint_buckets(&histories, &flags, &r);
    let start = cursor.map_or(0, |c| {
        all.partition_point(|e| UptimeCursor::of(e).cmp(&c) != std::cmp::Ordering::Greater)
    });
    let len = uptime_page_len(limit, r.buckets().len());
    let page: Vec<&vitals_contracts::view::EndpointUptime> = all.iter().skip(start).take(len).collect();
    let more = all.len() > start + page.len();
    let by_name: HashMap<&str, &vitals_uptime::History> = histories.iter().map(|h| (h.endpoint.as_str(), h)).collect();
    let endpoints: Vec<vitals_contracts::view::EndpointUptime> = page
        .iter()
        .map(|e| match by_name.get(e.endpoint.as_str()) {
            Some(h) if r.bucket.is_some() => vitals_uptime::endpoint(h, &r),
            _ => (*e).clone(),
        })
        .collect();
    let next_cursor = more
        .then(|| page.last().map(|e| crate::extract::encode_cursor(&UptimeCursor::of(e))))
        .flatten();
    Ok(Json(PoolUptime {
        pool,
        from: vitals_contracts::view::time(from),
        to: vitals_contracts::view::time(to),
        bucket: q.bucket.map(|b| b.as_str().to_owned()),
        figures,
        endpoints,
        next_cursor,
    }))
}

/// Query parameters of `GET /v1/incidents`.
#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct IncidentParams {
    /// The pool.
    #[param(inline)]
    pool: Name,
    /// Only this endpoint.
    #[param(inline)]
    endpoint: Option<Name>,
    /// Incidents that overlap the range from this time (RFC 3339); default seven days before `to`.
    #[param(inline)]
    from: Option<Time>,
    /// End of the range (RFC 3339); default now.
    #[param(inline)]
    to: Option<Time>,
    /// Page size, 1 to 500 (default 50).
    #[param(inline)]
    limit: Option<crate::history::PageLimit>,
    /// `next_cursor` of the previous page.
    cursor: Option<String>,
}

/// Position of the last incident of a page: (start µs, endpoint, seq).
#[derive(Serialize, Deserialize, PartialEq, Debug, Clone)]
struct Cursor {
    t: i64,
    e: String,
    s: i64,
}

impl Cursor {
    fn of(i: &Incident) -> Cursor {
        Cursor {
            t: i.started_at.timestamp_micros(),
            e: i.endpoint.clone(),
            s: i.seq,
        }
    }

    fn encode(&self) -> String {
        crate::extract::encode_cursor(self)
    }

    fn decode(s: &str) -> Result<Cursor, ApiError> {
        let c: Cursor = crate::extract::decode_cursor(s)?;
        crate::extract::no_control("cursor", &c.e)?;
        Ok(c)
    }

    /// Newest first: (start, endpoint, seq) descending.
    fn key(&self) -> (i64, &str, i64) {
        (self.t, &self.e, self.s)
    }
}

#[utoipa::path(get, path = "/v1/incidents", tag = "history", params(IncidentParams),
    responses((status = 200, description = "A page of a pool's incidents that overlap the range, newest first", body = IncidentPage),
              BadParameter,
              (status = 404, description = "No such pool", body = ErrorBody),
              NeedsToken, Busy))]
pub async fn incidents(
    State(app): State<AppState>,
    _: Reader,
    ApiQuery(q): ApiQuery<IncidentParams>,
) -> Result<Json<IncidentPage>, ApiError> {
    let pool = q.pool.as_str();
    let endpoint = q.endpoint.as_ref().map(Name::as_str);
    let (from, to) = range(q.from, q.to, Utc::now())?;
    let limit = int_or(q.limit, crate::history::DEFAULT_LIMIT);
    let cursor = q.cursor.as_deref().map(Cursor::decode).transpose()?;
    if !pool_known(&app.db, pool).await? {
        return Err(ApiError::NotFound(format!("pool {pool:?}")));
    }
    // Newest first, so a page needs only the recent part of the range: the incidents that start
    // in [lo, to) are newer than any that starts before lo, and those after the cursor are the
    // page when there are more than `limit` of them. lo goes back a day at first, four times as
    // far each time there are not, down to `from` (where incidents that began before the range
    // belong too). A first page of a 92-day range used to read and compute all 92 days.
    let upper = cursor.as_ref().map_or(to, |c| c.t.min(to));
    let mut reach = DAY_US;
    let (all, start) = loop {
        let lo = upper.saturating_sub(reach).max(from);
        let r = Range {
            from: lo,
            to,
            bucket: None,
        };
        let histories = store::histories(&app.db, pool, endpoint, lo, to).await?;
        let mut found: Vec<Incident> = histories
            .iter()
            .flat_map(|h| h.incidents(&r).into_iter().map(|s| s.view(pool, &h.endpoint, to)))
            .filter(|i| lo == from || i.started_at.timestamp_micros() >= lo)
            .collect();
        found.sort_by(|a, b| Cursor::of(b).key().cmp(&Cursor::of(a).key()));
        let start = cursor
            .as_ref()
            .map_or(0, |c| found.partition_point(|i| Cursor::of(i).key() >= c.key()));
        if lo == from || found.len() > start + limit as usize {
            break (found, start);
        }
        reach = reach.saturating_mul(4);
    };
    let mut items: Vec<Incident> = all.iter().skip(start).take(limit as usize).cloned().collect();
    let more = all.len() > start + items.len();
    let keys: Vec<(String, i64)> = items.iter().map(|i| (i.endpoint.clone(), i.seq)).collect();
    let mut evidence = store::evidence(&app.db, pool, &keys).await?;
    for i in &mut items {
        if let Some((reason, ev)) = evidence.remove(&(i.endpoint.clone(), i.seq)) {
            i.reason = reason;
            i.evidence = Some(ev);
        }
    }
    let next_cursor = more.then(|| items.last().map(|i| Cursor::of(i).encode())).flatten();
    Ok(Json(IncidentPage { items, next_cursor }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_uptime_page_holds_its_limit_within_the_bucket_budget() {
        assert_eq!(uptime_page_len(100, 0), 100, "no buckets: the limit");
        assert_eq!(uptime_page_len(100, 31 * 24), 6, "31 days hourly");
        assert_eq!(uptime_page_len(100, 92), 54, "92 days daily");
        assert_eq!(uptime_page_len(3, 24), 3);
        assert_eq!(uptime_page_len(100, 10_000), 1, "one at least");
    }

    #[test]
    fn the_uptime_cursor_orders_as_worst_first() {
        use std::cmp::Ordering::*;
        let c = |a: Option<f64>, i: usize, e: &str| UptimeCursor { a, i, e: e.into() };
        assert_eq!(c(Some(0.5), 0, "z").cmp(&c(Some(0.9), 0, "a")), Less);
        assert_eq!(
            c(Some(0.5), 3, "z").cmp(&c(Some(0.5), 1, "a")),
            Less,
            "more incidents first"
        );
        assert_eq!(c(Some(0.5), 1, "a").cmp(&c(Some(0.5), 1, "b")), Less);
        assert_eq!(
            c(None, 0, "a").cmp(&c(Some(1.0), 0, "z")),
            Greater,
            "nothing observed last"
        );
    }

    #[test]
    fn ranges_default_clip_and_refuse_with_the_parameter_named() {
        let now = DateTime::parse_from_rfc3339("2026-12-01T00:00:00Z")
            .unwrap()
            .with_timezone(&Utc);
        // As a request gives them: the query parsed by the route's extractor, then the range.
        let range_of = |pairs: &[(&str, &str)]| {
            let raw = serde_urlencoded::to_string(pairs).unwrap();
            crate::extract::query::<UptimeParams>(&raw).and_then(|p| range(p.from, p.to, now))
        };
        let (from, to) = range_of(&[]).unwrap();
        assert_eq!((to, to - from), (now.timestamp_micros(), 7 * DAY_US));
        let (_, to) = range_of(&[("to", "2027-01-01T00:00:00Z")]).unwrap();
        assert_eq!(to, now.timestamp_micros(), "clipped to now");
        for (pairs, field) in [
            (
                vec![("from", "2026-11-02T00:00:00Z"), ("to", "2026-11-01T00:00:00Z")],
                "to",
            ),
            (vec![("from", "2026-01-01T00:00:00Z")], "from"),
            (vec![("from", "2027-01-01T00:00:00Z")], "from"),
            (vec![("from", "yesterday")], "from"),
            (vec![("to", "2026-13-01T00:00:00Z")], "to"),
            (
                vec![("to", "2026-11-01T00:00:00Z"), ("to", "2026-11-02T00:00:00Z")],
                "to",
            ),
        ] {
            match range_of(&pairs) {
                Err(ApiError::Invalid { field: Some(f), .. }) => assert_eq!(f, field, "{pairs:?}"),
                other => panic!("{pairs:?}: {other:?}"),
            }
        }
    }
}
