//! The OpenAPI document is served, valid, and the live service honours it under a schema-based
//! fuzzer (schemathesis): no 5xx, no undocumented status, content type or body.

mod common;
use common::*;
use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_openapi_document_is_valid_and_the_service_honours_it_under_fuzzing() {
    let api = Api::start("fuzz", &[]).await;
    for s in 1..=30i64 {
        insert_transition(
            &api.db,
            "pool-a",
            &format!("ep-{}", s % 3),
            s,
            "unhealthy",
            "ejected",
            1_700_000_000_000_000 + s * 1_000_000,
        )
        .await;
    }
    sqlx::query(
        "INSERT INTO endpoint_state (pool, endpoint, seq, state, weight, ramp_ms, score, failure_rate, since, reason, policy_version)
         SELECT 'pool-a', 'ep-' || i, 10, 'degraded', 0.25, 0, 55, 0.2, now(), 'score<60', 0 FROM generate_series(0, 2) i",
    )
    .execute(&api.db)
    .await
    .unwrap();

    let (s, doc) = api.get("/v1/openapi.json").await;
    assert_eq!(s, 200);
    assert!(doc["openapi"].as_str().unwrap().starts_with("3."), "{}", doc["openapi"]);
    for path in [
        "/v1/transitions",
        "/v1/pools",
        "/v1/pools/{pool}",
        "/v1/pools/{pool}/endpoints/{endpoint}",
        "/v1/pools/{pool}/endpoints/{endpoint}/override",
        "/v1/pools/{pool}/policy",
        "/v1/stream",
        "/v1/signals",
    ] {
        assert!(doc["paths"][path].is_object(), "{path} is documented");
    }

    // schemathesis loads (and so validates) the document, then fuzzes every operation but the
    // never-ending live stream.
    let url = api.url("/v1/openapi.json");
    let auth = format!("Authorization: Bearer {ADMIN}");
    let run = tokio::process::Command::new("python3")
        .args([
            "-m",
            "schemathesis.cli",
            "run",
            &url,
            "--checks",
            "not_a_server_error,status_code_conformance,content_type_conformance,response_schema_conformance",
        ])
        .args([
            "--max-examples",
            "100",
            "--seed",
            "42",
            "--exclude-path",
            "/v1/stream",
            "--request-timeout",
            "20",
        ])
        .args(["-H", &auth])
        .env("NO_COLOR", "1")
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(900), run)
        .await
        .expect("schemathesis finishes within 15 minutes")
        .expect("schemathesis is installed (scripts/install-deps.sh)");
    let text = format!(
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    eprintln!("{text}");
    assert!(out.status.success(), "schemathesis found problems:\n{text}");
    assert!(text.contains("passed"), "schemathesis ran no test:\n{text}");
    api.drop_schema().await;
}
