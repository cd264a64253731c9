//! vitals with the real HAProxy (Debian's 2.6) and the real broker, database, processor, prober
//! and upstream simulator: HAProxy's own access log, in the shipped format
//! (`deploy/haproxy/vitals.cfg`), reaches vitals through `vitals-logbridge`; vitals ejects a
//! refusing and a failing server on that evidence; `vitals-haproxy` puts them in maintenance
//! through the Runtime API and HAProxy stops sending to them; healed, they are back; with vitals
//! silent, every server is put back (fail-open), except the one an operator put in maintenance.
//! And the bridge fed garbage and a flood keeps going and counts everything. Needs the local
//! stack: run `scripts/test.sh`.
// Needs the local stack and its peers: `scripts/test.sh` runs it (`--features stack`).
#![cfg(feature = "stack")]

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
         backend be_chat\n    balance roundrobin\n    timeout server 3s\n"
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

/// The processor (with or without the prober) and three simulated endpoints, HAProxy before them
/// in the shipped configuration, its log to the bridge, vitals-haproxy steering it, and calls
/// through it every 40 ms.
struct Rig {
    stack: Stack,
    gateway: String,
    api: Client,
    seen: Seen,
    steer_port: u16,
    bridge_port: u16,
    _driving: Driving,
    _services: Vec<Service>,
}

