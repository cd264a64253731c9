//! The HTTP API against the real database and broker.
// Needs the local stack and its peers: `scripts/test.sh` runs it (`--features stack`).
#![cfg(feature = "stack")]

mod common;
use common::*;
use reqwest::Method;
use serde_json::{json, Value};
use std::collections::BTreeSet;
use std::time::Duration;

const T0: i64 = 1_700_000_000_000_000;

/// 3 pools × 4 endpoints × 10 transitions, one every second, in a shuffled insert order.
async fn seed_history(api: &Api) -> Vec<(String, String, i64, i64)> {
    let mut rows = Vec::new();
    for s in 1..=10i64 {
        for p in 0..3 {
            for e in 0..4 {
                let t = T0 + (s * 12 + p * 4 + e) * 1_000_000;
                rows.push((format!("p{p}"), format!("e{e}"), s, t));
            }
        }
    }
    for (i, (p, e, s, t)) in rows.iter().enumerate() {
        let (to, reason) = if s % 2 == 0 {
            ("unhealthy", "ejected")
        } else {
            ("healthy", "recovered")
        };
        insert_transition(&api.db, p, e, *s, to, reason, *t).await;
        let _ = i;
    }
    rows
}

fn keys(items: &Value) -> Vec<(String, String, i64)> {
    items
        .as_array()
        .unwrap()
        .iter()
        .map(|i| {
            (
                i["pool"].as_str().unwrap().into(),
                i["endpoint"].as_str().unwrap().into(),
                i["seq"].as_i64().unwrap(),
            )
        })
        .collect()
}

