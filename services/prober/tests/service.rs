//! The prober binary against the real broker (and, end to end, the real processor and
//! Postgres): shards shared by two instances and taken over after a kill, configuration errors
//! and reloads, heartbeats, and a down endpoint ejected and brought back by the fast cadence.
//!
//! Needs the local stack (Kafka and Postgres, started by `scripts/test.sh`): run `scripts/test.sh`.
// Needs the local stack and its peers: `scripts/test.sh` runs it (`--features stack`).
#![cfg(feature = "stack")]

use rdkafka::consumer::Consumer;
use rdkafka::Message;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use vitals_contracts::{decode_signal, OutcomeClass, ProbeKind, ProbeResult, Signal};
use vitals_testkit::{brokers, free_port, http_get, metric, unique, wait_until, Service, Stamp, Topics};
use vitals_upstream_sim::{Behaviour, Sim, SimConfig};

fn now_us() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_micros() as i64
}

fn write_targets(path: &Path, sim: &Sim, n: usize, extra: &str) {
    let addr = sim.addr("e0").unwrap();
    let mut text = String::from("[defaults]\ninterval_ms = 300\nfast_interval_ms = 300\ntimeout_ms = 200\n");
    for i in 0..n {
        text.push_str(&format!(
            "[[target]]\nid = \"t{i:02}\"\npool = \"p\"\nendpoint = \"ep{i:02}\"\nkind = \"http\"\nurl = \"http://{addr}/health\"\n{extra}\n"
        ));
    }
    std::fs::write(path, text).unwrap();
}

struct Prober {
    service: Service,
    port: u16,
}

fn start_prober(config: &Path, name: &str, topics: &Topics, shard_topic: &str) -> Prober {
    start_prober_at(config, name, "test", topics, shard_topic)
}

fn start_prober_at(config: &Path, name: &str, location: &str, topics: &Topics, shard_topic: &str) -> Prober {
    let port = free_port();
    let args: Vec<String> = [
        "--config",
        config.to_str().unwrap(),
        "--name",
        name,
        "--location",
        location,
        "--brokers",
        &brokers(),
        "--signals-topic",
        &topics.signals,
        "--state-topic",
        &topics.state,
        "--shard-topic",
        shard_topic,
        "--shards",
        "8",
        "--http-addr",
        &format!("127.0.0.1:{port}"),
        "--reload-poll-ms",
        "200",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    Prober {
        service: Service::start("vitals-prober", name, &args),
        port,
    }
}

async fn ready(p: &Prober) {
    let port = p.port;
    let log = p.service.log.clone();
    wait_until(
        &format!("prober ready (log {})", log.display()),
        Duration::from_secs(30),
        || async move { http_get(port, "/readyz").await.is_some_and(|b| b == "ready") },
    )
    .await;
}

/// Every probe result on the signals topic, as it arrives.
fn follow(topic: &str) -> Arc<Mutex<Vec<ProbeResult>>> {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let c = vitals_testkit::consumer(&unique("follow"));
    c.subscribe(&[topic]).unwrap();
    let out = seen.clone();
    tokio::spawn(async move {
        while let Ok(m) = c.recv().await {
            if let Some(Ok(Signal::Probe(p))) = m.payload().map(decode_signal) {
                out.lock().unwrap().push(p);
            }
        }
    });
    seen
}

/// target → probers that probed it, over results that began within the last `span`.
fn owners(seen: &Mutex<Vec<ProbeResult>>, span: Duration) -> BTreeMap<String, BTreeSet<String>> {
    let since = now_us() - span.as_micros() as i64;
    let mut m: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for r in seen.lock().unwrap().iter().filter(|r| r.occurred_at >= since) {
        m.entry(r.endpoint.clone()).or_default().insert(r.prober.clone());
    }
    m
}

fn temp(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("{}-{name}.toml", unique("prober")))
}

