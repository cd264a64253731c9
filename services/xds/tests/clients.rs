//! vitals-xds with real xDS clients and no mock: grpc-go v1.85's proxyless client
//! (tools/xds-clients, Go) and grpcio's C-core client (Python), each dialling `xds:///grpc` with a
//! bootstrap file naming the real `vitals-xds` binary, calling real gRPC upstreams (the standard
//! health service), while the test writes vitals' transitions onto the real changes topic as the
//! processor does.
// Needs the local stack, Go and grpcio: `scripts/test.sh` runs it (`--features stack`).
#![cfg(feature = "stack")]

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;
use vitals_contracts::{encode, EndpointState, HealthChanged, HealthState, Tick};
use vitals_testkit::*;

const POOL: &str = "grpc";

fn now_ms() -> i64 {
    vitals_contracts::clock::now_us() / 1000
}

fn go() -> PathBuf {
    which("go").unwrap_or_else(|| PathBuf::from("/usr/local/go/bin/go"))
}

fn which(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH")?
        .to_str()?
        .split(':')
        .map(|d| PathBuf::from(d).join(name))
        .find(|p| p.is_file())
}

/// tools/xds-clients, built once per test run (Go's build cache makes it quick after the first).
fn tool() -> &'static PathBuf {
    static TOOL: OnceLock<PathBuf> = OnceLock::new();
    TOOL.get_or_init(|| {
        let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
        let out = root.join("target/xds-clients");
        let ok = Command::new(go())
            .args(["build", "-o"])
            .arg(&out)
            .arg(".")
            .current_dir(root.join("tools/xds-clients"))
            .status()
            .expect("go runs");
        assert!(ok.success(), "tools/xds-clients builds");
        out
    })
}

/// A program whose stdout lines are "UNIX_MS PEER" (or "UNIX_MS ERR CODE"), collected as they
/// come; closing its stdin stops it.
struct Caller {
    child: Child,
    stdin: Option<ChildStdin>,
    calls: Arc<Mutex<Vec<(i64, String)>>>,
}

impl Caller {
    fn start(mut cmd: Command) -> Caller {
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("the client starts");
        let stdin = child.stdin.take();
        let out = child.stdout.take().unwrap();
        let calls: Arc<Mutex<Vec<(i64, String)>>> = Arc::default();
        let c = calls.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                if let Some((ms, peer)) = line.split_once(' ') {
                    if let Ok(ms) = ms.parse() {
                        c.lock().unwrap().push((ms, peer.to_owned()));
                    }
                }
            }
        });
        Caller { child, stdin, calls }
    }

    /// Calls answered by `peer` after `since_ms`.
    fn to(&self, peer: &str, since_ms: i64) -> usize {
        self.calls
            .lock()
            .unwrap()
            .iter()
            .filter(|(t, p)| *t > since_ms && p == peer)
            .count()
    }

    /// Calls that failed after `since_ms`, with their codes.
    fn errors(&self, since_ms: i64) -> Vec<String> {
        self.calls
            .lock()
            .unwrap()
            .iter()
            .filter(|(t, p)| *t > since_ms && p.starts_with("ERR"))
            .map(|(_, p)| p.clone())
            .collect()
    }

    fn split(&self, since_ms: i64) -> BTreeMap<String, usize> {
        let mut m = BTreeMap::new();
        for (_, p) in self.calls.lock().unwrap().iter().filter(|(t, _)| *t > since_ms) {
            *m.entry(p.clone()).or_default() += 1;
        }
        m
    }
}

impl Drop for Caller {
    fn drop(&mut self) {
        drop(self.stdin.take());
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn bootstrap(dir: &std::path::Path, name: &str, xds_port: u16, cluster: &str) -> PathBuf {
    let path = dir.join(format!("{name}.json"));
    let text = format!(
        r#"{{"xds_servers": [{{"server_uri": "127.0.0.1:{xds_port}", "channel_creds": [{{"type": "insecure"}}], "server_features": ["xds_v3"]}}],
 "node": {{"id": "{name}", "cluster": "{cluster}", "locality": {{"zone": "z1"}}}}}}"#
    );
    std::fs::write(&path, text).unwrap();
    path
}

