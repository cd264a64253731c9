//! vitals fed by OpenTelemetry alone, with no vitals code in the caller: `vitals-otlp` in front
//! of the real broker, database and processor, and
//! - a service instrumented with the OpenTelemetry Python SDK and its httpx instrumentation,
//!   exporting over OTLP/HTTP (gzip, the older HTTP conventions) and over OTLP/gRPC (gzip, the
//!   stable conventions): an endpoint refusing connections, one answering 503s and one too slow
//!   for its callers are ejected, each with the spans' outcomes as the evidence;
//! - the LiteLLM proxy with its built-in `otel` callback only: a deployment failing is ejected
//!   from LiteLLM's own spans.
//!
//! No prober runs: the spans are the only evidence. Needs the local stack: run `scripts/test.sh`.
// Needs the local stack and its peers: `scripts/test.sh` runs it (`--features stack`).
#![cfg(feature = "stack")]

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use vitals_contracts::OutcomeClass;
use vitals_system_tests::*;
use vitals_testkit::{brokers, free_port, http_get, metric, unique, wait_until, Service, Topics};
use vitals_upstream_sim::Behaviour;

/// The secret the clients here send (`Authorization: Bearer …`, each in its own way), a reporter's
/// token in the receiver's tokens file.
const REPORTER_SECRET: &str = "otel-reporter-secret-5f2a9c";

/// The tokens file the receivers here read: one reporter, which may report as anyone.
fn tokens_file() -> std::path::PathBuf {
    let f = std::env::temp_dir().join(format!("{}.tokens", unique("otlp")));
    std::fs::write(&f, format!("clients:reporter:{REPORTER_SECRET}\n")).unwrap();
    f
}

/// The OpenTelemetry exporters' header setting carrying the token (the value percent-encoded,
/// as the specification says).
fn otlp_headers() -> String {
    format!("authorization=Bearer%20{REPORTER_SECRET}")
}

/// `vitals-otlp` reporting to `topics` with the table `map`, serving OTLP/HTTP and OTLP/gRPC on
/// free ports once ready, to clients with the token: (it, HTTP port, gRPC port, the metrics
/// port).
async fn start_otlp(label: &str, topics: &Topics, map: &str) -> (Service, u16, u16, u16) {
    let map_file = std::env::temp_dir().join(format!("{}.toml", unique(label)));
    std::fs::write(&map_file, map).unwrap();
    let (http, grpc, metrics) = (free_port(), free_port(), free_port());
    let otlp = Service::start(
        "vitals-otlp",
        label,
        &flags(&[
            ("--brokers", &brokers()),
            ("--signals-topic", &topics.signals),
            ("--map", map_file.to_str().unwrap()),
            ("--http-addr", &format!("127.0.0.1:{http}")),
            ("--grpc-addr", &format!("127.0.0.1:{grpc}")),
            ("--tokens-file", tokens_file().to_str().unwrap()),
            ("--metrics-addr", &format!("127.0.0.1:{metrics}")),
        ]),
    );
    wait_until("vitals-otlp up", Duration::from_secs(30), || async move {
        http_get(http, "/readyz").await.as_deref() == Some("ready")
    })
    .await;
    (otlp, http, grpc, metrics)
}

/// The OTel-instrumented client (tests/system/otel/httpx_client.py), its calls counted.
struct Client {
    child: KillOnDrop,
    calls: Arc<AtomicUsize>,
}

