//! vitals with the real nginx (Debian's 1.22) and the real broker, database, processor, prober
//! and upstream simulator: nginx's access log, in the shipped JSON format
//! (`deploy/nginx/vitals.conf`) over syslog (UDP), reaches vitals through `vitals-logbridge`;
//! an upstream answering 503 is retried by nginx on the next one, each attempt is its own report,
//! and vitals ejects the failing upstream on nginx's reports; then one refusing connections. Needs the local stack: run
//! `scripts/test.sh`.

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
    let mut upstream = String::from("upstream chat {\n");
    for (_, addr) in stack.sim.endpoints() {
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
         server {{\n listen 127.0.0.1:{port};\n access_log syslog:server={udp},tag=nginx vitals_json;\n\
         location / {{\n proxy_pass http://chat;\n proxy_next_upstream error timeout http_503 non_idempotent;\n\
         add_header x-vitals-server $upstream_addr always;\n }}\n }}\n}}\n",
        shipped = repo().join("deploy/nginx/vitals.conf").display(),
    );
    let conf_file = dir.join("nginx.conf");
    std::fs::write(&conf_file, conf).unwrap();
    let _nginx = Service::start_program(
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
