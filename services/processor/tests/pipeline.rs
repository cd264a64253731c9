//! The processor end to end on the real broker and the real database: results, crash safety,
//! poison input, rebalancing and replay.
// Needs the local stack and its peers: `scripts/test.sh` runs it (`--features stack`).
#![cfg(feature = "stack")]

mod common;
use common::*;
use std::collections::BTreeMap;
use std::time::Duration;
use vitals_contracts::*;
use vitals_engine::{Decision, Engine};

const LONG: Duration = Duration::from_secs(180);

/// What the engine decides for these inputs, partition by partition: the oracle for the
/// service, which must add nothing and lose nothing.
fn expected(inputs: &[Input]) -> Vec<HealthChanged> {
    let mut engines: BTreeMap<i32, Engine> = BTreeMap::new();
    let mut out = Vec::new();
    for i in inputs {
        let e = engines
            .entry(i.partition.expect("every test input names its partition"))
            .or_insert_with(|| Engine::new(Policy::default()));
        if let Ok(s) = decode_signal(&i.bytes) {
            if validate_signal(&s, Some(i.ts_ms * 1000)).is_ok() {
                for d in e.step(i.ts_ms * 1000, &s) {
                    if let Decision::Endpoint(h) = d {
                        out.push(*h);
                    }
                }
            }
        }
    }
    out.sort_by(|a, b| (&a.pool, &a.endpoint, a.seq).cmp(&(&b.pool, &b.endpoint, b.seq)));
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn end_to_end_scenario_lands_in_postgres_and_on_the_changes_topic() {
    let name = unique("e2e");
    let topics = create_topics(&name, 2).await;
    let mut inputs = Vec::new();
    let mut t = T0_MS;
    for ep in ["a", "b", "c", "d"] {
        inputs.push(signal_input(
            &call("e2e", ep, 0, OutcomeClass::Success, Some(300), t),
            t,
            2,
        ));
    }
    for i in 1..=5 {
        t += 100;
        inputs.push(signal_input(
            &call("e2e", "a", i, OutcomeClass::ConnectError, None, t),
            t,
            2,
        ));
    }
    // Isolation (30 s) expires with the ticks; the trial and the slow start follow.
    for s in 1..=40 {
        inputs.extend(ticks(T0_MS + s * 1000, 2));
    }
    for i in 0..40 {
        let ts = T0_MS + 41_000 + i * 1000;
        inputs.push(signal_input(
            &call("e2e", "a", 100 + i as u64, OutcomeClass::Success, Some(300), ts),
            ts,
            2,
        ));
    }
    produce(&topics.signals, &inputs).await;

    let db = Db::connect(&name).await;
    let _p = start_processor(&topics, &name, &name, &[]);
    db.wait_consumed(&name, inputs.len() as i64, LONG).await;

    let want = expected(&inputs);
    let states: Vec<HealthState> = want.iter().filter(|h| h.endpoint == "a").map(|h| h.to_state).collect();
    assert!(
        states.ends_with(&[HealthState::Unhealthy, HealthState::Recovering, HealthState::Healthy]),
        "{states:?}"
    );

    type Row = (String, i64, String, String, String, serde_json::Value, Vec<String>);
    let rows: Vec<Row> = sqlx::query_as(
        "SELECT endpoint, seq, from_state, to_state, reason, evidence, trigger_ids FROM transitions ORDER BY pool, endpoint, seq",
    )
    .fetch_all(&db.pool)
    .await
    .unwrap();
    assert_eq!(rows.len(), want.len());
    for (row, h) in rows.iter().zip(&want) {
        assert_eq!(
            (&row.0, row.1, row.2.as_str(), row.3.as_str()),
            (&h.endpoint, h.seq, h.from_state.as_str(), h.to_state.as_str())
        );
        assert_eq!(row.4, h.reason);
        assert_eq!(row.6, h.trigger_ids);
        assert_eq!(
            row.5["consecutive_failures"],
            serde_json::json!(h.evidence.consecutive_failures)
        );
    }
    let ejected = rows.iter().find(|r| r.3 == "unhealthy").unwrap();
    assert_eq!(ejected.5["consecutive_failures"], 5);
    assert_eq!(ejected.5["connect_error"], 5);
    assert_eq!(ejected.6.len(), 5, "the five failing calls are the trigger");

    // The same transitions leave on the changes topic, in sequence order per endpoint.
    let msgs = read_n(&topics.changes, want.len(), LONG).await;
    let mut published: Vec<HealthChanged> = msgs
        .iter()
        .filter(|m| header(m, "vitals-type").as_deref() == Some("HealthChanged"))
        .map(|m| decode::<HealthChanged>(rdkafka::Message::payload(m).unwrap()).unwrap())
        .collect();
    let per_endpoint: Vec<i64> = published.iter().filter(|h| h.endpoint == "a").map(|h| h.seq).collect();
    assert!(
        per_endpoint.windows(2).all(|w| w[0] < w[1]),
        "in order: {per_endpoint:?}"
    );
    published.sort_by(|a, b| (&a.pool, &a.endpoint, a.seq).cmp(&(&b.pool, &b.endpoint, b.seq)));
    published.dedup_by(|a, b| a.transition_id == b.transition_id);
    assert_eq!(published, want);
    let current: (String, i64) =
        sqlx::query_as("SELECT state, seq FROM endpoint_state WHERE pool = 'e2e' AND endpoint = 'a'")
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert_eq!(
        current,
        (
            "healthy".to_string(),
            want.iter().filter(|h| h.endpoint == "a").count() as i64
        )
    );
    db.drop_schema().await;
}

/// A gateway's summaries through the real processor: what the reporter's summarizer makes of
/// 100 calls a second to four endpoints, one of which goes down, lands in Postgres as the engine
/// decides it, and the ejection names the failures that caused it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn call_summaries_are_decided_as_the_engine_decides_them() {
    let name = unique("summaries");
    let topics = create_topics(&name, 2).await;
    let mut s = Summarizer::new(SummaryConfig::default(), "test");
    let mut inputs = Vec::new();
    let mut out = Vec::new();
    let mut calls = 0;
    // 20 s: every 10 ms one call to each endpoint; `a` refuses connections from 10 s on.
    for step in 0..2_000i64 {
        let ts = T0_MS + step * 10;
        s.flush_due(ts * 1000, &mut out);
        for ep in ["a", "b", "c", "d"] {
            let class = if ep == "a" && step >= 1_000 {
                OutcomeClass::ConnectError
            } else {
                OutcomeClass::Success
            };
            let Signal::Call(c) = call(
                "sum",
                ep,
                step as u64,
                class,
                (class == OutcomeClass::Success).then_some(200),
                ts,
            ) else {
                unreachable!()
            };
            s.add(c, ts * 1000, &mut out);
            calls += 1;
        }
        inputs.extend(out.drain(..).map(|sig| signal_input(&sig, ts, 2)));
        if step % 100 == 0 {
            inputs.extend(ticks(ts, 2));
        }
    }
    s.flush_all(&mut out);
    let end = T0_MS + 20_000;
    inputs.extend(out.drain(..).map(|sig| signal_input(&sig, end, 2)));
    assert!(inputs.len() * 10 < calls, "{} records for {calls} calls", inputs.len());
    produce(&topics.signals, &inputs).await;

    let db = Db::connect(&name).await;
    let _p = start_processor(&topics, &name, &name, &[]);
    db.wait_consumed(&name, inputs.len() as i64, LONG).await;
    let want = expected(&inputs);
    let ejection = want
        .iter()
        .find(|h| h.endpoint == "a" && h.to_state == HealthState::Unhealthy)
        .expect("a is ejected");
    assert!(
        (ejection.stream_time - (T0_MS + 10_000) * 1000).abs() < 300_000,
        "ejected at once: {}",
        ejection.stream_time
    );
    type Row = (String, i64, String, Vec<String>);
    let rows: Vec<Row> =
        sqlx::query_as("SELECT endpoint, seq, to_state, trigger_ids FROM transitions ORDER BY pool, endpoint, seq")
            .fetch_all(&db.pool)
            .await
            .unwrap();
    let got: Vec<Row> = want
        .iter()
        .map(|h| {
            (
                h.endpoint.clone(),
                h.seq,
                h.to_state.as_str().to_owned(),
                h.trigger_ids.clone(),
            )
        })
        .collect();
    assert_eq!(rows, got);
    let triggers = &rows.iter().find(|r| r.0 == "a" && r.2 == "unhealthy").unwrap().3;
    assert!(
        triggers.iter().all(|t| t.starts_with("sum-a-")),
        "the failing calls, sent one by one, are the trigger: {triggers:?}"
    );
    db.drop_schema().await;
}

