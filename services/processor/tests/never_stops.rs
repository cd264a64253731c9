//! Ordinary operations that once stopped the processor, each reproduced on the real broker and
//! database: two policy changes of one pool in one batch, retention meeting a backlog or a month
//! dropped under the writer, and a partition whose snapshot cannot be read. The generative test
//! (`generative.rs`) looks for more of them.
// Needs the local stack and its peers: `scripts/test.sh` runs it (`--features stack`).
#![cfg(feature = "stack")]

mod common;
use common::*;
use std::time::Duration;
use vitals_contracts::*;

const LONG: Duration = Duration::from_secs(180);

fn policy_change(pool: &str, version: i32, consecutive_failures: i32, ts_ms: i64) -> Signal {
    Signal::Policy(PolicyChange {
        change_id: format!("change-{version}"),
        pool: pool.into(),
        actor: "ops".into(),
        issued_at: ts_ms * 1000,
        policy: Policy {
            version,
            consecutive_failures,
            ..Policy::default()
        },
    })
}

fn assert_running(p: &mut Proc) {
    if let Ok(Some(status)) = p.child.try_wait() {
        let log = std::fs::read_to_string(&p.log).unwrap_or_default();
        panic!("the processor stopped ({status}):\n{log}");
    }
}

/// `PUT /v1/pools/{pool}/policy` twice in quick succession: both changes in one batch. The
/// upsert of `pool_policies` took both rows in one statement, Postgres refused it ("cannot affect
/// row a second time") as a permanent error, and every restart read the same batch again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_policy_changes_of_one_pool_in_one_batch_leave_the_last_in_force() {
    let name = unique("twopolicies");
    let topics = create_topics(&name, 1).await;
    let mut inputs: Vec<Input> = (0..10)
        .map(|i| {
            signal_input(
                &call("pp", "e0", i, OutcomeClass::Success, None, T0_MS + i as i64),
                T0_MS + i as i64,
                1,
            )
        })
        .collect();
    for (version, failures) in [(1, 4), (2, 6), (3, 7)] {
        inputs.push(signal_input(
            &policy_change("pp", version, failures, T0_MS + 20),
            T0_MS + 20,
            1,
        ));
    }
    for i in 0..6 {
        let ts = T0_MS + 30 + i;
        inputs.push(signal_input(
            &call("pp", "e0", 100 + i as u64, OutcomeClass::ConnectError, None, ts),
            ts,
            1,
        ));
    }
    produce(&topics.signals, &inputs).await;
    let db = Db::connect(&name).await;
    // Produced before the start, read in one batch.
    let mut p = start_processor(
        &topics,
        &name,
        &name,
        &["--batch-max-records", "100000", "--batch-max-ms", "200"],
    );
    db.wait_consumed(&name, inputs.len() as i64, LONG).await;
    assert_running(&mut p);
    let (version, policy) = vitals_store::read::pool_policy(&db.pool, "pp").await.unwrap().unwrap();
    assert_eq!(
        (version, policy.consecutive_failures),
        (3, 7),
        "the last change is in force"
    );
    // The engine applied the last one too: seven refusals are needed, six came.
    let left: Vec<String> = sqlx::query_scalar("SELECT to_state FROM transitions WHERE endpoint = 'e0' ORDER BY seq")
        .fetch_all(&db.pool)
        .await
        .unwrap();
    assert!(!left.iter().any(|s| s == "unhealthy"), "{left:?}");
    p.terminate();
    db.drop_schema().await;
}

/// Calls that fail for a while: `a` refuses from `from_ms` for `n` calls 10 ms apart.
fn refusals(pool: &str, ep: &str, from_ms: i64, n: i64) -> Vec<Input> {
    (0..n)
        .map(|i| {
            let ts = from_ms + i * 10;
            signal_input(&call(pool, ep, i as u64, OutcomeClass::ConnectError, None, ts), ts, 1)
        })
        .collect()
}

/// A backlog older than the retention (a fresh group over an old topic): its rows are not
/// written, counted instead, and no month is made for them (the relay would drop it again and
/// the writer then failed on it); the state projection and the events still follow.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rows_older_than_the_retention_are_counted_not_written_and_no_month_is_made_for_them() {
    let name = unique("expired");
    let topics = create_topics(&name, 1).await;
    // T0 is November 2023: beyond a 365-day retention.
    let inputs = refusals("old", "a", T0_MS, 20);
    produce(&topics.signals, &inputs).await;
    let db = Db::connect(&name).await;
    let (mut p, port) = start_serving(
        &topics,
        &name,
        &name,
        &["--audit-retention-days", "365", "--audit-retention-every-secs", "1"],
    );
    db.wait_consumed(&name, inputs.len() as i64, LONG).await;
    assert_running(&mut p);
    let decided: usize = {
        let mut e = vitals_engine::Engine::new(Policy::default());
        inputs
            .iter()
            .map(|i| e.step(i.ts_ms * 1000, &decode_signal(&i.bytes).unwrap()).len())
            .sum()
    };
    assert!(decided >= 2, "the backlog makes decisions: {decided}");
    wait_until("the expired rows counted", LONG, || async {
        metric(port, "vitals_processor_audit_rows_expired_total").await == Some(decided as f64)
    })
    .await;
    let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM transitions")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(rows, 0);
    let month: bool = sqlx::query_scalar("SELECT to_regclass('transitions_y2023m11') IS NOT NULL")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert!(!month, "no month is made for rows retention does not keep");
    let state: (i64, String) = sqlx::query_as("SELECT seq, state FROM endpoint_state WHERE endpoint = 'a'")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(state.1, "unhealthy", "the projection follows the decisions: {state:?}");
    let events = read_n(&topics.changes, 1, LONG).await;
    assert_eq!(header(&events[0], "vitals-type").as_deref(), Some("HealthChanged"));
    p.terminate();
    db.drop_schema().await;
}

