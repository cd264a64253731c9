//! The live stream: events as they happen, and an exact resume with Last-Event-ID.

mod common;
use common::*;
use vitals_contracts::*;

fn change(endpoint: &str, seq: i64) -> HealthChanged {
    HealthChanged {
        transition_id: format!("live/{endpoint}/{seq}"),
        pool: "live".into(),
        endpoint: endpoint.into(),
        seq,
        from_state: HealthState::Healthy,
        to_state: HealthState::Degraded,
        weight: 0.25,
        ramp_ms: 0,
        retry_at: None,
        reason_code: "degraded".into(),
        reason: format!("test {seq}"),
        evidence: Evidence {
            window_ms: 30_000,
            thresholds: vec!["score<60".into()],
            ..Evidence::default()
        },
        policy_version: 0,
        trigger_ids: vec![],
        stream_time: 1_700_000_000_000_000 + seq,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_sees_changes_live_and_resumes_exactly_once() {
    let api = Api::start("sse", &[]).await;
    let p = producer();
    let send = |h: HealthChanged| {
        let p = p.clone();
        let topic = api.topics.changes.clone();
        async move { produce(&p, &topic, &format!("live/{}", h.endpoint), &encode(&h).unwrap()).await }
    };
    // Events from before the client connects are not replayed to a new client.
    send(change("old", 1)).await;

    let mut c = Sse::connect(&api, None).await;
    let ready = c.next().await;
    assert_eq!(ready.event, "ready");
    let mut seen: Vec<(String, i64)> = Vec::new();
    let mut last_id = ready.id.clone();
    // Five changes over four endpoints, and a republished duplicate in the middle.
    let first: Vec<(&str, i64)> = vec![("a", 1), ("b", 1), ("a", 2), ("c", 1), ("d", 1)];
    for (i, (e, s)) in first.iter().enumerate() {
        send(change(e, *s)).await;
        if i == 2 {
            send(change("a", 1)).await; // the relay republished after a crash
        }
    }
    for _ in 0..first.len() {
        let ev = c.next().await;
        assert_eq!(ev.event, "health_changed");
        let v: serde_json::Value = serde_json::from_str(&ev.data).unwrap();
        seen.push((v["endpoint"].as_str().unwrap().into(), v["seq"].as_i64().unwrap()));
        last_id = ev.id;
    }
    drop(c); // disconnect

    let second: Vec<(&str, i64)> = vec![("b", 2), ("a", 3), ("e", 1), ("c", 2)];
    for (e, s) in &second {
        send(change(e, *s)).await;
    }
    let mut c = Sse::connect(&api, Some(&last_id)).await;
    assert_eq!(c.next().await.event, "ready");
    for _ in 0..second.len() {
        let ev = c.next().await;
        let v: serde_json::Value = serde_json::from_str(&ev.data).unwrap();
        seen.push((v["endpoint"].as_str().unwrap().into(), v["seq"].as_i64().unwrap()));
    }
    // Nothing else follows: sentinels on many keys (so on every partition) come next, no repeat
    // of an earlier event before them.
    for i in 0..10 {
        send(change(&format!("zz{i}"), 1)).await;
    }
    for _ in 0..10 {
        let v: serde_json::Value = serde_json::from_str(&c.next().await.data).unwrap();
        assert!(
            v["endpoint"].as_str().unwrap().starts_with("zz"),
            "an unexpected event: {v}"
        );
    }
    // Exactly once each (order holds per endpoint; partitions interleave freely).
    for e in ["a", "b", "c", "d", "e"] {
        let seqs: Vec<i64> = seen.iter().filter(|(x, _)| x == e).map(|(_, s)| *s).collect();
        assert!(seqs.windows(2).all(|w| w[0] < w[1]), "{e}: {seqs:?}");
    }
    let mut want: Vec<(String, i64)> = first.iter().chain(&second).map(|(e, s)| (e.to_string(), *s)).collect();
    want.sort();
    seen.sort();
    assert_eq!(seen, want, "every event once, none from before the first connect");

    // A resume id that is not ours is refused.
    let r = api
        .http
        .get(api.url("/v1/stream"))
        .header("Last-Event-ID", "garbage")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 400);
    api.drop_schema().await;
}