async fn rig(name: &str, prober: bool) -> Rig {
    let stack = if prober {
        Stack::start(name, "chat").await
    } else {
        Stack::start_without_prober(name, "chat").await
    };
    let dir = std::env::temp_dir().join(unique("haproxy"));
    std::fs::create_dir_all(&dir).unwrap();
    let gateway = unique("haproxy");
    let map = format!("gateway = \"{gateway}\"\n[[backend]]\nname = \"be_chat\"\npool = \"chat\"\n");
    let log_socket = dir.join("log.sock");
    let (bridge, bridge_port) = start_logbridge(
        "logbridge-haproxy",
        &stack.topics,
        &map,
        &["--unix", log_socket.to_str().unwrap(), "--unix-mode", "600"],
    )
    .await;
    let port = free_port();
    let (haproxy, admin_sock) = start_haproxy(&dir, &stack, port, &log_socket);
    let api = Client::parse(admin_sock.to_str().unwrap());
    wait_until("HAProxy's Runtime API", Duration::from_secs(30), || {
        let api = api.clone();
        async move { servers(&api).await.len() == 3 }
    })
    .await;
    let map_file = dir.join("map.toml");
    std::fs::write(&map_file, &map).unwrap();
    let steer_port = free_port();
    let steer = Service::start(
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
    let (seen, driving) = drive(
        format!("http://127.0.0.1:{port}/v1/chat/completions"),
        "x-vitals-server",
        Duration::from_millis(40),
    );
    wait_until("HAProxy sending to all three", Duration::from_secs(60), || {
        let n = seen.by_deployment(unix_now() - 3.0).len();
        async move { n >= 3 }
    })
    .await;
    Rig {
        stack,
        gateway,
        api,
        seen,
        steer_port,
        bridge_port,
        _driving: driving,
        _services: vec![bridge, haproxy, steer],
    }
}

/// Wait for `n` more reconciles of vitals-haproxy (each reads HAProxy's state and corrects it).
async fn reconciles(steer_port: u16, n: f64) {
    let from = metric(steer_port, "vitals_haproxy_reconciles_total")
        .await
        .unwrap_or(0.0);
    wait_until(&format!("{n} reconciles"), Duration::from_secs(30), || async move {
        metric(steer_port, "vitals_haproxy_reconciles_total")
            .await
            .unwrap_or(0.0)
            >= from + n
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn haproxy_logs_feed_vitals_and_vitals_haproxy_steers_it_out_and_back_and_fails_open() {
    let Rig {
        stack,
        gateway,
        api,
        seen,
        steer_port,
        bridge_port,
        _driving,
        _services,
    } = rig("haproxy_loop", true).await;

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

/// With no prober, vitals-haproxy lets a server out of rotation in for its trial when it is due,
/// and HAProxy's own requests to it readmit it. The shipped configuration's detection of refused
/// connections is measured here (no test override of its timeouts).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn haproxy_without_a_prober_brings_a_server_back_by_its_trial_requests() {
    let Rig {
        stack,
        gateway,
        api,
        seen,
        steer_port,
        _driving,
        _services,
        ..
    } = rig("haproxy_trial", false).await;
    let fault = unix_now();
    stack.set(
        "e0",
        Behaviour {
            refuse: true,
            ..healthy()
        },
    );
    let (ejected, triggers, _) = stack
        .transition_after("e0", "unhealthy", fault, Duration::from_secs(60))
        .await;
    let maint = wait_server(&api, "e0", "in maintenance", |s| s.admin_state & admin::FMAINT != 0).await;
    let evidence = evidence_from(&stack, &triggers, &gateway).await;
    assert!(
        !evidence.is_empty()
            && evidence
                .iter()
                .all(|c| c.outcome == OutcomeClass::ConnectError && c.endpoint == "e0"),
        "e0 ejected on HAProxy's reports of refused connections: {evidence:?}"
    );
    let failed = seen.failed(fault);
    eprintln!(
        "shipped config: e0 ejected {:.2} s after it began refusing, in maint {:.2} s after that; {failed} requests failed at the client",
        ejected - fault,
        maint - ejected
    );
    stack.set("e0", healthy());
    let heal = unix_now();
    let (back, triggers, _) = stack
        .transition_after("e0", "recovering", heal, Duration::from_secs(120))
        .await;
    let ready = wait_server(&api, "e0", "ready", |s| s.admin_state == 0).await;
    let chosen = seen.wait_chosen("e0", heal, Duration::from_secs(60)).await;
    let codes: Vec<String> = sqlx::query_scalar(
        "SELECT reason_code FROM transitions WHERE endpoint = 'e0' AND stream_time > to_timestamp($1) ORDER BY seq",
    )
    .bind(fault)
    .fetch_all(&stack.db)
    .await
    .unwrap();
    eprintln!(
        "no prober: e0 readmitted {:.1} s after the heal, ready in HAProxy {:.1} s, chosen {:.1} s; transitions {codes:?}; trials {:?}",
        back - heal,
        ready - heal,
        chosen - heal,
        metric(steer_port, "vitals_haproxy_trials_total").await
    );
    assert!(
        codes.iter().any(|c| c == "trial_succeeded"),
        "readmitted by its trial: {codes:?}"
    );
    // No prober runs: the readmission's triggers are the bridge's reports of HAProxy's requests
    // (successes go out summed, so the ids are the summaries').
    assert!(!triggers.is_empty(), "readmitted on evidence");
    assert!(metric(steer_port, "vitals_haproxy_trials_total").await >= Some(1.0));
    drop(_driving);
    stack.finish().await;
}

/// What an operator does at HAProxy's Runtime API wins over vitals: a weight they set is the
/// base vitals multiplies (not reset), and a server they drain while vitals holds it in
/// maintenance stays drained after vitals readmits it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operators_weight_and_drain_are_kept_by_vitals_haproxy() {
    let Rig {
        stack,
        api,
        steer_port,
        _driving,
        _services,
        ..
    } = rig("haproxy_operator", true).await;
    let set = |line: &str| api.set(line, Duration::from_secs(3)).unwrap();
    set("set server be_chat/e2 weight 50");
    reconciles(steer_port, 4.0).await;
    let weights: Vec<(String, u32)> = servers(&api).await.into_iter().map(|s| (s.name, s.weight)).collect();
    assert_eq!(
        weights,
        [("e0".to_string(), 100), ("e1".to_string(), 100), ("e2".to_string(), 50)],
        "the operator's weight is kept"
    );
    // e1 fails, vitals holds it in maintenance; the operator drains it meanwhile.
    let at = unix_now();
    stack.set(
        "e1",
        Behaviour {
            server_errors: 1.0,
            ..healthy()
        },
    );
    stack
        .transition_after("e1", "unhealthy", at, Duration::from_secs(60))
        .await;
    wait_server(&api, "e1", "in maintenance", |s| s.admin_state & admin::FMAINT != 0).await;
    set("set server be_chat/e1 state drain");
    stack.set("e1", healthy());
    let heal = unix_now();
    stack
        .transition_after("e1", "recovering", heal, Duration::from_secs(60))
        .await;
    reconciles(steer_port, 4.0).await;
    let e1 = servers(&api).await.into_iter().find(|s| s.name == "e1").unwrap();
    assert!(
        e1.admin_state & admin::FDRAIN != 0,
        "readmitted by vitals, still drained by the operator: {e1:?}"
    );
    assert_eq!(metric(steer_port, "vitals_haproxy_operator_held").await, Some(1.0));
    // The operator lets it go: vitals steers it again (ready, at its ramp or full weight).
    set("set server be_chat/e1 state ready");
    wait_server(&api, "e1", "ready", |s| s.admin_state == 0).await;
    wait_until("vitals steering e1 again", Duration::from_secs(30), || async move {
        metric(steer_port, "vitals_haproxy_operator_held").await == Some(0.0)
    })
    .await;
    let e2 = servers(&api).await.into_iter().find(|s| s.name == "e2").unwrap();
    assert_eq!(e2.weight, 50, "still the operator's weight: {e2:?}");
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