impl Client {
    fn start(stack: &Stack, otlp: &str, protocol: &str, env: &[(&str, &str)]) -> Client {
        let script = repo().join("tests/system/otel/httpx_client.py");
        let mut cmd = Command::new(venv_bin("python"));
        cmd.arg(script).args([
            "--otlp",
            otlp,
            "--protocol",
            protocol,
            "--gzip",
            "--rate",
            "15",
            "--timeout",
            "1",
        ]);
        for (ep, addr) in stack.sim.endpoints() {
            cmd.args(["--target", &format!("{ep}=http://{addr}")]);
        }
        let log = std::env::temp_dir().join(format!("{}.log", unique(&format!("otel-{protocol}"))));
        eprintln!("OTel client ({protocol}) log: {}", log.display());
        let mut child = cmd
            .env("OTEL_EXPORTER_OTLP_HEADERS", otlp_headers())
            .envs(env.iter().copied())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(std::fs::File::create(&log).unwrap()))
            .spawn()
            .expect("the OTel client starts");
        let calls = Arc::new(AtomicUsize::new(0));
        let out = child.stdout.take().unwrap();
        let c = calls.clone();
        std::thread::spawn(move || {
            for _ in BufReader::new(out).lines().map_while(Result::ok) {
                c.fetch_add(1, Ordering::Relaxed);
            }
        });
        Client {
            child: KillOnDrop(child),
            calls,
        }
    }
}

/// Set `fault` on `ep`; wait for its ejection; the ejection's evidence reported by `gateway`
/// (the spans' reports among its triggers). Then heal it and wait for its readmission.
async fn ejected_on_spans(
    stack: &Stack,
    ep: &str,
    fault: Behaviour,
    gateway: &str,
    what: &str,
) -> Vec<vitals_contracts::CallOutcome> {
    stack.set(ep, fault);
    let at = unix_now();
    let (t, triggers, _) = stack
        .transition_after(ep, "unhealthy", at, Duration::from_secs(120))
        .await;
    let evidence = evidence_from(stack, &triggers, gateway).await;
    eprintln!(
        "{what}: {ep} ejected {:.1} s after the fault; {} of its {} triggers are the spans' reports: {:?}",
        t - at,
        evidence.len(),
        triggers.len(),
        evidence.iter().map(|c| c.outcome).collect::<Vec<_>>()
    );
    stack.set(ep, healthy());
    let heal = unix_now();
    let (back, _, _) = stack
        .transition_after(ep, "recovering", heal, Duration::from_secs(120))
        .await;
    eprintln!(
        "{what}: {ep} readmitted {:.1} s after the heal, on the spans alone",
        back - heal
    );
    evidence
}

/// Wait until `vitals-otlp` (metrics port `metrics`) has reported `n` calls from `who`'s spans.
async fn calls_reported(metrics: u16, n: f64, who: &str) {
    wait_until(
        &format!("{who}'s spans reported as calls"),
        Duration::from_secs(90),
        || async move {
            metric(metrics, "vitals_otlp_spans_total{result=\"call\"}")
                .await
                .unwrap_or(0.0)
                >= n
        },
    )
    .await;
}

/// An endpoint answering every request 503.
fn answering_503() -> Behaviour {
    Behaviour {
        server_errors: 1.0,
        ..healthy()
    }
}

