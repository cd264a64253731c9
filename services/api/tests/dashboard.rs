//! The dashboard in a real browser: the API serves it, the processor feeds it, playwright drives
//! Debian's chromium through `dashboard_test.py` (fleet, search, pool, endpoint, an operator
//! action from the page, a live update without reload). Screenshots are left in the temp
//! directory for a person to look at.
// Needs the local stack and its peers: `scripts/test.sh` runs it (`--features stack`).
#![cfg(feature = "stack")]

mod common;
use common::*;
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_shows_the_fleet_and_acts_from_a_real_browser() {
    let api = Api::start("dash", &[]).await;
    api.start_processor();
    // 10,000 endpoints in 1,000 pools, straight into the state projection.
    sqlx::query(
        "INSERT INTO endpoint_state (pool, endpoint, seq, state, weight, ramp_ms, score, failure_rate, since, reason, policy_version)
         SELECT 'bulk-' || lpad((i / 10)::text, 4, '0'), 'ep-' || (i % 10), 0,
                (ARRAY['healthy','healthy','healthy','degraded','unhealthy'])[1 + i % 5], 1.0, 0, 100, 0, now(), 'first seen', 0
         FROM generate_series(0, 9999) i",
    )
    .execute(&api.db)
    .await
    .unwrap();
    // Pool "wide": 120 endpoints, more than a fleet page lists per pool (50).
    sqlx::query(
        "INSERT INTO endpoint_state (pool, endpoint, seq, state, weight, ramp_ms, score, failure_rate, since, reason, policy_version)
         SELECT 'wide', 'w-' || lpad(i::text, 3, '0'), 0, CASE WHEN i > 100 THEN 'unhealthy' ELSE 'healthy' END,
                1.0, 0, 100, 0, now(), 'first seen', 0
         FROM generate_series(1, 120) i",
    )
    .execute(&api.db)
    .await
    .unwrap();
    // Pool "up": the uptime fixture the API and CLI tests read too.
    let t0 = vitals_testkit::uptime::uptime_t0();
    vitals_testkit::uptime::seed_uptime(&api.db, t0).await;
    let iso = |us: i64| {
        chrono::DateTime::from_timestamp_micros(us)
            .unwrap()
            .to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
    };
    let (up_from, up_to) = (iso(t0), iso(t0 + 86_400_000_000));
    // Pool "dash": three endpoints through ingest, e1's connections refused until it is ejected.
    let mut items = Vec::new();
    for i in 0..12 {
        for ep in ["e1", "e2", "e3"] {
            let outcome = if ep == "e1" { "connect_error" } else { "success" };
            items.push(json!({"type": "call", "pool": "dash", "endpoint": ep, "gateway": "gw", "outcome": outcome,
                              "latency_us": 1000 + i, "http_status": if ep == "e1" { serde_json::Value::Null } else { json!(200) }}));
        }
    }
    let (s, b) = api
        .send(
            reqwest::Method::POST,
            "/v1/signals",
            Some(WRITER),
            json!({"items": items}).to_string(),
        )
        .await;
    assert_eq!((s, b["accepted"].as_i64()), (200, Some(36)), "{b}");
    let db = api.db.clone();
    wait_until("e1 ejected", std::time::Duration::from_secs(30), || {
        let db = db.clone();
        async move {
            sqlx::query_scalar::<_, i64>(
                "SELECT count(*) FROM endpoint_state WHERE pool = 'dash' AND state = 'unhealthy'",
            )
            .fetch_one(&db)
            .await
            .unwrap()
                == 1
        }
    })
    .await;
    let shots = std::env::temp_dir().join(unique("dashboard-shots"));
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/dashboard_test.py");
    let (base, shots_s) = (api.base.clone(), shots.display().to_string());
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new("python3")
            .args([script, &base, ADMIN, &shots_s, &up_from, &up_to])
            .output()
            .expect("python3 runs")
    })
    .await
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "the browser test failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let figures: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap();
    eprintln!("dashboard: {figures}; screenshots in {}", shots.display());
    for shot in [
        "fleet.png",
        "pool.png",
        "uptime.png",
        "endpoint.png",
        "pool-after-action.png",
    ] {
        assert!(
            std::fs::metadata(shots.join(shot)).is_ok_and(|m| m.len() > 10_000),
            "{shot}"
        );
    }
    // The action from the page is in the audit log, with its reason and actor.
    let (to, reason): (String, String) = sqlx::query_as(
        "SELECT to_state, reason FROM transitions WHERE pool = 'dash' AND endpoint = 'e2' AND reason_code = 'forced_unhealthy'",
    )
    .fetch_one(&api.db)
    .await
    .unwrap();
    assert_eq!(to, "unhealthy");
    assert!(reason.contains("from the dashboard test"), "{reason}");
    api.drop_schema().await;
}
