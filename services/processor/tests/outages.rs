//! Postgres and Kafka restart under a running processor. These stop the shared local services,
//! so they live in their own test binary (cargo runs test binaries one at a time) and run one
//! after the other.
// Needs the local stack and its peers: `scripts/test.sh` runs it (`--features stack`).
#![cfg(feature = "stack")]

mod common;
use common::*;
use std::time::Duration;
use tokio::sync::Mutex;

const LONG: Duration = Duration::from_secs(240);
static SERIAL: Mutex<()> = Mutex::const_new(());

/// Brings a stopped service back however the test ends, so that a failure here does not leave
/// the next tests without Postgres or Kafka.
struct Restore(&'static str);

impl Drop for Restore {
    fn drop(&mut self) {
        stack(self.0);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_restart_mid_run_pauses_and_loses_nothing() {
    let _serial = SERIAL.lock().await;
    let name = unique("pgrestart");
    let topics = create_topics(&name, 4).await;
    let inputs = workload(16, 30_000, 4, 31);
    let half = inputs.len() / 2;
    produce(&topics.signals, &inputs[..half]).await;
    let db = Db::connect(&name).await;
    let (mut p, port) = start_serving(&topics, &name, &name, &["--batch-max-records", "100"]);
    db.wait_consumed(&name, half as i64 / 2, LONG).await;
    assert_eq!(
        http_get(port, "/readyz").await.as_deref(),
        Some("ready"),
        "assigned, restored, database up"
    );

    stack("pg-down");
    let restore = Restore("pg-up");
    produce(&topics.signals, &inputs[half..]).await;
    wait_until("the processor to notice the database is gone", LONG, || async {
        metric(port, "vitals_processor_db_retries_total").await.unwrap_or(0.0) > 0.0
    })
    .await;
    let ready = http_get(port, "/readyz").await.unwrap_or_default();
    assert_eq!(ready, "database unreachable");
    // The lag comes from the write path: everything produced since the outage began is behind
    // (before, it read librdkafka's statistics and stayed near zero).
    let behind = (inputs.len() - half) as f64;
    wait_until(
        "the lag metric to show the records the outage holds back",
        LONG,
        || async {
            metric(port, "vitals_processor_consumer_lag").await.unwrap_or(0.0) >= behind
                && metric(port, "vitals_processor_group_lag").await.unwrap_or(0.0) >= behind
        },
    )
    .await;
    drop(restore); // pg-up

    db.wait_consumed(&name, inputs.len() as i64, LONG).await;
    assert!(p.terminate().success());
    let got = db.digest(true).await;
    let want = reference_digest(&topics, inputs.len() as i64, true).await;
    assert_eq!(got, want);
    assert_eq!(db.sequence_gaps().await, vec![]);
    db.drop_schema().await;
}

/// A processor holding no partition once read `consumer_lag` 0 while records waited behind a
/// Postgres outage, so an alert on lag stayed silent. Two processors share a one-partition topic:
/// the idle one's group lag counts the records the holder cannot commit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_processor_holding_no_partition_reports_the_groups_lag_through_an_outage() {
    let _serial = SERIAL.lock().await;
    let name = unique("grouplag");
    let topics = create_topics(&name, 1).await;
    let inputs = workload(4, 8_000, 1, 41);
    let half = inputs.len() / 2;
    produce(&topics.signals, &inputs[..half]).await;
    let db = Db::connect(&name).await;
    let (mut a, port_a) = start_serving(&topics, &name, &name, &["--batch-max-records", "100"]);
    let (mut b, port_b) = start_serving(&topics, &name, &name, &["--batch-max-records", "100"]);
    db.wait_consumed(&name, half as i64, LONG).await;
    wait_until(
        "one processor to hold the partition and the other none",
        LONG,
        || async {
            let a = metric(port_a, "vitals_processor_assigned_partitions")
                .await
                .unwrap_or(0.0);
            let b = metric(port_b, "vitals_processor_assigned_partitions")
                .await
                .unwrap_or(0.0);
            a + b == 1.0
        },
    )
    .await;
    let idle = if metric(port_a, "vitals_processor_assigned_partitions").await == Some(0.0) {
        port_a
    } else {
        port_b
    };

    stack("pg-down");
    let restore = Restore("pg-up");
    produce(&topics.signals, &inputs[half..]).await;
    let behind = (inputs.len() - half) as f64;
    wait_until("the idle processor's group lag to count what waits", LONG, || async {
        metric(idle, "vitals_processor_group_lag").await.unwrap_or(0.0) >= behind
    })
    .await;
    assert_eq!(metric(idle, "vitals_processor_assigned_partitions").await, Some(0.0));
    assert_eq!(
        metric(idle, "vitals_processor_consumer_lag").await,
        Some(0.0),
        "nothing assigned: its own lag is 0, which is why the group's is reported"
    );
    drop(restore); // pg-up

    db.wait_consumed(&name, inputs.len() as i64, LONG).await;
    wait_until("the group lag to return to 0 on both", LONG, || async {
        metric(port_a, "vitals_processor_group_lag").await == Some(0.0)
            && metric(port_b, "vitals_processor_group_lag").await == Some(0.0)
    })
    .await;
    assert!(a.terminate().success());
    assert!(b.terminate().success());
    let got = db.digest(true).await;
    let want = reference_digest(&topics, inputs.len() as i64, true).await;
    assert_eq!(got, want);
    db.drop_schema().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kafka_restart_mid_run_pauses_and_loses_nothing() {
    let _serial = SERIAL.lock().await;
    let name = unique("kafkarestart");
    let topics = create_topics(&name, 4).await;
    let inputs = workload(16, 30_000, 4, 37);
    let cut = inputs.len() * 2 / 3;
    produce(&topics.signals, &inputs[..cut]).await;
    let db = Db::connect(&name).await;
    let mut p = start_processor(&topics, &name, &name, &["--batch-max-records", "100"]);
    db.wait_consumed(&name, inputs.len() as i64 / 3, LONG).await;

    stack("kafka-down");
    drop(Restore("kafka-up"));
    produce(&topics.signals, &inputs[cut..]).await;

    db.wait_consumed(&name, inputs.len() as i64, LONG).await;
    // Every transition reached the changes topic (at least once; duplicates are allowed), and
    // published rows leave the outbox.
    let published = wait_published(&db, &topics.changes, LONG).await;
    wait_until("the outbox to empty", LONG, || async {
        sqlx::query_scalar::<_, i64>("SELECT count(*) FROM outbox")
            .fetch_one(&db.pool)
            .await
            .is_ok_and(|n| n == 0)
    })
    .await;
    assert!(p.terminate().success());
    let got = db.digest(true).await;
    let want = reference_digest(&topics, inputs.len() as i64, true).await;
    assert_eq!(got, want);
    assert_eq!(published.len() as i64, got.0);
    db.drop_schema().await;
}

/// A clone in a folder the postgres user cannot traverse (a home directory of mode 700) once
/// made `scripts/stack.sh up` fail with "initdb failed". The stack now places the cluster where
/// that user can reach it. This starts a second, throwaway cluster on its own port.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_stack_starts_postgres_for_a_clone_in_a_private_home_directory() {
    let _serial = SERIAL.lock().await;
    let home = std::env::temp_dir().join(unique("home"));
    let scripts = home.join("clone/scripts");
    std::fs::create_dir_all(&scripts).unwrap();
    let here = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/stack.sh");
    std::fs::copy(&here, scripts.join("stack.sh")).unwrap();
    let mode = std::process::Command::new("chmod")
        .arg("700")
        .arg(&home)
        .status()
        .unwrap();
    assert!(mode.success());
    let port = free_port().to_string();
    let run = |cmd: &str| {
        std::process::Command::new("bash")
            .arg(scripts.join("stack.sh"))
            .arg(cmd)
            .env("VITALS_PG_PORT", &port)
            .output()
            .expect("stack script runs")
    };
    let up = run("pg-up");
    let said = String::from_utf8_lossy(&up.stderr).into_owned();
    let location = std::fs::read_to_string(home.join("clone/.local/pg-location")).unwrap_or_default();
    let down = run("pg-down");
    if !location.trim().is_empty() {
        let _ = std::fs::remove_dir_all(location.trim());
    }
    let _ = std::fs::remove_dir_all(&home);
    assert!(up.status.success(), "pg-up failed: {said}");
    assert!(said.contains("placing the cluster in"), "{said}");
    assert!(location.starts_with("/var/lib/postgresql/vitals-"), "{location}");
    assert!(down.status.success(), "{}", String::from_utf8_lossy(&down.stderr));
}
