//! The router in-process against the simulator and the real broker: streams pass through,
//! calls are reported, a refused connection is retried on another endpoint, and an endpoint the
//! health view says is out gets no calls.
//!
//! Needs the local stack (Kafka and Postgres, started by `scripts/test.sh`): run `scripts/test.sh`.
// Needs the local stack and its peers: `scripts/test.sh` runs it (`--features stack`).
#![cfg(feature = "stack")]

use futures::StreamExt;
use rdkafka::producer::FutureRecord;
use rdkafka::Message;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;
use vitals_contracts::{decode_signal, encode, HealthState, OutcomeClass, Signal};
use vitals_reporter::Reporter;
use vitals_router::{router, Proxy, Routes};
use vitals_testkit::{brokers, http_get, producer, read_n, unique, wait_until, Stamp, Topics};
use vitals_upstream_sim::{Behaviour, Sim, SimConfig};

/// Send `n` streamed completions; returns how many each endpoint served, and checks each stream
/// arrived whole.
async fn load(port: u16, n: usize) -> BTreeMap<String, usize> {
    let client = reqwest::Client::new();
    let mut served = BTreeMap::new();
    for _ in 0..n {
        let r = client
            .post(format!("http://127.0.0.1:{port}/v1/chat/completions"))
            .json(&serde_json::json!({"model": "gpt-sim", "stream": true, "max_tokens": 3, "messages": []}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), 200);
        let ep = r.headers()["x-vitals-endpoint"].to_str().unwrap().to_owned();
        let mut body = Vec::new();
        let mut s = r.bytes_stream();
        while let Some(c) = s.next().await {
            body.extend_from_slice(&c.unwrap());
        }
        let text = String::from_utf8(body).unwrap();
        assert!(text.ends_with("data: [DONE]\n\n"), "{text}");
        assert_eq!(text.matches("\"content\":\"tok \"").count(), 3);
        *served.entry(ep).or_default() += 1;
    }
    served
}

/// The router on `routes` (TOML), reporting to and following `topics`: its port, reporter and
/// health view.
async fn serve(routes: &str, topics: &Topics) -> (u16, Arc<Reporter>, vitals_healthview::Follower) {
    let routes = Routes::parse(routes).unwrap();
    let mut rc = vitals_reporter::Config::new(brokers());
    rc.topic = topics.signals.clone();
    // One record per call: the tests read each call's report (the binary sums by default).
    rc.summarize = None;
    let reporter = Arc::new(Reporter::new(rc).unwrap());
    let mut vc = vitals_healthview::Config::new(brokers());
    vc.state_topic = topics.state.clone();
    vc.changes_topic = topics.changes.clone();
    let follower = tokio::task::spawn_blocking(move || vitals_healthview::follow(vc))
        .await
        .unwrap()
        .unwrap();
    let proxy = Arc::new(Proxy::new(routes, follower.view.clone(), reporter.clone()).unwrap());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move { axum::serve(listener, router(proxy)).await });
    (port, reporter, follower)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_pass_through_calls_are_reported_and_an_ejected_endpoint_gets_none() {
    let mut sc = SimConfig::healthy(2, 1);
    for e in &mut sc.endpoints {
        e.behaviour.ttft_ms = 30;
    }
    let sim = Sim::start(sc).await.unwrap();
    let topics = Topics::create(&unique("router"), 1, Stamp::LogAppendTime).await;
    let mut routes = String::from("gateway = \"router-test\"\n[[pool]]\nname = \"llm\"\nmodels = [\"gpt-sim\"]\n");
    for (name, addr) in sim.endpoints() {
        routes.push_str(&format!(
            "[[pool.upstream]]\nname = \"{name}\"\nurl = \"http://{addr}\"\n"
        ));
    }
    let (port, reporter, follower) = serve(&routes, &topics).await;
    let view = follower.view.clone();

    let served = load(port, 30).await;
    assert!(
        served.get("e0").is_some_and(|n| *n > 3) && served.get("e1").is_some_and(|n| *n > 3),
        "{served:?}"
    );
    // e0 refuses connections: every call still succeeds, on e1.
    sim.set(
        "e0",
        Behaviour {
            refuse: true,
            ..Behaviour::default()
        },
    )
    .unwrap();
    let served = load(port, 20).await;
    assert_eq!(served.get("e1"), Some(&20), "{served:?}");
    let r = reporter.clone();
    assert!(tokio::task::spawn_blocking(move || r.flush(Duration::from_secs(10)))
        .await
        .unwrap());
    let c = reporter.counters();
    let messages = read_n(&topics.signals, c.delivered as usize, Duration::from_secs(20)).await;
    let mut by_class: BTreeMap<(String, OutcomeClass), usize> = BTreeMap::new();
    for m in &messages {
        let Ok(Signal::Call(call)) = decode_signal(m.payload().unwrap()) else {
            panic!("a call")
        };
        assert_eq!(call.gateway, "router-test");
        if call.outcome == OutcomeClass::Success {
            let ttft = call.ttft_us.unwrap();
            assert!((30_000..200_000).contains(&ttft), "first token measured: {ttft} µs");
        }
        *by_class.entry((call.endpoint.clone(), call.outcome)).or_default() += 1;
    }
    assert_eq!(
        messages.len(),
        50 + by_class
            .get(&("e0".into(), OutcomeClass::ConnectError))
            .copied()
            .unwrap_or(0)
    );
    assert!(
        by_class.contains_key(&("e0".into(), OutcomeClass::ConnectError)),
        "{by_class:?}"
    );
    // The view says e0 is out (weight 0) and its trial not due: healed or not, it
    // gets no calls (the trial call is the health view's tests').
    let out = vitals_contracts::HealthChanged {
        retry_at: Some(i64::MAX / 2),
        ..vitals_testkit::health_changed("llm", "e0", 1, HealthState::Unhealthy)
    };
    producer()
        .send(
            FutureRecord::to(&topics.changes)
                .key("llm/e0")
                .payload(&encode(&out).unwrap()),
            Duration::from_secs(5),
        )
        .await
        .unwrap();
    let v = view.clone();
    wait_until("the view has e0 out", Duration::from_secs(10), || {
        let w = v.weight("llm", "e0", 2);
        async move { w == Some(0.0) }
    })
    .await;
    sim.set("e0", Behaviour::default()).unwrap();
    let served = load(port, 20).await;
    assert_eq!(served.get("e1"), Some(&20), "{served:?}");
    drop(follower);
    sim.shutdown().await;
}

