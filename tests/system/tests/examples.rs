//! The examples of `examples/` work as documented, against the real broker, database, processor
//! and API: the Python producer's reports lead to a transition, the Python consumer prints it,
//! the kcat commands show and send records, and the curl batch is ingested item by item.
//!
//! Needs the local stack (Kafka and Postgres, started by `scripts/test.sh`): run `scripts/test.sh`.
// Needs the local stack and its peers: `scripts/test.sh` runs it (`--features stack`).
#![cfg(feature = "stack")]

use rdkafka::consumer::Consumer;
use rdkafka::Message;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;
use vitals_contracts::{decode_signal, encode, CallOutcome, OutcomeClass, Signal};
use vitals_testkit::{brokers, free_port, unique, wait_until, Stamp, Topics};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Run an example; its stdout, or a panic with its stderr.
fn run(program: &str, args: &[&str], env: &[(&str, &str)]) -> String {
    let out = Command::new(program)
        .args(args)
        .envs(env.iter().copied())
        .current_dir(root())
        .output()
        .unwrap_or_else(|e| panic!("{program} runs: {e}"));
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{program} {args:?} failed ({}):\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// Every call report on `topic` (read from the beginning until `want` matches or 30 s pass).
async fn calls_on(topic: &str, want: impl Fn(&[CallOutcome]) -> bool) -> Vec<CallOutcome> {
    let c = vitals_testkit::consumer(&unique("examples_reader"));
    c.subscribe(&[topic]).unwrap();
    let mut calls = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while !want(&calls) {
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        match tokio::time::timeout(left, c.recv()).await {
            Ok(Ok(m)) => {
                if let Some(Ok(Signal::Call(call))) = m.payload().map(decode_signal) {
                    calls.push(call);
                }
            }
            Ok(Err(e)) => panic!("reading {topic}: {e}"),
            Err(_) => break,
        }
    }
    calls
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_examples_report_follow_and_ingest() {
    let name = unique("examples");
    let topics = Topics::create(&name, 2, Stamp::LogAppendTime).await;
    let db = vitals_testkit::migrated_schema(&name).await;
    let _processor = vitals_testkit::start_processor(&topics, &name, &name, &[]);
    let b = brokers();
    let py = |script: &str, args: &[&str]| {
        let mut a = vec![script];
        a.extend_from_slice(args);
        run("python3", &a, &[])
    };

    // Python producer: two healthy peers, then an endpoint whose connections are refused.
    for (ep, outcome, n) in [
        ("e2", "SUCCESS", "12"),
        ("e3", "SUCCESS", "12"),
        ("e1", "CONNECT_ERROR", "12"),
    ] {
        let out = py(
            "examples/python/report_calls.py",
            &[
                "--brokers",
                &b,
                "--topic",
                &topics.signals,
                "--pool",
                "py",
                "--endpoint",
                ep,
                "--outcome",
                outcome,
                "--count",
                n,
            ],
        );
        assert!(
            out.contains(&format!("delivered {n} {outcome} reports for py/{ep}")),
            "{out}"
        );
    }
    let transitions = || async {
        sqlx::query_scalar::<_, i64>("SELECT count(*) FROM transitions WHERE pool = 'py' AND endpoint = 'e1'")
            .fetch_one(&db)
            .await
            .unwrap()
    };
    wait_until(
        "a transition of py/e1 from the Python reports",
        Duration::from_secs(60),
        || async { transitions().await > 0 },
    )
    .await;

    // Python consumer: the state, then the changes from the beginning.
    let out = py(
        "examples/python/follow_health.py",
        &[
            "--brokers",
            &b,
            "--state-topic",
            &topics.state,
            "--changes-topic",
            &topics.changes,
            "--from-beginning",
            "--max",
            "1",
            "--timeout",
            "60",
        ],
    );
    let first: Vec<&str> = out
        .lines()
        .filter(|l| l.starts_with("py/e1 seq 1: healthy -> "))
        .collect();
    assert_eq!(first.len(), 1, "the first change of py/e1, once:\n{out}");
    assert!(out.contains("py/e1 is "), "the state topic's record of py/e1:\n{out}");

    // kcat: the changes keyed by pool/endpoint, the compacted state keyed by pool/endpoint, and a report
    // sent from a file (encoded by the contracts, as any client would send it).
    let env = [
        ("VITALS_KAFKA_BROKERS", b.as_str()),
        ("VITALS_SIGNALS_TOPIC", topics.signals.as_str()),
        ("VITALS_CHANGES_TOPIC", topics.changes.as_str()),
        ("VITALS_STATE_TOPIC", topics.state.as_str()),
    ];
    let out = run("examples/kcat.sh", &["tail-changes", "5"], &env);
    assert!(out.lines().any(|l| l.starts_with("key=py/e1 partition=")), "{out}");
    let out = run("examples/kcat.sh", &["states"], &env);
    assert!(out.lines().any(|l| l.starts_with("py/e1 ")), "{out}");
    let file = std::env::temp_dir().join(format!("{name}.bin"));
    let report = CallOutcome {
        http_status: Some(200),
        latency_us: 1_000,
        ..CallOutcome::new(
            unique("kcat-call"),
            "py",
            "e4",
            "kcat",
            vitals_now(),
            OutcomeClass::Success,
        )
    };
    std::fs::write(&file, encode(&report).unwrap()).unwrap();
    let out = run("examples/kcat.sh", &["report", file.to_str().unwrap(), "py"], &env);
    assert!(out.contains("keyed by py"), "{out}");
    let calls = calls_on(&topics.signals, |c| c.iter().any(|c| c.event_id == report.event_id)).await;
    assert!(calls.contains(&report), "the kcat report on the signals topic");
    let _ = std::fs::remove_file(&file);

    // curl: the API ingests a batch item by item.
    let port = free_port();
    let _api = vitals_testkit::start_api(&topics, &name, port, &["gw:writer:examples-writer-secret-01"]).await;
    let api_url = format!("http://127.0.0.1:{port}");
    let out = run(
        "examples/curl-ingest.sh",
        &["py", "e5"],
        &[
            ("VITALS_API", api_url.as_str()),
            ("VITALS_TOKEN", "examples-writer-secret-01"),
        ],
    );
    let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap_or_else(|e| panic!("{e}: {out}"));
    assert_eq!(
        (v["accepted"].as_i64(), v["rejected"].as_i64()),
        (Some(3), Some(1)),
        "{v}"
    );
    assert_eq!(v["results"][3]["status"], "rejected");
    let calls = calls_on(&topics.signals, |c| {
        c.iter().filter(|c| c.endpoint == "e5").count() >= 2
    })
    .await;
    let e5: Vec<OutcomeClass> = calls.iter().filter(|c| c.endpoint == "e5").map(|c| c.outcome).collect();
    assert_eq!(
        e5,
        [OutcomeClass::Success, OutcomeClass::ServerError],
        "the curl batch's calls, in order"
    );
    vitals_testkit::drop_schema(&db, &name).await;
}

fn vitals_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_micros() as i64
}