async fn all_pages(
    api: &Api,
    query: &str,
    limit: usize,
    mut between: impl FnMut(usize) -> Option<(String, String, i64, i64)>,
) -> Vec<Value> {
    let mut out = Vec::new();
    let mut cursor: Option<String> = None;
    for page in 0.. {
        let sep = if query.is_empty() { "" } else { "&" };
        let c = cursor.as_ref().map(|c| format!("&cursor={c}")).unwrap_or_default();
        let (status, body) = api.get(&format!("/v1/transitions?limit={limit}{sep}{query}{c}")).await;
        assert_eq!(status, 200, "{body}");
        let items = body["items"].as_array().unwrap().clone();
        assert!(items.len() <= limit);
        out.extend(items);
        // New rows arrive between pages: newer than everything, so no page may change.
        if let Some((p, e, s, t)) = between(page) {
            insert_transition(&api.db, &p, &e, s, "degraded", "degraded", t).await;
        }
        match body["next_cursor"].as_str() {
            Some(c) => cursor = Some(c.to_owned()),
            None => break,
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn history_filters_orders_and_paginates_stably_while_rows_arrive() {
    let api = Api::start("hist", &[]).await;
    let rows = seed_history(&api).await;

    // By endpoint: newest first, evidence and reason on every item.
    let (s, body) = api.get("/v1/transitions?pool=p1&endpoint=e2").await;
    assert_eq!(s, 200);
    let seqs: Vec<i64> = keys(&body["items"]).iter().map(|k| k.2).collect();
    assert_eq!(seqs, (1..=10).rev().collect::<Vec<_>>());
    let first = &body["items"][0];
    assert_eq!(first["evidence"]["consecutive_failures"], 5);
    assert_eq!(first["reason"], "test reason 10");
    assert_eq!(first["to_state"], "unhealthy");
    assert!(body["next_cursor"].is_null());

    // Fleet-wide, 7 per page, while newer rows keep arriving: every row exactly once, in order.
    let mut extra = 0;
    let items = all_pages(&api, "", 7, |page| {
        extra += 1;
        Some((
            "p9".into(),
            "late".into(),
            page as i64 + 1,
            T0 + 10_000_000_000 + page as i64,
        ))
    })
    .await;
    let got = keys(&Value::Array(items.clone()));
    let want: BTreeSet<(String, String, i64)> = rows.iter().map(|(p, e, s, _)| (p.clone(), e.clone(), *s)).collect();
    assert_eq!(got.len(), want.len(), "no duplicates, nothing missing");
    assert_eq!(got.iter().cloned().collect::<BTreeSet<_>>(), want);
    let times: Vec<String> = items
        .iter()
        .map(|i| i["stream_time"].as_str().unwrap().to_owned())
        .collect();
    assert!(times.windows(2).all(|w| w[0] >= w[1]), "newest first");
    assert!(extra > 10);

    // By pool, 5 per page.
    let items = all_pages(&api, "pool=p0", 5, |_| None).await;
    assert_eq!(items.len(), 40);
    assert!(items.iter().all(|i| i["pool"] == "p0"));

    // Filters.
    let (_, body) = api.get("/v1/transitions?pool=p2&state=unhealthy&limit=500").await;
    assert_eq!(body["items"].as_array().unwrap().len(), 20);
    let (_, body) = api.get("/v1/transitions?reason=recovered&limit=500").await;
    assert_eq!(body["items"].as_array().unwrap().len(), 60);
    let from = chrono::DateTime::from_timestamp_micros(T0 + 100 * 1_000_000)
        .unwrap()
        .to_rfc3339();
    let to = chrono::DateTime::from_timestamp_micros(T0 + 110 * 1_000_000)
        .unwrap()
        .to_rfc3339();
    let (_, body) = api
        .get(&format!(
            "/v1/transitions?from={}&to={}",
            urlencode(&from),
            urlencode(&to)
        ))
        .await;
    assert_eq!(body["items"].as_array().unwrap().len(), 10);

    // Empty results.
    let (s, body) = api.get("/v1/transitions?pool=nope").await;
    assert_eq!((s, body["items"].as_array().unwrap().len()), (200, 0));
    assert!(body["next_cursor"].is_null());

    // Invalid parameters: 400 naming the parameter.
    for (q, field) in [
        ("limit=0", "limit"),
        ("limit=abc", "limit"),
        ("limit=501", "limit"),
        ("from=yesterday", "from"),
        ("to=2024-13-01T00:00:00Z", "to"),
        ("state=sleepy", "state"),
        ("cursor=garbage", "cursor"),
        ("endpoint=e1", "endpoint"),
    ] {
        let (s, body) = api.get(&format!("/v1/transitions?{q}")).await;
        assert_eq!(s, 400, "{q}: {body}");
        assert_eq!(body["error"]["code"], "invalid_request");
        assert_eq!(body["error"]["field"], field, "{q}");
    }
    api.drop_schema().await;
}

fn urlencode(s: &str) -> String {
    s.replace('+', "%2B").replace(':', "%3A")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn current_health_lists_pools_and_endpoints_with_latest_evidence() {
    let api = Api::start("cur", &[]).await;
    for (p, e, state, seq) in [
        ("a", "x", "healthy", 0),
        ("a", "y", "unhealthy", 3),
        ("b", "z", "degraded", 1),
    ] {
        sqlx::query(
            "INSERT INTO endpoint_state (pool, endpoint, seq, state, weight, ramp_ms, score, failure_rate, since, reason, policy_version)
             VALUES ($1, $2, $3, $4, 1, 0, 50, 0.1, now(), 'r', 0)",
        )
        .bind(p)
        .bind(e)
        .bind(seq as i64)
        .bind(state)
        .execute(&api.db)
        .await
        .unwrap();
    }
    insert_transition(&api.db, "a", "y", 3, "unhealthy", "ejected", T0).await;
    let (s, page) = api.get("/v1/pools").await;
    assert_eq!(s, 200);
    let body = &page["pools"];
    assert_eq!(body.as_array().unwrap().len(), 2);
    assert!(page["next_after"].is_null(), "one page holds both");
    assert_eq!(
        (
            body[0]["pool"].as_str(),
            body[0]["total"].as_i64(),
            body[0]["healthy"].as_i64()
        ),
        (Some("a"), Some(2), Some(1))
    );
    let (s, body) = api.get("/v1/pools/b").await;
    assert_eq!((s, body["endpoints"][0]["state"].as_str()), (200, Some("degraded")));
    let (s, body) = api.get("/v1/pools/a/endpoints/y").await;
    assert_eq!(s, 200);
    assert_eq!(body["state"], "unhealthy");
    assert_eq!(body["last_transition"]["evidence"]["consecutive_failures"], 5);
    let (s, body) = api.get("/v1/pools/a/endpoints/x").await;
    assert_eq!((s, body["last_transition"].is_null()), (200, true));
    let (s, body) = api.get("/v1/pools/nope").await;
    assert_eq!((s, body["error"]["code"].as_str()), (404, Some("not_found")));
    api.drop_schema().await;
}

fn call(pool: &str, ep: &str, outcome: &str) -> Value {
    json!({"type": "call", "pool": pool, "endpoint": ep, "gateway": "gw-http", "outcome": outcome, "latency_us": 20000})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ingested_batch_lands_on_the_topic_and_its_effect_appears_in_the_history() {
    let api = Api::start("ingest", &[]).await;
    api.start_processor();
    let mut items = vec![
        call("ing", "y", "success"),
        call("ing", "z", "success"),
        call("ing", "w", "success"),
    ];
    items.extend((0..5).map(|_| call("ing", "x", "connect_error")));
    let (s, body) = api
        .send(
            Method::POST,
            "/v1/signals",
            Some(WRITER),
            json!({"items": items}).to_string(),
        )
        .await;
    assert_eq!(s, 200, "{body}");
    assert_eq!(
        (
            body["accepted"].as_i64(),
            body["rejected"].as_i64(),
            body["failed"].as_i64()
        ),
        (Some(8), Some(0), Some(0))
    );
    for r in body["results"].as_array().unwrap() {
        assert_eq!(r["status"], "accepted");
        assert!(r["offset"].as_i64().unwrap() >= 0, "the broker confirmed it: {r}");
    }
    wait_until(
        "the ejection to appear in the history",
        Duration::from_secs(60),
        || async {
            let (_, b) = api.get("/v1/transitions?pool=ing&endpoint=x&state=unhealthy").await;
            b["items"].as_array().is_some_and(|i| !i.is_empty())
        },
    )
    .await;
    let (_, b) = api.get("/v1/transitions?pool=ing&endpoint=x&state=unhealthy").await;
    assert_eq!(b["items"][0]["evidence"]["connect_error"], 5);
    let (_, b) = api.get("/v1/pools/ing").await;
    assert_eq!(b["total"], 4, "endpoints without transitions are listed too: {b}");
    api.drop_schema().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mixed_batches_report_per_item_and_bad_bodies_are_refused() {
    let api = Api::start("mixed", &["--max-body-bytes", "65536"]).await;
    let mut negative = call("m", "a", "success");
    negative["latency_us"] = json!(-5);
    let mut no_pool = call("m", "a", "success");
    no_pool.as_object_mut().unwrap().remove("pool");
    let items = json!({"items": [
        call("m", "a", "success"),
        negative,
        call("m", "a", "sleepy"),
        no_pool,
        json!({"type": "probe", "pool": "m", "endpoint": "b", "prober": "p", "kind": "heartbeat", "outcome": "success", "latency_us": 1, "interval_ms": 5000}),
        json!({"type": "carrier_pigeon"}),
        json!({"type": "call", "pool": "m", "endpoint": "a", "gateway": "g", "outcome": "success", "latency_us": "fast"}),
        // A misspelt outcome class is refused by name, not read as 0 calls of the right class.
        json!({"type": "summary", "pool": "m", "endpoint": "a", "gateway": "g", "started_at": "2026-12-01T00:00:00Z",
               "ended_at": "2026-12-01T00:00:00.250Z", "calls": {"success": 1, "server_errror": 500}}),
    ]});
    let (s, body) = api
        .send(Method::POST, "/v1/signals", Some(WRITER), items.to_string())
        .await;
    assert_eq!(s, 200, "{body}");
    let statuses: Vec<&str> = body["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["status"].as_str().unwrap())
        .collect();
    assert_eq!(
        statuses,
        ["accepted", "rejected", "rejected", "rejected", "accepted", "rejected", "rejected", "rejected"]
    );
    assert_eq!(body["results"][1]["field"], "latency_us");
    assert!(
        body["results"][7]["error"].as_str().unwrap().contains("server_errror"),
        "{body}"
    );
    assert!(body["results"][2]["error"].as_str().unwrap().contains("sleepy"));
    assert_eq!(
        (body["accepted"].as_i64(), body["rejected"].as_i64()),
        (Some(2), Some(6))
    );

    for (payload, field) in [("{not json", "body"), ("{\"items\": 5}", "items"), ("[]", "items")] {
        let (s, body) = api
            .send(Method::POST, "/v1/signals", Some(WRITER), payload.into())
            .await;
        assert_eq!(s, 400, "{payload}");
        assert_eq!(body["error"]["field"], field);
    }
    let big = json!({"items": [], "padding": "x".repeat(70_000)}).to_string();
    let (s, body) = api.send(Method::POST, "/v1/signals", Some(WRITER), big).await;
    assert_eq!((s, body["error"]["code"].as_str()), (413, Some("payload_too_large")));
    api.drop_schema().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn write_routes_refuse_missing_or_wrong_tokens_and_accept_the_right_role() {
    let api = Api::start("auth", &["--read-requires-token", "true"]).await;
    let ingest = json!({"items": [call("p", "e", "success")]}).to_string();
    let over = json!({"action": "maintenance_on", "reason": "kernel upgrade"}).to_string();
    let policy = json!({"version": 2, "consecutive_failures": 4}).to_string();
    let routes = [
        (Method::POST, "/v1/signals", ingest.clone(), WRITER, 200),
        (
            Method::POST,
            "/v1/pools/p/endpoints/e/override",
            over.clone(),
            ADMIN,
            202,
        ),
        (Method::PUT, "/v1/pools/p/policy", policy.clone(), ADMIN, 202),
    ];
    for (m, path, body, good, ok) in &routes {
        let (s, b) = api.send(m.clone(), path, None, body.clone()).await;
        assert_eq!(
            (s, b["error"]["code"].as_str()),
            (401, Some("unauthenticated")),
            "{path} without a token"
        );
        let (s, _) = api
            .send(m.clone(), path, Some("not-a-real-token-at-all"), body.clone())
            .await;
        assert_eq!(s, 401, "{path} with a wrong token");
        let (s, b) = api.send(m.clone(), path, Some(READER), body.clone()).await;
        assert_eq!(
            (s, b["error"]["code"].as_str()),
            (403, Some("forbidden")),
            "{path} with a reader token"
        );
        let (s, b) = api.send(m.clone(), path, Some(good), body.clone()).await;
        assert_eq!(s, *ok, "{path}: {b}");
    }
    let (s, _) = api
        .send(Method::POST, "/v1/pools/p/endpoints/e/override", Some(WRITER), over)
        .await;
    assert_eq!(s, 403, "overrides need an admin");
    let (s, b) = api
        .send(
            Method::PUT,
            "/v1/pools/p/policy",
            Some(ADMIN),
            json!({"window_ms": 7000}).to_string(),
        )
        .await;
    assert_eq!((s, b["error"]["field"].as_str()), (400, Some("policy.bucket_ms")));
    // Reads need a token here: every route whose document says 401 refuses a request without
    // one (or with a wrong one) and takes a reader's, whichever path serves it (the live stream
    // is taken over before the router sees it).
    let doc: serde_json::Value = api
        .http
        .get(api.url("/v1/openapi.json"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let mut reads = Vec::new();
    for (path, ops) in doc["paths"].as_object().unwrap() {
        if ops["get"]["responses"].get("401").is_some() {
            reads.push(path.replace("{pool}", "p").replace("{endpoint}", "e"));
        }
    }
    assert!(reads.len() >= 8, "{reads:?}");
    for path in &reads {
        let path = if path == "/v1/incidents" {
            "/v1/incidents?pool=p"
        } else {
            path.as_str()
        };
        let (s, b) = api.get(path).await;
        assert_eq!(
            (s, b["error"]["code"].as_str()),
            (401, Some("unauthenticated")),
            "{path}"
        );
        let r = api
            .http
            .get(api.url(path))
            .bearer_auth("not-a-real-token-at-all")
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), 401, "{path} with a wrong token");
        let r = api.http.get(api.url(path)).bearer_auth(READER).send().await.unwrap();
        let s = r.status().as_u16();
        assert!(s != 401 && s != 403 && s < 500, "{path} with a reader's token: {s}");
    }
    api.drop_schema().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reporter_token_reports_only_for_its_gateways_and_pools_and_the_tokens_file_is_read_again() {
    let dir = std::env::temp_dir().join(unique("api-tokens"));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("tokens");
    std::fs::write(
        &file,
        "edge-eu:reporter;gateways=edge-eu-*;pools=chat:eu-reporter-secret-01\n",
    )
    .unwrap();
    let api = Api::start(
        "bound",
        &["--tokens-file", file.to_str().unwrap(), "--read-requires-token", "true"],
    )
    .await;
    let item = |gateway: &str, pool: &str| json!({"type": "call", "pool": pool, "endpoint": "e", "gateway": gateway, "outcome": "server_error", "latency_us": 1});
    let probe = json!({"type": "probe", "pool": "chat", "endpoint": "e", "prober": "edge-eu-prober", "kind": "heartbeat",
                       "outcome": "success", "latency_us": 1, "interval_ms": 5000});
    let body =
        json!({"items": [item("edge-eu-1", "chat"), item("edge-us-1", "chat"), item("edge-eu-2", "embed"), probe]});
    let (s, b) = api
        .send(
            Method::POST,
            "/v1/signals",
            Some("eu-reporter-secret-01"),
            body.to_string(),
        )
        .await;
    assert_eq!(s, 200, "{b}");
    let results = b["results"].as_array().unwrap();
    let statuses: Vec<_> = results.iter().map(|r| r["status"].as_str().unwrap()).collect();
    assert_eq!(statuses, ["accepted", "rejected", "rejected", "accepted"], "{b}");
    assert_eq!(results[1]["field"], "gateway");
    assert!(results[1]["error"].as_str().unwrap().contains("edge-eu-*"), "{b}");
    assert_eq!(results[2]["field"], "pool");
    let metrics = api.text("/metrics").await;
    assert!(
        metrics.contains("vitals_api_ingest_unbound_total{token=\"edge-eu\"} 2"),
        "{metrics}"
    );
    // A reporter may only report: it reads nothing.
    let r = api
        .http
        .get(api.url("/v1/pools"))
        .bearer_auth("eu-reporter-secret-01")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 403);
    // A token added to the file works without a restart; the one removed stops.
    std::fs::write(&file, "edge-us:reporter;gateways=edge-us-1:us-reporter-secret-01\n").unwrap();
    let one = json!({"items": [item("edge-us-1", "chat")]}).to_string();
    wait_until("the new token to be taken", Duration::from_secs(30), || async {
        let (s, _) = api
            .send(Method::POST, "/v1/signals", Some("us-reporter-secret-01"), one.clone())
            .await;
        s == 200
    })
    .await;
    let (s, _) = api
        .send(Method::POST, "/v1/signals", Some("eu-reporter-secret-01"), one.clone())
        .await;
    assert_eq!(s, 401, "the removed token is refused");
    api.drop_schema().await;
    std::fs::remove_dir_all(&dir).unwrap();
}
