//! Each probe kind against the simulator in each fault mode gives the right outcome class.

use std::time::Duration;
use vitals_contracts::{DependencyStatus, OutcomeClass};
use vitals_prober::config::{parse, Target};
use vitals_prober::probe::{Clients, Observation};
use vitals_upstream_sim::{Behaviour, Dependency, Sim, SimConfig};

async fn sim(behaviours: Vec<Behaviour>) -> Sim {
    let mut c = SimConfig::healthy(behaviours.len(), 3);
    for (e, b) in c.endpoints.iter_mut().zip(behaviours) {
        e.behaviour = b;
    }
    Sim::start(c).await.unwrap()
}

fn target(kind: &str, location: &str, extra: &str) -> Target {
    let place = if kind == "tcp" {
        format!("address = \"{location}\"")
    } else {
        format!("url = \"{location}\"")
    };
    let text = format!(
        "[[target]]\nid = \"t\"\npool = \"p\"\nendpoint = \"e\"\nkind = \"{kind}\"\n{place}\ntimeout_ms = 400\n{extra}\n"
    );
    parse(&text).unwrap().remove(0)
}

async fn probe(kind: &str, sim: &Sim, ep: &str, path: &str, extra: &str) -> Observation {
    let addr = sim.addr(ep).unwrap();
    let location = if kind == "tcp" {
        addr.to_string()
    } else {
        format!("http://{addr}{path}")
    };
    Clients::new().unwrap().probe(&target(kind, &location, extra), 7).await
}

fn faults() -> Vec<Behaviour> {
    vec![
        Behaviour::default(),
        Behaviour {
            server_errors: 1.0,
            ..Behaviour::default()
        },
        Behaviour {
            drops: 1.0,
            ..Behaviour::default()
        },
        Behaviour {
            refuse: true,
            ..Behaviour::default()
        },
        Behaviour {
            hang: true,
            ..Behaviour::default()
        },
        Behaviour {
            rate_limited: 1.0,
            retry_after_s: Some(3),
            ..Behaviour::default()
        },
        Behaviour {
            client_errors: 1.0,
            ..Behaviour::default()
        },
    ]
}

#[tokio::test]
async fn http_and_tcp_probes_classify_every_fault() {
    let sim = sim(faults()).await;
    let http = |ep: &'static str| {
        let sim = &sim;
        async move { probe("http", sim, ep, "/health", "").await.outcome }
    };
    assert_eq!(http("e0").await, OutcomeClass::Success);
    assert_eq!(http("e1").await, OutcomeClass::ServerError);
    assert_eq!(http("e2").await, OutcomeClass::ConnectionDropped);
    assert_eq!(http("e3").await, OutcomeClass::ConnectError);
    assert_eq!(http("e4").await, OutcomeClass::Timeout);
    let tcp = |ep: &'static str| {
        let sim = &sim;
        async move { probe("tcp", sim, ep, "", "").await.outcome }
    };
    assert_eq!(tcp("e0").await, OutcomeClass::Success);
    assert_eq!(tcp("e3").await, OutcomeClass::ConnectError);
    sim.shutdown().await;
}

#[tokio::test]
async fn completion_probes_classify_every_fault() {
    let sim = sim(faults()).await;
    let extra = "model = \"m\"\nmax_tokens = 3";
    let mut seen = Vec::new();
    for ep in ["e0", "e1", "e2", "e3", "e4", "e5", "e6"] {
        seen.push(
            probe("completion", &sim, ep, "/v1/chat/completions", extra)
                .await
                .outcome,
        );
    }
    assert_eq!(
        seen,
        vec![
            OutcomeClass::Success,
            OutcomeClass::ServerError,
            OutcomeClass::ConnectionDropped,
            OutcomeClass::ConnectError,
            OutcomeClass::Timeout,
            OutcomeClass::RateLimited,
            OutcomeClass::InvalidResponse,
        ]
    );
    sim.shutdown().await;
}

#[tokio::test]
async fn a_completion_probe_measures_the_first_token_within_five_ms() {
    let sim = sim(vec![Behaviour {
        ttft_ms: 200,
        tokens: 4,
        token_ms: 30,
        ..Behaviour::default()
    }])
    .await;
    let mut ttft = Vec::new();
    let mut tpot = Vec::new();
    for _ in 0..5 {
        let o = probe("completion", &sim, "e0", "/v1/chat/completions", "model = \"m\"").await;
        assert_eq!((o.outcome, o.tokens), (OutcomeClass::Success, 4), "{o:?}");
        ttft.push(o.ttft.unwrap());
        tpot.push(o.tpot.unwrap());
    }
    ttft.sort();
    tpot.sort();
    let (t, p) = (ttft[2], tpot[2]);
    assert!(
        t >= Duration::from_millis(195) && t <= Duration::from_millis(205),
        "median first token {t:?} of {ttft:?}"
    );
    assert!(
        p >= Duration::from_millis(25) && p <= Duration::from_millis(35),
        "median time per token {p:?}"
    );
    sim.shutdown().await;
}

#[tokio::test]
async fn body_assertions_and_the_dependency_report() {
    let dep = |name: &str, critical, status| Dependency {
        name: name.into(),
        critical,
        status,
    };
    let sim = sim(vec![Behaviour {
        dependencies: vec![
            dep("db", true, vitals_upstream_sim::DependencyStatus::Down),
            dep("cache", false, vitals_upstream_sim::DependencyStatus::Up),
        ],
        ..Behaviour::default()
    }])
    .await;
    let ok = probe(
        "http",
        &sim,
        "e0",
        "/health",
        "body_regex = \"\\\"status\\\":\\\"ok\\\"\"",
    )
    .await;
    assert_eq!(ok.outcome, OutcomeClass::Success, "{ok:?}");
    let bad = probe("http", &sim, "e0", "/health", "body_regex = \"degraded\"").await;
    assert_eq!(bad.outcome, OutcomeClass::InvalidResponse);
    assert!(bad.detail.contains("degraded"), "{}", bad.detail);
    let ok = probe(
        "http",
        &sim,
        "e0",
        "/health",
        "body_json_pointer = \"/status\"\nbody_equals = \"ok\"",
    )
    .await;
    assert_eq!(ok.outcome, OutcomeClass::Success, "{ok:?}");
    let bad = probe(
        "http",
        &sim,
        "e0",
        "/health",
        "body_json_pointer = \"/endpoint\"\nbody_equals = \"e9\"",
    )
    .await;
    assert_eq!(bad.outcome, OutcomeClass::InvalidResponse);
    let deep = probe("deep_health", &sim, "e0", "/health/deep", "").await;
    assert_eq!((deep.outcome, deep.http_status), (OutcomeClass::Success, Some(503)));
    assert_eq!(deep.dependencies.len(), 2);
    assert_eq!(deep.dependencies[0].name, "db");
    assert!(deep.dependencies[0].critical);
    assert_eq!(deep.dependencies[0].status, DependencyStatus::Down);
    assert_eq!(deep.dependencies[1].status, DependencyStatus::Up);
    let plain = probe("deep_health", &sim, "e0", "/health", "").await;
    assert_eq!(plain.outcome, OutcomeClass::InvalidResponse, "no dependencies listed");
    sim.shutdown().await;
}
