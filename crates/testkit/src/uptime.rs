//! The uptime fixture: a known audit log that the API, dashboard and CLI tests read, so that all
//! three are checked against the same figures.

use sqlx::PgPool;

/// The audit log's month holding `t_us` (it is partitioned by month, migration 0011): rows
/// written without the processor need it first.
pub async fn create_month(db: &PgPool, t_us: i64) {
    let t = vitals_store::timestamp(t_us);
    vitals_store::months::create_months(db, t, t)
        .await
        .expect("creating the audit log's month");
}

/// Insert a transition row with its from-state and weight, as the processor would.
pub async fn insert_change(
    db: &PgPool,
    pool: &str,
    endpoint: &str,
    seq: i64,
    (from, to, weight): (&str, &str, f64),
    reason_code: &str,
    t_us: i64,
) {
    create_month(db, t_us).await;
    sqlx::query(
        "INSERT INTO transitions (pool, endpoint, seq, transition_id, from_state, to_state, weight, ramp_ms,
         reason_code, reason, window_calls, trigger_ids, policy_version, evidence, stream_time, source_partition,
         source_offset)
         VALUES ($1, $2, $3, $1 || '/' || $2 || '/' || $3, $4, $5, $6, 0, $7, $7 || ' of ' || $2, 20, ARRAY['sig-' || $3], 0, $8, to_timestamp($9::double precision / 1e6), 0, $3)",
    )
    .bind(pool)
    .bind(endpoint)
    .bind(seq)
    .bind(from)
    .bind(to)
    .bind(weight)
    .bind(reason_code)
    .bind(evidence_json())
    .bind(t_us)
    .execute(db)
    .await
    .unwrap();
}

/// The evidence of a test transition: 5 timeouts in a row, 3 successes in the window.
pub fn evidence_json() -> serde_json::Value {
    serde_json::json!({
        "window_ms": 30000, "success": 3, "timeout": 5, "connect_error": 0, "connection_dropped": 0,
        "rate_limited": 0, "server_error": 0, "client_error": 0, "invalid_response": 0, "cancelled": 0,
        "failure_rate": 0.625, "score": 40.0, "ttft_p50_ms": 250.0, "ttft_p99_ms": null,
        "latency_ewma_ms": null, "pool_latency_median_ms": null, "consecutive_failures": 5,
        "consecutive_successes": 0, "consecutive_hard_failures": 5, "isolations": 1,
        "thresholds": ["consecutive_failures>=5"]
    })
}

/// The uptime fixture, relative to `t0` (µs, a UTC midnight at least a day ago), shared by the
/// API, dashboard and CLI tests so that all three show the same figures: pool `up` over
/// `[t0, t0 + 24 h)` — `a` out since before the range (an incident that started 20 min before
/// it), `b` ejected for 10 s at 05:00, `c` in maintenance 02:00–03:00, `d` first seen at 12:00;
/// the pool in panic for those 10 s; the calls of [`UPTIME_REQUESTS`].
pub async fn seed_uptime(db: &PgPool, t0: i64) {
    seed_requests(db, t0).await;
    const MIN: i64 = 60_000_000;
    const H: i64 = 60 * MIN;
    for (ep, state, seen) in [
        ("a", "healthy", t0 - H),
        ("b", "healthy", t0 - H),
        ("c", "healthy", t0 - H),
        ("d", "healthy", t0 + 12 * H),
    ] {
        sqlx::query(
            "INSERT INTO endpoint_state (pool, endpoint, seq, state, weight, ramp_ms, score, failure_rate, since, reason, policy_version, first_seen)
             VALUES ('up', $1, 9, $2, 1, 0, 100, 0, now(), 'r', 0, to_timestamp($3::double precision / 1e6))",
        )
        .bind(ep)
        .bind(state)
        .bind(seen)
        .execute(db)
        .await
        .unwrap();
    }
    type Row<'a> = (&'a str, i64, (&'a str, &'a str, f64), &'a str, i64);
    let changes: &[Row] = &[
        ("a", 1, ("healthy", "suspect", 1.0), "suspect", t0 - 30 * MIN),
        ("a", 2, ("suspect", "unhealthy", 0.0), "ejected", t0 - 20 * MIN),
        ("a", 3, ("unhealthy", "recovering", 0.1), "readmitted", t0 + 10 * MIN),
        ("a", 4, ("recovering", "healthy", 1.0), "recovered", t0 + 40 * MIN),
        ("b", 1, ("healthy", "unhealthy", 0.0), "ejected", t0 + 5 * H),
        (
            "b",
            2,
            ("unhealthy", "recovering", 0.1),
            "readmitted",
            t0 + 5 * H + 10_000_000,
        ),
        (
            "b",
            3,
            ("recovering", "healthy", 1.0),
            "recovered",
            t0 + 5 * H + 40_000_000,
        ),
        ("c", 1, ("healthy", "maintenance", 0.0), "maintenance_on", t0 + 2 * H),
        (
            "c",
            2,
            ("maintenance", "recovering", 0.1),
            "override_cleared",
            t0 + 3 * H,
        ),
        (
            "c",
            3,
            ("recovering", "healthy", 1.0),
            "recovered",
            t0 + 3 * H + 30 * MIN,
        ),
    ];
    for (ep, seq, states, code, at) in changes {
        insert_change(db, "up", ep, *seq, *states, code, *at).await;
    }
    for (seq, panic, at) in [(1, true, t0 + 5 * H), (2, false, t0 + 5 * H + 10_000_000)] {
        create_month(db, at).await;
        sqlx::query(
            "INSERT INTO pool_events (pool, seq, endpoints, healthy, ejected, healthy_fraction, panic, correlated_outage, reason,
             policy_version, stream_time, source_partition, source_offset)
             VALUES ('up', $1, 4, 3, 1, 0.75, $2, false, 'test', 0, to_timestamp($3::double precision / 1e6), 0, $1)",
        )
        .bind(seq)
        .bind(panic)
        .bind(at)
        .execute(db)
        .await
        .unwrap();
    }
}

