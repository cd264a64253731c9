//! The alerter against a real Alertmanager (Debian's prometheus-alertmanager, started by
//! `scripts/stack.sh am-run`, with the shipped
//! deploy/alertmanager/alertmanager.yml, its timings shortened) and a local webhook receiver:
//! fire, group by pool, resolve, inhibit during a correlated outage, Alertmanager restarted
//! mid-incident, and the alerter restarted (it rebuilds what is firing from the topic and
//! delivers what came after its committed offset).
//!
//! Needs the local stack (Kafka and Postgres, started by `scripts/test.sh`): run `scripts/test.sh`.
// Needs the local stack and its peers: `scripts/test.sh` runs it (`--features stack`).
#![cfg(feature = "stack")]

use axum::extract::{Path, State};
use axum::routing::post;
use axum::Json;
use rdkafka::producer::FutureRecord;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use vitals_contracts::{encode, HealthChanged, HealthState, PoolHealthChanged};
use vitals_testkit::{brokers, free_port, producer, unique, wait_until, Service, Stamp, Topics};

type Received = Arc<Mutex<Vec<(String, serde_json::Value)>>>;

async fn receive(State(r): State<Received>, Path(path): Path<String>, Json(v): Json<serde_json::Value>) {
    r.lock().unwrap().push((path, v));
}

fn change(pool: &str, ep: &str, seq: i64, to: HealthState) -> HealthChanged {
    HealthChanged {
        weight: if to == HealthState::Unhealthy { 0.0 } else { 0.1 },
        reason: "test".into(),
        stream_time: now_us(),
        ..vitals_testkit::health_changed(pool, ep, seq, to)
    }
}

fn now_us() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_micros() as i64
}

/// Alertmanager's view of an alert: (state, inhibited by).
async fn am_alert(port: u16, endpoint: &str) -> Option<(String, usize)> {
    let v: serde_json::Value = reqwest::get(format!("http://127.0.0.1:{port}/api/v2/alerts"))
        .await
        .ok()?
        .json()
        .await
        .ok()?;
    v.as_array()?
        .iter()
        .find(|a| a["labels"]["endpoint"] == endpoint)
        .map(|a| {
            (
                a["status"]["state"].as_str().unwrap_or("").to_owned(),
                a["status"]["inhibitedBy"].as_array().map_or(0, Vec::len),
            )
        })
}