fn go_client(boot: &std::path::Path) -> Caller {
    let mut cmd = Command::new(tool());
    cmd.args(["client", &format!("xds:///{POOL}"), "20ms"])
        .env("GRPC_XDS_BOOTSTRAP", boot);
    Caller::start(cmd)
}

fn python_client(boot: &std::path::Path) -> Caller {
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tools/xds-clients/client.py");
    let mut cmd = Command::new("python3");
    cmd.arg(script)
        .args([&format!("xds:///{POOL}"), "0.02"])
        .env("GRPC_XDS_BOOTSTRAP", boot);
    Caller::start(cmd)
}

fn xds(topics: &Topics, grpc_port: u16, http_port: u16, extra: &[&str]) -> Service {
    let mut args: Vec<String> = [
        "--brokers",
        &brokers(),
        "--changes-topic",
        &topics.changes,
        "--state-topic",
        &topics.state,
        "--grpc-addr",
        &format!("127.0.0.1:{grpc_port}"),
        "--http-addr",
        &format!("127.0.0.1:{http_port}"),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    args.extend(extra.iter().map(|s| s.to_string()));
    Service::start("vitals-xds", "xds", &args)
}

/// A transition as the processor publishes it: on the changes topic, and a fleet one's state on
/// the compacted state topic too (what a restarted follower starts from).
async fn publish(topics: &Topics, h: HealthChanged) {
    let key = format!("{}/{}", h.pool, h.endpoint);
    let p = producer();
    if h.scope.is_none() {
        let state = Input {
            partition: None,
            ts_ms: now_ms(),
            key: Some(key.clone()),
            bytes: encode(&EndpointState::from_change(&h)).unwrap(),
        };
        produce(&p, &topics.state, [state]).await;
    }
    let input = Input {
        partition: None,
        ts_ms: now_ms(),
        key: Some(key),
        bytes: encode(&h).unwrap(),
    };
    produce(&p, &topics.changes, [input]).await;
}

fn change(ep: &str, seq: i64, to: HealthState, scope: Option<&str>) -> HealthChanged {
    let now = now_ms() * 1000;
    HealthChanged {
        scope: scope.map(str::to_owned),
        stream_time: now,
        // The trial far off: the test's endpoints come back by its transitions.
        retry_at: (to == HealthState::Unhealthy).then_some(now + 600_000_000),
        ..health_changed(POOL, ep, seq, to)
    }
}

/// The processor's ticks on the changes topic: the view stays fresh while they run.
fn ticks(topics: &Topics, on: Arc<AtomicBool>) -> tokio::task::JoinHandle<()> {
    let topic = topics.changes.clone();
    tokio::spawn(async move {
        let p = producer();
        while on.load(Ordering::Relaxed) {
            let t = Tick {
                ticker: "test".into(),
                emitted_at: now_ms() * 1000,
            };
            let input = Input {
                partition: Some(0),
                ts_ms: now_ms(),
                key: None,
                bytes: encode(&t).unwrap(),
            };
            produce(&p, &topic, [input]).await;
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    })
}

/// Wait until every caller has called each of `peers` since `since`.
async fn reaching(callers: &[&Caller], peers: &[&str], since: i64, what: &str) {
    wait_until(what, Duration::from_secs(60), || async {
        callers.iter().all(|c| peers.iter().all(|p| c.to(p, since) > 0))
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_grpc_clients_follow_vitals_decisions_through_vitals_xds() {
    let topics = Topics::create(&unique("xds"), 1, Stamp::LogAppendTime).await;
    let dir = std::env::temp_dir().join(unique("xds-boot"));
    std::fs::create_dir_all(&dir).unwrap();
    let ports: Vec<u16> = (0..3).map(|_| free_port()).collect();
    let eps: Vec<String> = ports.iter().map(|p| format!("127.0.0.1:{p}")).collect();
    let (a, b, c) = (eps[0].as_str(), eps[1].as_str(), eps[2].as_str());
    let mut upstreams = Caller::start({
        let mut cmd = Command::new(tool());
        cmd.arg("upstreams").args(ports.iter().map(u16::to_string));
        cmd
    });
    wait_until("the upstreams listening", Duration::from_secs(30), || async {
        ports
            .iter()
            .all(|p| std::net::TcpStream::connect(("127.0.0.1", *p)).is_ok())
    })
    .await;
    // vitals knows the pool's three endpoints, healthy.
    for ep in &eps {
        publish(&topics, change(ep, 1, HealthState::Healthy, None)).await;
    }
    let ticking = Arc::new(AtomicBool::new(true));
    let ticker = ticks(&topics, ticking.clone());
    let (grpc_port, http_port) = (free_port(), free_port());
    let mut server = xds(
        &topics,
        grpc_port,
        http_port,
        &["--fail-open-after-secs", "4", "--stale-after-secs", "2"],
    );
    wait_until("vitals-xds ready", Duration::from_secs(60), || async {
        http_get(http_port, "/readyz")
            .await
            .is_some_and(|b| b.contains("ready"))
    })
    .await;
    let go = go_client(&bootstrap(&dir, "go-1", grpc_port, "edge-go"));
    let py = python_client(&bootstrap(&dir, "py-1", grpc_port, "edge-py"));
    let start = now_ms();
    reaching(
        &[&go, &py],
        &[a, b, c],
        start,
        "both clients calling all three upstreams",
    )
    .await;
    eprintln!("split at start: go {:?}, python {:?}", go.split(start), py.split(start));

    // Ejected: no call reaches b from 1 s after the decision on.
    publish(&topics, change(b, 2, HealthState::Unhealthy, None)).await;
    let out = now_ms();
    tokio::time::sleep(Duration::from_secs(3)).await;
    for (name, cl) in [("go", &go), ("python", &py)] {
        assert_eq!(
            cl.to(b, out + 1_000),
            0,
            "{name}: calls to the ejected endpoint: {:?}",
            cl.split(out)
        );
        assert!(
            cl.to(a, out + 1_000) > 0 && cl.to(c, out + 1_000) > 0,
            "{name}: {:?}",
            cl.split(out)
        );
        let first_gone = cl
            .calls
            .lock()
            .unwrap()
            .iter()
            .filter(|(t, p)| *t > out && p == b)
            .map(|(t, _)| *t)
            .max();
        eprintln!(
            "{name}: the last call to b came {:?} ms after the decision",
            first_gone.map(|t| t - out)
        );
    }

    // Readmitted: calls reach it again.
    publish(&topics, change(b, 3, HealthState::Healthy, None)).await;
    let back = now_ms();
    reaching(&[&go, &py], &[b], back, "the readmitted endpoint called again").await;

    // Maintenance: DRAINING, no new calls.
    publish(&topics, change(c, 2, HealthState::Maintenance, None)).await;
    let drained = now_ms();
    tokio::time::sleep(Duration::from_secs(3)).await;
    for (name, cl) in [("go", &go), ("python", &py)] {
        assert_eq!(
            cl.to(c, drained + 1_000),
            0,
            "{name}: calls to the draining endpoint: {:?}",
            cl.split(drained)
        );
    }
    publish(&topics, change(c, 3, HealthState::Healthy, None)).await;
    reaching(&[&go, &py], &[c], now_ms(), "the endpoint back from maintenance").await;

    // A scoped decision: out for gateway=edge-go only — the Go client (cluster edge-go) stops
    // calling a, the Python one (edge-py) does not.
    publish(&topics, change(a, 2, HealthState::Unhealthy, Some("gateway=edge-go"))).await;
    let scoped = now_ms();
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(go.to(a, scoped + 1_000), 0, "go (edge-go): {:?}", go.split(scoped));
    assert!(py.to(a, scoped + 1_000) > 0, "python (edge-py): {:?}", py.split(scoped));
    publish(&topics, change(a, 3, HealthState::Healthy, Some("gateway=edge-go"))).await;
    reaching(&[&go], &[a], now_ms(), "a back for edge-go").await;

    // A restart of vitals-xds loses no call: the clients keep their assignment meanwhile, and
    // take the restarted server's (the same versions) without a failed call.
    let before = now_ms();
    server.kill9();
    tokio::time::sleep(Duration::from_secs(2)).await;
    server = xds(
        &topics,
        grpc_port,
        http_port,
        &["--fail-open-after-secs", "4", "--stale-after-secs", "2"],
    );
    wait_until("vitals-xds ready again", Duration::from_secs(60), || async {
        http_get(http_port, "/readyz")
            .await
            .is_some_and(|b| b.contains("ready"))
    })
    .await;
    // Each client comes back on its own backoff (grpc-go's grows while the server is away).
    wait_until(
        "both clients' streams on the restarted server",
        Duration::from_secs(120),
        || async { metric(http_port, "vitals_xds_streams").await.is_some_and(|n| n >= 2.0) },
    )
    .await;
    let restarted = now_ms();
    reaching(&[&go, &py], &[a, b, c], restarted, "all three called after the restart").await;
    for (name, cl) in [("go", &go), ("python", &py)] {
        assert_eq!(
            cl.errors(before),
            Vec::<String>::new(),
            "{name}: failed calls across the restart"
        );
    }

    // Fail-open: b out again, then vitals goes silent; after --fail-open-after-secs (4) every
    // endpoint is served in rotation, b too.
    publish(&topics, change(b, 4, HealthState::Unhealthy, None)).await;
    let out_again = now_ms();
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(go.to(b, out_again + 1_000), 0);
    ticking.store(false, Ordering::Relaxed);
    ticker.await.unwrap();
    let silent = now_ms();
    reaching(
        &[&go, &py],
        &[b],
        silent,
        "b served again once vitals is silent (fail-open)",
    )
    .await;
    let opened = go
        .calls
        .lock()
        .unwrap()
        .iter()
        .find(|(t, p)| *t > silent && p == b)
        .map(|(t, _)| t - silent);
    eprintln!("fail-open: b called again {opened:?} ms after the last tick");
    assert!(
        opened.is_some_and(|ms| ms >= 2_000),
        "not before the view went open: {opened:?}"
    );
    let metrics = http_get(http_port, "/metrics").await.unwrap_or_default();
    assert!(
        !metrics.lines().any(|l| l.starts_with("vitals_xds_nacks_total{")),
        "no client refused a response:\n{metrics}"
    );
    assert!(
        metrics.contains("vitals_xds_responses_total{type=\"ClusterLoadAssignment\"}"),
        "{metrics}"
    );
    drop(upstreams.stdin.take());
    let _ = upstreams.child.wait();
    drop(server);
}

/// Endpoint weights (vitals' slow start and probation, as `load_balancing_weight`) shift the
/// split where the client's policy honours them: one endpoint at a tenth of the others' weight,
/// under `round_robin` (the weights ignored by both clients: a third of the calls each) and under
/// `ring_hash` (each call hashed at random, so the ring's weighted shares are the split).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn weights_shift_the_split_where_the_clients_policy_honours_them() {
    for policy in ["round_robin", "ring_hash"] {
        let topics = Topics::create(&unique("xdsw"), 1, Stamp::LogAppendTime).await;
        let dir = std::env::temp_dir().join(unique("xdsw-boot"));
        std::fs::create_dir_all(&dir).unwrap();
        let ports: Vec<u16> = (0..3).map(|_| free_port()).collect();
        let eps: Vec<String> = ports.iter().map(|p| format!("127.0.0.1:{p}")).collect();
        let _upstreams = Caller::start({
            let mut cmd = Command::new(tool());
            cmd.arg("upstreams").args(ports.iter().map(u16::to_string));
            cmd
        });
        for (i, ep) in eps.iter().enumerate() {
            let mut h = change(
                ep,
                1,
                if i == 1 {
                    HealthState::Recovering
                } else {
                    HealthState::Healthy
                },
                None,
            );
            if i == 1 {
                h.weight = 0.1;
            }
            publish(&topics, h).await;
        }
        let on = Arc::new(AtomicBool::new(true));
        let ticker = ticks(&topics, on.clone());
        let (grpc_port, http_port) = (free_port(), free_port());
        // ring_hash's run tells every client DEGRADED as it is (`--degraded degraded`), the other
        // run leaves the default (auto: gRPC clients are told HEALTHY at the lowered weight).
        let told = if policy == "ring_hash" { "degraded" } else { "auto" };
        let _server = xds(
            &topics,
            grpc_port,
            http_port,
            &["--lb-policy", policy, "--degraded", told],
        );
        wait_until("vitals-xds ready", Duration::from_secs(60), || async {
            http_get(http_port, "/readyz")
                .await
                .is_some_and(|b| b.contains("ready"))
        })
        .await;
        let go = go_client(&bootstrap(&dir, "go-w", grpc_port, "edge-go"));
        let py = python_client(&bootstrap(&dir, "py-w", grpc_port, "edge-py"));
        let start = now_ms();
        reaching(&[&go, &py], &[&eps[0], &eps[2]], start, "both clients calling").await;
        let from = now_ms();
        tokio::time::sleep(Duration::from_secs(6)).await;
        for (name, cl) in [("go", &go), ("python", &py)] {
            let split = cl.split(from);
            let total: usize = eps.iter().map(|e| split.get(e).copied().unwrap_or(0)).sum();
            let share = split.get(&eps[1]).copied().unwrap_or(0) as f64 / total.max(1) as f64;
            eprintln!(
                "{policy}, {name}: the endpoint at weight 10 of 100 took {:.1} % of {total} calls",
                share * 100.0
            );
            assert!(total >= 100, "{policy}, {name}: {split:?}");
            match policy {
                "round_robin" => assert!(
                    share > 0.25,
                    "{policy}, {name}: weights are not honoured by round_robin: {split:?}"
                ),
                _ => assert!(share < 0.15, "{policy}, {name}: the weight shifts the split: {split:?}"),
            }
        }
        // Degraded: gRPC leaves an endpoint it is told is DEGRADED out altogether; told HEALTHY at
        // its lowered weight (auto), it keeps getting calls.
        publish(&topics, change(&eps[1], 2, HealthState::Degraded, None)).await;
        tokio::time::sleep(Duration::from_secs(2)).await;
        let from = now_ms();
        tokio::time::sleep(Duration::from_secs(4)).await;
        for (name, cl) in [("go", &go), ("python", &py)] {
            let split = cl.split(from);
            let n = split.get(&eps[1]).copied().unwrap_or(0);
            eprintln!("degraded told as {told}, {policy}, {name}: {n} calls to it of {split:?}");
            DEGRADED_CALLS.lock().unwrap().push((told, name, n));
        }
        on.store(false, Ordering::Relaxed);
        ticker.await.unwrap();
    }
    let degraded = DEGRADED_CALLS.lock().unwrap().clone();
    for (told, name, n) in &degraded {
        match *told {
            "degraded" => assert_eq!(*n, 0, "{name}: gRPC leaves a DEGRADED endpoint out: {degraded:?}"),
            _ => assert!(
                *n > 20,
                "{name}: told HEALTHY at a quarter's weight, it is called: {degraded:?}"
            ),
        }
    }
}

static DEGRADED_CALLS: Mutex<Vec<(&str, &str, usize)>> = Mutex::new(Vec::new());

/// The incremental (delta) variant and plain EDS, which neither gRPC client speaks (Envoy does):
/// tonic clients of Envoy's own service definitions against the real binary. A subscription
/// gets the resource; a transition sends it again with its new version; a reconnect that names
/// the version it holds gets nothing it has; a name that is no pool is removed; plain EDS
/// answers state-of-the-world requests for assignments only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_incremental_variant_and_plain_eds_serve_the_same_assignments() {
    use envoy_types::pb::envoy::config::core::v3::{HealthStatus, Node};
    use envoy_types::pb::envoy::config::endpoint::v3::{lb_endpoint, ClusterLoadAssignment};
    use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
    use envoy_types::pb::envoy::service::discovery::v3::{
        DeltaDiscoveryRequest, DeltaDiscoveryResponse, DiscoveryRequest,
    };
    use envoy_types::pb::envoy::service::endpoint::v3::endpoint_discovery_service_client::EndpointDiscoveryServiceClient;
    use prost::Message;
    const EDS: &str = "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment";

    let topics = Topics::create(&unique("xdsd"), 1, Stamp::LogAppendTime).await;
    let (a, b) = ("127.0.0.1:7101", "127.0.0.1:7102");
    publish(&topics, change(a, 1, HealthState::Healthy, None)).await;
    publish(&topics, change(b, 1, HealthState::Healthy, None)).await;
    let (grpc_port, http_port) = (free_port(), free_port());
    let _server = xds(&topics, grpc_port, http_port, &[]);
    wait_until("vitals-xds ready", Duration::from_secs(60), || async {
        http_get(http_port, "/readyz")
            .await
            .is_some_and(|b| b.contains("ready"))
    })
    .await;
    let url = format!("http://127.0.0.1:{grpc_port}");
    let node = Node {
        id: "rs-1".into(),
        cluster: "edge-rs".into(),
        ..Default::default()
    };
    let statuses = |cla: &ClusterLoadAssignment| -> BTreeMap<String, i32> {
        cla.endpoints
            .iter()
            .flat_map(|l| &l.lb_endpoints)
            .map(|e| match &e.host_identifier {
                Some(lb_endpoint::HostIdentifier::Endpoint(ep)) => (ep.hostname.clone(), e.health_status),
                _ => (String::new(), e.health_status),
            })
            .collect()
    };
    let decode = |r: &DeltaDiscoveryResponse| {
        ClusterLoadAssignment::decode(r.resources[0].resource.as_ref().unwrap().value.as_slice()).unwrap()
    };
    let open = |initial: Vec<(String, String)>, subscribe: Vec<String>| {
        let (url, node) = (url.clone(), node.clone());
        async move {
            let mut client = AggregatedDiscoveryServiceClient::connect(url).await.expect("connects");
            let (tx, rx) = tokio::sync::mpsc::channel(8);
            tx.send(DeltaDiscoveryRequest {
                node: Some(node),
                type_url: EDS.into(),
                resource_names_subscribe: subscribe,
                initial_resource_versions: initial.into_iter().collect(),
                ..Default::default()
            })
            .await
            .unwrap();
            let inbound = client
                .delta_aggregated_resources(tokio_stream::wrappers::ReceiverStream::new(rx))
                .await
                .expect("the stream opens")
                .into_inner();
            (tx, inbound)
        }
    };
    let (tx, mut inbound) = open(Vec::new(), vec![POOL.into()]).await;
    let first = next(&mut inbound).await;
    assert_eq!(first.resources.len(), 1);
    let version = first.resources[0].version.clone();
    assert_eq!(
        statuses(&decode(&first)).values().copied().collect::<Vec<_>>(),
        [HealthStatus::Healthy as i32; 2]
    );
    tx.send(DeltaDiscoveryRequest {
        type_url: EDS.into(),
        response_nonce: first.nonce.clone(),
        ..Default::default()
    })
    .await
    .unwrap();
    // A transition: the assignment again, b unhealthy, another version.
    publish(&topics, change(b, 2, HealthState::Unhealthy, None)).await;
    let update = next(&mut inbound).await;
    assert_ne!(update.resources[0].version, version);
    assert_eq!(statuses(&decode(&update))[b], HealthStatus::Unhealthy as i32);
    let held = update.resources[0].version.clone();
    // A name that is no pool: removed.
    tx.send(DeltaDiscoveryRequest {
        type_url: EDS.into(),
        resource_names_subscribe: vec!["nope".into()],
        response_nonce: update.nonce.clone(),
        ..Default::default()
    })
    .await
    .unwrap();
    let removed = next(&mut inbound).await;
    assert_eq!(
        (removed.resources.len(), removed.removed_resources.clone()),
        (0, vec!["nope".to_owned()])
    );
    drop(tx);
    // A reconnect holding the current version: nothing sent until something changes.
    let (tx2, mut inbound2) = open(vec![(POOL.into(), held)], vec![POOL.into()]).await;
    let quiet = tokio::time::timeout(Duration::from_secs(2), inbound2.message()).await;
    assert!(
        quiet.is_err(),
        "nothing new for a client holding the current version: {quiet:?}"
    );
    publish(&topics, change(b, 3, HealthState::Healthy, None)).await;
    let back = next(&mut inbound2).await;
    assert_eq!(statuses(&decode(&back))[b], HealthStatus::Healthy as i32);
    drop(tx2);
    // Plain EDS, state of the world.
    let mut eds = EndpointDiscoveryServiceClient::connect(url.clone()).await.unwrap();
    let (etx, erx) = tokio::sync::mpsc::channel(4);
    etx.send(DiscoveryRequest {
        node: Some(node.clone()),
        type_url: EDS.into(),
        resource_names: vec![POOL.into()],
        ..Default::default()
    })
    .await
    .unwrap();
    let mut sotw = eds
        .stream_endpoints(tokio_stream::wrappers::ReceiverStream::new(erx))
        .await
        .unwrap()
        .into_inner();
    let r = tokio::time::timeout(Duration::from_secs(30), sotw.message())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    let cla = ClusterLoadAssignment::decode(r.resources[0].value.as_slice()).unwrap();
    assert_eq!(statuses(&cla)[b], HealthStatus::Healthy as i32);
    assert_eq!(r.type_url, EDS);
}

/// The next answer on an incremental stream, within 30 s.
async fn next(
    inbound: &mut tonic::Streaming<envoy_types::pb::envoy::service::discovery::v3::DeltaDiscoveryResponse>,
) -> envoy_types::pb::envoy::service::discovery::v3::DeltaDiscoveryResponse {
    tokio::time::timeout(Duration::from_secs(30), inbound.message())
        .await
        .expect("an answer within 30 s")
        .expect("no error")
        .expect("the stream is open")
}

/// deploy/envoy's configurations (not run here: no Envoy binary on these machines) decode
/// strictly into Envoy's protos and pass their validation rules; a misspelt field or an
/// impossible value is refused, so the check can fail.
#[test]
fn the_envoy_configurations_hold_against_envoys_protos() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let check = |path: &std::path::Path| {
        let out = Command::new(tool())
            .arg("envoy-config")
            .arg(path)
            .output()
            .expect("runs");
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr),
        )
    };
    for name in ["envoy.yaml", "envoy-eds.yaml"] {
        let path = root.join("deploy/envoy").join(name);
        let (ok, said) = check(&path);
        assert!(ok, "{name}: {said}");
        let text = std::fs::read_to_string(&path).unwrap();
        let dir = std::env::temp_dir().join(unique("envoy-config"));
        std::fs::create_dir_all(&dir).unwrap();
        for (what, from, to) in [
            ("a misspelt field", "stat_prefix:", "stat_prefx:"),
            ("a port out of range", "port_value: 10000", "port_value: 100000"),
        ] {
            let bad = dir.join(name);
            std::fs::write(&bad, text.replacen(from, to, 1)).unwrap();
            let (ok, said) = check(&bad);
            assert!(!ok, "{name} with {what} is refused: {said}");
        }
    }
}

