//! The `vitals` binary: `simulate` gives exactly the processor's transitions for the same log
//! (the real processor, broker and database against the same signals as JSON lines); the verbs
//! against the real API; `--help` and exit codes.
//!
//! Needs the local stack (Kafka and Postgres, started by `scripts/test.sh`): run `scripts/test.sh`.
// Needs the local stack and its peers: `scripts/test.sh` runs it (`--features stack`).
#![cfg(feature = "stack")]

use std::io::Write;
use std::process::{Command, Stdio};
use std::time::Duration;
use vitals_contracts::{encode, CallOutcome, OutcomeClass, Tick};
use vitals_testkit::{
    binary, free_port, produce, producer, start_api, unique, wait_until, Input, Service, Stamp, Topics,
};

/// Run `vitals` with `args` and `stdin`: (exit code, stdout, stderr).
fn vitals(args: &[&str], stdin: &str, env: &[(&str, &str)]) -> (i32, String, String) {
    let mut child = Command::new(binary("vitals"))
        .args(args)
        .envs(env.iter().copied())
        .env("XDG_CONFIG_HOME", std::env::temp_dir().join(unique("no-config")))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("vitals runs");
    let mut input = child.stdin.take().unwrap();
    let text = stdin.to_owned();
    let writer = std::thread::spawn(move || {
        let _ = input.write_all(text.as_bytes());
    });
    let out = child.wait_with_output().unwrap();
    writer.join().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Pool `replay`: three endpoints at 10 calls a second each for 40 s, `a` refusing connections
/// from 10 s to 25 s; pool `bt`: three more, `x` failing three calls in a row at 20 s (too few
/// for the default policy to eject it); a tick every second until 90 s. As (stream time ms,
/// signal) pairs.
fn workload(t0_ms: i64) -> Vec<(i64, Option<CallOutcome>)> {
    let mut out = Vec::new();
    for i in 0..400i64 {
        let t_ms = t0_ms + i * 100;
        for (pool, ep) in [
            ("replay", "a"),
            ("replay", "b"),
            ("replay", "c"),
            ("bt", "x"),
            ("bt", "y"),
            ("bt", "z"),
        ] {
            let refused =
                (ep == "a" && (10_000..25_000).contains(&(i * 100))) || (ep == "x" && (200..203).contains(&i));
            out.push((
                t_ms,
                Some(CallOutcome {
                    http_status: (!refused).then_some(200),
                    latency_us: if refused { 2_000 } else { 150_000 },
                    ttft_us: (!refused).then_some(90_000),
                    ..CallOutcome::new(
                        format!("{ep}-{i}"),
                        pool,
                        ep,
                        "gw",
                        t_ms * 1000,
                        if refused {
                            OutcomeClass::ConnectError
                        } else {
                            OutcomeClass::Success
                        },
                    )
                }),
            ));
        }
        if i % 10 == 0 {
            out.push((t_ms, None));
        }
    }
    for s in 40..=90 {
        out.push((t0_ms + s * 1000, None));
    }
    out
}

fn json_line(t_ms: i64, signal: &Option<CallOutcome>) -> String {
    match signal {
        None => format!("{{\"type\":\"tick\",\"t_us\":{}}}\n", t_ms * 1000),
        Some(c) => {
            let mut v = serde_json::json!({
                "type": "call", "t_us": t_ms * 1000, "event_id": c.event_id, "pool": c.pool,
                "endpoint": c.endpoint, "gateway": c.gateway, "outcome": c.outcome.as_str(),
                "latency_us": c.latency_us,
            });
            if let Some(s) = c.http_status {
                v["http_status"] = s.into();
            }
            if let Some(t) = c.ttft_us {
                v["ttft_us"] = t.into();
            }
            // occurred_at is the stream time here (as RFC 3339 it would round to the second).
            format!("{v}\n")
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn simulate_gives_the_processors_transitions_for_the_same_log() {
    let name = unique("replay");
    let topics = Topics::create(&name, 1, Stamp::CreateTime).await;
    let db = vitals_testkit::migrated_schema(&name).await;
    let t0_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
        - 600_000;
    let work = workload(t0_ms);
    let inputs: Vec<Input> = work
        .iter()
        .map(|(t, s)| Input {
            partition: Some(0),
            ts_ms: *t,
            key: s.as_ref().map(|c| c.pool.clone()),
            bytes: match s {
                Some(c) => encode(c).unwrap(),
                None => encode(&Tick {
                    ticker: "test".into(),
                    emitted_at: t * 1000,
                })
                .unwrap(),
            },
        })
        .collect();
    produce(&producer(), &topics.signals, inputs).await;
    let _processor = vitals_testkit::start_processor(&topics, &name, &name, &[]);
    let n = work.len() as i64;
    let d = db.clone();
    wait_until("the processor through the log", Duration::from_secs(60), || {
        let d = d.clone();
        async move {
            sqlx::query_scalar::<_, i64>("SELECT coalesce(max(next_offset), 0) FROM consumer_offsets")
                .fetch_one(&d)
                .await
                .unwrap()
                >= n
        }
    })
    .await;
    let processor: Vec<(String, i64, String, String, i64)> = sqlx::query_as(
        "SELECT endpoint, seq, to_state, reason_code, (extract(epoch FROM stream_time) * 1000000)::bigint
         FROM transitions ORDER BY stream_time, endpoint, seq",
    )
    .fetch_all(&db)
    .await
    .unwrap();

    let input: String = work.iter().map(|(t, s)| json_line(*t, s)).collect();
    let (code, out, err) = vitals(&["simulate"], &input, &[]);
    assert_eq!(code, 0, "{err}");
    let mut simulated: Vec<(String, i64, String, String, i64)> = out
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|v| v["kind"] == "endpoint")
        .map(|v| {
            (
                v["endpoint"].as_str().unwrap().to_owned(),
                v["seq"].as_i64().unwrap(),
                v["to"].as_str().unwrap().to_owned(),
                v["reason_code"].as_str().unwrap().to_owned(),
                v["t_us"].as_i64().unwrap(),
            )
        })
        .collect();
    simulated.sort_by(|a, b| (a.4, &a.0, a.1).cmp(&(b.4, &b.0, b.1)));
    assert!(
        processor.iter().any(|t| t.0 == "a" && t.2 == "unhealthy")
            && processor.iter().any(|t| t.0 == "a" && t.2 == "recovering"),
        "the workload ejects and readmits a: {processor:?}"
    );
    assert_eq!(simulated, processor, "simulate and the processor decide alike");
    let ticks = out.lines().filter(|l| l.contains("\"tick_done\"")).count();
    assert_eq!(
        ticks,
        work.iter().filter(|(_, s)| s.is_none()).count(),
        "every tick acknowledged"
    );

    // Backtest over the range: the current policy changes nothing; a stricter one (two failures
    // in a row eject) ejects bt/x, which the audit log never did.
    let port = free_port();
    let _api = start_api(&topics, &name, port, &[]).await;
    let url = format!("http://127.0.0.1:{port}");
    let brokers = vitals_testkit::brokers();
    let env = [
        ("VITALS_API", url.as_str()),
        ("VITALS_KAFKA_BROKERS", brokers.as_str()),
        ("VITALS_SIGNALS_TOPIC", topics.signals.as_str()),
    ];
    let (from, to) = (rfc3339(t0_ms), rfc3339(t0_ms + 90_000));
    let dir = std::env::temp_dir().join(unique("backtest"));
    std::fs::create_dir_all(&dir).unwrap();
    let same = dir.join("same.json");
    std::fs::write(&same, "{}").unwrap();
    let stricter = dir.join("stricter.json");
    std::fs::write(&stricter, "{\"consecutive_failures\": 2}").unwrap();
    let html = dir.join("report.html");
    let run = |policy: &std::path::Path, extra: &[&str]| {
        let mut args: Vec<String> = [
            "backtest",
            "--from",
            &from,
            "--to",
            &to,
            "--policy",
            policy.to_str().unwrap(),
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        args.extend(extra.iter().map(|s| s.to_string()));
        let env: Vec<(String, String)> = env.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        std::thread::spawn(move || {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
            vitals(&args, "", &env)
        })
        .join()
        .unwrap()
    };
    let (code, out, err) = run(&same, &[]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("endpoints decide differently; the candidate adds 0 ejections and removes 0")
            && out.lines().filter(|l| l.ends_with("changed")).count() == 0
            && out.contains("replay/a  1 → 1"),
        "{out}\n{err}"
    );
    assert!(err.contains("reading"), "progress on stderr: {err}");
    let (code, out, err) = run(&stricter, &["--html", html.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    let x = out
        .lines()
        .find(|l| l.starts_with("bt/x"))
        .unwrap_or_else(|| panic!("{out}"));
    assert!(x.contains("0 → 1") && x.ends_with("changed"), "{x}");
    let page = std::fs::read_to_string(&html).unwrap();
    assert!(page.contains("bt/x — changed"), "the report names the change");
    // A real browser opens it: the DOM it builds has the changed endpoint and its bars, and a
    // screenshot is left for a person to look at.
    let shot = std::env::temp_dir().join(format!("{name}-backtest.png"));
    let browser = |args: &[&str]| {
        Command::new("chromium")
            .args(["--headless", "--no-sandbox", "--disable-gpu", "--window-size=1000,800"])
            .args(args)
            .arg(format!("file://{}", html.display()))
            .output()
            .expect("chromium runs (scripts/install-deps.sh installs it)")
    };
    let dom = String::from_utf8_lossy(&browser(&["--dump-dom"]).stdout).into_owned();
    assert!(
        dom.contains("<section class=\"changed\"><h2>bt/x — changed</h2>"),
        "{dom}"
    );
    assert!(dom.matches("<rect ").count() >= 12, "two bars per endpoint");
    browser(&[&format!("--screenshot={}", shot.display())]);
    assert!(
        std::fs::metadata(&shot).map(|m| m.len()).unwrap_or(0) > 1_000,
        "a screenshot of the report"
    );
    eprintln!("backtest report: {} (screenshot {})", html.display(), shot.display());
    let (code, out, _) = run(&stricter, &["--json", "--pool", "bt"]);
    assert_eq!(code, 0);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let x = v.as_array().unwrap().iter().find(|d| d["endpoint"] == "x").unwrap();
    assert_eq!(
        (x["ejections_current"].as_i64(), x["ejections_candidate"].as_i64()),
        (Some(0), Some(1))
    );
    assert!(
        v.as_array().unwrap().iter().all(|d| d["pool"] == "bt"),
        "--pool keeps one pool"
    );
    let (code, _, err) = run(&same, &["--to", "not-a-time"]);
    assert_eq!(code, 2, "a repeated flag is a usage error: {err}");
    vitals_testkit::drop_schema(&db, &name).await;
}

/// Milliseconds since the epoch as RFC 3339 (UTC).
fn rfc3339(ms: i64) -> String {
    chrono::DateTime::<chrono::Utc>::from_timestamp_millis(ms)
        .unwrap()
        .to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

#[test]
fn help_usage_errors_and_bad_input_have_their_exit_codes() {
    for sub in [
        "simulate", "backtest", "health", "history", "override", "policy", "tail",
    ] {
        let (code, out, _) = vitals(&[sub, "--help"], "", &[]);
        assert_eq!(code, 0, "{sub} --help");
        assert!(out.contains("Usage: vitals"), "{sub}: {out}");
    }
    let (code, _, err) = vitals(&["teleport"], "", &[]);
    assert_eq!(code, 2, "{err}");
    let (code, out, err) = vitals(
        &["simulate"],
        "{\"type\":\"tick\"}\n{\"type\":\"tick\",\"t_us\":5}\n",
        &[],
    );
    assert_eq!(code, 4, "bad lines: exit 4 ({err})");
    assert!(out.contains("\"field\":\"t_us\""), "{out}");
    assert!(out.contains("\"tick_done\""), "{out}");
    let dir = std::env::temp_dir().join(unique("policy"));
    std::fs::write(&dir, "{\"window_ms\": \"long\"}").unwrap();
    let (code, _, err) = vitals(&["simulate", "--policy", dir.to_str().unwrap()], "", &[]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("not a policy"), "{err}");
    let (code, _, err) = vitals(
        &[
            "backtest",
            "--from",
            "yesterday",
            "--to",
            "now",
            "--policy",
            "none.json",
        ],
        "",
        &[],
    );
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("--from \"yesterday\" is not an RFC 3339 time"), "{err}");
    let (code, _, err) = vitals(&["health", "--api", "http://127.0.0.1:1"], "", &[]);
    assert_eq!(code, 1, "unreachable API: {err}");
    assert!(err.contains("cannot reach the API"), "{err}");
}

const ADMIN: &str = "cli-admin-secret-000001";

/// What the verbs act through: a processor and an API (with the `ADMIN` token) on topics and a
/// schema of their own.
struct Live {
    name: String,
    db: sqlx::PgPool,
    url: String,
    _processor: Service,
    _api: Service,
}

async fn live(prefix: &str) -> Live {
    let name = unique(prefix);
    let topics = Topics::create(&name, 1, Stamp::LogAppendTime).await;
    let db = vitals_testkit::migrated_schema(&name).await;
    let _processor = vitals_testkit::start_processor(&topics, &name, &name, &[]);
    let port = free_port();
    let _api = start_api(&topics, &name, port, &[&format!("ops:admin:{ADMIN}")]).await;
    Live {
        name,
        db,
        url: format!("http://127.0.0.1:{port}"),
        _processor,
        _api,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_verbs_read_and_act_through_the_api() {
    let Live {
        name,
        db,
        url,
        _processor,
        _api,
    } = live("cli_api").await;
    let env = [("VITALS_API", url.as_str()), ("VITALS_TOKEN", ADMIN)];
    let blocking = |args: Vec<&'static str>| {
        let env: Vec<(String, String)> = env.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        tokio::task::spawn_blocking(move || {
            let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
            vitals(&args, "", &env)
        })
    };
    // An override lands in the audit log; history and health show it.
    let (code, out, err) = blocking(vec![
        "override",
        "cli",
        "e1",
        "force_unhealthy",
        "--reason",
        "disk on fire",
    ])
    .await
    .unwrap();
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.starts_with("accepted: force_unhealthy on cli/e1"), "{out}");
    let d = db.clone();
    wait_until("the override in the audit log", Duration::from_secs(30), || {
        let d = d.clone();
        async move {
            sqlx::query_scalar::<_, i64>("SELECT count(*) FROM transitions WHERE endpoint = 'e1'")
                .fetch_one(&d)
                .await
                .unwrap()
                > 0
        }
    })
    .await;
    let (code, out, _) = blocking(vec!["history", "--pool", "cli"]).await.unwrap();
    assert_eq!(code, 0);
    assert!(
        out.contains("cli/e1  healthy -> unhealthy  [forced_unhealthy]"),
        "{out}"
    );
    let (code, out, _) = blocking(vec!["history", "--pool", "cli", "--json"]).await.unwrap();
    assert_eq!(code, 0);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v[0]["reason_code"], "forced_unhealthy");
    let (code, out, _) = blocking(vec!["health", "cli"]).await.unwrap();
    assert_eq!(code, 0);
    assert!(
        out.lines().any(|l| l.starts_with("e1") && l.contains("unhealthy")),
        "{out}"
    );
    // A policy set through the command is the one the engine applies.
    let file = std::env::temp_dir().join(unique("policy"));
    std::fs::write(&file, "{\"consecutive_failures\": 7, \"min_volume\": 12}").unwrap();
    let file_s: &'static str = Box::leak(file.display().to_string().into_boxed_str());
    let (code, out, err) = blocking(vec!["policy", "set", "cli", file_s]).await.unwrap();
    assert_eq!(code, 0, "{out}{err}");
    let mut got = serde_json::Value::Null;
    for _ in 0..300 {
        let (code, out, _) = blocking(vec!["policy", "get", "cli", "--json"]).await.unwrap();
        if code == 0 {
            got = serde_json::from_str(&out).unwrap();
            if got["policy"]["consecutive_failures"] == 7 {
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(got["policy"]["consecutive_failures"], 7, "{got}");
    assert_eq!(got["policy"]["min_volume"], 12);
    let (code, out, _) = blocking(vec!["policy", "get", "cli"]).await.unwrap();
    assert_eq!(code, 0);
    assert!(
        out.lines()
            .any(|l| l.trim_start().starts_with("consecutive_failures") && l.ends_with(" 7")),
        "{out}"
    );
    let (code, _, err) = blocking(vec!["policy", "get", "nowhere"]).await.unwrap();
    assert_eq!(code, 3, "no such pool: {err}");
    // A refusal: an unknown action, named by the API; exit 3.
    let (code, _, err) = blocking(vec!["override", "cli", "e1", "explode", "--reason", "x"])
        .await
        .unwrap();
    assert_eq!(code, 3, "{err}");
    assert!(err.contains("the API answered 400"), "{err}");
    // tail: once it follows the stream, the next change arrives on it.
    let mut tail = Command::new(binary("vitals"))
        .args(["tail", "--pool", "cli", "--max", "1"])
        .envs(env.iter().copied())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = tail.stderr.take().unwrap();
    let following = tokio::task::spawn_blocking(move || {
        use std::io::BufRead;
        std::io::BufReader::new(stderr)
            .lines()
            .map_while(Result::ok)
            .any(|l| l.contains("following the live stream"))
    });
    assert!(
        tokio::time::timeout(Duration::from_secs(30), following)
            .await
            .unwrap()
            .unwrap(),
        "tail follows the stream"
    );
    let (code, _, err) = blocking(vec!["override", "cli", "e1", "clear", "--reason", "fixed"])
        .await
        .unwrap();
    assert_eq!(code, 0, "{err}");
    let out = tokio::task::spawn_blocking(move || tail.wait_with_output().unwrap());
    let out = tokio::time::timeout(Duration::from_secs(30), out)
        .await
        .expect("tail ends")
        .unwrap();
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("cli/e1  unhealthy -> "), "{text}");
    vitals_testkit::drop_schema(&db, &name).await;
}

#[test]
fn scenarios_put_a_candidate_beside_the_default() {
    let (code, out, err) = vitals(
        &["scenarios", "--json", "--runs", "2", "--scenario", "hard-down"],
        "",
        &[],
    );
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(
        v[0]["default"], v[0]["candidate"],
        "no candidate: the default on both sides"
    );
    let file = std::env::temp_dir().join(unique("eager"));
    std::fs::write(&file, "{\"consecutive_failures\": 2, \"hard_break_after\": 2}").unwrap();
    let (code, out, err) = vitals(
        &["scenarios", "--json", "--runs", "2", "--policy", file.to_str().unwrap()],
        "",
        &[],
    );
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let hard = v
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["scenario"] == "hard-down")
        .unwrap();
    let (d, c) = (
        hard["default"]["out_after_s"].as_f64().unwrap(),
        hard["candidate"]["out_after_s"].as_f64().unwrap(),
    );
    assert!(c < d, "an eager policy ejects a dead endpoint sooner: {c} vs {d}");
    assert_eq!(
        v.as_array().unwrap().len(),
        vitals_scorecard::scenarios().len(),
        "every scenario"
    );
    assert!(hard["default"]["transitions_in_fault"].is_u64(), "{hard}");
    assert!(
        hard["default"]["restore_s"].as_f64().is_some_and(|r| r < 10.0),
        "{hard}"
    );
    let (code, _, err) = vitals(&["scenarios", "--scenario", "nope"], "", &[]);
    assert_eq!(code, 1);
    assert!(err.contains("there are: hard-down"), "{err}");
}

/// A driver in lock-step: it writes a tick and waits for its acknowledgement before writing on,
/// with the input still open (the acknowledgement is flushed at once, not at the end).
#[test]
fn simulate_runs_in_lock_step_with_its_driver() {
    use std::io::{BufRead, BufReader};
    let mut child = Command::new(binary("vitals"))
        .arg("simulate")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let t0: i64 = 1_700_000_000_000_000;
    for step in 0..20i64 {
        let t = t0 + step * 1_000_000;
        for ep in ["a", "b", "c"] {
            let outcome = if ep == "a" && step >= 5 {
                "connect_error"
            } else {
                "success"
            };
            writeln!(
                stdin,
                r#"{{"type":"call","t_us":{t},"pool":"p","endpoint":"{ep}","gateway":"g","outcome":"{outcome}","latency_us":1000}}"#
            )
            .unwrap();
        }
        writeln!(stdin, r#"{{"type":"tick","t_us":{t}}}"#).unwrap();
        stdin.flush().unwrap();
        // Everything this step caused, then its acknowledgement.
        let mut line = String::new();
        loop {
            line.clear();
            assert!(stdout.read_line(&mut line).unwrap() > 0, "simulate ended early");
            let v: serde_json::Value = serde_json::from_str(&line).unwrap();
            if v["kind"] == "tick_done" {
                assert_eq!(v["t_us"], t);
                break;
            }
            assert!(v["t_us"].as_i64().unwrap() <= t, "a decision of this step: {line}");
        }
    }
    drop(stdin);
    assert!(child.wait().unwrap().success());
}

/// `vitals simulate` takes the reporter's summaries: healthy endpoints summed each interval,
/// then one summary of ten refused calls ejects its endpoint on them; a bad summary is an error line
/// naming the field, and the stream goes on.
#[test]
fn simulate_takes_call_summaries() {
    let t0: i64 = 1_700_000_000_000_000;
    let iso = |us: i64| {
        chrono::DateTime::from_timestamp_micros(us)
            .unwrap()
            .to_rfc3339_opts(chrono::SecondsFormat::Micros, true)
    };
    let mut input = String::new();
    for step in 0..20i64 {
        let t = t0 + step * 250_000;
        for ep in ["a", "b", "c"] {
            let calls = if ep == "a" && step == 19 {
                r#"{"connect_error":10},"leading_failures":10,"longest_failure_run":10,"trailing_failures":10"#
                    .to_owned()
            } else {
                r#"{"success":25},"trailing_successes":25"#.to_owned()
            };
            input.push_str(&format!(
                r#"{{"type":"summary","t_us":{t},"summary_id":"s-{ep}-{step}","pool":"p","endpoint":"{ep}","gateway":"g","started_at":"{}","ended_at":"{}","calls":{calls}}}"#,
                iso(t - 250_000),
                iso(t)
            ));
            input.push('\n');
        }
    }
    input.push_str(&format!(
        r#"{{"type":"summary","t_us":{},"pool":"p","endpoint":"b","gateway":"g","started_at":"{}","ended_at":"{}","calls":{{"success":-1}}}}"#,
        t0 + 5_000_000,
        iso(t0),
        iso(t0)
    ));
    input.push('\n');
    let (code, out, err) = vitals(&["simulate"], &input, &[]);
    assert_eq!(code, 4, "a line was refused: {err}");
    let lines: Vec<serde_json::Value> = out.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let ejected: Vec<&serde_json::Value> = lines
        .iter()
        .filter(|v| v["kind"] == "endpoint" && v["to"] == "unhealthy")
        .collect();
    assert_eq!(ejected.len(), 1, "{out}");
    assert_eq!(ejected[0]["endpoint"], "a");
    assert_eq!(ejected[0]["t_us"], t0 + 19 * 250_000);
    // The summary's calls are the evidence: ten refused calls, ten in a row.
    assert_eq!(ejected[0]["evidence"]["connect_error"], 10, "{out}");
    assert_eq!(ejected[0]["evidence"]["consecutive_failures"], 10, "{out}");
    let error = lines.iter().find(|v| v["kind"] == "error").expect("an error line");
    assert_eq!(error["field"], "calls", "{error}");
}

/// `vitals report` shows the API's figures for the same range: the JSON is the API's uptime and
/// incidents, the table and the HTML page name the same numbers; a bad time is a usage error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_report_shows_the_apis_uptime_and_incidents() {
    let name = unique("cli_report");
    let topics = Topics::create(&name, 1, Stamp::LogAppendTime).await;
    let db = vitals_testkit::migrated_schema(&name).await;
    let t0 = vitals_testkit::uptime::uptime_t0();
    vitals_testkit::uptime::seed_uptime(&db, t0).await;
    let port = free_port();
    let _api = start_api(&topics, &name, port, &[&format!("ops:admin:{ADMIN}")]).await;
    let url = format!("http://127.0.0.1:{port}");
    let iso = |us: i64| {
        chrono::DateTime::from_timestamp_micros(us)
            .unwrap()
            .to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
    };
    let (from, to) = (iso(t0), iso(t0 + 86_400_000_000));
    let run = |args: Vec<String>| {
        let url = url.clone();
        tokio::task::spawn_blocking(move || {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            vitals(&args, "", &[("VITALS_API", url.as_str())])
        })
    };
    let args = |extra: &[&str]| -> Vec<String> {
        ["report", "--pool", "up", "--from", &from, "--to", &to]
            .iter()
            .chain(extra)
            .map(|s| s.to_string())
            .collect()
    };
    let (code, out, err) = run(args(&["--json"])).await.unwrap();
    assert_eq!(code, 0, "{err}");
    let report: serde_json::Value = serde_json::from_str(&out).unwrap();
    let http = reqwest::Client::new();
    let api: serde_json::Value = http
        .get(format!("{url}/v1/pools/up/uptime?from={from}&to={to}&bucket=hour"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(report["pools"][0]["uptime"], api, "the report's figures are the API's");
    let incidents = report["pools"][0]["incidents"].as_array().unwrap();
    assert_eq!(incidents.len(), 2);
    assert_eq!(
        (incidents[0]["endpoint"].as_str(), incidents[0]["duration_s"].as_f64()),
        (Some("b"), Some(10.0))
    );
    assert_eq!(incidents[1]["time_to_out_s"], 600.0);

    let (code, out, err) = run(args(&[])).await.unwrap();
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("pool up: availability 100.000 % (every endpoint in rotation 99.294 %), incidents 2"),
        "{out}"
    );
    let a_row = out.lines().find(|l| l.starts_with("a ")).unwrap();
    assert!(a_row.contains("99.306 %") && a_row.contains("10.0 min"), "{a_row}");
    // Request availability from the fixture's calls: a 70 of 120, c 30 of 60, the pool 240 of 340.
    assert!(a_row.contains("58.333 %") && a_row.contains(" 120 "), "{a_row}");
    let c_row = out.lines().find(|l| l.starts_with("c ")).unwrap();
    assert!(c_row.contains("50.000 %") && c_row.contains(" 60 "), "{c_row}");
    assert!(out.contains("requests: 70.588 % of 340 calls succeeded"), "{out}");
    let (code, page, err) = run(args(&["--html"])).await.unwrap();
    assert_eq!(code, 0, "{err}");
    assert!(page.starts_with("<!doctype html>") && page.contains("<h3>Incidents</h3>"));
    assert!(
        page.contains("99.306 %") && page.contains("ejected, readmitted"),
        "{page}"
    );
    assert!(
        page.contains("requests <b>70.588 % of 340 calls succeeded</b>")
            && page.contains("<td>58.333 %</td><td>120</td>")
            && page.contains("05:00:00: 99.722 % in rotation, 55.556 % of 45 calls succeeded"),
        "{page}"
    );
    let (code, _, err) = run(vec!["report".into(), "--from".into(), "last week".into()])
        .await
        .unwrap();
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--from \"last week\" is not an RFC 3339 time"), "{err}");
}

/// Pool and endpoint names with `/`, `%`, spaces and letters beyond ASCII reach the API as one
/// path segment in every verb that names them (they were sent raw: `openai/gpt-4o` was a 404).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_verb_takes_names_with_slashes_percents_spaces_and_non_ascii() {
    let Live {
        name,
        db,
        url,
        _processor,
        _api,
    } = live("cli_names").await;
    let run = |args: Vec<String>| {
        let url = url.clone();
        tokio::task::spawn_blocking(move || {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            vitals(&args, "", &[("VITALS_API", url.as_str()), ("VITALS_TOKEN", ADMIN)])
        })
    };
    let policy = std::env::temp_dir().join(unique("policy"));
    std::fs::write(&policy, "{\"consecutive_failures\": 6}").unwrap();
    let policy = policy.display().to_string();
    for (pool, ep) in [
        ("openai/gpt-4o", "us-east/1"),
        ("50% off", "a%2Fb"),
        ("my pool", "end point"),
        ("モデル", "端点"),
    ] {
        let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
        let (code, out, err) = run(s(&["override", pool, ep, "force_unhealthy", "--reason", "test"]))
            .await
            .unwrap();
        assert_eq!(code, 0, "override {pool:?}/{ep:?}: {out}{err}");
        let d = db.clone();
        let (p, e) = (pool.to_owned(), ep.to_owned());
        wait_until("the override in the audit log", Duration::from_secs(30), || {
            let (d, p, e) = (d.clone(), p.clone(), e.clone());
            async move {
                sqlx::query_scalar::<_, i64>("SELECT count(*) FROM transitions WHERE pool = $1 AND endpoint = $2")
                    .bind(p)
                    .bind(e)
                    .fetch_one(&d)
                    .await
                    .unwrap()
                    > 0
            }
        })
        .await;
        let (code, out, err) = run(s(&["health", pool])).await.unwrap();
        assert_eq!(code, 0, "health {pool:?}: {err}");
        assert!(
            out.lines().any(|l| l.starts_with(ep) && l.contains("unhealthy")),
            "{out}"
        );
        let (code, out, err) = run(s(&["health", pool, ep])).await.unwrap();
        assert_eq!(code, 0, "health {pool:?} {ep:?}: {err}");
        assert!(out.contains("unhealthy"), "{out}");
        let (code, out, err) = run(s(&["history", "--pool", pool])).await.unwrap();
        assert_eq!(code, 0, "history {pool:?}: {err}");
        assert!(out.contains(&format!("{pool}/{ep}  healthy -> unhealthy")), "{out}");
        let (code, out, err) = run(s(&["policy", "set", pool, &policy])).await.unwrap();
        assert_eq!(code, 0, "policy set {pool:?}: {out}{err}");
        let mut applied = false;
        for _ in 0..300 {
            let (code, out, _) = run(s(&["policy", "get", pool, "--json"])).await.unwrap();
            if code == 0
                && serde_json::from_str::<serde_json::Value>(&out).unwrap()["policy"]["consecutive_failures"] == 6
            {
                applied = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert!(applied, "policy of {pool:?} set and read back");
        let (code, out, err) = run(s(&["report", "--pool", pool, "--json"])).await.unwrap();
        assert_eq!(code, 0, "report {pool:?}: {err}");
        let report: serde_json::Value = serde_json::from_str(&out).unwrap();
        assert_eq!(report["pools"][0]["uptime"]["pool"], pool, "{report}");
    }
    vitals_testkit::drop_schema(&db, &name).await;
}
