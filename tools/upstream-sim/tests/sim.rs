//! The simulator against a real HTTP client: every fault mode answers as configured.

use futures::StreamExt;
use reqwest::header::HeaderName;
use std::time::{Duration, Instant};
use vitals_upstream_sim::{Behaviour, Dependency, DependencyStatus, Period, Sim, SimConfig, DECIDED_AT, DECIDED_TTFT};

async fn sim(behaviours: Vec<Behaviour>, seed: u64) -> Sim {
    let mut c = SimConfig::healthy(behaviours.len(), seed);
    for (e, b) in c.endpoints.iter_mut().zip(behaviours) {
        e.behaviour = b;
    }
    Sim::start(c).await.unwrap()
}

fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap()
}

fn url(sim: &Sim, name: &str, path: &str) -> String {
    format!("http://{}{path}", sim.addr(name).unwrap())
}

/// A streamed completion: (time to the role chunk, time to the first content token, content
/// chunks, whether it ended with [DONE]), or the error that broke it.
async fn stream(sim: &Sim, name: &str) -> Result<(Duration, Duration, usize, bool), String> {
    let started = Instant::now();
    let r = client()
        .post(url(sim, name, "/v1/chat/completions"))
        .json(&serde_json::json!({"model": "m", "stream": true, "max_tokens": 16,
            "messages": [{"role": "user", "content": "hi"}]}))
        .send()
        .await
        .map_err(|e| format!("send: {e}"))?;
    if !r.status().is_success() {
        return Err(format!("status {}", r.status().as_u16()));
    }
    let mut body = r.bytes_stream();
    let (mut role, mut first, mut tokens, mut done) = (None, None, 0, false);
    let mut buf = String::new();
    while let Some(chunk) = body.next().await {
        let chunk = chunk.map_err(|e| format!("body: {e}"))?;
        buf.push_str(std::str::from_utf8(&chunk).unwrap());
        while let Some(end) = buf.find("\n\n") {
            let event: String = buf.drain(..end + 2).collect();
            let data = event.trim().strip_prefix("data: ").unwrap().to_owned();
            if data == "[DONE]" {
                done = true;
                continue;
            }
            let v: serde_json::Value = serde_json::from_str(&data).unwrap();
            let delta = &v["choices"][0]["delta"];
            if delta["role"] == "assistant" {
                role.get_or_insert(started.elapsed());
            }
            if delta["content"].as_str().is_some_and(|c| !c.is_empty()) {
                first.get_or_insert(started.elapsed());
                tokens += 1;
            }
        }
    }
    Ok((role.unwrap(), first.unwrap(), tokens, done))
}

async fn status(sim: &Sim, name: &str, path: &str) -> Result<u16, String> {
    let c = client();
    let r = if path == "/v1/chat/completions" {
        c.post(url(sim, name, path))
            .json(&serde_json::json!({"model": "m", "messages": []}))
            .send()
            .await
    } else {
        c.get(url(sim, name, path)).send().await
    };
    let r = r.map_err(|e| format!("{e:?}"))?;
    let s = r.status().as_u16();
    r.bytes().await.map_err(|e| format!("body: {e}"))?;
    Ok(s)
}

