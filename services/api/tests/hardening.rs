//! What hostile clients and careless operators broke, each reproduced as it was found: metric
//! series without bound, connections held open forever, an owner role the API did not need,
//! NUL bytes answered with 500, an unpaginated fleet listing, live-stream slots taken by
//! anonymous clients, oversized items answered as retryable, policy typos and absurd values
//! accepted, and a lowercase `bearer` refused.
// Needs the local stack and its peers: `scripts/test.sh` runs it (`--features stack`).
#![cfg(feature = "stack")]

mod common;
use common::*;
use reqwest::Method;
use serde_json::json;
use std::str::FromStr;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_methods_cannot_add_metric_series() {
    let api = Api::start("cardinality", &[]).await;
    for i in 0..200 {
        let m = Method::from_bytes(format!("X{i}").as_bytes()).unwrap();
        let r = api.http.request(m, api.url("/v1/transitions")).send().await.unwrap();
        if i == 0 {
            // A 405 says why, in the API's error format.
            assert_eq!(r.status(), 405);
            let b: serde_json::Value = r.json().await.unwrap();
            assert_eq!(b["error"]["code"], "method_not_allowed", "{b}");
        }
    }
    let text = api.text("/metrics").await;
    assert!(!text.contains("method=\"X1"), "no client-chosen label reaches /metrics");
    assert!(text.contains("method=\"other\""), "{text}");
    let series = text
        .lines()
        .filter(|l| l.starts_with("vitals_api_requests_total"))
        .count();
    assert!(series < 10, "{series} series");
    api.drop_schema().await;
}