/// One gateway's broken route: the scoped transitions land in the audit log with their scope
/// and in the scoped-state projection (a row while the endpoint is out for the scope, none once
/// its trial passed), and the fleet's state of the endpoint is untouched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scoped_decision_is_audited_with_its_scope_and_projected_while_in_force() {
    let name = unique("scoped");
    let topics = create_topics(&name, 2).await;
    let mut inputs = Vec::new();
    // 60 s: every 10 ms one call, from g1..g5 in turn, to a, b, c in turn; g1's calls to a
    // refuse connections from 2 s to 10 s. Stop before the end at `cut` to see the row.
    let build = |until_ms: i64| {
        let mut v = Vec::new();
        for step in 0..until_ms / 10 {
            let ts = T0_MS + step * 10;
            let (g, ep) = (step % 5 + 1, ["a", "b", "c"][(step / 5 % 3) as usize]);
            let broken = g == 1 && ep == "a" && (200..1_000).contains(&step);
            let class = if broken {
                OutcomeClass::ConnectError
            } else {
                OutcomeClass::Success
            };
            let Signal::Call(c) = call("scoped", ep, step as u64, class, None, ts) else {
                unreachable!()
            };
            let c = CallOutcome {
                gateway: format!("g{g}"),
                http_status: (!broken).then_some(200),
                ..c
            };
            v.push(signal_input(&Signal::Call(c), ts, 2));
            if step % 100 == 0 {
                v.extend(ticks(ts, 2));
            }
        }
        v
    };
    inputs.extend(build(20_000));
    produce(&topics.signals, &inputs).await;
    let db = Db::connect(&name).await;
    let _p = start_processor(&topics, &name, &name, &[]);
    db.wait_consumed(&name, inputs.len() as i64, LONG).await;
    type Row = (String, i64, String, Option<String>);
    let scoped: Vec<(String, String, String)> =
        sqlx::query_as("SELECT endpoint, scope, state FROM scoped_state ORDER BY endpoint, scope")
            .fetch_all(&db.pool)
            .await
            .unwrap();
    assert_eq!(
        scoped,
        [("a".to_owned(), "gateway=g1".to_owned(), "unhealthy".to_owned())]
    );
    let (state,): (String,) = sqlx::query_as("SELECT state FROM endpoint_state WHERE endpoint = 'a'")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(state, "healthy", "the fleet's state is untouched");

    // The rest of the minute: g1's trial passes.
    let rest: Vec<Input> = build(60_000).into_iter().skip(inputs.len()).collect();
    produce(&topics.signals, &rest).await;
    inputs.extend(rest);
    db.wait_consumed(&name, inputs.len() as i64, LONG).await;
    let rows: Vec<Row> =
        sqlx::query_as("SELECT endpoint, seq, to_state, scope FROM transitions ORDER BY pool, endpoint, seq")
            .fetch_all(&db.pool)
            .await
            .unwrap();
    let want: Vec<Row> = expected(&inputs)
        .iter()
        .map(|h| {
            (
                h.endpoint.clone(),
                h.seq,
                h.to_state.as_str().to_owned(),
                h.scope.clone(),
            )
        })
        .collect();
    assert_eq!(rows, want);
    assert!(
        rows.iter().all(|r| r.3.as_deref() == Some("gateway=g1")) && rows.len() >= 2,
        "out for g1 and back, nothing for the fleet: {rows:?}"
    );
    let left: (i64,) = sqlx::query_as("SELECT count(*) FROM scoped_state")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(left.0, 0, "back for g1: no decision in force");
    db.drop_schema().await;
}