async fn sim(n: usize) -> Sim {
    Sim::start(SimConfig::healthy(n, 1)).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_probers_share_the_targets_and_one_takes_over_when_the_other_is_killed() {
    let sim = sim(1).await;
    let topics = Topics::create(&unique("shard"), 2, Stamp::LogAppendTime).await;
    let shard_topic = unique("shards");
    let config = temp("shared");
    write_targets(&config, &sim, 16, "");
    let seen = follow(&topics.signals);
    let mut a = start_prober(&config, "a", &topics, &shard_topic);
    ready(&a).await;
    let b = start_prober(&config, "b", &topics, &shard_topic);
    ready(&b).await;
    // Once the group has settled, every target is probed by exactly one of the two.
    let settled = seen.clone();
    wait_until("the two probers split the targets", Duration::from_secs(40), || {
        let o = owners(&settled, Duration::from_millis(1_500));
        let probers = o.values().flatten().collect::<BTreeSet<&String>>().len();
        let split = o.len() == 16 && o.values().all(|p| p.len() == 1) && probers == 2;
        async move { split }
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let o = owners(&seen, Duration::from_secs(2));
    assert_eq!(o.len(), 16);
    assert!(o.values().all(|p| p.len() == 1), "a target probed by both: {o:?}");
    let by_a = o.values().filter(|p| p.contains("test/a")).count();
    assert!((2..=14).contains(&by_a), "both take a share: a has {by_a}");
    // Another location probes every target once more, whatever the first one does.
    let c = start_prober_at(&config, "c", "eu", &topics, &shard_topic);
    ready(&c).await;
    let other = seen.clone();
    wait_until(
        "the other location probes every target",
        Duration::from_secs(30),
        || {
            let o = owners(&other, Duration::from_millis(1_500));
            let both = o.len() == 16 && o.values().all(|p| p.contains("eu/c") && p.len() == 2);
            async move { both }
        },
    )
    .await;
    drop(c);
    // a dies without leaving the group: b has every target within seconds.
    let killed = std::time::Instant::now();
    a.service.kill9();
    let after = seen.clone();
    wait_until("b probes every target", Duration::from_secs(30), || {
        let o = owners(&after, Duration::from_secs(1));
        let all_b = o.len() == 16 && o.values().all(|p| p.len() == 1 && p.contains("test/b"));
        async move { all_b }
    })
    .await;
    // What the group decided (b owns every target, once each) is the assertion; how long the
    // machine took is only reported.
    let took = killed.elapsed();
    eprintln!("takeover after kill -9: {took:?}");
    drop(b);
    let _ = std::fs::remove_file(&config);
    sim.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn configuration_errors_reloads_and_heartbeats() {
    let sim = sim(1).await;
    let topics = Topics::create(&unique("reload"), 1, Stamp::LogAppendTime).await;
    let shard_topic = unique("shards");
    let config = temp("reload");
    // An error at start: the process exits and says where.
    write_targets(&config, &sim, 1, "timeout_ms = 5000");
    let mut bad = start_prober(&config, "bad", &topics, &shard_topic);
    let status = bad.service.child.wait().unwrap();
    assert!(!status.success());
    let log = std::fs::read_to_string(&bad.service.log).unwrap();
    assert!(log.contains("line 11: target \"t00\" timeout_ms"), "{log}");
    // A signals topic that does not exist (auto-create off): it would publish into nothing and
    // say it is ready. It refuses to start, naming the topic.
    write_targets(&config, &sim, 1, "");
    let missing = Topics {
        signals: unique("missing.signals"),
        ..topics.clone()
    };
    let mut nowhere = start_prober(&config, "nowhere", &missing, &shard_topic);
    assert!(!nowhere.service.child.wait().unwrap().success());
    let log = std::fs::read_to_string(&nowhere.service.log).unwrap();
    assert!(
        log.contains(&format!("the topic {} does not exist", missing.signals)),
        "{log}"
    );

    write_targets(&config, &sim, 1, "");
    let seen = follow(&topics.signals);
    let p = start_prober(&config, "r", &topics, &shard_topic);
    ready(&p).await;
    let s = seen.clone();
    wait_until("ep00 probed", Duration::from_secs(20), || {
        let n = owners(&s, Duration::from_secs(1)).len();
        async move { n == 1 }
    })
    .await;
    // A second target in the file: probed without a restart.
    write_targets(&config, &sim, 2, "");
    let s = seen.clone();
    wait_until("ep01 probed after the reload", Duration::from_secs(20), || {
        let n = owners(&s, Duration::from_secs(1)).len();
        async move { n == 2 }
    })
    .await;
    // A broken file is refused; the two targets keep being probed.
    std::fs::write(&config, "[[target]]\nid = 5\n").unwrap();
    let port = p.port;
    wait_until("the broken file refused", Duration::from_secs(20), || async move {
        metric(port, "vitals_prober_config_reloads_total{result=\"error\"}").await == Some(1.0)
    })
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(owners(&seen, Duration::from_secs(1)).len(), 2);
    // A heartbeat pushed to the prober becomes a probe result of kind heartbeat.
    let r = reqwest::Client::new()
        .post(format!("http://127.0.0.1:{port}/v1/heartbeats"))
        .json(&serde_json::json!({"pool": "p", "endpoint": "worker-1", "interval_ms": 5000}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 202);
    let r = reqwest::Client::new()
        .post(format!("http://127.0.0.1:{port}/v1/heartbeats"))
        .json(&serde_json::json!({"pool": "", "endpoint": "worker-1"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 400);
    let s = seen.clone();
    wait_until("the heartbeat on the signals topic", Duration::from_secs(20), || {
        let found = s
            .lock()
            .unwrap()
            .iter()
            .any(|r| r.kind == ProbeKind::Heartbeat && r.endpoint == "worker-1" && r.interval_ms == Some(5000));
        async move { found }
    })
    .await;
    drop(p);
    let _ = std::fs::remove_file(&config);
    sim.shutdown().await;
}

/// The gateways' calls on the signals topic reach the prober: while they bring first-token
/// times for an endpoint, its synthetic completions are skipped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gateway_calls_on_the_signals_topic_cover_synthetic_completions() {
    let sim = sim(1).await;
    let topics = Topics::create(&unique("traffic"), 1, Stamp::LogAppendTime).await;
    let config = temp("traffic");
    let addr = sim.addr("e0").unwrap();
    std::fs::write(
        &config,
        format!(
            "[[target]]\nid = \"c\"\npool = \"p\"\nendpoint = \"busy\"\nkind = \"completion\"\nurl = \"http://{addr}/v1/chat/completions\"\nmodel = \"m\"\ninterval_ms = 300\nfast_interval_ms = 300\ntimeout_ms = 250\n"
        ),
    )
    .unwrap();
    let seen = follow(&topics.signals);
    let p = start_prober(&config, "t", &topics, &unique("shards"));
    ready(&p).await;
    let s = seen.clone();
    wait_until("completions before any traffic", Duration::from_secs(20), || {
        let n = s.lock().unwrap().len();
        async move { n >= 2 }
    })
    .await;
    let producer = vitals_testkit::producer();
    let mut quiet_from = None;
    for i in 0..40 {
        let call = Signal::Call(vitals_contracts::CallOutcome {
            http_status: Some(200),
            latency_us: 900_000,
            ttft_us: Some(300_000),
            ..vitals_contracts::CallOutcome::new(
                format!("call-{i}"),
                "p",
                "busy",
                "gw",
                now_us(),
                OutcomeClass::Success,
            )
        });
        let bytes = vitals_contracts::encode_signal(&call).unwrap();
        producer
            .send(
                rdkafka::producer::FutureRecord::to(&topics.signals)
                    .key("p")
                    .payload(&bytes),
                Duration::from_secs(5),
            )
            .await
            .unwrap();
        if i == 15 {
            quiet_from = Some(now_us());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (from, to) = (quiet_from.unwrap(), now_us());
    let during = seen
        .lock()
        .unwrap()
        .iter()
        .filter(|r| r.occurred_at >= from && r.occurred_at <= to)
        .count();
    assert_eq!(during, 0, "completions while calls brought first tokens");
    let s = seen.clone();
    wait_until("completions again once the calls stop", Duration::from_secs(10), || {
        let n = s.lock().unwrap().iter().filter(|r| r.occurred_at > to).count();
        async move { n >= 2 }
    })
    .await;
    drop(p);
    let _ = std::fs::remove_file(&config);
    sim.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_down_endpoint_is_ejected_and_the_fast_cadence_brings_it_back() {
    let sim = sim(1).await;
    let topics = Topics::create(&unique("e2e"), 2, Stamp::LogAppendTime).await;
    let schema = unique("prober_e2e");
    let db = vitals_testkit::migrated_schema(&schema).await;
    let _processor = vitals_testkit::start_processor(&topics, &unique("proc"), &schema, &[]);
    let config = temp("e2e");
    let addr = sim.addr("e0").unwrap();
    std::fs::write(
        &config,
        format!(
            "[[target]]\nid = \"e0-health\"\npool = \"llm\"\nendpoint = \"e0\"\nkind = \"http\"\nurl = \"http://{addr}/health\"\ninterval_ms = 1000\nfast_interval_ms = 200\ntimeout_ms = 150\n"
        ),
    )
    .unwrap();
    let seen = follow(&topics.signals);
    let p = start_prober(&config, "e2e", &topics, &unique("shards"));
    ready(&p).await;
    let s = seen.clone();
    wait_until("probes flowing", Duration::from_secs(20), || {
        let n = s.lock().unwrap().len();
        async move { n >= 2 }
    })
    .await;
    sim.set(
        "e0",
        Behaviour {
            refuse: true,
            ..Behaviour::default()
        },
    )
    .unwrap();
    let query = |to: &'static str| {
        let db = db.clone();
        async move {
            sqlx::query_as::<_, (i64, chrono::DateTime<chrono::Utc>)>(
                "SELECT seq, stream_time FROM transitions WHERE endpoint = 'e0' AND to_state = $1 ORDER BY seq LIMIT 1",
            )
            .bind(to)
            .fetch_optional(&db)
            .await
            .unwrap()
        }
    };
    wait_until("ejected in Postgres", Duration::from_secs(30), || async {
        query("unhealthy").await.is_some()
    })
    .await;
    let (_, ejected_at) = query("unhealthy").await.unwrap();
    let ejected_us = ejected_at.timestamp_micros();
    let changes = vitals_testkit::read_n(&topics.changes, 1, Duration::from_secs(20)).await;
    assert!(!changes.is_empty());
    // The state topic says unhealthy: the prober probes every 200 ms.
    tokio::time::sleep(Duration::from_secs(4)).await;
    let fast: Vec<i64> = seen
        .lock()
        .unwrap()
        .iter()
        .filter(|r| r.occurred_at > ejected_us + 2_000_000)
        .map(|r| r.occurred_at)
        .collect();
    assert!(fast.len() >= 8, "{} probes in ~2 s after the ejection", fast.len());
    assert!(
        fast.windows(2).all(|w| w[1] - w[0] < 400_000),
        "fast cadence: {:?}",
        fast.windows(2).map(|w| w[1] - w[0]).collect::<Vec<_>>()
    );
    // Healed after the minimum isolation (10 s): back within one fast interval.
    let wait = (ejected_us + 11_000_000 - now_us()).max(0);
    tokio::time::sleep(Duration::from_micros(wait as u64)).await;
    sim.set("e0", Behaviour::default()).unwrap();
    let healed = now_us();
    wait_until("readmitted in Postgres", Duration::from_secs(20), || async {
        query("recovering").await.is_some()
    })
    .await;
    let (_, back) = query("recovering").await.unwrap();
    let after = back.timestamp_micros() - healed;
    assert!(after < 1_000_000, "readmitted {after} µs after the heal");
    eprintln!("readmitted {} ms after the heal", after / 1000);
    let probes = seen.lock().unwrap().clone();
    assert!(probes.iter().any(|r| r.outcome == OutcomeClass::ConnectError));
    assert!(probes.iter().all(|r| r.prober == "test/e2e"));
    drop(p);
    vitals_testkit::drop_schema(&db, &schema).await;
    let _ = std::fs::remove_file(&config);
    sim.shutdown().await;
}