/// Calls counted for an endpoint in the minute starting at `minute_us`, written as the processor
/// writes them: into the minute rollups and added to the hour's.
pub async fn insert_requests(db: &PgPool, pool: &str, endpoint: &str, minute_us: i64, r: vitals_contracts::Requests) {
    create_month(db, minute_us).await;
    let hour_us = minute_us.div_euclid(3_600_000_000) * 3_600_000_000;
    for (table, at, t) in [
        ("request_rollups", "minute", minute_us),
        ("request_rollups_hourly", "hour", hour_us),
    ] {
        sqlx::query(&format!(
            "INSERT INTO {table} (pool, endpoint, {at}, succeeded, failed, rate_limited, neutral)
             VALUES ($1, $2, to_timestamp($3::double precision / 1e6), $4, $5, $6, $7)
             ON CONFLICT (pool, endpoint, {at}) DO UPDATE SET succeeded = {table}.succeeded + excluded.succeeded,
               failed = {table}.failed + excluded.failed, rate_limited = {table}.rate_limited + excluded.rate_limited,
               neutral = {table}.neutral + excluded.neutral"
        ))
        .bind(pool)
        .bind(endpoint)
        .bind(t)
        .bind(r.succeeded)
        .bind(r.failed)
        .bind(r.rate_limited)
        .bind(r.neutral)
        .execute(db)
        .await
        .unwrap();
    }
}

/// The fixture's calls (pool `up`), as (endpoint, minute after `t0`, succeeded, failed, rate
/// limited, neutral). Over `[t0, t0 + 24 h)`: a 70 of 120 succeeded (and 7 neutral), b 40 of 60,
/// c 30 of 60, d 100 of 100 — the pool 240 of 340 (70.588 %). a's row 5 minutes before `t0` is
/// outside that range. Over `[t0 + 4 h 30 min, t0 + 6 h 30 min)`, a range with one whole hour
/// and two half hours: a 50 of 50, b 40 of 60 (25 of 45 in the hour from 05:00, 15 of 15 after
/// 06:00).
pub const UPTIME_REQUESTS: &[(&str, i64, i64, i64, i64, i64)] = &[
    ("a", -5, 0, 99, 0, 0),
    ("a", 10, 20, 50, 0, 0),
    ("a", 5 * 60 + 30, 50, 0, 0, 7),
    ("b", 5 * 60, 25, 10, 10, 0),
    ("b", 6 * 60 + 1, 15, 0, 0, 0),
    ("c", 2 * 60 + 30, 30, 30, 0, 0),
    ("d", 13 * 60, 100, 0, 0, 0),
];

/// Write [`UPTIME_REQUESTS`] for the fixture at `t0`.
pub async fn seed_requests(db: &PgPool, t0: i64) {
    for (ep, minute, succeeded, failed, rate_limited, neutral) in UPTIME_REQUESTS {
        let r = vitals_contracts::Requests {
            succeeded: *succeeded,
            failed: *failed,
            rate_limited: *rate_limited,
            neutral: *neutral,
        };
        insert_requests(db, "up", ep, t0 + minute * 60_000_000, r).await;
    }
}

/// A UTC midnight at least a day before now, in µs.
pub fn uptime_t0() -> i64 {
    const DAY: i64 = 86_400_000_000;
    let now = chrono::Utc::now().timestamp_micros();
    now.div_euclid(DAY) * DAY - 2 * DAY
}