/// Pool `kc1/a` + endpoint `x` and pool `kc1` + endpoint `a/x` once shared a transition id, an
/// outbox key and a Kafka key, so the second one's events were silently dropped. And the
/// compacted state topic held only endpoints that had a transition, so a router bootstrapping
/// from it did not learn a pool's healthy members.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn names_with_slashes_keep_their_own_events_and_every_endpoint_reaches_the_state_topic() {
    let name = unique("keys");
    let topics = create_topics(&name, 2).await;
    let mut inputs = Vec::new();
    let mut t = T0_MS;
    for (pool, ep) in [("kc1/a", "x"), ("kc1", "a/x")] {
        for i in 0..5 {
            t += 100;
            inputs.push(signal_input(
                &call(pool, ep, i, OutcomeClass::ConnectError, None, t),
                t,
                2,
            ));
        }
    }
    inputs.push(signal_input(
        &call("kc1", "ok", 0, OutcomeClass::Success, Some(300), t),
        t,
        2,
    ));
    produce(&topics.signals, &inputs).await;
    let db = Db::connect(&name).await;
    let _p = start_processor(&topics, &name, &name, &[]);
    db.wait_consumed(&name, inputs.len() as i64, LONG).await;

    let ejected: Vec<(String, String, String)> = sqlx::query_as(
        "SELECT pool, endpoint, transition_id FROM transitions WHERE to_state = 'unhealthy' ORDER BY pool, endpoint",
    )
    .fetch_all(&db.pool)
    .await
    .unwrap();
    assert_eq!(
        ejected,
        vec![
            ("kc1".into(), "a/x".into(), "kc1/a%2Fx/2".into()),
            ("kc1/a".into(), "x".into(), "kc1%2Fa/x/2".into()),
        ]
    );
    // Each: suspect, then unhealthy; and whatever pool events the pools raised.
    let on_changes: i64 =
        sqlx::query_scalar("SELECT (SELECT count(*) FROM transitions) + (SELECT count(*) FROM pool_events)")
            .fetch_one(&db.pool)
            .await
            .unwrap();
    let changes: Vec<_> = read_n(&topics.changes, on_changes as usize, LONG)
        .await
        .into_iter()
        .filter(|m| header(m, "vitals-type").as_deref() == Some("HealthChanged"))
        .collect();
    let mut keys: Vec<String> = changes
        .iter()
        .map(|m| String::from_utf8(rdkafka::Message::key(m).unwrap().to_vec()).unwrap())
        .collect();
    keys.sort();
    assert_eq!(
        keys,
        vec!["kc1%2Fa/x", "kc1%2Fa/x", "kc1/a%2Fx", "kc1/a%2Fx"],
        "both endpoints' events reach routers"
    );
    for m in &changes {
        let h = decode::<HealthChanged>(rdkafka::Message::payload(m).unwrap()).unwrap();
        let key = String::from_utf8(rdkafka::Message::key(m).unwrap().to_vec()).unwrap();
        assert_eq!(
            keys::parse_endpoint_key(&key),
            Some((h.pool.clone(), h.endpoint.clone()))
        );
    }

    // Three endpoints first seen (healthy, seq 0) and four transitions.
    let states = read_n(&topics.state, 7, LONG).await;
    let mut latest: BTreeMap<String, EndpointState> = BTreeMap::new();
    for m in &states {
        let key = String::from_utf8(rdkafka::Message::key(m).unwrap().to_vec()).unwrap();
        let st = decode::<EndpointState>(rdkafka::Message::payload(m).unwrap()).unwrap();
        let e = latest.entry(key).or_insert_with(|| st.clone());
        if st.seq >= e.seq {
            *e = st;
        }
    }
    let summary: Vec<(&str, HealthState, i64)> = latest.iter().map(|(k, s)| (k.as_str(), s.state, s.seq)).collect();
    assert_eq!(
        summary,
        vec![
            ("kc1%2Fa/x", HealthState::Unhealthy, 2),
            ("kc1/a%2Fx", HealthState::Unhealthy, 2),
            ("kc1/ok", HealthState::Healthy, 0),
        ]
    );
    db.drop_schema().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_at_several_points_loses_and_doubles_nothing() {
    let name = unique("crash");
    let topics = create_topics(&name, 4).await;
    let inputs = workload(24, 40_000, 4, 11);
    produce(&topics.signals, &inputs).await;
    let total = inputs.len() as i64;
    let db = Db::connect(&name).await;
    // Small batches keep the processor slow enough that every kill lands mid-run; a snapshot
    // every 2,500 records of a partition, whatever its size, so that kills land between them.
    let args = [
        "--snapshot-every",
        "2500",
        "--snapshot-bytes-per-record",
        "0",
        "--batch-max-records",
        "100",
    ];
    for stop_at in [total / 5, total / 2, total * 4 / 5] {
        let mut p = start_processor(&topics, &name, &name, &args);
        db.wait_consumed(&name, stop_at, LONG).await;
        p.kill9();
        let at = db.consumed(&name).await;
        assert!(at < total, "killed mid-run ({at} of {total} consumed)");
    }
    let mut p = start_processor(&topics, &name, &name, &args);
    db.wait_consumed(&name, total, LONG).await;
    p.terminate();
    let got = db.digest(true).await;
    let want = reference_digest(&topics, total, true).await;
    assert!(got.0 > 50, "the workload makes transitions: {}", got.0);
    assert_eq!(got, want, "audit log after three kill -9 equals an uninterrupted run");
    assert_eq!(db.sequence_gaps().await, vec![], "no gaps, no doubles");
    db.drop_schema().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn poison_records_go_to_the_dead_letter_topic_and_change_nothing_else() {
    let name = unique("poison");
    let topics = create_topics(&name, 2).await;
    let clean_topics = create_topics(&format!("{name}c"), 2).await;
    let valid = workload(6, 5_000, 2, 5);
    let good = valid[10].bytes.clone();
    let mut unknown = good.clone();
    unknown[2..10].copy_from_slice(&0x0123_4567_89ab_cdef_u64.to_le_bytes());
    let mut negative = call("pool-1", "ep-0", 999_999, OutcomeClass::Success, None, T0_MS);
    if let Signal::Call(c) = &mut negative {
        c.latency_us = -7;
    }
    let mut empty_pool = call("x", "ep-0", 999_998, OutcomeClass::Success, None, T0_MS);
    if let Signal::Call(c) = &mut empty_pool {
        c.pool = String::new();
    }
    // A CallOutcome of the older schema whose attributes map announces 400,000,000 entries: it
    // aborted the processor on every restart.
    let hex = "c301b121b3fe4544bfc810706f69736f6e2d3114706f69736f6e706f6f6c046531046777e8d991c3cfdcb00600029003d00f00008090bcfd02026b0276";
    let forged_map: Vec<u8> = (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
        .collect();
    // A policy whose isolation overflowed the timestamps Postgres stores: it stalled every pool.
    let overflowing_policy = Signal::Policy(PolicyChange {
        change_id: "policy-wrap".into(),
        pool: "pool-1".into(),
        actor: "careless-admin".into(),
        issued_at: T0_MS * 1000,
        policy: Policy {
            version: 21,
            isolation_base_ms: 17_444_980_000_000_000,
            isolation_max_ms: 17_444_980_000_000_000,
            ..Policy::default()
        },
    });
    let mut huge_attributes = call("pool-1", "ep-0", 999_997, OutcomeClass::Success, None, T0_MS);
    if let Signal::Call(c) = &mut huge_attributes {
        c.attributes = (0..100).map(|i| (format!("k{i}"), "v".repeat(500))).collect();
    }
    let poison: Vec<(Vec<u8>, &str)> = vec![
        (forged_map, "invalid_body"),
        (encode_signal(&overflowing_policy).unwrap(), "invalid_value"),
        (encode_signal(&huge_attributes).unwrap(), "invalid_value"),
        (b"definitely not avro".to_vec(), "bad_magic"),
        (unknown, "unknown_fingerprint"),
        (good[..good.len() - 3].to_vec(), "invalid_body"),
        (vec![0xC3], "too_short"),
        (encode_signal(&negative).unwrap(), "invalid_value"),
        (encode_signal(&empty_pool).unwrap(), "invalid_value"),
    ];
    let mut mixed = Vec::new();
    for (i, input) in valid.iter().enumerate() {
        mixed.push(input.clone());
        if i % 500 == 250 {
            let (bytes, _) = &poison[(i / 500) % poison.len()];
            mixed.push(Input {
                partition: Some((i % 2) as i32),
                ts_ms: input.ts_ms,
                key: None,
                bytes: bytes.clone(),
            });
        }
    }
    let poisoned: Vec<&str> = (0..valid.len())
        .filter(|i| i % 500 == 250)
        .map(|i| poison[(i / 500) % poison.len()].1)
        .collect();
    produce(&topics.signals, &mixed).await;
    produce(&clean_topics.signals, &valid).await;

    let db = Db::connect(&name).await;
    let _p = start_processor(&topics, &name, &name, &[]);
    db.wait_consumed(&name, mixed.len() as i64, LONG).await;

    let dead = read_n(&topics.dlq, poisoned.len(), LONG).await;
    let mut codes: Vec<String> = dead.iter().map(|m| header(m, "vitals-error-code").unwrap()).collect();
    let mut want_codes: Vec<String> = poisoned.iter().map(|s| s.to_string()).collect();
    codes.sort();
    want_codes.sort();
    assert_eq!(codes, want_codes);
    for m in &dead {
        assert_eq!(
            header(m, "vitals-origin-topic").as_deref(),
            Some(topics.signals.as_str())
        );
        let p: i32 = header(m, "vitals-origin-partition").unwrap().parse().unwrap();
        let o: i64 = header(m, "vitals-origin-offset").unwrap().parse().unwrap();
        assert!((0..2).contains(&p) && o >= 0);
        assert!(!header(m, "vitals-error").unwrap().is_empty());
    }
    let got = db.digest(false).await;
    let want = reference_digest(&clean_topics, valid.len() as i64, false).await;
    assert!(got.0 > 5, "{}", got.0);
    assert_eq!(got, want, "valid records give the same audit log as a clean run");
    db.drop_schema().await;
}

/// A pool holds at most its policy's `max_endpoints`: the processor dead-letters a signal naming
/// one more (code `pool_full`, the reason in a header) and the pool keeps the endpoints it had.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn signals_beyond_a_pools_endpoint_cap_are_dead_lettered_with_the_reason() {
    let name = unique("cap");
    let topics = create_topics(&name, 1).await;
    let policy = Signal::Policy(PolicyChange {
        change_id: "cap-2".into(),
        pool: "capped".into(),
        actor: "admin".into(),
        issued_at: T0_MS * 1000,
        policy: Policy {
            version: 3,
            max_endpoints: 2,
            ..Policy::default()
        },
    });
    let mut signals = vec![policy];
    for (i, ep) in ["a", "b", "c", "a", "d", "b"].iter().enumerate() {
        signals.push(call(
            "capped",
            ep,
            i as u64,
            OutcomeClass::Success,
            None,
            T0_MS + i as i64,
        ));
    }
    let inputs: Vec<Input> = signals
        .iter()
        .enumerate()
        .map(|(i, s)| Input {
            partition: Some(0),
            ts_ms: T0_MS + i as i64,
            key: Some("capped".into()),
            bytes: encode_signal(s).unwrap(),
        })
        .collect();
    produce(&topics.signals, &inputs).await;
    let db = Db::connect(&name).await;
    let _p = start_processor(&topics, &name, &name, &[]);
    db.wait_consumed(&name, inputs.len() as i64, LONG).await;
    let dead = read_n(&topics.dlq, 2, LONG).await;
    let offsets: Vec<String> = dead
        .iter()
        .map(|m| header(m, "vitals-origin-offset").unwrap())
        .collect();
    assert_eq!(offsets, ["3", "5"], "c and d, the third and fourth endpoints");
    for m in &dead {
        assert_eq!(header(m, "vitals-error-code").as_deref(), Some("pool_full"));
        let why = header(m, "vitals-error").unwrap();
        assert!(why.contains("max_endpoints 2"), "{why}");
    }
    let held: Vec<String> =
        sqlx::query_scalar("SELECT endpoint FROM endpoint_state WHERE pool = 'capped' ORDER BY endpoint")
            .fetch_all(&db.pool)
            .await
            .unwrap();
    assert_eq!(held, ["a", "b"]);
    db.drop_schema().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_processor_joining_and_leaving_changes_nothing() {
    let name = unique("rebal");
    let topics = create_topics(&name, 4).await;
    let inputs = workload(24, 40_000, 4, 23);
    produce(&topics.signals, &inputs).await;
    let total = inputs.len() as i64;
    let db = Db::connect(&name).await;
    let args = ["--batch-max-records", "200", "--snapshot-every", "3000"];
    let mut a = start_processor(&topics, &name, &name, &args);
    db.wait_consumed(&name, total / 5, LONG).await;
    let mut b = start_processor(&topics, &name, &name, &args);
    wait_until("the second processor to claim partitions", LONG, || async {
        sqlx::query_scalar::<_, i64>("SELECT max(epoch) FROM consumer_offsets")
            .fetch_one(&db.pool)
            .await
            .unwrap_or(0)
            >= 2
    })
    .await;
    db.wait_consumed(&name, total * 3 / 5, LONG).await;
    assert!(b.terminate().success(), "the second processor leaves cleanly");
    db.wait_consumed(&name, total, LONG).await;
    assert!(a.terminate().success());
    let got = db.digest(true).await;
    let want = reference_digest(&topics, total, true).await;
    assert_eq!(got, want);
    assert_eq!(db.sequence_gaps().await, vec![]);
    db.drop_schema().await;
}

/// The members of `group` and their client ids, as the broker's group coordinator lists them.
async fn group_members(group: &str) -> Vec<String> {
    use rdkafka::consumer::Consumer;
    let c = vitals_testkit::consumer(&unique("lister"));
    let group = group.to_owned();
    tokio::task::spawn_blocking(move || {
        let list = c.fetch_group_list(Some(&group), Duration::from_secs(10)).ok()?;
        let mut ids: Vec<String> = list
            .groups()
            .iter()
            .find(|g| g.name() == group && g.state() == "Stable")?
            .members()
            .iter()
            .map(|m| m.client_id().to_owned())
            .collect();
        ids.sort();
        Some(ids)
    })
    .await
    .unwrap()
    .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lanes_consume_the_partitions_in_parallel_and_decide_as_one_loop_does() {
    let name = unique("lanes");
    let topics = create_topics(&name, 4).await;
    let inputs = workload(24, 40_000, 4, 31);
    let total = inputs.len() as i64;
    let db = Db::connect(&name).await;
    let args = ["--lanes", "3", "--batch-max-records", "300", "--snapshot-every", "2000"];
    let (mut p, port) = start_serving(&topics, &name, &name, &args);
    // Three members of the group, all this one processor's lanes, and it is ready only once
    // every lane holds a restored assignment.
    wait_until("three lanes in a stable group", LONG, || async {
        group_members(&name).await.len() == 3
    })
    .await;
    let members = group_members(&name).await;
    let lanes: Vec<&str> = members.iter().map(|m| m.rsplit('-').next().unwrap()).collect();
    assert_eq!(lanes, ["0", "1", "2"], "{members:?}");
    assert!(members.iter().all(|m| m.contains("-lane-")), "{members:?}");
    wait_until("/readyz ready", LONG, || async {
        http_get(port, "/readyz").await.as_deref() == Some("ready")
    })
    .await;
    produce(&topics.signals, &inputs).await;
    db.wait_consumed(&name, total, LONG).await;
    assert!(
        p.terminate().success(),
        "{}",
        std::fs::read_to_string(&p.log).unwrap_or_default()
    );
    let got = db.digest(true).await;
    let want = reference_digest(&topics, total, true).await;
    assert!(got.0 > 20, "transitions: {}", got.0);
    assert_eq!(got, want, "three lanes decide and record what one loop does");
    assert_eq!(db.sequence_gaps().await, vec![]);
    db.drop_schema().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replay_into_a_fresh_schema_gives_an_identical_audit_log() {
    let name = unique("replay");
    let topics = create_topics(&name, 3).await;
    let inputs = workload(12, 20_000, 3, 99);
    produce(&topics.signals, &inputs).await;
    let first = reference_digest(&topics, inputs.len() as i64, true).await;
    let second = reference_digest(&topics, inputs.len() as i64, true).await;
    assert!(first.0 > 20, "{}", first.0);
    assert_eq!(first, second);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_policy_change_is_the_pools_policy_in_force_and_is_restored_for_pools_changed_before() {
    let name = unique("policyrow");
    let topics = create_topics(&name, 1).await;
    let mut inputs: Vec<Input> = (0..20)
        .map(|i| {
            signal_input(
                &call("pp", "e0", i, OutcomeClass::Success, None, T0_MS + i as i64),
                T0_MS + i as i64,
                1,
            )
        })
        .collect();
    let change = Signal::Policy(PolicyChange {
        change_id: "policy-7".into(),
        pool: "pp".into(),
        actor: "ops".into(),
        issued_at: (T0_MS + 30) * 1000,
        policy: Policy {
            version: 5,
            consecutive_failures: 7,
            ..Policy::default()
        },
    });
    inputs.push(signal_input(&change, T0_MS + 30, 1));
    inputs.push(signal_input(
        &call("other", "e0", 1, OutcomeClass::Success, None, T0_MS + 40),
        T0_MS + 40,
        1,
    ));
    produce(&topics.signals, &inputs).await;
    let db = Db::connect(&name).await;
    let mut p = start_processor(&topics, &name, &name, &[]);
    db.wait_consumed(&name, inputs.len() as i64, LONG).await;
    let read = |pool: &'static str| {
        let db = db.pool.clone();
        async move { vitals_store::read::pool_policy(&db, pool).await.unwrap() }
    };
    let (version, policy) = read("pp").await.expect("the changed pool's policy");
    assert_eq!((version, policy.consecutive_failures), (5, 7));
    assert_eq!(
        read("other").await,
        Some((0, Policy::default())),
        "never changed: the default"
    );
    assert_eq!(read("nowhere").await, None, "a pool never seen");
    // A pool whose policy changed before the table existed: its row is written when its
    // partition is next restored (from the snapshot the processor took at shutdown).
    p.terminate();
    sqlx::query("DELETE FROM pool_policies")
        .execute(&db.pool)
        .await
        .unwrap();
    assert_eq!(read("pp").await, Some((0, Policy::default())));
    let _p = start_processor(&topics, &name, &name, &[]);
    wait_until("the restored pool's policy row", LONG, || async {
        read("pp").await.is_some_and(|(v, _)| v == 5)
    })
    .await;
    assert_eq!(read("pp").await.map(|(_, p)| p.consecutive_failures), Some(7));
    db.drop_schema().await;
}

/// Whatever order batches arrive in across months, and however often the writer restarts or
/// forgets, every month a batch wrote to exists with the month after it (generated: the months'
/// order was where a bug hid, when a month first made as the one ahead later got rows).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_month_written_to_has_the_month_after_it_whatever_the_order() {
    use vitals_store::months::{month_of, month_start, Months, Retention};
    let name = unique("month-order");
    let pool = vitals_testkit::migrated_schema(&name).await;
    let base = month_of(1_796_083_200_000_000); // December 2026
    let mut rng = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let tables = |pool: sqlx::PgPool| async move {
        let names: Vec<String> = sqlx::query_scalar(
            "SELECT c.relname::text FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
             WHERE i.inhparent = 'transitions'::regclass",
        )
        .fetch_all(&pool)
        .await
        .unwrap();
        names
    };
    let table = |m: i64| format!("transitions_{}", month_start(m).format("y%Ym%m"));
    let mut writer = Months::new(Retention::default());
    let mut written = std::collections::BTreeSet::new();
    for round in 0..60 {
        match next() % 10 {
            0 => writer = Months::new(Retention::default()),
            1 => writer.forget(),
            _ => {}
        }
        // A batch: one to three stream times within eight months of December 2026.
        let times: Vec<i64> = (0..1 + next() % 3)
            .map(|_| {
                let m = base + (next() % 8) as i64;
                month_start(m).timestamp_micros() + (next() % 86_400_000_000) as i64
            })
            .collect();
        writer.ensure(&pool, times.iter().copied()).await.unwrap();
        written.extend(times.iter().map(|&t| month_of(t)));
        let have = tables(pool.clone()).await;
        for &m in &written {
            for want in [table(m), table(m + 1)] {
                assert!(
                    have.contains(&want),
                    "round {round}: {want} missing after writing to {:?}; tables {have:?}",
                    written.iter().map(|&m| table(m)).collect::<Vec<_>>()
                );
            }
        }
    }
    vitals_testkit::drop_schema(&pool, &name).await;
}

/// The audit log is partitioned by month of stream time (migration 0011): the migration moves
/// the rows already there, a batch creates the months it writes to (and the next one ahead),
/// and retention drops whole months that ended before it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_audit_log_is_kept_in_months_and_retention_drops_whole_ones() {
    let name = unique("months");
    let db = Db::connect(&name).await;
    // The schema as it was before partitioning, with a row from last June and one from January
    // 2025 (beyond a 365-day retention).
    sqlx::query(&format!("CREATE SCHEMA \"{name}\""))
        .execute(&db.pool)
        .await
        .unwrap();
    let before = sqlx::migrate::Migrator {
        migrations: std::borrow::Cow::Owned(
            vitals_store::MIGRATOR
                .iter()
                .filter(|m| m.version < 11)
                .cloned()
                .collect(),
        ),
        ignore_missing: false,
        locking: true,
        no_tx: false,
    };
    before.run(&db.pool).await.unwrap();
    for (ep, at) in [("june", "2026-06-15T12:00:00Z"), ("old", "2025-01-20T12:00:00Z")] {
        sqlx::query(
            "INSERT INTO transitions (pool, endpoint, seq, transition_id, from_state, to_state, weight, ramp_ms,
             reason_code, reason, failure_rate, score, window_calls, window_failures, consecutive_failures,
             consecutive_successes, thresholds, trigger_ids, policy_version, evidence, stream_time,
             source_partition, source_offset)
             VALUES ('before', $1, 1, 'before/' || $1 || '/1', 'healthy', 'unhealthy', 0, 0, 'ejected', 'r', 1, 0,
             5, 5, 5, 0, '{}', '{}', 0, '{}', $2::timestamptz, 0, 0)",
        )
        .bind(ep)
        .bind(at)
        .execute(&db.pool)
        .await
        .unwrap();
    }

    // 40 s of calls around midnight UTC, 30 November to 1 December 2026: `a` refuses
    // connections from 10 s before midnight, `b` from 5 s after.
    let midnight_ms: i64 = 1_796_083_200_000;
    let topics = create_topics(&name, 2).await;
    let mut inputs = Vec::new();
    for step in 0..4_000i64 {
        let ts = midnight_ms - 20_000 + step * 10;
        for (ep, fails_from) in [("a", midnight_ms - 10_000), ("b", midnight_ms + 5_000), ("c", i64::MAX)] {
            let class = if ts >= fails_from {
                OutcomeClass::ConnectError
            } else {
                OutcomeClass::Success
            };
            let ttft = (class == OutcomeClass::Success).then_some(200);
            inputs.push(signal_input(&call("months", ep, step as u64, class, ttft, ts), ts, 2));
        }
        if step % 100 == 0 {
            inputs.extend(ticks(ts, 2));
        }
    }
    produce(&topics.signals, &inputs).await;
    let _p = start_processor(&topics, &name, &name, &["--audit-retention-days", "365"]);
    db.wait_consumed(&name, inputs.len() as i64, LONG).await;

    type Row = (String, String, i64, String);
    let rows: Vec<Row> = sqlx::query_as(
        "SELECT tableoid::regclass::text, endpoint, seq, to_state FROM transitions WHERE pool = 'months'
         ORDER BY endpoint, seq",
    )
    .fetch_all(&db.pool)
    .await
    .unwrap();
    let want = expected(&inputs);
    assert_eq!(
        rows.iter().map(|r| (r.1.clone(), r.2, r.3.clone())).collect::<Vec<_>>(),
        want.iter()
            .map(|h| (h.endpoint.clone(), h.seq, h.to_state.as_str().to_owned()))
            .collect::<Vec<_>>(),
        "the audit log is the engine's"
    );
    let month_of = |ep: &str| {
        rows.iter()
            .find(|r| r.1 == ep && r.3 != "healthy")
            .map(|r| r.0.clone())
            .unwrap_or_else(|| panic!("{ep} leaves healthy: {rows:?}"))
    };
    assert_eq!(month_of("a"), "transitions_y2026m11");
    assert_eq!(month_of("b"), "transitions_y2026m12");

    // Retention drops January 2025 whole; the June row was moved into its month and stays.
    wait_until("retention to drop January 2025", LONG, || async {
        sqlx::query_scalar::<_, bool>("SELECT to_regclass('transitions_y2025m01') IS NULL")
            .fetch_one(&db.pool)
            .await
            .unwrap()
    })
    .await;
    let before_rows: Vec<(String, String)> =
        sqlx::query_as("SELECT tableoid::regclass::text, endpoint FROM transitions WHERE pool = 'before'")
            .fetch_all(&db.pool)
            .await
            .unwrap();
    assert_eq!(before_rows, [("transitions_y2026m06".to_owned(), "june".to_owned())]);
    let months: Vec<String> = sqlx::query_scalar(
        "SELECT c.relname::text FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
         WHERE i.inhparent = 'transitions'::regclass ORDER BY 1",
    )
    .fetch_all(&db.pool)
    .await
    .unwrap();
    assert_eq!(
        months,
        [
            "transitions_y2026m06",
            "transitions_y2026m11",
            "transitions_y2026m12",
            "transitions_y2027m01"
        ],
        "the months written to, and the next one ahead"
    );
    db.drop_schema().await;
}
