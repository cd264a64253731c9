//! vitals with the real HAProxy (Debian's 2.6) and the real broker, database, processor, prober
//! and upstream simulator: HAProxy's own access log, in the shipped format
//! (`deploy/haproxy/vitals.cfg`), reaches vitals through `vitals-logbridge`; vitals ejects a
//! refusing and a failing server on that evidence; `vitals-haproxy` puts them in maintenance
//! through the Runtime API and HAProxy stops sending to them; healed, they are back; with vitals
//! silent, every server is put back (fail-open), except the one an operator put in maintenance.
//! And the bridge fed garbage and a flood keeps going and counts everything. Needs the local
//! stack: run `scripts/test.sh`.

use std::path::{Path, PathBuf};
use std::time::Duration;
use vitals_contracts::OutcomeClass;
use vitals_gateways::runtime::{admin, Client, Server};
use vitals_system_tests::*;
use vitals_testkit::{brokers, free_port, http_get, metric, unique, wait_until, Service, Stamp, Topics};
use vitals_upstream_sim::Behaviour;

fn haproxy_bin() -> PathBuf {
    let p = PathBuf::from("/usr/sbin/haproxy");
    assert!(p.exists(), "haproxy is missing: run scripts/install-deps.sh");
    p
}

/// HAProxy in the foreground: a global section logging to the bridge's socket, the shipped
/// defaults, and a frontend on `port` before backend `be_chat` with the simulator's endpoints.
fn start_haproxy(dir: &Path, stack: &Stack, port: u16, log_socket: &Path) -> (Service, PathBuf) {
    let admin = dir.join("admin.sock");
    let global = format!(
        "global\n    log unix@{} len 4096 local0\n    stats socket {} mode 600 level admin\n",
        log_socket.display(),
        admin.display()
    );
    let mut proxies = format!(
        "frontend fe\n    bind 127.0.0.1:{port}\n    capture response header Retry-After len 16\n    \
         http-after-response set-header x-vitals-server %s\n    default_backend be_chat\n\
         backend be_chat\n    balance roundrobin\n    timeout connect 200ms\n    timeout server 3s\n"
    );
    for (ep, addr) in stack.sim.endpoints() {
        proxies.push_str(&format!("    server {ep} {addr} weight 100\n"));
    }
    std::fs::write(dir.join("global.cfg"), global).unwrap();
    std::fs::write(dir.join("proxies.cfg"), proxies).unwrap();
    let shipped = repo().join("deploy/haproxy/vitals.cfg");
    let files = [dir.join("global.cfg"), shipped, dir.join("proxies.cfg")];
    let mut args = vec!["-db".to_string()];
    for f in &files {
        args.extend(["-f".to_string(), f.display().to_string()]);
    }
    (Service::start_program(&haproxy_bin(), "haproxy", &args), admin)
}

async fn servers(api: &Client) -> Vec<Server> {
    let api = api.clone();
    tokio::task::spawn_blocking(move || api.servers(Duration::from_secs(3)))
        .await
        .unwrap()
        .unwrap_or_default()
}