/// Calls to each of `urls` every `every` (with a bearer token when given), until aborted.
fn load(
    urls: Vec<String>,
    every: Duration,
    bearer: Option<&'static str>,
    body: serde_json::Value,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let client = reqwest::Client::builder()
            .timeout(Duration::from_secs(10))
            .build()
            .unwrap();
        let mut tick = tokio::time::interval(every);
        loop {
            tick.tick().await;
            for url in &urls {
                let mut req = client.post(url).json(&body);
                if let Some(t) = bearer {
                    req = req.bearer_auth(t);
                }
                tokio::spawn(async move {
                    let _ = req.send().await;
                });
            }
        }
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn otel_sdk_spans_over_http_and_grpc_eject_a_refusing_a_failing_and_a_slow_endpoint() {
    let pool = "checkout";
    let stack = Stack::start_without_prober("otlp_sdk", pool).await;
    // The default table (client spans; pool from service.name; endpoint from the server's
    // address and port), with the simulator's addresses renamed to its endpoint names.
    let mut map = String::from("[endpoints]\n");
    for (ep, addr) in stack.sim.endpoints() {
        map.push_str(&format!("\"{addr}\" = \"{ep}\"\n"));
    }
    let (_otlp, http, grpc, metrics) = start_otlp("otlp-sdk", &stack.topics, &map).await;
    let over_http = Client::start(&stack, &format!("http://127.0.0.1:{http}"), "http", &[]);
    let over_grpc = Client::start(
        &stack,
        &format!("http://127.0.0.1:{grpc}"),
        "grpc",
        &[("OTEL_SEMCONV_STABILITY_OPT_IN", "http")],
    );
    wait_until(
        "spans from both exporters reported",
        Duration::from_secs(90),
        || async move {
            let ok = |t: &'static str| async move {
                metric(
                    metrics,
                    &format!("vitals_otlp_requests_total{{transport=\"{t}\",result=\"ok\"}}"),
                )
                .await
                .unwrap_or(0.0)
            };
            ok("http").await > 2.0 && ok("grpc").await > 2.0
        },
    )
    .await;

    let refused = ejected_on_spans(
        &stack,
        "e0",
        Behaviour {
            refuse: true,
            ..healthy()
        },
        pool,
        "refused connections",
    )
    .await;
    assert!(
        refused.iter().any(|c| c.outcome == OutcomeClass::ConnectError),
        "the spans of refused connections are connect errors: {refused:?}"
    );
    let failing = ejected_on_spans(&stack, "e1", answering_503(), pool, "503s").await;
    assert!(
        failing
            .iter()
            .any(|c| c.outcome == OutcomeClass::ServerError && c.http_status == Some(503)),
        "the spans of 503 answers are server errors with their status: {failing:?}"
    );
    let slow = ejected_on_spans(
        &stack,
        "e2",
        Behaviour {
            ttft_ms: 3000,
            ..healthy()
        },
        pool,
        "slow answers",
    )
    .await;
    assert!(
        slow.iter().any(|c| c.outcome == OutcomeClass::Timeout),
        "the spans of calls their client gave up on are timeouts: {slow:?}"
    );
    for c in refused.iter().chain(&failing).chain(&slow) {
        assert_eq!(
            c.event_id.len(),
            48,
            "a report's id is its span's trace and span ids: {c:?}"
        );
        assert_eq!(c.attributes.get("otel.rule").map(String::as_str), Some("http-client"));
    }
    // Both transports carried calls; nothing was refused or dropped.
    for (name, at_least) in [
        ("vitals_otlp_requests_total{transport=\"http\",result=\"ok\"}", 1.0),
        ("vitals_otlp_requests_total{transport=\"grpc\",result=\"ok\"}", 1.0),
        ("vitals_otlp_spans_total{result=\"call\"}", 100.0),
        // Both SDK exporters sent the token from OTEL_EXPORTER_OTLP_HEADERS.
        (
            "vitals_otlp_reporter_spans_total{token=\"clients\",result=\"taken\"}",
            100.0,
        ),
    ] {
        let v = metric(metrics, name).await.unwrap_or(0.0);
        assert!(v >= at_least, "{name} = {v}");
    }
    for name in [
        "vitals_otlp_requests_total{transport=\"http\",result=\"malformed\"}",
        "vitals_otlp_requests_total{transport=\"grpc\",result=\"malformed\"}",
        "vitals_otlp_spans_total{result=\"rejected\"}",
        "vitals_otlp_outcomes_total{result=\"dropped\"}",
        "vitals_otlp_requests_total{transport=\"http\",result=\"unauthenticated\"}",
        "vitals_otlp_requests_total{transport=\"grpc\",result=\"unauthenticated\"}",
    ] {
        assert_eq!(metric(metrics, name).await, Some(0.0), "{name}");
    }
    eprintln!(
        "calls made: {} over HTTP, {} over gRPC",
        over_http.calls.load(Ordering::Relaxed),
        over_grpc.calls.load(Ordering::Relaxed)
    );
    drop((over_http.child, over_grpc.child));
    stack.finish().await;
}

const MASTER_KEY: &str = "sk-vitals-otlp-test-7d3e1c9a";