/// A real Alertmanager on a free port running the shipped configuration, pointed at a webhook
/// receiver on `hook_port` and made quick, once it is ready: (its config file, port, process).
async fn alertmanager(hook_port: u16) -> (std::path::PathBuf, u16, Service) {
    let shipped = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../deploy/alertmanager/alertmanager.yml"
    ))
    .unwrap();
    let config = shipped
        .replace(
            "http://127.0.0.1:5001/hook",
            &format!("http://127.0.0.1:{hook_port}/hook"),
        )
        .replace("group_wait: 30s", "group_wait: 200ms")
        .replace("group_interval: 5m", "group_interval: 500ms");
    assert_ne!(config, shipped);
    let config_path = std::env::temp_dir().join(format!("{}.yml", unique("am")));
    std::fs::write(&config_path, config).unwrap();
    let am_port = free_port();
    let am = vitals_testkit::alertmanager(&config_path, am_port);
    wait_until("Alertmanager ready", Duration::from_secs(30), || async move {
        reqwest::get(format!("http://127.0.0.1:{am_port}/-/ready"))
            .await
            .is_ok_and(|r| r.status().is_success())
    })
    .await;
    (config_path, am_port, am)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn alerts_fire_group_resolve_inhibit_and_survive_restarts() {
    let topics = Topics::create(&unique("alerter"), 2, Stamp::LogAppendTime).await;
    // The webhook receiver: Alertmanager's notifications on /hook, the Slack-style posts on /slack.
    let received: Received = Arc::default();
    let app = axum::Router::new()
        .route("/{path}", post(receive))
        .with_state(received.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let hook_port = listener.local_addr().unwrap().port();
    tokio::spawn(async move { axum::serve(listener, app).await });
    let (config_path, am_port, mut am) = alertmanager(hook_port).await;

    let group = unique("alerter");
    let args: Vec<String> = [
        "--brokers",
        &brokers(),
        "--changes-topic",
        &topics.changes,
        "--group",
        &group,
        "--alertmanager-url",
        &format!("http://127.0.0.1:{am_port}"),
        "--webhook-url",
        &format!("http://127.0.0.1:{hook_port}/slack"),
        "--resend-secs",
        "1",
        "--api-url",
        "http://vitals-api:8080",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let mut alerter = Service::start("vitals-alerter", "alerter", &args);
    let p = producer();
    let send = |key: String, bytes: Vec<u8>| {
        let (p, topic) = (p.clone(), topics.changes.clone());
        async move {
            p.send(
                FutureRecord::to(&topic).key(&key).payload(&bytes),
                Duration::from_secs(5),
            )
            .await
            .unwrap();
        }
    };
    let notified = |want: Box<dyn Fn(&serde_json::Value) -> bool + Send>| {
        let r = received.clone();
        async move {
            let r2 = r.clone();
            wait_until("a notification", Duration::from_secs(30), move || {
                let hit = r2.lock().unwrap().iter().any(|(path, v)| path == "hook" && want(v));
                async move { hit }
            })
            .await;
        }
    };
    let has = |v: &serde_json::Value, endpoint: &str, status: &str| {
        v["alerts"].as_array().is_some_and(|a| {
            a.iter()
                .any(|a| a["labels"]["endpoint"] == endpoint && a["status"] == status)
        })
    };

    // Fire: p1/e1 out of rotation.
    send(
        "p1/e1".into(),
        encode(&change("p1", "e1", 1, HealthState::Unhealthy)).unwrap(),
    )
    .await;
    notified(Box::new(move |v| has(v, "e1", "firing"))).await;
    {
        let r = received.lock().unwrap();
        let (_, v) = r.iter().find(|(p, v)| p == "hook" && has(v, "e1", "firing")).unwrap();
        let a = &v["alerts"][0];
        assert_eq!(a["labels"]["alertname"], "VitalsEndpointOutOfRotation");
        assert_eq!(a["labels"]["reason_code"], "ejected");
        assert_eq!(
            a["annotations"]["history"],
            "http://vitals-api:8080/v1/transitions?pool=p1&endpoint=e1"
        );
        assert!(r.iter().any(|(p, v)| p == "slack"
            && v["text"]
                .as_str()
                .unwrap()
                .starts_with("[FIRING] VitalsEndpointOutOfRotation: p1/e1")));
    }
    // Group: a second endpoint of the same pool comes in the same group.
    send(
        "p1/e2".into(),
        encode(&change("p1", "e2", 1, HealthState::Unhealthy)).unwrap(),
    )
    .await;
    notified(Box::new(move |v| {
        v["groupLabels"]["pool"] == "p1" && has(v, "e1", "firing") && has(v, "e2", "firing")
    }))
    .await;
    // Resolve: e1 is back.
    send(
        "p1/e1".into(),
        encode(&change("p1", "e1", 2, HealthState::Recovering)).unwrap(),
    )
    .await;
    notified(Box::new(move |v| has(v, "e1", "resolved"))).await;

    // Inhibit: pool p2 in a correlated outage; its endpoint's alert is silenced.
    let outage = PoolHealthChanged {
        pool: "p2".into(),
        seq: 1,
        endpoints: 2,
        healthy: 0,
        ejected: 1,
        healthy_fraction: 0.0,
        panic: false,
        correlated_outage: true,
        reason: "test".into(),
        policy_version: 0,
        stream_time: now_us(),
        faulty_reporters: vec![],
    };
    send("p2".into(), encode(&outage).unwrap()).await;
    send(
        "p2/e3".into(),
        encode(&change("p2", "e3", 1, HealthState::Unhealthy)).unwrap(),
    )
    .await;
    wait_until("e3 inhibited by the outage", Duration::from_secs(30), || async move {
        am_alert(am_port, "e3")
            .await
            .is_some_and(|(state, by)| state == "suppressed" && by > 0)
    })
    .await;
    notified(Box::new(|v| {
        v["alerts"]
            .as_array()
            .is_some_and(|a| a.iter().any(|a| a["labels"]["alertname"] == "VitalsCorrelatedOutage"))
    }))
    .await;
    assert!(
        !received
            .lock()
            .unwrap()
            .iter()
            .any(|(p, v)| p == "hook" && has(v, "e3", "firing")),
        "no page for an endpoint of a pool in a correlated outage"
    );

    // Alertmanager restarted mid-incident (its storage gone): the re-sends restore e2.
    am.kill9();
    am = vitals_testkit::alertmanager(&config_path, am_port);
    wait_until(
        "e2 firing again in the new Alertmanager",
        Duration::from_secs(30),
        || async move {
            am_alert(am_port, "e2")
                .await
                .is_some_and(|(state, _)| state == "active")
        },
    )
    .await;

    // The alerter restarted: e2 comes back while it is down; the new one rebuilds from the topic
    // and resolves e2.
    alerter.kill9();
    send(
        "p1/e2".into(),
        encode(&change("p1", "e2", 2, HealthState::Recovering)).unwrap(),
    )
    .await;
    let _alerter = Service::start("vitals-alerter", "alerter", &args);
    notified(Box::new(move |v| has(v, "e2", "resolved"))).await;
    drop(am);
}

/// Alertmanager's active alerts named `name` for `endpoint`: their summaries.
async fn am_active(port: u16, name: &str, endpoint: &str) -> Option<Vec<String>> {
    let v: serde_json::Value = reqwest::get(format!("http://127.0.0.1:{port}/api/v2/alerts?active=true"))
        .await
        .ok()?
        .json()
        .await
        .ok()?;
    Some(
        v.as_array()?
            .iter()
            .filter(|a| a["labels"]["alertname"] == name && a["labels"]["endpoint"] == endpoint)
            .filter(|a| a["status"]["state"] == "active")
            .map(|a| a["annotations"]["summary"].as_str().unwrap_or("").to_owned())
            .collect(),
    )
}

/// With `--availability-below 0.99 --availability-window-secs 60`, an endpoint out of rotation
/// 10 s of the last minute (stream time, advanced by ticks on the changes topic) has a firing
/// `VitalsEndpointAvailabilityLow` in a real Alertmanager, resolved once the window holds no
/// outage.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_availability_alert_fires_below_its_threshold_and_resolves() {
    let topics = Topics::create(&unique("avail"), 1, Stamp::LogAppendTime).await;
    let (_, am_port, _am) = alertmanager(free_port()).await;
    let args: Vec<String> = [
        "--brokers",
        &brokers(),
        "--changes-topic",
        &topics.changes,
        "--group",
        &unique("avail"),
        "--alertmanager-url",
        &format!("http://127.0.0.1:{am_port}"),
        "--resend-secs",
        "1",
        "--availability-below",
        "0.99",
        "--availability-window-secs",
        "60",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let _alerter = Service::start("vitals-alerter", "alerter", &args);
    let p = producer();
    let send = |bytes: Vec<u8>| {
        let (p, topic) = (p.clone(), topics.changes.clone());
        async move {
            p.send(
                FutureRecord::to(&topic).key("p9/e9").payload(&bytes),
                Duration::from_secs(5),
            )
            .await
            .unwrap();
        }
    };
    // Stream times in the past, so that Alertmanager takes a resolution as done at once.
    let t = now_us() - 300_000_000;
    let s = 1_000_000;
    let tick = |at: i64| {
        encode(&vitals_contracts::Tick {
            ticker: "processor-test".into(),
            emitted_at: at,
        })
        .unwrap()
    };
    send(
        encode(&HealthChanged {
            stream_time: t,
            ..change("p9", "e9", 1, HealthState::Unhealthy)
        })
        .unwrap(),
    )
    .await;
    send(
        encode(&HealthChanged {
            stream_time: t + 10 * s,
            ..change("p9", "e9", 2, HealthState::Recovering)
        })
        .unwrap(),
    )
    .await;
    send(tick(t + 50 * s)).await;
    wait_until(
        "the availability alert in Alertmanager",
        Duration::from_secs(60),
        || async move {
            am_active(am_port, "VitalsEndpointAvailabilityLow", "e9")
                .await
                .is_some_and(|v| v.len() == 1)
        },
    )
    .await;
    let summary = am_active(am_port, "VitalsEndpointAvailabilityLow", "e9").await.unwrap();
    assert!(
        summary[0].contains("p9/e9 was in rotation 83.333 % of the last 60 s (alert below 99.000 %)"),
        "{summary:?}"
    );
    // A minute later the window holds no outage: resolved.
    send(tick(t + 120 * s)).await;
    wait_until(
        "the availability alert resolved",
        Duration::from_secs(60),
        || async move {
            am_active(am_port, "VitalsEndpointAvailabilityLow", "e9")
                .await
                .is_some_and(|v| v.is_empty())
        },
    )
    .await;
}

/// With `--success-below 0.99 --success-min-calls 20`, the alerter reads request availability
/// from a real API over a schema holding counted calls: an endpoint 40 of 100 of whose calls
/// succeeded in the window has a firing `VitalsEndpointSuccessLow` in a real Alertmanager with
/// its true figure, one with 5 calls (too few) and one whose calls all succeeded have none; once
/// its calls succeed again (10,000 more) it resolves. Without `--api-url` the rule is refused at
/// start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_success_alert_fires_from_the_apis_figures_and_resolves() {
    let name = unique("success");
    let topics = Topics::create(&name, 1, Stamp::LogAppendTime).await;
    let db = vitals_testkit::migrated_schema(&name).await;
    const MIN: i64 = 60_000_000;
    let minute = now_us().div_euclid(MIN) * MIN - 2 * MIN;
    for ep in ["s1", "s2", "s3"] {
        sqlx::query(
            "INSERT INTO endpoint_state (pool, endpoint, seq, state, weight, ramp_ms, score, failure_rate, since, reason, policy_version, first_seen)
             VALUES ('sp/1', $1, 0, 'healthy', 1, 0, 100, 0, now(), 'r', 0, now() - interval '1 hour')",
        )
        .bind(ep)
        .execute(&db)
        .await
        .unwrap();
    }
    let calls = |succeeded: i64, failed: i64| vitals_contracts::Requests {
        succeeded,
        failed,
        ..Default::default()
    };
    use vitals_testkit::uptime::insert_requests;
    insert_requests(&db, "sp/1", "s1", minute, calls(40, 60)).await;
    insert_requests(&db, "sp/1", "s2", minute, calls(0, 5)).await;
    insert_requests(&db, "sp/1", "s3", minute, calls(100, 0)).await;
    let api_port = free_port();
    let _api = vitals_testkit::start_api(&topics, &name, api_port, &[]).await;
    let (_, am_port, _am) = alertmanager(free_port()).await;
    let api_url = format!("http://127.0.0.1:{api_port}");
    let am_url = format!("http://127.0.0.1:{am_port}");
    let mut args: Vec<String> = [
        "--brokers",
        &brokers(),
        "--changes-topic",
        &topics.changes,
        "--group",
        &name,
        "--alertmanager-url",
        &am_url,
        "--success-below",
        "0.99",
        "--success-window-secs",
        "600",
        "--success-check-secs",
        "1",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    // Without the API's URL there is nothing to read the figures from: refused at start.
    let refused = std::process::Command::new(vitals_testkit::binary("vitals-alerter"))
        .args(&args)
        .output()
        .unwrap();
    assert!(!refused.status.success());
    let err = String::from_utf8_lossy(&refused.stderr);
    assert!(
        err.contains("--success-below reads request availability from the API: give --api-url"),
        "{err}"
    );
    args.extend(["--api-url".to_string(), api_url]);
    let _alerter = Service::start("vitals-alerter", "alerter-success", &args);
    wait_until(
        "the success alert in Alertmanager",
        Duration::from_secs(60),
        || async move {
            am_active(am_port, "VitalsEndpointSuccessLow", "s1")
                .await
                .is_some_and(|v| v.len() == 1)
        },
    )
    .await;
    let summary = am_active(am_port, "VitalsEndpointSuccessLow", "s1").await.unwrap();
    assert_eq!(
        summary,
        vec!["sp/1/s1: 40.000 % of 100 calls succeeded over the last 600 s (alert below 99.000 %)".to_string()]
    );
    for quiet in ["s2", "s3"] {
        assert_eq!(
            am_active(am_port, "VitalsEndpointSuccessLow", quiet).await,
            Some(vec![]),
            "{quiet}"
        );
    }
    insert_requests(&db, "sp/1", "s1", minute + MIN, calls(10_000, 0)).await;
    wait_until("the success alert resolved", Duration::from_secs(60), || async move {
        am_active(am_port, "VitalsEndpointSuccessLow", "s1")
            .await
            .is_some_and(|v| v.is_empty())
    })
    .await;
}