/// A pool with a first-token deadline: a call whose first token is late still streams whole to
/// its user, but is reported as a timeout when the deadline passes, once; /metrics says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_first_token_is_reported_at_the_pools_deadline() {
    let mut sc = SimConfig::healthy(1, 1);
    sc.endpoints[0].behaviour.ttft_ms = 400;
    let sim = Sim::start(sc).await.unwrap();
    let topics = Topics::create(&unique("router_ttft"), 1, Stamp::LogAppendTime).await;
    let (name, addr) = &sim.endpoints()[0];
    let routes = format!(
        "gateway = \"router-ttft\"\n[[pool]]\nname = \"llm\"\nmodels = [\"gpt-sim\"]\nttft_deadline_ms = 100\n[[pool.upstream]]\nname = \"{name}\"\nurl = \"http://{addr}\"\n"
    );
    let (port, reporter, _follower) = serve(&routes, &topics).await;
    let served = load(port, 3).await;
    assert_eq!(served.get("e0"), Some(&3), "every call served whole");
    let r = reporter.clone();
    assert!(tokio::task::spawn_blocking(move || r.flush(Duration::from_secs(10)))
        .await
        .unwrap());
    let messages = read_n(&topics.signals, 3, Duration::from_secs(20)).await;
    for m in &messages {
        let Ok(Signal::Call(call)) = decode_signal(m.payload().unwrap()) else {
            panic!("a call")
        };
        assert_eq!((call.outcome, call.latency_us), (OutcomeClass::Timeout, 100_000));
        assert_eq!(
            call.attributes.get("vitals.early").map(String::as_str),
            Some("ttft_deadline")
        );
    }
    let metrics = http_get(port, "/metrics").await.unwrap();
    for line in [
        "vitals_reporter_reports_total{result=\"early\"} 3",
        "vitals_reporter_reports_total{result=\"superseded\"} 3",
        "vitals_reporter_reports_total{result=\"delivered\"} 3",
    ] {
        assert!(metrics.lines().any(|l| l == line), "{line} in\n{metrics}");
    }
    sim.shutdown().await;
}