/// A month dropped after the writer last saw it (another processor's retention, an operator):
/// the batch found no partition for its rows (SQLSTATE 23514), took it for a data error and
/// stopped. Now it makes the month again and goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_month_dropped_under_the_writer_is_made_again_and_the_batch_goes_on() {
    let name = unique("dropped");
    let topics = create_topics(&name, 1).await;
    let first = refusals("m", "a", T0_MS, 20);
    produce(&topics.signals, &first).await;
    let db = Db::connect(&name).await;
    let (mut p, port) = start_serving(&topics, &name, &name, &[]);
    db.wait_consumed(&name, first.len() as i64, LONG).await;
    for t in ["transitions_y2023m11", "pool_events_y2023m11"] {
        sqlx::query(&format!("DROP TABLE {t}")).execute(&db.pool).await.unwrap();
    }
    let second = refusals("m", "b", T0_MS + 60_000, 20);
    produce(&topics.signals, &second).await;
    db.wait_consumed(&name, (first.len() + second.len()) as i64, LONG).await;
    assert_running(&mut p);
    let b: Vec<String> = sqlx::query_scalar("SELECT to_state FROM transitions WHERE endpoint = 'b' ORDER BY seq")
        .fetch_all(&db.pool)
        .await
        .unwrap();
    // (Degraded, not ejected: with `a` out, ejecting `b` too would pass the pool's 50 %.)
    assert!(!b.is_empty(), "b's rows are written in the month made again");
    assert!(metric(port, "vitals_processor_db_retries_total").await.unwrap_or(0.0) >= 1.0);
    p.terminate();
    db.drop_schema().await;
}

/// A stored snapshot this build cannot read is an error retrying cannot fix. The rebalance
/// callback retried it for ever, blocking the consumer: no partition was consumed. Now that
/// partition is left out and named in /readyz, and the others go on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partition_that_cannot_be_restored_is_named_in_readyz_and_the_others_go_on() {
    let name = unique("unrestorable");
    let topics = create_topics(&name, 2).await;
    let pools: Vec<String> = (0..20)
        .map(|i| format!("pool-{i}"))
        .filter(|p| partition_of(p, 2) == 0)
        .take(1)
        .chain(
            (0..20)
                .map(|i| format!("pool-{i}"))
                .filter(|p| partition_of(p, 2) == 1)
                .take(1),
        )
        .collect();
    let batch = |from: u64| -> Vec<Input> {
        (from..from + 10)
            .flat_map(|i| {
                let ts = T0_MS + i as i64 * 10;
                pools
                    .iter()
                    .map(move |p| signal_input(&call(p, "e", i, OutcomeClass::Success, None, ts), ts, 2))
            })
            .collect()
    };
    let first = batch(0);
    produce(&topics.signals, &first).await;
    let db = Db::connect(&name).await;
    let mut p = start_processor(&topics, &name, &name, &[]);
    db.wait_consumed(&name, first.len() as i64, LONG).await;
    assert!(p.terminate().success());
    let broken = sqlx::query("UPDATE engine_snapshots SET state = '\\x00ffee'::bytea WHERE partition = 1")
        .execute(&db.pool)
        .await
        .unwrap()
        .rows_affected();
    assert_eq!(broken, 1, "partition 1 had a snapshot");

    let second = batch(10);
    produce(&topics.signals, &second).await;
    let (mut p, port) = start_serving(&topics, &name, &name, &[]);
    let offset = |partition: i32| {
        let db = db.pool.clone();
        async move {
            sqlx::query_scalar::<_, i64>("SELECT next_offset FROM consumer_offsets WHERE partition = $1")
                .bind(partition)
                .fetch_one(&db)
                .await
                .unwrap()
        }
    };
    wait_until("partition 0 consumed to its end", LONG, || async {
        offset(0).await == 20
    })
    .await;
    wait_until("/readyz names partition 1", LONG, || async {
        http_get(port, "/readyz")
            .await
            .is_some_and(|b| b.contains("partition 1") && b.contains("unreadable"))
    })
    .await;
    assert_eq!(
        metric(port, "vitals_processor_unrestorable_partitions").await,
        Some(1.0)
    );
    assert_eq!(offset(1).await, 10, "partition 1 is left as it was");
    assert_running(&mut p);
    p.terminate();
    db.drop_schema().await;
}
