//! The loop closes: load through the router to simulated upstreams; one endpoint refuses
//! connections; the router's reports and the prober's results reach the processor, which ejects
//! it; the router stops sending to it; it heals; the prober's fast cadence readmits it and the
//! router sends to it again. Users see no failed call (a refused connection is retried on
//! another endpoint).
//!
//! Needs the local stack (Kafka and Postgres, started by `scripts/test.sh`): run `scripts/test.sh`.
// Needs the local stack and its peers: `scripts/test.sh` runs it (`--features stack`).
#![cfg(feature = "stack")]

use futures::StreamExt;
use rdkafka::consumer::Consumer;
use rdkafka::Message;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use vitals_contracts::{decode_signal, OutcomeClass, Signal};
use vitals_testkit::{brokers, free_port, http_get, unique, wait_until, Service, Stamp, Topics};
use vitals_upstream_sim::{Behaviour, Sim, SimConfig};

#[derive(Default)]
struct Load {
    /// (when, endpoint that served it or "", status)
    calls: Vec<(Instant, String, u16)>,
}

fn flags(pairs: &[(&str, &str)]) -> Vec<String> {
    pairs.iter().flat_map(|(k, v)| [k.to_string(), v.to_string()]).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refusing_endpoint_is_routed_around_and_comes_back_after_it_heals() {
    let mut sc = SimConfig::healthy(3, 1);
    for e in &mut sc.endpoints {
        e.behaviour.ttft_ms = 20;
        e.behaviour.tokens = 2;
    }
    let sim = Sim::start(sc).await.unwrap();
    let topics = Topics::create(&unique("loop"), 2, Stamp::LogAppendTime).await;
    let schema = unique("loop");
    let db = vitals_testkit::migrated_schema(&schema).await;
    let _processor = vitals_testkit::start_processor(
        &topics,
        &unique("loop_proc"),
        &schema,
        &["--view-tick-interval-ms", "1000"],
    );
    let dir = std::env::temp_dir();
    // The prober: a health probe per endpoint.
    let prober_cfg = dir.join(format!("{}.toml", unique("loop_prober")));
    let mut targets = String::from("[defaults]\ninterval_ms = 1000\nfast_interval_ms = 200\ntimeout_ms = 150\n");
    for (name, addr) in sim.endpoints() {
        targets.push_str(&format!(
            "[[target]]\nid = \"{name}\"\npool = \"llm\"\nendpoint = \"{name}\"\nkind = \"http\"\nurl = \"http://{addr}/health\"\n"
        ));
    }
    std::fs::write(&prober_cfg, targets).unwrap();
    let prober_port = free_port();
    let b = brokers();
    let mut args = flags(&[
        ("--config", prober_cfg.to_str().unwrap()),
        ("--name", "p1"),
        ("--brokers", &b),
        ("--signals-topic", &topics.signals),
        ("--state-topic", &topics.state),
        ("--shard-topic", &unique("loop_shards")),
        ("--http-addr", &format!("127.0.0.1:{prober_port}")),
    ]);
    let _prober = Service::start("vitals-prober", "loop-prober", &args);
    // The router over the three endpoints.
    let router_port = free_port();
    let routes_cfg = dir.join(format!("{}.toml", unique("loop_routes")));
    let mut routes = format!(
        "listen = \"127.0.0.1:{router_port}\"\ngateway = \"router\"\n[[pool]]\nname = \"llm\"\nmodels = [\"m\"]\n"
    );
    for (name, addr) in sim.endpoints() {
        routes.push_str(&format!(
            "[[pool.upstream]]\nname = \"{name}\"\nurl = \"http://{addr}\"\n"
        ));
    }
    std::fs::write(&routes_cfg, routes).unwrap();
    args = flags(&[
        ("--config", routes_cfg.to_str().unwrap()),
        ("--brokers", &b),
        ("--signals-topic", &topics.signals),
        ("--changes-topic", &topics.changes),
        ("--state-topic", &topics.state),
    ]);
    let router = Service::start("vitals-router", "loop-router", &args);
    let log = router.log.clone();
    wait_until(
        &format!("router up ({})", log.display()),
        Duration::from_secs(30),
        || async move { http_get(router_port, "/healthz").await.is_some() },
    )
    .await;
    wait_until("prober ready", Duration::from_secs(30), || async move {
        http_get(prober_port, "/readyz").await.as_deref() == Some("ready")
    })
    .await;

    // Load: 20 calls a second through the router for the whole test.
    let load = Arc::new(Mutex::new(Load::default()));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let generator = {
        let (load, stop) = (load.clone(), stop.clone());
        tokio::spawn(async move {
            let client = reqwest::Client::new();
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let r = client
                    .post(format!("http://127.0.0.1:{router_port}/v1/chat/completions"))
                    .json(&serde_json_body())
                    .send()
                    .await;
                let (ep, status) = match r {
                    Ok(r) => {
                        let ep = r
                            .headers()
                            .get("x-vitals-endpoint")
                            .and_then(|v| v.to_str().ok())
                            .unwrap_or("")
                            .to_owned();
                        let status = r.status().as_u16();
                        let mut s = r.bytes_stream();
                        let mut whole = true;
                        while let Some(c) = s.next().await {
                            whole &= c.is_ok();
                        }
                        (ep, if whole { status } else { 599 })
                    }
                    Err(_) => (String::new(), 598),
                };
                load.lock().unwrap().calls.push((Instant::now(), ep, status));
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
    };
    let served_by = |since: Instant| -> BTreeMap<String, usize> {
        let mut m = BTreeMap::new();
        for (t, ep, _) in load.lock().unwrap().calls.iter().filter(|(t, _, _)| *t >= since) {
            let _ = t;
            *m.entry(ep.clone()).or_default() += 1;
        }
        m
    };
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(served_by(Instant::now() - Duration::from_secs(3)).contains_key("e0"));

    // e0 refuses connections.
    sim.set(
        "e0",
        Behaviour {
            refuse: true,
            ..Behaviour::default()
        },
    )
    .unwrap();
    let fault = Instant::now();
    let query = |to: &'static str| {
        let db = db.clone();
        async move {
            sqlx::query_scalar::<_, i64>("SELECT count(*) FROM transitions WHERE endpoint = 'e0' AND to_state = $1")
                .bind(to)
                .fetch_one(&db)
                .await
                .unwrap()
        }
    };
    wait_until("e0 ejected", Duration::from_secs(30), || async {
        query("unhealthy").await > 0
    })
    .await;
    let ejected_after = fault.elapsed();
    // The router stops trying e0: no refused connection reported by it a second after the ejection.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let quiet_from = vitals_now() - 1_000_000;
    let reports = router_reports(&topics.signals).await;
    let late = reports
        .iter()
        .filter(|(at, ep, class)| *at > quiet_from && ep == "e0" && *class == OutcomeClass::ConnectError)
        .count();
    assert_eq!(late, 0, "the router still sent to e0 after its ejection");

    // Healed after the minimum isolation: the prober readmits it, the router sends to it again.
    tokio::time::sleep(Duration::from_secs(9)).await;
    sim.set(
        "e0",
        Behaviour {
            ttft_ms: 20,
            tokens: 2,
            ..Behaviour::default()
        },
    )
    .unwrap();
    let healed = Instant::now();
    wait_until("e0 readmitted", Duration::from_secs(30), || async {
        query("recovering").await > 0
    })
    .await;
    let readmitted_after = healed.elapsed();
    let l = load.clone();
    wait_until("calls served by e0 again", Duration::from_secs(30), || {
        let back = l
            .lock()
            .unwrap()
            .calls
            .iter()
            .any(|(t, ep, _)| *t > healed && ep == "e0");
        async move { back }
    })
    .await;
    let traffic_back_after = load
        .lock()
        .unwrap()
        .calls
        .iter()
        .find(|(t, ep, _)| *t > healed && ep == "e0")
        .map(|(t, _, _)| t.duration_since(healed))
        .unwrap();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    generator.await.unwrap();
    let calls = load.lock().unwrap().calls.len();
    let failed = load.lock().unwrap().calls.iter().filter(|(_, _, s)| *s != 200).count();
    eprintln!(
        "loop: {calls} calls, {failed} failed for their user; e0 ejected {ejected_after:?} after the fault, readmitted {readmitted_after:?} after the heal, served again {traffic_back_after:?} after it"
    );
    assert_eq!(failed, 0, "a refused connection is retried on another endpoint");
    vitals_testkit::drop_schema(&db, &schema).await;
    let _ = std::fs::remove_file(&prober_cfg);
    let _ = std::fs::remove_file(&routes_cfg);
    sim.shutdown().await;
}

fn serde_json_body() -> serde_json::Value {
    serde_json::json!({"model": "m", "stream": true, "max_tokens": 2, "messages": []})
}

fn vitals_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_micros() as i64
}

/// The router's call reports on the signals topic so far, one by one or summed: (when,
/// endpoint, class).
async fn router_reports(topic: &str) -> Vec<(i64, String, OutcomeClass)> {
    let c = vitals_testkit::consumer(&unique("loop_reader"));
    c.subscribe(&[topic]).unwrap();
    let mut out = Vec::new();
    // Records keep arriving (the load runs): read what was written until now.
    let until = vitals_now();
    while let Ok(Ok(m)) = tokio::time::timeout(Duration::from_secs(2), c.recv()).await {
        match m.payload().map(decode_signal) {
            Some(Ok(Signal::Call(call))) => out.push((call.occurred_at, call.endpoint, call.outcome)),
            // The router sums its calls (its default): each class a summary holds, at its first
            // call's end (all of them ended then or later).
            Some(Ok(Signal::Summary(s))) => out.extend(
                s.calls
                    .iter()
                    .filter(|(_, n)| *n > 0)
                    .map(|(class, _)| (s.started_at, s.endpoint.clone(), class)),
            ),
            _ => {}
        }
        // Every record counts here (summaries and probe results keep coming, calls may not).
        if m.timestamp().to_millis().is_some_and(|t| t * 1000 > until) {
            break;
        }
    }
    out
}
