//! The monitoring files of deploy/ hold up: the Prometheus rules pass promtool's check and their
//! unit tests, the Alertmanager configuration passes amtool's check, and the Grafana dashboard
//! asks for metrics the real processor exports and runs SQL the real audit log answers.
//!
//! Needs the local stack (Kafka and Postgres, started by `scripts/test.sh`): run `scripts/test.sh`.
// Needs the local stack and its peers: `scripts/test.sh` runs it (`--features stack`).
#![cfg(feature = "stack")]

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;
use vitals_testkit::{free_port, http_get, unique, wait_until, Stamp, Topics};

fn deploy(path: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../deploy")
        .join(path)
}

fn tool(program: &str, args: &[&str], dir: &PathBuf) -> String {
    let out = Command::new(program)
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap_or_else(|e| panic!("{program} runs (scripts/install-deps.sh installs it): {e}"));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{program} {args:?}:\n{text}");
    text
}

#[test]
fn the_prometheus_rules_and_the_alertmanager_configuration_check() {
    let dir = deploy("prometheus");
    assert!(tool("promtool", &["check", "rules", "vitals-rules.yml"], &dir).contains("SUCCESS: 8 rules found"));
    assert!(tool("promtool", &["test", "rules", "vitals-rules.test.yml"], &dir).contains("SUCCESS"));
    tool(
        "promtool",
        &["check", "config", "--syntax-only", "prometheus.yml"],
        &dir,
    );
    let out = tool("amtool", &["check-config", "alertmanager.yml"], &deploy("alertmanager"));
    assert!(out.contains("1 inhibit rules"), "{out}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_grafana_dashboard_asks_for_what_vitals_has() {
    let dashboard: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(deploy("grafana/dashboards/vitals.json")).unwrap()).unwrap();
    let panels = dashboard["panels"].as_array().unwrap();
    let exprs: Vec<&str> = panels
        .iter()
        .flat_map(|p| p["targets"].as_array().into_iter().flatten())
        .filter_map(|t| t["expr"].as_str())
        .collect();
    let sqls: Vec<String> = panels
        .iter()
        .flat_map(|p| p["targets"].as_array().into_iter().flatten())
        .filter_map(|t| t["rawSql"].as_str().map(str::to_owned))
        .chain(
            dashboard["templating"]["list"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|v| v["query"].as_str().map(str::to_owned)),
        )
        .collect();
    assert!(exprs.len() >= 4 && sqls.len() >= 2, "{exprs:?} {sqls:?}");

    // The processor's metric names, from a real one.
    let name = unique("dash");
    let topics = Topics::create(&name, 1, Stamp::LogAppendTime).await;
    let db = vitals_testkit::migrated_schema(&name).await;
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let _p = vitals_testkit::start_processor(&topics, &name, &name, &["--http-addr", &addr]);
    wait_until("the processor's metrics", Duration::from_secs(30), || async move {
        http_get(port, "/metrics")
            .await
            .is_some_and(|m| m.contains("vitals_processor_consumer_lag"))
    })
    .await;
    let metrics = http_get(port, "/metrics").await.unwrap();
    for e in &exprs {
        for word in e.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')) {
            if word.starts_with("vitals_") {
                assert!(
                    metrics.lines().any(|l| l.starts_with(word)),
                    "the dashboard asks for {word}, which the processor does not export"
                );
            }
        }
    }
    // The SQL runs against the real audit log, Grafana's macros filled in.
    for sql in &sqls {
        let sql = sql
            .replace("$__timeFilter(stream_time)", "stream_time > now() - interval '1 day'")
            .replace("${pool:regex}", ".*");
        sqlx::query(&sql)
            .fetch_all(&db)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"));
    }
    vitals_testkit::drop_schema(&db, &name).await;
}
