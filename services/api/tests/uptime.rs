//! Uptime and incidents over HTTP, from a known audit log: exact figures for a range that starts
//! mid-incident, an endpoint first seen inside it, maintenance and pool panic; incidents a page at
//! a time; bad ranges refused with the parameter named.
// Needs the local stack and its peers: `scripts/test.sh` runs it (`--features stack`).
#![cfg(feature = "stack")]

mod common;
use common::*;

fn iso(us: i64) -> String {
    chrono::DateTime::from_timestamp_micros(us)
        .unwrap()
        .to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

const H: i64 = 3_600_000_000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn uptime_and_incidents_of_a_known_log_are_exact() {
    let api = Api::start("uptime", &[]).await;
    let t0 = uptime_t0();
    seed_uptime(&api.db, t0).await;
    let range = format!("from={}&to={}", iso(t0), iso(t0 + 24 * H));

    let (s, u) = api.get(&format!("/v1/pools/up/uptime?{range}&bucket=hour")).await;
    assert_eq!(s, 200, "{u}");
    let by: std::collections::HashMap<&str, &serde_json::Value> = u["endpoints"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| (e["endpoint"].as_str().unwrap(), e))
        .collect();
    let f = |e: &str, k: &str| by[e][k].as_f64().unwrap();
    assert_eq!((f("a", "observed_s"), f("a", "available_s")), (86_400.0, 85_800.0));
    assert_eq!(
        by["a"]["state_s"]["unhealthy"], 600.0,
        "mid-incident: out from the range's start"
    );
    assert_eq!(by["a"]["incidents"], 1);
    assert_eq!(
        (f("b", "available_s"), by["b"]["incidents"].as_i64()),
        (86_390.0, Some(1))
    );
    assert_eq!(
        by["b"]["buckets"][5]["available_s"], 3_590.0,
        "the 10-second ejection in its hour"
    );
    assert_eq!((f("c", "maintenance_s"), f("c", "availability")), (3_600.0, 1.0));
    assert_eq!(
        (f("d", "observed_s"), f("d", "availability")),
        (43_200.0, 1.0),
        "first seen at noon"
    );
    assert_eq!(u["endpoints"][0]["endpoint"], "a", "worst first");
    let p = &u["pool_figures"];
    assert_eq!(
        (p["observed_s"].as_f64(), p["any_available_s"].as_f64()),
        (Some(86_400.0), Some(86_400.0))
    );
    assert_eq!(p["all_available_s"], 86_400.0 - 610.0);
    assert_eq!((p["panic_s"].as_f64(), p["incidents"].as_i64()), (Some(10.0), Some(2)));
    assert_eq!(p["buckets"].as_array().unwrap().len(), 24);
    // Request availability, from the fixture's calls: the minutes that start in the range.
    let req = |v: &serde_json::Value| {
        let r = &v["requests"];
        let n = |k: &str| r[k].as_i64().unwrap();
        (
            n("succeeded"),
            n("failed") + n("rate_limited") + n("succeeded"),
            n("neutral"),
        )
    };
    assert_eq!(req(by["a"]), (70, 120, 7), "a's row before the range left out");
    assert_eq!(
        (req(by["b"]), req(by["c"]), req(by["d"])),
        ((40, 60, 0), (30, 60, 0), (100, 100, 0))
    );
    assert_eq!(req(p), (240, 340, 7));
    assert_eq!(p["request_availability"].as_f64(), Some(240.0 / 340.0));
    assert_eq!(by["c"]["request_availability"].as_f64(), Some(0.5));
    assert_eq!(
        req(&by["b"]["buckets"][5]),
        (25, 45, 0),
        "b's calls in the hour from 05:00"
    );
    assert_eq!(req(&p["buckets"][0]), (20, 70, 0));
    assert!(p["buckets"][1]["request_availability"].is_null(), "no calls: no share");
    // Weighted by the calls each served (a 127, b, c 60, d 100), not by evidence.
    let weighted = (f("a", "availability") * 127.0 + f("b", "availability") * 60.0 + 60.0 + 100.0) / 347.0;
    assert!(
        (p["traffic_weighted_availability"].as_f64().unwrap() - weighted).abs() < 1e-12,
        "{p}"
    );
    // A range with one whole hour between two half hours: the hour from the hourly rollups,
    // the halves from the minutes, in buckets clipped to the range.
    let odd = format!("from={}&to={}", iso(t0 + 4 * H + H / 2), iso(t0 + 6 * H + H / 2));
    let (s, o) = api.get(&format!("/v1/pools/up/uptime?{odd}&bucket=hour")).await;
    assert_eq!(s, 200, "{o}");
    let ob: std::collections::HashMap<&str, &serde_json::Value> = o["endpoints"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| (e["endpoint"].as_str().unwrap(), e))
        .collect();
    assert_eq!((req(ob["a"]), req(ob["b"])), ((50, 50, 7), (40, 60, 0)));
    let b_buckets: Vec<_> = ob["b"]["buckets"].as_array().unwrap().iter().map(req).collect();
    assert_eq!(b_buckets, vec![(0, 0, 0), (25, 45, 0), (15, 15, 0)]);
    assert_eq!(req(&o["pool_figures"]), (90, 110, 7));
    let (_, daily) = api.get(&format!("/v1/pools/up/uptime?{range}&bucket=day")).await;
    assert_eq!(req(&daily["pool_figures"]["buckets"][0]), (240, 340, 7));
    assert_eq!(daily["pool_figures"]["buckets"].as_array().unwrap().len(), 1);
    assert!(u["next_cursor"].is_null(), "every endpoint on one page: {u}");

    // A page of endpoints at a time, worst first, the pool's figures on each: the same answer.
    let mut paged: Vec<serde_json::Value> = Vec::new();
    let mut cursor: Option<String> = None;
    for _ in 0..10 {
        let c = cursor.as_deref().map_or(String::new(), |c| format!("&cursor={c}"));
        let (s, page) = api
            .get(&format!("/v1/pools/up/uptime?{range}&bucket=hour&limit=1{c}"))
            .await;
        assert_eq!(s, 200, "{page}");
        assert_eq!(page["pool_figures"], u["pool_figures"]);
        assert_eq!(page["endpoints"].as_array().unwrap().len(), 1);
        paged.extend(page["endpoints"].as_array().unwrap().iter().cloned());
        cursor = page["next_cursor"].as_str().map(str::to_owned);
        if cursor.is_none() {
            break;
        }
    }
    assert_eq!(
        &serde_json::Value::Array(paged),
        &u["endpoints"],
        "the pages make the whole answer"
    );

    // Incidents, newest first, a page at a time; the same figures.
    let (s, page) = api.get(&format!("/v1/incidents?pool=up&{range}&limit=1")).await;
    assert_eq!(s, 200, "{page}");
    let b = &page["items"][0];
    assert_eq!(
        (b["endpoint"].as_str(), b["duration_s"].as_f64()),
        (Some("b"), Some(10.0))
    );
    assert_eq!(b["reason_codes"], serde_json::json!(["ejected", "readmitted"]));
    assert_eq!(b["reason"], "ejected of b");
    assert_eq!(b["evidence"]["consecutive_failures"], 5);
    let cursor = page["next_cursor"].as_str().unwrap().to_owned();
    let (_, page) = api
        .get(&format!("/v1/incidents?pool=up&{range}&limit=1&cursor={cursor}"))
        .await;
    let a = &page["items"][0];
    assert_eq!(a["endpoint"], "a");
    assert_eq!(
        a["started_at"].as_str().unwrap(),
        iso(t0 - H / 3).replace("+00:00", "Z")
    );
    assert_eq!(
        (a["time_to_out_s"].as_f64(), a["time_to_back_s"].as_f64()),
        (Some(600.0), Some(1800.0))
    );
    assert!(page["next_cursor"].is_null(), "{page}");
    let (_, only_a) = api.get(&format!("/v1/incidents?pool=up&endpoint=a&{range}")).await;
    assert_eq!(only_a["items"].as_array().unwrap().len(), 1);

    // Bad input: 400 naming the parameter; an unknown pool 404.
    let bad = [
        (format!("/v1/pools/up/uptime?from={}&to={}", iso(t0 + H), iso(t0)), "to"),
        (format!("/v1/pools/up/uptime?from={}", iso(t0 - 100 * 24 * H)), "from"),
        ("/v1/pools/up/uptime?from=last-week".to_string(), "from"),
        ("/v1/pools/up/uptime?to=garbage".to_string(), "to"),
        (format!("/v1/pools/up/uptime?{range}&bucket=week"), "bucket"),
        (
            format!("/v1/pools/up/uptime?from={}&bucket=hour", iso(t0 - 40 * 24 * H)),
            "bucket",
        ),
        (format!("/v1/incidents?{range}"), "pool"),
        (format!("/v1/incidents?pool=up&{range}&limit=0"), "limit"),
        (format!("/v1/incidents?pool=up&{range}&cursor=abc"), "cursor"),
        (format!("/v1/pools/up/uptime?{range}&cursor=abc"), "cursor"),
        (format!("/v1/pools/up/uptime?{range}&limit=1001"), "limit"),
    ];
    for (path, field) in bad {
        let (s, b) = api.get(&path).await;
        assert_eq!((s, b["error"]["field"].as_str()), (400, Some(field)), "{path}: {b}");
    }
    assert_eq!(api.get("/v1/pools/nope/uptime").await.0, 404);
    assert_eq!(api.get("/v1/incidents?pool=nope").await.0, 404);
    api.drop_schema().await;
}

/// Incidents days apart, read a page at a time (each page from the recent part of the range
/// only): the same incidents, in the same order, as one page of all of them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn incidents_days_apart_page_newest_first_as_one_page_of_them_all() {
    let api = Api::start("incidents_days", &[]).await;
    const D: i64 = 24 * H;
    let to = uptime_t0();
    let from = to - 60 * D;
    let mut seq = 0;
    for (ep, days_ago) in [("x", 50), ("y", 20), ("x", 9), ("y", 3), ("x", 2), ("y", 1)] {
        let start = to - days_ago * D + 7 * H;
        for (from_state, to_state, weight, code, at) in [
            ("healthy", "unhealthy", 0.0, "ejected", start),
            ("unhealthy", "recovering", 0.1, "readmitted", start + H),
            ("recovering", "healthy", 1.0, "recovered", start + 2 * H),
        ] {
            seq += 1;
            vitals_testkit::uptime::insert_change(&api.db, "days", ep, seq, (from_state, to_state, weight), code, at)
                .await;
        }
    }
    sqlx::query(
        "INSERT INTO endpoint_state (pool, endpoint, seq, state, weight, ramp_ms, score, failure_rate, since, reason, policy_version, first_seen)
         SELECT 'days', e, 1, 'healthy', 1, 0, 100, 0, now(), '', 0, to_timestamp($1::double precision / 1e6) FROM unnest(ARRAY['x', 'y', 'z']) e",
    )
    .bind(from - D)
    .execute(&api.db)
    .await
    .unwrap();
    // z is out for 25 days: a page whose cursor is before its end reads it again for its end.
    for (seq, (from_state, to_state, weight, code, at)) in [
        ("healthy", "unhealthy", 0.0, "ejected", to - 30 * D),
        ("unhealthy", "unhealthy", 0.0, "trial_failed", to - 20 * D),
        ("unhealthy", "recovering", 0.1, "readmitted", to - 5 * D),
    ]
    .into_iter()
    .enumerate()
    {
        vitals_testkit::uptime::insert_change(
            &api.db,
            "days",
            "z",
            seq as i64 + 1,
            (from_state, to_state, weight),
            code,
            at,
        )
        .await;
    }
    let range = format!("from={}&to={}", iso(from), iso(to));
    let (s, whole) = api.get(&format!("/v1/incidents?pool=days&{range}&limit=500")).await;
    assert_eq!(s, 200, "{whole}");
    let whole = whole["items"].as_array().unwrap().clone();
    assert_eq!(whole.len(), 7, "{whole:?}");
    let z = whole.iter().find(|i| i["endpoint"] == "z").unwrap();
    assert_eq!(z["duration_s"], 25.0 * 86_400.0, "{z}");
    assert_eq!(
        z["reason_codes"],
        serde_json::json!(["ejected", "trial_failed", "readmitted"])
    );
    let mut paged = Vec::new();
    let mut cursor: Option<String> = None;
    for _ in 0..10 {
        let c = cursor.as_deref().map_or(String::new(), |c| format!("&cursor={c}"));
        let (s, page) = api.get(&format!("/v1/incidents?pool=days&{range}&limit=2{c}")).await;
        assert_eq!(s, 200, "{page}");
        paged.extend(page["items"].as_array().unwrap().iter().cloned());
        cursor = page["next_cursor"].as_str().map(str::to_owned);
        if cursor.is_none() {
            break;
        }
    }
    assert_eq!(paged, whole, "pages of two make the whole list, newest first");
    let starts: Vec<&str> = whole.iter().map(|i| i["started_at"].as_str().unwrap()).collect();
    let mut sorted = starts.clone();
    sorted.sort_unstable_by(|a, b| b.cmp(a));
    assert_eq!(starts, sorted, "newest first");
    api.drop_schema().await;
}