/// Two instances behind one address serve the same answer: the same versions and the same bytes
/// for the same state, as a restarted instance does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_serve_the_same_versions() {
    use envoy_types::pb::envoy::config::core::v3::Node;
    use envoy_types::pb::envoy::service::discovery::v3::DiscoveryRequest;
    use envoy_types::pb::envoy::service::endpoint::v3::endpoint_discovery_service_client::EndpointDiscoveryServiceClient;
    let topics = Topics::create(&unique("xds2"), 1, Stamp::LogAppendTime).await;
    publish(&topics, change("127.0.0.1:7201", 1, HealthState::Healthy, None)).await;
    publish(&topics, change("127.0.0.1:7202", 1, HealthState::Unhealthy, None)).await;
    let mut answers = Vec::new();
    let mut servers = Vec::new();
    for _ in 0..2 {
        let (grpc_port, http_port) = (free_port(), free_port());
        servers.push(xds(&topics, grpc_port, http_port, &[]));
        wait_until("vitals-xds ready", Duration::from_secs(60), || async {
            http_get(http_port, "/readyz")
                .await
                .is_some_and(|b| b.contains("ready"))
        })
        .await;
        let mut eds = EndpointDiscoveryServiceClient::connect(format!("http://127.0.0.1:{grpc_port}"))
            .await
            .unwrap();
        let r = eds
            .fetch_endpoints(DiscoveryRequest {
                node: Some(Node {
                    cluster: "edge".into(),
                    ..Default::default()
                }),
                resource_names: vec![POOL.into()],
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        answers.push((r.version_info, r.resources));
    }
    drop(servers);
    assert!(!answers[0].1.is_empty());
    assert_eq!(answers[0], answers[1], "the same version and bytes from both instances");
}