/// Read until the server closes the connection; the bytes it sent.
async fn until_closed(mut s: TcpStream, deadline: Duration) -> Vec<u8> {
    let mut out = Vec::new();
    tokio::time::timeout(deadline, s.read_to_end(&mut out))
        .await
        .expect("the server closes the connection in time")
        .ok();
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn half_sent_and_silent_connections_are_closed_and_connections_are_capped() {
    let api = Api::start("conns", &["--header-read-timeout-ms", "500", "--max-connections", "4"]).await;
    let addr = format!("127.0.0.1:{}", api.port);
    // Four connections hold every slot (nothing else has connected yet); the fifth is told so
    // and closed.
    let mut held = Vec::new();
    for _ in 0..4 {
        held.push(TcpStream::connect(&addr).await.unwrap());
    }
    let mut extra = TcpStream::connect(&addr).await.unwrap();
    extra
        .write_all(b"GET /v1/pools HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let answer = String::from_utf8(until_closed(extra, Duration::from_secs(5)).await).unwrap();
    assert!(answer.starts_with("HTTP/1.1 503"), "{answer}");
    assert!(answer.contains("\"busy\""), "{answer}");
    // A liveness probe is still answered: a busy API is not a dead one to restart.
    let mut probe = TcpStream::connect(&addr).await.unwrap();
    probe
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let answer = String::from_utf8(until_closed(probe, Duration::from_secs(5)).await).unwrap();
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(answer.ends_with("ok"), "{answer}");
    // The held ones send nothing: the header-read timeout closes them.
    for h in held {
        until_closed(h, Duration::from_secs(5)).await;
    }
    let mut partial = TcpStream::connect(&addr).await.unwrap();
    partial
        .write_all(b"GET /v1/pools HTTP/1.1\r\nHost: x\r\n")
        .await
        .unwrap();
    until_closed(partial, Duration::from_secs(5)).await;
    wait_until("a slot to free up", Duration::from_secs(10), || async {
        // While the cap holds, the answer is a 503.
        let r = api.http.get(api.url("/readyz")).send().await;
        r.is_ok_and(|r| r.status().as_u16() == 200)
    })
    .await;
    api.drop_schema().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_runs_read_only_and_refuses_an_unmigrated_schema() {
    let api = Api::start("roles", &[]).await;
    // The API's role (the one the harness gives it) can read but not write.
    let opts = sqlx::postgres::PgConnectOptions::from_str(&reader_url())
        .unwrap()
        .options([("search_path", api.name.as_str())]);
    let reader = sqlx::postgres::PgPoolOptions::new()
        .max_connections(1)
        .connect_with(opts)
        .await
        .unwrap();
    let n: i64 = sqlx::query_scalar("SELECT count(*) FROM transitions")
        .fetch_one(&reader)
        .await
        .unwrap();
    assert_eq!(n, 0);
    let denied = sqlx::query("DELETE FROM transitions")
        .execute(&reader)
        .await
        .unwrap_err();
    assert!(denied.to_string().contains("permission denied"), "{denied}");
    assert_eq!(api.get("/v1/pools").await.0, 200);

    // An API pointed at a schema nobody migrated says what to do instead of creating it.
    let cfg = vitals_api::config::Config::parse_from([
        "vitals-api",
        "--http-addr",
        "127.0.0.1:0",
        "--db-schema",
        "no_such_schema_anywhere",
        "--database-url",
        &reader_url(),
        "--brokers",
        &brokers(),
    ]);
    let err = match vitals_api::build(cfg, tokio_util::sync::CancellationToken::new()).await {
        Ok(_) => panic!("the API started on an unmigrated schema"),
        Err(e) => format!("{e:#}"),
    };
    assert!(err.contains("start vitals-processor first"), "{err}");
    api.drop_schema().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn control_characters_in_paths_queries_and_cursors_are_a_400() {
    let api = Api::start("nul", &[]).await;
    let cursor = {
        use base64::Engine as _;
        base64::engine::general_purpose::URL_SAFE_NO_PAD
            .encode(json!({"t": 1, "p": "a\u{0}", "e": "b", "s": 1}).to_string())
    };
    for (path, field) in [
        ("/v1/pools/%00".to_string(), "pool"),
        ("/v1/pools/a/endpoints/%0A".to_string(), "endpoint"),
        ("/v1/transitions?pool=%00".to_string(), "pool"),
        (format!("/v1/transitions?cursor={cursor}"), "cursor"),
        ("/v1/stream?pool=x%00".to_string(), "pool"),
    ] {
        let (s, b) = api.get(&path).await;
        assert_eq!((s, b["error"]["field"].as_str()), (400, Some(field)), "{path}: {b}");
    }
    api.drop_schema().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pool_listing_is_paginated() {
    let api = Api::start("pages", &[]).await;
    sqlx::query(
        "INSERT INTO endpoint_state (pool, endpoint, seq, state, weight, ramp_ms, score, failure_rate, since, reason, policy_version)
         SELECT 'pool-' || lpad(p::text, 4, '0'), 'ep-' || e, 0, 'healthy', 1, 0, 100, 0, now(), 'first seen', 0
         FROM generate_series(1, 250) p, generate_series(1, 3) e",
    )
    .execute(&api.db)
    .await
    .unwrap();
    let mut seen = Vec::new();
    let mut after: Option<String> = None;
    loop {
        let q = after.as_ref().map(|a| format!("&after={a}")).unwrap_or_default();
        let (s, page) = api.get(&format!("/v1/pools?limit=100{q}")).await;
        assert_eq!(s, 200, "{page}");
        for p in page["pools"].as_array().unwrap() {
            assert_eq!(p["total"], 3);
            seen.push(p["pool"].as_str().unwrap().to_owned());
        }
        match page["next_after"].as_str() {
            Some(a) => after = Some(a.to_owned()),
            None => break,
        }
    }
    let want: Vec<String> = (1..=250).map(|p| format!("pool-{p:04}")).collect();
    assert_eq!(seen, want);
    let (s, b) = api.get("/v1/pools?limit=0").await;
    assert_eq!((s, b["error"]["field"].as_str()), (400, Some("limit")));
    let (s, b) = api.get("/v1/pools?limit=100000").await;
    assert_eq!((s, b["error"]["field"].as_str()), (400, Some("limit")));
    api.drop_schema().await;
}

/// A writer ingesting 30,000 endpoints into one pool once made `GET /v1/pools?limit=1` and
/// `GET /v1/pools/{pool}` answer 5.5 MB each. Now a pool's endpoints come a page at a time, with
/// counts over all of them, and every response is bounded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_of_30000_endpoints_is_listed_a_bounded_page_at_a_time() {
    let api = Api::start("bigpool", &[]).await;
    sqlx::query(
        "INSERT INTO endpoint_state (pool, endpoint, seq, state, weight, ramp_ms, score, failure_rate, since, reason, policy_version)
         SELECT 'big', 'ep-' || lpad(e::text, 5, '0'), 0, CASE WHEN e % 10 = 0 THEN 'unhealthy' ELSE 'healthy' END,
                1, 0, 100, 0, now(), 'first seen', 0
         FROM generate_series(1, 30000) e
         UNION ALL
         SELECT 'small-' || p, 'ep-' || e, 0, 'healthy', 1, 0, 100, 0, now(), 'first seen', 0
         FROM generate_series(1, 20) p, generate_series(1, 3) e",
    )
    .execute(&api.db)
    .await
    .unwrap();
    let bytes = |path: &str| {
        let (http, url) = (api.http.clone(), api.url(path));
        async move {
            let r = http.get(url).send().await.unwrap();
            assert_eq!(r.status(), 200);
            let b = r.bytes().await.unwrap();
            (b.len(), serde_json::from_slice::<serde_json::Value>(&b).unwrap())
        }
    };
    let (n, page) = bytes("/v1/pools?limit=1").await;
    assert!(n < 30_000, "{n} bytes for one pool");
    let big = &page["pools"][0];
    assert_eq!(
        (big["pool"].as_str(), big["total"].as_i64(), big["healthy"].as_i64()),
        (Some("big"), Some(30_000), Some(27_000))
    );
    assert_eq!(big["by_state"]["unhealthy"], 3_000);
    assert_eq!(big["endpoints"].as_array().unwrap().len(), 50);
    assert_eq!(big["next_after"], "ep-00050");
    assert_eq!(page["next_after"], "big");

    // The pool's own route: 500 by default, up to 1,000 a page, every endpoint once in order.
    let (n, first) = bytes("/v1/pools/big").await;
    assert_eq!(first["endpoints"].as_array().unwrap().len(), 500);
    assert!(n < 150_000, "{n} bytes for 500 endpoints");
    let mut seen = 0;
    let mut after = String::new();
    loop {
        let (n, p) = bytes(&format!("/v1/pools/big?limit=1000&after={after}")).await;
        assert!(n < 300_000, "{n} bytes for a page");
        assert_eq!(p["total"], 30_000);
        for e in p["endpoints"].as_array().unwrap() {
            seen += 1;
            assert_eq!(e["endpoint"].as_str().unwrap(), format!("ep-{seen:05}"));
        }
        match p["next_after"].as_str() {
            Some(a) => after = a.to_owned(),
            None => break,
        }
    }
    assert_eq!(seen, 30_000);

    // A fleet page stops before 5,000 listed endpoints, and paging still reaches every pool.
    let mut pools = Vec::new();
    let mut after = String::new();
    loop {
        let (n, p) = bytes(&format!("/v1/pools?limit=1000&endpoints=1000&after={after}")).await;
        assert!(n < 1_500_000, "{n} bytes for a fleet page");
        let listed: usize = p["pools"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p["endpoints"].as_array().unwrap().len())
            .sum();
        assert!(listed <= 5_000, "{listed} endpoints in one page");
        pools.extend(
            p["pools"]
                .as_array()
                .unwrap()
                .iter()
                .map(|p| p["pool"].as_str().unwrap().to_owned()),
        );
        match p["next_after"].as_str() {
            Some(a) => after = a.to_owned(),
            None => break,
        }
    }
    assert_eq!(pools.len(), 21);
    assert_eq!(pools[0], "big");
    let (_, counts_only) = bytes("/v1/pools?endpoints=0&limit=1000").await;
    assert_eq!(counts_only["pools"].as_array().unwrap().len(), 21);
    assert!(counts_only["pools"][0]["endpoints"].as_array().unwrap().is_empty());
    for bad in [
        "/v1/pools?endpoints=1001",
        "/v1/pools?endpoints=-1",
        "/v1/pools?endpoints=x",
    ] {
        let (s, b) = api.get(bad).await;
        assert_eq!(
            (s, b["error"]["field"].as_str()),
            (400, Some("endpoints")),
            "{bad}: {b}"
        );
    }
    let (s, b) = api.get("/v1/pools/big?limit=1001").await;
    assert_eq!((s, b["error"]["field"].as_str()), (400, Some("limit")));
    api.drop_schema().await;
}

/// 100 concurrent fleet listings once exhausted the database pool: half of them were told "the
/// database is unavailable" and other routes took seconds. Now each route has its own share,
/// and a request that cannot get one in time is told the server is busy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_on_one_route_gets_busy_answers_and_leaves_the_others_served() {
    let api = Api::start("flood", &[]).await;
    sqlx::query(
        "INSERT INTO endpoint_state (pool, endpoint, seq, state, weight, ramp_ms, score, failure_rate, since, reason, policy_version)
         SELECT 'pool-' || p, 'ep-' || e, 0, 'healthy', 1, 0, 100, 0, now(), 'first seen', 0
         FROM generate_series(1, 1000) p, generate_series(1, 10) e",
    )
    .execute(&api.db)
    .await
    .unwrap();
    let flood: Vec<_> = (0..100)
        .map(|_| {
            let (http, url) = (api.http.clone(), api.url("/v1/pools?limit=1000"));
            tokio::spawn(async move {
                let r = http.get(url).send().await.unwrap();
                let status = r.status().as_u16();
                let body: serde_json::Value = r.json().await.unwrap_or_default();
                (status, body["error"]["code"].as_str().map(str::to_owned))
            })
        })
        .collect();
    // Another route is served meanwhile.
    let (s, _) = api.get("/v1/transitions?limit=1").await;
    assert_eq!(s, 200);
    let mut answers = std::collections::BTreeMap::new();
    for f in flood {
        *answers.entry(f.await.unwrap()).or_insert(0) += 1;
    }
    for (status, code) in answers.keys() {
        assert!(
            *status == 200 || (*status == 503 && code.as_deref() == Some("busy")),
            "{answers:?}"
        );
    }
    api.drop_schema().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn live_streams_are_capped_per_client_keep_slots_for_tokens_and_end_after_their_lifetime() {
    let api = Api::start(
        "slots",
        &[
            "--max-streams",
            "4",
            "--max-streams-per-client",
            "2",
            "--stream-max-lifetime-secs",
            "2",
        ],
    )
    .await;
    let mut open = Vec::new();
    for _ in 0..2 {
        open.push(
            Sse::open(&api, "/v1/stream", None, None)
                .await
                .expect("an anonymous stream"),
        );
    }
    let (s, b) = Sse::open(&api, "/v1/stream", None, None)
        .await
        .err()
        .expect("a third is refused");
    assert_eq!((s, b["error"]["code"].as_str()), (429, Some("too_many_requests")));
    // The reserved slot: a token holder still gets in.
    open.push(
        Sse::open(&api, "/v1/stream", None, Some(READER))
            .await
            .expect("a reader's stream"),
    );
    // Every stream ends with a `reconnect` event that resumes it.
    let mut first = open.remove(0);
    assert_eq!(first.next().await.event, "ready");
    let last = first.next().await;
    assert_eq!(last.event, "reconnect");
    assert!(!last.id.is_empty());
    assert!(first.next_or_end().await.is_none(), "the server ends the stream");
    api.drop_schema().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_items_are_rejected_not_retried() {
    let api = Api::start("sizes", &[]).await;
    let mut item = json!({"type": "call", "pool": "p", "endpoint": "e", "gateway": "gw", "outcome": "success", "latency_us": 5000});
    item["attributes"] = json!((0..100)
        .map(|i| (format!("k{i}"), json!("v".repeat(100))))
        .collect::<serde_json::Map<_, _>>());
    let body = json!({"items": [item]}).to_string();
    let r = api
        .http
        .post(api.url("/v1/signals"))
        .bearer_auth(WRITER)
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .unwrap();
    assert!(r.headers().get("retry-after").is_none(), "nothing to retry");
    assert_eq!(
        r.headers().get("x-content-type-options").map(|v| v.as_bytes()),
        Some(b"nosniff".as_slice()),
        "JSON answers are not sniffed"
    );
    let b: serde_json::Value = r.json().await.unwrap();
    assert_eq!(b["rejected"], 1, "{b}");
    assert_eq!(b["results"][0]["field"], "attributes", "{b}");
    let r = api.http.get(api.url("/v1/no-such-route")).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 404);
    assert!(r.headers().get("x-content-type-options").is_some(), "errors too");
    api.drop_schema().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn policy_typos_and_absurd_values_are_refused_and_bearer_is_case_insensitive() {
    let api = Api::start("policy", &[]).await;
    let put = |body: serde_json::Value| api.send(Method::PUT, "/v1/pools/wrap/policy", Some(ADMIN), body.to_string());
    let (s, b) = put(
        json!({"version": 21, "isolation_base_ms": 17444980000000000i64, "isolation_max_ms": 17444980000000000i64}),
    )
    .await;
    assert_eq!(
        (s, b["error"]["field"].as_str()),
        (400, Some("policy.isolation_base_ms")),
        "{b}"
    );
    for (field, value) in [
        ("heartbeat_interval_ms", json!(i64::MAX)),
        ("slow_start_ms", json!(i64::MAX)),
        ("recover_hold_ms", json!(i64::MAX)),
        ("ttft_max_ms", json!(1e308)),
    ] {
        let (s, b) = put(json!({ field: value })).await;
        assert_eq!(
            (s, b["error"]["field"].as_str()),
            (400, Some(format!("policy.{field}").as_str())),
            "{b}"
        );
    }
    let (s, b) = put(json!({"version": 3, "consecutive_failure": 9})).await;
    assert_eq!(
        (s, b["error"]["field"].as_str()),
        (400, Some("policy.consecutive_failure")),
        "{b}"
    );
    let (s, b) = put(json!({"version": 3, "consecutive_failures": 9})).await;
    assert_eq!(s, 202, "{b}");
    let r = api
        .http
        .put(api.url("/v1/pools/wrap/policy"))
        .header("authorization", format!("bearer {ADMIN}"))
        .header("content-type", "application/json")
        .body(json!({"version": 4}).to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 202, "a lowercase scheme is accepted");
    api.drop_schema().await;
}

/// Pool and endpoint names compare as bytes in every key and index (migration 0005), whatever
/// the cluster's locale: the order the engine sorts by and the history cursors walk in.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn name_keys_compare_as_bytes_whatever_the_locale() {
    let api = Api::start("collation", &[]).await;
    let columns: Vec<(String, String, Option<String>)> = sqlx::query_as(
        "SELECT table_name::text, column_name::text, collation_name::text FROM information_schema.columns
         WHERE table_schema = $1 AND column_name IN ('pool', 'endpoint', 'consumer_group', 'topic')
           AND table_name <> 'outbox'
         ORDER BY table_name, column_name",
    )
    .bind(&api.name)
    .fetch_all(&api.db)
    .await
    .unwrap();
    assert_eq!(columns.len(), 19, "{columns:?}");
    for (table, column, collation) in &columns {
        assert_eq!(collation.as_deref(), Some("C"), "{table}.{column}");
    }
    api.drop_schema().await;
}

/// More connections than the open-file limit holds would fail on accept ("Too many open files")
/// and starve every other socket: a number the limit cannot hold is refused at start, with the
/// numbers (the default, 0, fits itself to the limit).
#[tokio::test]
async fn more_connections_than_the_open_file_limit_holds_are_refused_at_start() {
    use clap::Parser;
    let cfg = vitals_api::config::Config::parse_from(["vitals-api", "--max-connections", "100000000"]);
    let Err(e) = vitals_api::build(cfg, tokio_util::sync::CancellationToken::new()).await else {
        panic!("started with 100,000,000 connections allowed");
    };
    let e = e.to_string();
    assert!(
        e.contains("open-file limit is") && e.contains("lower --max-connections to at most"),
        "{e}"
    );
}