#[tokio::test]
async fn a_streamed_completion_sends_its_first_content_token_after_the_ttft() {
    let sim = sim(
        vec![Behaviour {
            ttft_ms: 300,
            tokens: 5,
            token_ms: 20,
            ..Behaviour::default()
        }],
        1,
    )
    .await;
    let (role, first, tokens, done) = stream(&sim, "e0").await.unwrap();
    // What the simulator decided, not how long a busy machine took: the first token waits the
    // ttft, and the role chunk comes before it (lower bounds and order only: a busy machine can
    // only make things later).
    assert!(first >= Duration::from_millis(300), "{first:?}");
    assert!(
        role < first,
        "the role chunk comes before the first token: role {role:?}, first token {first:?}"
    );
    assert_eq!((tokens, done), (5, true));
    // Not streamed: one answer after every token.
    let started = Instant::now();
    let v: serde_json::Value = client()
        .post(url(&sim, "e0", "/v1/chat/completions"))
        .json(&serde_json::json!({"model": "m", "max_tokens": 2, "messages": []}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert!(started.elapsed() >= Duration::from_millis(320));
    assert_eq!(v["choices"][0]["message"]["content"], "tok tok");
    assert_eq!(v["usage"]["completion_tokens"], 2);
    sim.shutdown().await;
}

#[tokio::test]
async fn each_fault_answers_as_configured() {
    let sim = sim(
        vec![
            Behaviour {
                server_errors: 1.0,
                ..Behaviour::default()
            },
            Behaviour {
                rate_limited: 1.0,
                retry_after_s: Some(7),
                ..Behaviour::default()
            },
            Behaviour {
                client_errors: 1.0,
                ..Behaviour::default()
            },
            Behaviour {
                drops: 1.0,
                ..Behaviour::default()
            },
            Behaviour {
                hang: true,
                ..Behaviour::default()
            },
        ],
        1,
    )
    .await;
    let completions = "/v1/chat/completions";
    assert_eq!(status(&sim, "e0", completions).await, Ok(503));
    assert_eq!(status(&sim, "e0", "/health").await, Ok(503));
    let r = client()
        .post(url(&sim, "e1", completions))
        .json(&serde_json::json!({"messages": []}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 429);
    assert_eq!(r.headers()["retry-after"], "7");
    assert_eq!(
        status(&sim, "e1", "/health").await,
        Ok(200),
        "a health route sees no 429s"
    );
    assert_eq!(status(&sim, "e2", completions).await, Ok(400));
    assert_eq!(status(&sim, "e2", "/health").await, Ok(200));
    let dropped = stream(&sim, "e3").await.unwrap_err();
    assert!(dropped.starts_with("body"), "{dropped}");
    // A short answer may break before its headers are out: the client sees the connection close
    // either way, never a status.
    let dropped = status(&sim, "e3", "/health").await.unwrap_err();
    assert!(
        dropped.starts_with("body") || dropped.contains("IncompleteMessage") || dropped.contains("closed"),
        "{dropped}"
    );
    let hung = reqwest::Client::builder()
        .timeout(Duration::from_millis(300))
        .build()
        .unwrap()
        .get(url(&sim, "e4", "/health"))
        .send()
        .await
        .unwrap_err();
    assert!(hung.is_timeout(), "{hung:?}");
    sim.shutdown().await;
}

#[tokio::test]
async fn a_refusing_endpoint_closes_its_listener_and_heals_on_the_same_port() {
    let sim = sim(vec![Behaviour::default()], 1).await;
    let addr = sim.addr("e0").unwrap();
    assert_eq!(status(&sim, "e0", "/health").await, Ok(200));
    sim.set(
        "e0",
        Behaviour {
            refuse: true,
            ..Behaviour::default()
        },
    )
    .unwrap();
    let refused = vitals_wait(|| async { tokio::net::TcpStream::connect(addr).await.is_err() }).await;
    assert!(refused, "connections are refused");
    let err = status(&sim, "e0", "/health").await.unwrap_err();
    assert!(err.contains("Connect") || err.contains("connect"), "{err}");
    sim.set("e0", Behaviour::default()).unwrap();
    let back = vitals_wait(|| async { tokio::net::TcpStream::connect(addr).await.is_ok() }).await;
    assert!(back, "listening again on {addr}");
    assert_eq!(status(&sim, "e0", "/health").await, Ok(200));
    sim.shutdown().await;
}

/// Poll `f` until it holds, for at most 5 s.
async fn vitals_wait<F, Fut>(f: F) -> bool
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline {
        if f().await {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    false
}

#[tokio::test]
async fn a_periodic_fault_is_bad_then_good_in_turn() {
    let sim = sim(
        vec![
            Behaviour {
                server_errors: 1.0,
                period: Some(Period {
                    bad_ms: 600,
                    good_ms: 600,
                }),
                ..Behaviour::default()
            },
            Behaviour {
                refuse: true,
                period: Some(Period {
                    bad_ms: 600,
                    good_ms: 600,
                }),
                ..Behaviour::default()
            },
        ],
        1,
    )
    .await;
    let start = Instant::now();
    let addr = sim.addr("e1").unwrap();
    // The middle of each phase: bad, good, bad.
    let mut seen = Vec::new();
    for mid in [300u64, 900, 1500] {
        tokio::time::sleep_until((start + Duration::from_millis(mid)).into()).await;
        let s = status(&sim, "e0", "/health").await.unwrap();
        let listening = tokio::net::TcpStream::connect(addr).await.is_ok();
        seen.push((s, listening));
    }
    assert_eq!(seen, vec![(503, false), (200, true), (503, false)]);
    sim.shutdown().await;
}

#[tokio::test]
async fn the_first_token_ramps_over_the_configured_time() {
    let sim = sim(
        vec![Behaviour {
            ttft_ms: 100,
            ttft_to_ms: Some(2_100),
            ramp_ms: 2_000,
            tokens: 1,
            ..Behaviour::default()
        }],
        1,
    )
    .await;
    // What the simulator chose, at the point of the ramp it was at (its response headers), not
    // how long a busy machine took: the ramp is a line from 100 ms to 2,100 ms over 2 s, and the
    // first token comes no sooner than chosen.
    let mut chosen = Vec::new();
    for wait in [0u64, 1_000] {
        tokio::time::sleep(Duration::from_millis(wait)).await;
        let started = Instant::now();
        let r = client()
            .post(url(&sim, "e0", "/v1/chat/completions"))
            .json(&serde_json::json!({"model": "m", "stream": false, "max_tokens": 1,
                "messages": [{"role": "user", "content": "hi"}]}))
            .send()
            .await
            .unwrap();
        let header = |name: &HeaderName| -> u64 { r.headers()[name.as_str()].to_str().unwrap().parse().unwrap() };
        let (ttft, at) = (header(&DECIDED_TTFT), header(&DECIDED_AT));
        assert!(r.status().is_success());
        r.bytes().await.unwrap();
        let expected = 100 + at.min(2_000);
        assert!(
            ttft.abs_diff(expected) <= 1,
            "{at} ms into a ramp from 100 to 2,100 ms over 2 s: chose {ttft} ms, the ramp says {expected} ms"
        );
        assert!(
            started.elapsed() >= Duration::from_millis(ttft),
            "answered before its first token"
        );
        chosen.push((at, ttft));
    }
    assert!(
        chosen[1].0 >= chosen[0].0 + 1_000 && chosen[1].1 > chosen[0].1,
        "later on the ramp, a later first token: {chosen:?}"
    );
    sim.shutdown().await;
}

#[tokio::test]
async fn deep_health_reports_dependencies_and_fails_on_a_critical_one() {
    let dep = |name: &str, critical, status| Dependency {
        name: name.into(),
        critical,
        status,
    };
    let sim = sim(
        vec![
            Behaviour {
                dependencies: vec![
                    dep("db", true, DependencyStatus::Down),
                    dep("cache", false, DependencyStatus::Up),
                ],
                ..Behaviour::default()
            },
            Behaviour {
                dependencies: vec![dep("search", false, DependencyStatus::Down)],
                ..Behaviour::default()
            },
        ],
        1,
    )
    .await;
    let r = client().get(url(&sim, "e0", "/health/deep")).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 503);
    let v: serde_json::Value = r.json().await.unwrap();
    assert_eq!(v["status"], "down");
    assert_eq!(
        v["dependencies"][0],
        serde_json::json!({"name": "db", "critical": true, "status": "down"})
    );
    let r = client().get(url(&sim, "e1", "/health/deep")).send().await.unwrap();
    assert_eq!(
        r.status().as_u16(),
        200,
        "a non-critical dependency down is not a failure"
    );
    let v: serde_json::Value = r.json().await.unwrap();
    assert_eq!(v["dependencies"][0]["status"], "down");
    sim.shutdown().await;
}

#[tokio::test]
async fn the_same_seed_gives_the_same_faults() {
    let half = || Behaviour {
        server_errors: 0.5,
        ..Behaviour::default()
    };
    let mut runs = Vec::new();
    for seed in [5, 5, 6] {
        let sim = sim(vec![half()], seed).await;
        let mut statuses = Vec::new();
        for _ in 0..40 {
            statuses.push(status(&sim, "e0", "/health").await.unwrap());
        }
        sim.shutdown().await;
        runs.push(statuses);
    }
    assert_eq!(runs[0], runs[1]);
    assert_ne!(runs[0], runs[2], "another seed, other faults");
    let errors = runs[0].iter().filter(|s| **s == 503).count();
    assert!((10..=30).contains(&errors), "about half: {errors} of 40");
}

#[tokio::test]
async fn the_admin_api_replaces_behaviour_and_names_a_bad_field() {
    let sim = sim(vec![Behaviour::default()], 1).await;
    let admin = format!("http://{}", sim.admin_addr());
    let c = client();
    let r = c
        .put(format!("{admin}/endpoints/e0"))
        .json(&serde_json::json!({"server_errors": 2.0}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 400);
    let v: serde_json::Value = r.json().await.unwrap();
    assert_eq!(v["field"], "server_errors");
    let r = c
        .put(format!("{admin}/endpoints/e0"))
        .json(&serde_json::json!({"server_error": 1.0}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 400);
    let v: serde_json::Value = r.json().await.unwrap();
    assert!(v["error"].as_str().unwrap().contains("server_error"), "{v}");
    let r = c
        .put(format!("{admin}/endpoints/nope"))
        .json(&serde_json::json!({}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 404);
    assert_eq!(status(&sim, "e0", "/health").await, Ok(200));
    let r = c
        .put(format!("{admin}/endpoints/e0"))
        .json(&serde_json::json!({"server_errors": 1.0}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    assert_eq!(status(&sim, "e0", "/health").await, Ok(503));
    let list: serde_json::Value = c
        .get(format!("{admin}/endpoints"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(list[0]["behaviour"]["server_errors"], 1.0);
    assert_eq!(list[0]["requests"], 2);
    sim.shutdown().await;
}

#[test]
fn a_configuration_error_names_the_line_and_the_field() {
    let err = SimConfig::from_toml("seed = 1\n[[endpoint]]\nname = \"a\"\nport = \"x\"\n")
        .unwrap_err()
        .to_string();
    assert!(err.contains("line 4") && err.contains("port"), "{err}");
    let err = SimConfig::from_toml("[[endpoint]]\nname = \"a\"\n[endpoint.behaviour]\ndrops = 1.5\n")
        .unwrap_err()
        .to_string();
    assert!(err.contains("behaviour.drops"), "{err}");
    let err = SimConfig::from_toml("[[endpoint]]\nname = \"a\"\n[endpoint.behaviour]\nttft = 5\n")
        .unwrap_err()
        .to_string();
    assert!(err.contains("ttft") && err.contains("line 4"), "{err}");
    let ok = SimConfig::from_toml(
        "seed = 3\nadmin = \"127.0.0.1:0\"\n[[endpoint]]\nname = \"a\"\n[endpoint.behaviour]\nttft_ms = 900\nperiod = { bad_ms = 10000, good_ms = 10000 }\n",
    )
    .unwrap();
    assert_eq!(ok.endpoints[0].behaviour.ttft_ms, 900);
    let shipped = SimConfig::from_toml(include_str!("../../../deploy/upstream-sim/sim.toml")).unwrap();
    assert_eq!(shipped.endpoints.len(), 2);
}
