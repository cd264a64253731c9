//! vitals with the real nginx (Debian's 1.22) and the real broker, database, processor, prober
//! and upstream simulator: nginx's access log, in the shipped JSON format
//! (`deploy/nginx/vitals.conf`) over syslog (UDP), reaches vitals through `vitals-logbridge`;
//! an upstream answering 503 is retried by nginx on the next one, each attempt is its own report,
//! and vitals ejects the failing upstream on nginx's reports; then one refusing connections. Needs the local stack: run
//! `scripts/test.sh`.
// Needs the local stack and its peers: `scripts/test.sh` runs it (`--features stack`).
#![cfg(feature = "stack")]

use std::path::PathBuf;
use std::time::Duration;
use vitals_contracts::OutcomeClass;
use vitals_system_tests::*;
use vitals_testkit::{free_port, unique, wait_until, Service};
use vitals_upstream_sim::Behaviour;

fn nginx_bin() -> PathBuf {
    let p = PathBuf::from("/usr/sbin/nginx");
    assert!(p.exists(), "nginx is missing: run scripts/install-deps.sh");
    p
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nginx_logs_over_syslog_eject_a_failing_upstream_with_each_attempt_reported() {
    let stack = Stack::start("nginx_loop", "chat").await;
    let dir = std::env::temp_dir().join(unique("nginx"));
    std::fs::create_dir_all(&dir).unwrap();
    let gateway = unique("nginx");
    // The bridge names nginx's upstream addresses as the prober names the endpoints.
    let mut map =
        format!("gateway = \"{gateway}\"\n[[backend]]\nname = \"chat\"\npool = \"chat\"\n[backend.servers]\n");
    for (ep, addr) in stack.sim.endpoints() {
        map.push_str(&format!("\"{addr}\" = \"{ep}\"\n"));
    }
    let udp = format!("127.0.0.1:{}", free_port());
    let (_bridge, _) = start_logbridge("logbridge-nginx", &stack.topics, &map, &["--udp", &udp]).await;
    let port = free_port();
    let upstreams: Vec<std::net::SocketAddr> = stack.sim.endpoints().into_iter().map(|(_, a)| a).collect();
    let _nginx = start_nginx(
        &dir,
        &upstreams,
        port,
        &format!("syslog:server={udp},tag=nginx"),
        "proxy_next_upstream error timeout http_503 non_idempotent;\n add_header x-vitals-server $upstream_addr always;",
    );
    let (seen, _driving) = drive(
        format!("http://127.0.0.1:{port}/v1/chat/completions"),
        "x-vitals-server",
        Duration::from_millis(50),
    );
    wait_until("nginx serving from all three", Duration::from_secs(60), || {
        let n = seen.by_deployment(unix_now() - 3.0).len();
        async move { n >= 3 }
    })
    .await;

    let fault = unix_now();
    stack.set(
        "e1",
        Behaviour {
            server_errors: 1.0,
            ..healthy()
        },
    );
    let (at, triggers, _) = stack
        .transition_after("e1", "unhealthy", fault, Duration::from_secs(60))
        .await;
    eprintln!("nginx: e1 ejected {:.1} s after it began answering 503", at - fault);
    let evidence = evidence_from(&stack, &triggers, &gateway).await;
    assert!(
        !evidence.is_empty()
            && evidence
                .iter()
                .all(|c| c.outcome == OutcomeClass::ServerError && c.endpoint == "e1" && c.http_status == Some(503)),
        "e1 ejected on nginx's reports of its 503s: {evidence:?}"
    );
    // nginx tried the next upstream after each 503: the request's attempts are reported apart.
    let retried: Vec<&str> = evidence
        .iter()
        .map(|c| c.event_id.as_str())
        .filter(|id| id.contains('/'))
        .collect();
    assert!(!retried.is_empty(), "attempts of retried requests: {triggers:?}");
    assert_eq!(seen.failed(fault), 0, "nginx's retries hid the 503s from the clients");

    // e1 heals; e0 refuses connections: nginx's times (no connect time, no header) say refused,
    // though the status (502) would say bad gateway.
    stack.set("e1", healthy());
    let fault = unix_now();
    stack.set(
        "e0",
        Behaviour {
            refuse: true,
            ..healthy()
        },
    );
    let (at, triggers, _) = stack
        .transition_after("e0", "unhealthy", fault, Duration::from_secs(60))
        .await;
    eprintln!("nginx: e0 ejected {:.1} s after it began refusing", at - fault);
    let evidence = evidence_from(&stack, &triggers, &gateway).await;
    assert!(
        !evidence.is_empty()
            && evidence
                .iter()
                .all(|c| c.outcome == OutcomeClass::ConnectError && c.endpoint == "e0"),
        "e0 ejected on nginx's reports of refused connections: {evidence:?}"
    );
    drop(_driving);
    stack.finish().await;
}

/// nginx in the foreground before `upstreams` (each `max_fails=0`: vitals judges them, not nginx's
/// passive check), its access log in the shipped JSON format written to `access_log` (an nginx
/// `access_log` target), listening on `port`, with `location` directives beside `proxy_pass`.
fn start_nginx(
    dir: &std::path::Path,
    upstreams: &[std::net::SocketAddr],
    port: u16,
    access_log: &str,
    location: &str,
) -> Service {
    let mut upstream = String::from("upstream chat {\n");
    for addr in upstreams {
        upstream.push_str(&format!("    server {addr} max_fails=0;\n"));
    }
    upstream.push_str("}\n");
    let d = dir.display();
    let conf = format!(
        "daemon off;\nmaster_process off;\nworker_processes 1;\npid {d}/nginx.pid;\nerror_log {d}/error.log info;\n\
         events {{ worker_connections 256; }}\n\
         http {{\n    include {shipped};\n\
         client_body_temp_path {d}/body;\n proxy_temp_path {d}/proxy;\n fastcgi_temp_path {d}/fastcgi;\n\
         uwsgi_temp_path {d}/uwsgi;\n scgi_temp_path {d}/scgi;\n\
         {upstream}\
         server {{\n listen 127.0.0.1:{port};\n access_log {access_log} vitals_json;\n\
         location / {{\n proxy_pass http://chat;\n {location}\n }}\n }}\n}}\n",
        shipped = repo().join("deploy/nginx/vitals.conf").display(),
    );
    let conf_file = dir.join("nginx.conf");
    std::fs::write(&conf_file, conf).unwrap();
    Service::start_program(
        &nginx_bin(),
        "nginx",
        &[
            "-p".into(),
            d.to_string(),
            "-e".into(),
            format!("{d}/error.log"),
            "-c".into(),
            conf_file.display().to_string(),
        ],
    )
}

/// `n` calls through nginx, one after another; how many it answered.
async fn calls(port: u16, n: usize) -> usize {
    let client = reqwest::Client::new();
    let mut ok = 0;
    for _ in 0..n {
        let body = serde_json::json!({"model": "m", "max_tokens": 2, "messages": []});
        if client
            .post(format!("http://127.0.0.1:{port}/v1/chat/completions"))
            .json(&body)
            .send()
            .await
            .is_ok_and(|r| r.status().is_success())
        {
            ok += 1;
        }
    }
    ok
}

fn lines_in(path: &std::path::Path) -> usize {
    std::fs::read_to_string(path).map_or(0, |t| t.lines().count())
}

/// A metric's value on `/metrics` of the service on `port` (the first series whose line starts
/// with `series`).
async fn metric(port: u16, series: &str) -> Option<u64> {
    let text = vitals_testkit::http_get(port, "/metrics").await?;
    text.lines()
        .find(|l| l.starts_with(series))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

/// logrotate's `create` renames nginx's log and makes a new one; nginx writes to the renamed file
/// until it is told to reopen its log (USR1). Every line of both files reaches vitals.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rotated_nginx_log_is_read_to_its_end_before_the_new_one() {
    let sim = vitals_upstream_sim::Sim::start(vitals_upstream_sim::SimConfig::healthy(1, 3))
        .await
        .unwrap();
    let topics = vitals_testkit::Topics::create(&unique("nginx_rotate"), 1, vitals_testkit::Stamp::LogAppendTime).await;
    let dir = std::env::temp_dir().join(unique("nginx-rotate"));
    std::fs::create_dir_all(&dir).unwrap();
    let log = dir.join("access.log");
    let gateway = unique("nginx-rotate");
    let map = format!("gateway = \"{gateway}\"\n");
    let port = free_port();
    let _nginx = start_nginx(&dir, &[sim.endpoints()[0].1], port, &log.display().to_string(), "");
    wait_until("nginx's log", Duration::from_secs(30), || {
        let ok = log.exists();
        async move { ok }
    })
    .await;
    let file = log.display().to_string();
    let (_bridge, metrics) = start_logbridge(
        "logbridge-rotate",
        &topics,
        &map,
        &["--file", &file, "--summarize-ms", "0", "--rotated-quiet-ms", "2000"],
    )
    .await;
    wait_until("the bridge following", Duration::from_secs(30), || async move {
        metric(metrics, "vitals_logbridge_lines_total").await.is_some()
    })
    .await;
    let mut answered = calls(port, 100).await;
    std::fs::rename(&log, dir.join("access.log.1")).unwrap();
    std::fs::write(&log, "").unwrap(); // logrotate's `create`
    answered += calls(port, 100).await; // still written to access.log.1
    let pid = std::fs::read_to_string(dir.join("nginx.pid")).unwrap();
    assert!(std::process::Command::new("kill")
        .args(["-USR1", pid.trim()])
        .status()
        .unwrap()
        .success());
    wait_until("nginx reopening its log", Duration::from_secs(30), || {
        let reopened = std::fs::read_to_string(dir.join("error.log")).is_ok_and(|t| t.contains("reopening logs"));
        async move { reopened }
    })
    .await;
    answered += calls(port, 100).await;
    assert_eq!(answered, 300);
    // nginx writes a call's line after it has sent the response: wait for the last lines to
    // land, then check that exactly one line was written per call.
    let written = || lines_in(&dir.join("access.log.1")) + lines_in(&log);
    wait_until("nginx to log the last calls", Duration::from_secs(30), || async {
        written() >= 300
    })
    .await;
    assert_eq!(written(), 300, "nginx logged every call once");
    wait_until("every line reported", Duration::from_secs(60), || async move {
        metric(metrics, "vitals_logbridge_reports_total").await == Some(300)
    })
    .await;
    let mine = reports(&topics)
        .await
        .into_values()
        .filter(|c| c.gateway == gateway)
        .count();
    eprintln!(
        "rotation: {} lines in the renamed file, {} in the new one, {mine} reports",
        lines_in(&dir.join("access.log.1")),
        lines_in(&log)
    );
    assert_eq!(mine, 300, "every line of both files reached vitals");
}

/// A file with a backlog (read from its start) is read as fast as the reports can be sent: with
/// a reporter queue of 16, none is dropped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_backlog_waits_for_the_reporter_and_loses_nothing() {
    let topics = vitals_testkit::Topics::create(&unique("backlog"), 2, vitals_testkit::Stamp::LogAppendTime).await;
    let dir = std::env::temp_dir().join(unique("backlog"));
    std::fs::create_dir_all(&dir).unwrap();
    let log = dir.join("access.log");
    const N: u64 = 60_000;
    let mut text = String::new();
    for i in 0..N {
        text.push_str(&format!(
            "{{\"v\":1,\"time\":\"{}.{:03}\",\"id\":\"req-{i}\",\"upstream\":\"chat\",\"addr\":\"127.0.0.1:{}\",\"status\":\"200\",\"connect\":\"0.001\",\"header\":\"0.002\",\"response\":\"0.003\",\"request_time\":\"0.004\",\"client_status\":\"200\"}}\n",
            1_796_113_290 + i / 1000,
            i % 1000,
            9000 + i % 3
        ));
    }
    std::fs::write(&log, text).unwrap();
    let file = log.display().to_string();
    let (_bridge, metrics) = start_logbridge(
        "logbridge-backlog",
        &topics,
        "gateway = \"backlog\"\n",
        &["--file", &file, "--from-start", "--summarize-ms", "0", "--queue", "16"],
    )
    .await;
    wait_until("the backlog delivered", Duration::from_secs(240), || async move {
        metric(metrics, "vitals_reporter_reports_total{result=\"delivered\"}").await == Some(N)
    })
    .await;
    let dropped = metric(metrics, "vitals_reporter_reports_total{result=\"dropped_queue_full\"}").await;
    let reported = metric(metrics, "vitals_logbridge_reports_total").await;
    assert_eq!((dropped, reported), (Some(0), Some(N)));
}