/// Wait until HAProxy shows server `name` as `cond` says; print and return when.
async fn wait_server(api: &Client, name: &str, what: &str, cond: impl Fn(&Server) -> bool) -> f64 {
    let cond = &cond;
    wait_until(
        &format!("HAProxy: {name} {what}"),
        Duration::from_secs(60),
        || async move { servers(api).await.iter().any(|s| s.name == name && cond(s)) },
    )
    .await;
    unix_now()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn haproxy_logs_feed_vitals_and_vitals_haproxy_steers_it_out_and_back_and_fails_open() {
    let stack = Stack::start("haproxy_loop", "chat").await;
    let dir = std::env::temp_dir().join(unique("haproxy"));
    std::fs::create_dir_all(&dir).unwrap();
    let gateway = unique("haproxy");
    let map = format!("gateway = \"{gateway}\"\n[[backend]]\nname = \"be_chat\"\npool = \"chat\"\n");
    let log_socket = dir.join("log.sock");
    let (_bridge, bridge_port) = start_logbridge(
        "logbridge-haproxy",
        &stack.topics,
        &map,
        &["--unix", log_socket.to_str().unwrap(), "--unix-mode", "600"],
    )
    .await;
    let port = free_port();
    let (_haproxy, admin_sock) = start_haproxy(&dir, &stack, port, &log_socket);
    let api = Client::parse(admin_sock.to_str().unwrap());
    wait_until("HAProxy's Runtime API", Duration::from_secs(30), || {
        let api = api.clone();
        async move { servers(&api).await.len() == 3 }
    })
    .await;
    let map_file = dir.join("map.toml");
    std::fs::write(&map_file, &map).unwrap();
    let steer_port = free_port();
    let _steer = Service::start(
        "vitals-haproxy",
        "vitals-haproxy",
        &flags(&[
            ("--runtime-api", admin_sock.to_str().unwrap()),
            ("--map", map_file.to_str().unwrap()),
            ("--brokers", &brokers()),
            ("--changes-topic", &stack.topics.changes),
            ("--state-topic", &stack.topics.state),
            ("--interval-ms", "500"),
            ("--stale-after-secs", "3"),
            ("--fail-open-after-secs", "8"),
            ("--state-file", dir.join("steered").to_str().unwrap()),
            ("--http-addr", &format!("127.0.0.1:{steer_port}")),
        ]),
    );
    wait_until("vitals-haproxy ready", Duration::from_secs(60), || async move {
        http_get(steer_port, "/readyz").await.as_deref() == Some("ready")
    })
    .await;

    let (seen, _driving) = drive(
        format!("http://127.0.0.1:{port}/v1/chat/completions"),
        "x-vitals-server",
        Duration::from_millis(40),
    );
    wait_until("HAProxy sending to all three", Duration::from_secs(60), || {
        let n = seen.by_deployment(unix_now() - 3.0).len();
        async move { n >= 3 }
    })
    .await;

    // 1. e0 refuses connections, then (once back) e1 answers 503: HAProxy's log says which is
    // which. One at a time: vitals ejects at most half of a pool.
    let faults = [
        (
            "e0",
            Behaviour {
                refuse: true,
                ..healthy()
            },
            OutcomeClass::ConnectError,
        ),
        (
            "e1",
            Behaviour {
                server_errors: 1.0,
                ..healthy()
            },
            OutcomeClass::ServerError,
        ),
    ];
    for (ep, fault, class) in faults {
        let at = unix_now();
        stack.set(ep, fault);
        let (ejected, triggers, _) = stack
            .transition_after(ep, "unhealthy", at, Duration::from_secs(60))
            .await;
        let maint = wait_server(&api, ep, "in maintenance", |s| s.admin_state & admin::FMAINT != 0).await;
        let last = seen
            .wait_left_out(ep, at, vitals_system_tests::LEFT_OUT_CALLS, Duration::from_secs(120))
            .await;
        let evidence = evidence_from(&stack, &triggers, &gateway).await;
        assert!(
            !evidence.is_empty() && evidence.iter().all(|c| c.outcome == class && c.endpoint == ep),
            "{ep} ejected on HAProxy's reports of {class:?}: {evidence:?}"
        );
        eprintln!(
            "{ep} ({class:?}): ejected {:.1} s after the fault, in maint {:.2} s after that; HAProxy's last request to it {:.1} s after the fault",
            ejected - at,
            maint - ejected,
            last - at
        );
        // 2. Healed: readmitted by the prober, back in rotation in slow start, HAProxy sends to it again.
        stack.set(ep, healthy());
        let heal = unix_now();
        let ready = wait_server(&api, ep, "ready", |s| s.admin_state == 0).await;
        let ramp = servers(&api).await.into_iter().find(|s| s.name == ep).unwrap();
        assert!(ramp.weight < 100, "back in slow start, its weight ramping: {ramp:?}");
        let back = seen.wait_chosen(ep, heal, Duration::from_secs(60)).await;
        eprintln!(
            "{ep}: ready {:.1} s after the heal at weight {}, chosen again {:.1} s after",
            ready - heal,
            ramp.weight,
            back - heal
        );
    }
    let metrics = http_get(bridge_port, "/metrics").await.unwrap_or_default();
    eprintln!(
        "bridge: {}",
        metrics
            .lines()
            .filter(|l| l.starts_with("vitals_logbridge_") && !l.ends_with(" 0"))
            .collect::<Vec<_>>()
            .join("; ")
    );

    // 3. An operator puts e2 in maintenance; e1 fails again and is taken out; then vitals goes
    // silent (the processor frozen): after --fail-open-after-secs every server vitals steers is
    // ready at full weight, and the operator's e2 stays in maintenance.
    api.set("set server be_chat/e2 state maint", Duration::from_secs(3))
        .unwrap();
    let again = unix_now();
    stack.set(
        "e1",
        Behaviour {
            server_errors: 1.0,
            ..healthy()
        },
    );
    stack
        .transition_after("e1", "unhealthy", again, Duration::from_secs(60))
        .await;
    wait_server(&api, "e1", "in maintenance again", |s| {
        s.admin_state & admin::FMAINT != 0
    })
    .await;
    stack.processor.signal("-STOP");
    let silent = unix_now();
    let open = wait_server(&api, "e1", "ready (failed open)", |s| {
        s.admin_state == 0 && s.weight == s.initial_weight
    })
    .await;
    eprintln!("fail-open: e1 ready {:.1} s after vitals went silent", open - silent);
    // The view last heard a tick up to 1 s before the freeze; stale (after 3 s) is not open.
    assert!(
        open - silent >= 6.0,
        "not before the configured 8 s: {:.1} s",
        open - silent
    );
    let e2 = servers(&api).await.into_iter().find(|s| s.name == "e2").unwrap();
    assert!(
        e2.admin_state & admin::FMAINT != 0,
        "the operator's maintenance is left alone: {e2:?}"
    );
    assert_eq!(metric(steer_port, "vitals_haproxy_view_freshness").await, Some(2.0));
    assert_eq!(metric(steer_port, "vitals_haproxy_operator_held").await, Some(1.0));
    stack.processor.signal("-CONT");
    drop(_driving);
    stack.finish().await;
}

/// Send `lines` to the bridge over UDP.
fn send(sock: &std::net::UdpSocket, to: &str, lines: &[Vec<u8>]) {
    for l in lines {
        sock.send_to(l, to).unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_bridge_counts_garbage_and_a_flood_and_keeps_reporting_the_valid_lines_between() {
    let topics = Topics::create(&unique("logbridge_garbage"), 2, Stamp::LogAppendTime).await;
    let udp = format!("127.0.0.1:{}", free_port());
    let (_bridge, port) = start_logbridge(
        "logbridge-garbage",
        &topics,
        "gateway = \"garbage-test\"\n",
        &[
            "--udp",
            &udp,
            "--max-line-bytes",
            "2048",
            "--bad-lines-logged-per-min",
            "3",
            // One record per line: the test finds each valid line's own report.
            "--summarize-ms",
            "0",
        ],
    )
    .await;
    let sock = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let now = unix_now() as i64;
    let valid = |id: &str| {
        format!("<134>Dec  1 08:21:26 haproxy[1]: vitals1 {now}.100 {id} be s1 200 0 0 0 1 1 ---- 0 {{}}").into_bytes()
    };
    let mut lines = Vec::new();
    let garbage: Vec<Vec<u8>> = vec![
        b"\x00\x01\xff\xfe\xfd".to_vec(),
        b"<134>Dec  1 08:21:26 haproxy[1]: vitals1 123".to_vec(),
        vec![b'A'; 4000],
        b"<9999>broken".to_vec(),
        b"{\"v\":1,\"time\":\"17".to_vec(),
        b"GET /index.html HTTP/1.1".to_vec(),
    ];
    for (i, g) in garbage.iter().enumerate() {
        lines.push(g.clone());
        lines.push(valid(&format!("between-{i}")));
    }
    send(&sock, &udp, &lines);
    // A flood well beyond what the bridge reads in the time: counted as read or as dropped by
    // the kernel, never silently lost; then one more valid line.
    let flood: Vec<Vec<u8>> = (0..100_000).map(|i| valid(&format!("flood-{i}"))).collect();
    send(&sock, &udp, &flood);
    let sent = (lines.len() + flood.len()) as f64;
    let input = format!("vitals_logbridge_lines_total{{input=\"udp:{udp}\"}}");
    let drops = format!("vitals_logbridge_kernel_drops{{input=\"udp:{udp}\"}}");
    let accounted = |n: f64| {
        let (input, drops) = (input.clone(), drops.clone());
        async move {
            let read = metric(port, &input).await.unwrap_or(0.0);
            let dropped = metric(port, &drops).await.unwrap_or(0.0);
            read + dropped == n
        }
    };
    wait_until(
        "every datagram read or counted as dropped",
        Duration::from_secs(60),
        || accounted(sent),
    )
    .await;
    eprintln!(
        "flood: {} read, {} dropped by the kernel",
        metric(port, &input).await.unwrap_or(0.0),
        metric(port, &drops).await.unwrap_or(0.0)
    );
    // Then one more valid line, read once the flood is over.
    send(&sock, &udp, &[valid("after-the-flood")]);
    wait_until("the line after the flood read", Duration::from_secs(30), || {
        accounted(sent + 1.0)
    })
    .await;
    let bad = |r: &'static str| async move {
        metric(port, &format!("vitals_logbridge_bad_lines_total{{reason=\"{r}\"}}")).await
    };
    assert_eq!(bad("not_utf8").await, Some(1.0));
    assert_eq!(bad("truncated").await, Some(2.0));
    assert_eq!(bad("oversized").await, Some(1.0));
    assert_eq!(bad("framing").await, Some(1.0));
    assert_eq!(bad("unknown_format").await, Some(1.0));
    assert_eq!(
        http_get(port, "/healthz").await.as_deref(),
        Some("ok"),
        "the bridge is still up"
    );
    let reported = reports(&topics).await;
    for i in 0..garbage.len() {
        assert!(
            reported.contains_key(&format!("between-{i}")),
            "valid line {i} between garbage reported"
        );
    }
    assert!(
        reported.contains_key("after-the-flood"),
        "the line after the flood is reported"
    );
    let log = std::fs::read_to_string(&_bridge.log).unwrap_or_default();
    let sampled = log.matches("bad log line (sampled)").count();
    assert_eq!(sampled, 3, "bad lines logged at the configured rate: {sampled}");
}