/// LiteLLM's spans name a failed call's deployment only by its model string (the failure span's
/// `hidden_params` carry no model id or API base in 1.110.2), so each deployment gets its own
/// model name here, and the table reads `litellm.provider.model`.
const LITELLM_MAP: &str = r#"
gateway = ["litellm-otel"]
[[call]]
name = "litellm"
kinds = ["internal", "client"]
span_names = ["litellm_request"]
pool = ["{litellm.model_group}"]
endpoint = ["{litellm.provider.model}"]
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn litellm_proxy_with_only_its_otel_callback_gets_a_failing_deployment_ejected() {
    let pool = "chat";
    let stack = Stack::start_without_prober("otlp_litellm", pool).await;
    let mut map = String::from(LITELLM_MAP);
    map.push_str("[endpoints]\n");
    for (ep, _) in stack.sim.endpoints() {
        map.push_str(&format!("\"openai/{ep}\" = \"{ep}\"\n"));
    }
    let (_otlp, http, _, metrics) = start_otlp("otlp-litellm", &stack.topics, &map).await;
    let port = free_port();
    let mut yaml = String::from("model_list:\n");
    for (ep, addr) in stack.sim.endpoints() {
        yaml.push_str(&format!(
            "  - model_name: {pool}\n    litellm_params:\n      model: openai/{ep}\n      api_base: http://{addr}/v1\n      api_key: none\n    model_info:\n      id: {ep}\n"
        ));
    }
    yaml.push_str(
        "litellm_settings:\n  callbacks: [\"otel\"]\nrouter_settings:\n  num_retries: 0\n  disable_cooldowns: true\n",
    );
    yaml.push_str(&format!("general_settings:\n  master_key: {MASTER_KEY}\n"));
    let cfg = std::env::temp_dir().join(format!("{}.yaml", unique("litellm_otel")));
    std::fs::write(&cfg, yaml).unwrap();
    let log = std::env::temp_dir().join(format!("{}.log", unique("litellm-otel")));
    eprintln!("LiteLLM proxy log: {}", log.display());
    let _proxy = KillOnDrop(
        Command::new(venv_bin("litellm"))
            .args([
                "--config",
                cfg.to_str().unwrap(),
                "--host",
                "127.0.0.1",
                "--port",
                &port.to_string(),
            ])
            .env("OTEL_EXPORTER", "otlp_http")
            .env("OTEL_ENDPOINT", format!("http://127.0.0.1:{http}/v1/traces"))
            // LiteLLM splits its headers setting on '=' and ',' and decodes nothing.
            .env("OTEL_HEADERS", format!("Authorization=Bearer {REPORTER_SECRET}"))
            .env("LITELLM_LOCAL_MODEL_COST_MAP", "True")
            .stdin(Stdio::null())
            .stdout(Stdio::from(std::fs::File::create(&log).unwrap()))
            .stderr(Stdio::from(std::fs::File::create(&log).unwrap()))
            .spawn()
            .expect("the LiteLLM proxy starts"),
    );
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    let url = format!("http://127.0.0.1:{port}/v1/chat/completions");
    let body = serde_json::json!({"model": pool, "messages": [{"role": "user", "content": "hi"}]});
    {
        let (client, url, body) = (client.clone(), url.clone(), body.clone());
        wait_until("the LiteLLM proxy up", Duration::from_secs(120), || {
            let (client, url, body) = (client.clone(), url.clone(), body.clone());
            async move {
                client
                    .post(url)
                    .bearer_auth(MASTER_KEY)
                    .json(&body)
                    .send()
                    .await
                    .is_ok_and(|r| r.status().is_success())
            }
        })
        .await;
    }
    // Load: 10 calls a second through the proxy, which spreads them over e0, e1, e2.
    let load = load(
        vec![url.clone()],
        Duration::from_millis(100),
        Some(MASTER_KEY),
        body.clone(),
    );
    calls_reported(metrics, 20.0, "LiteLLM").await;
    let failing = ejected_on_spans(&stack, "e1", answering_503(), "litellm-otel", "LiteLLM, 503s").await;
    assert!(
        failing.iter().any(|c| c.outcome.is_failure()),
        "the ejection's evidence includes LiteLLM's failure spans: {failing:?}"
    );
    assert!(
        failing
            .iter()
            .all(|c| c.attributes.get("otel.span").map(String::as_str) == Some("litellm_request")),
        "{failing:?}"
    );
    load.abort();
    stack.finish().await;
}

/// Caddy's spans (its `tracing` directive: one SERVER span per request, from otelhttp) name the
/// site that took the request, not the upstream it chose, so each simulated endpoint gets a site
/// of its own and the table names endpoints by the site's address. They carry the status the
/// upstream answered; a refused upstream's 502, which Caddy answers outside the tracing handler,
/// they record as 200 (Caddy 2.11.9), so the fault here is answers of 503.
fn caddy_map(sites: &[(String, u16)]) -> String {
    let mut map = String::from(
        "gateway = [\"{resource:service.name}\"]\n[[call]]\nname = \"caddy\"\nkinds = [\"server\"]\nspan_names = [\"vitals_upstream\"]\npool = [\"web\"]\nendpoint = [\"{server.address}:{server.port}\"]\n[endpoints]\n",
    );
    for (ep, port) in sites {
        map.push_str(&format!("\"127.0.0.1:{port}\" = \"{ep}\"\n"));
    }
    map
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn caddy_emitting_otlp_natively_gets_a_failing_upstream_ejected() {
    let caddy = std::path::PathBuf::from(
        std::env::var("VITALS_CADDY").unwrap_or_else(|_| "/opt/vitals-caddy/bin/caddy".into()),
    );
    assert!(
        caddy.exists(),
        "{} is missing: run scripts/install-deps.sh (it builds Caddy from its Go module)",
        caddy.display()
    );
    let stack = Stack::start_without_prober("otlp_caddy", "web").await;
    let sites: Vec<(String, u16)> = stack
        .sim
        .endpoints()
        .into_iter()
        .map(|(ep, _)| (ep, free_port()))
        .collect();
    let (_otlp, http, _, metrics) = start_otlp("otlp-caddy", &stack.topics, &caddy_map(&sites)).await;
    let mut caddyfile = String::from("{\n\tadmin off\n\tauto_https off\n}\n");
    for ((_, port), (_, addr)) in sites.iter().zip(stack.sim.endpoints()) {
        caddyfile.push_str(&format!(
            ":{port} {{\n\tbind 127.0.0.1\n\ttracing {{\n\t\tspan vitals_upstream\n\t}}\n\treverse_proxy {addr}\n}}\n"
        ));
    }
    let cfg = std::env::temp_dir().join(format!("{}.caddyfile", unique("caddy")));
    std::fs::write(&cfg, caddyfile).unwrap();
    let log = std::env::temp_dir().join(format!("{}.log", unique("caddy")));
    eprintln!("Caddy log: {}", log.display());
    let _caddy = KillOnDrop(
        Command::new(&caddy)
            .args(["run", "--config", cfg.to_str().unwrap(), "--adapter", "caddyfile"])
            .env("OTEL_SERVICE_NAME", "caddy")
            .env("OTEL_TRACES_EXPORTER", "otlp")
            .env("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
            .env("OTEL_EXPORTER_OTLP_ENDPOINT", format!("http://127.0.0.1:{http}"))
            .env("OTEL_EXPORTER_OTLP_HEADERS", otlp_headers())
            .env("OTEL_BSP_SCHEDULE_DELAY", "200")
            .stdin(Stdio::null())
            .stdout(Stdio::from(std::fs::File::create(&log).unwrap()))
            .stderr(Stdio::from(std::fs::File::create(&log).unwrap()))
            .spawn()
            .expect("Caddy starts"),
    );
    // Load: every site, 5 calls a second each.
    let urls = sites
        .iter()
        .map(|(_, p)| format!("http://127.0.0.1:{p}/v1/chat/completions"))
        .collect();
    let load = load(
        urls,
        Duration::from_millis(200),
        None,
        serde_json::json!({"model": "m", "messages": []}),
    );
    calls_reported(metrics, 30.0, "Caddy").await;
    let failing = ejected_on_spans(&stack, "e1", answering_503(), "caddy", "Caddy, 503s").await;
    assert!(
        failing
            .iter()
            .any(|c| c.outcome == OutcomeClass::ServerError && c.http_status == Some(503)),
        "Caddy's spans of the upstream's 503s are the ejection's evidence: {failing:?}"
    );
    load.abort();
    stack.finish().await;
}
