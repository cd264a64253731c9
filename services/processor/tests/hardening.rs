//! Promises that independent testers broke, each reproduced as it was found: a shutdown during a
//! database stall that lost transitions, and a frozen processor that stalled the whole group and
//! then silently stopped processing the partitions it was given back.
//!
//! Needs the local stack (Kafka and Postgres, started by `scripts/test.sh`): run `scripts/test.sh`.
// Needs the local stack and its peers: `scripts/test.sh` runs it (`--features stack`).
#![cfg(feature = "stack")]

mod common;
use common::*;
use std::process::Command;
use std::time::Duration;
use vitals_contracts::*;

const LONG: Duration = Duration::from_secs(180);

fn signal(pid: u32, sig: &str) {
    let ok = Command::new("kill")
        .args([sig, &pid.to_string()])
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    assert!(ok, "kill {sig} {pid}");
}

/// Create and migrate `schema` as the processor would, and make every offset update of a batch
/// for which `condition` holds fail with SQLSTATE `code`: a database fault a test can aim.
async fn fail_offset_updates(schema: &str, condition: &str, code: &str, message: &str) -> sqlx::PgPool {
    let pool = vitals_testkit::migrated_schema(schema).await;
    let function = format!(
        "CREATE FUNCTION fail_offset_updates() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN
           IF {condition} THEN RAISE EXCEPTION '{message}' USING ERRCODE = '{code}'; END IF;
           RETURN NEW;
         END $$"
    );
    for stmt in [
        function.as_str(),
        "CREATE TRIGGER fail_offset_updates BEFORE UPDATE ON consumer_offsets
         FOR EACH ROW EXECUTE FUNCTION fail_offset_updates()",
    ] {
        sqlx::query(stmt).execute(&pool).await.expect(stmt);
    }
    pool
}

/// The first batch fails with a transient error (a trigger raises `admin_shutdown`, SQLSTATE
/// 57P01) while later batches would succeed; the processor is stopped during that stall. The
/// abandoned batch must not be skipped by the batches after it: after a restart the audit log
/// equals a clean run. (Before: the shutdown wrote the next batch with offsets and a snapshot
/// past the abandoned one, and its transitions were gone for good.) While the writer is stuck,
/// `/readyz` says so and the lag metric shows the real lag.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shutdown_during_a_database_stall_loses_no_transition() {
    let name = unique("stall");
    let topics = create_topics(&name, 1).await;
    // Ejections in the first 100 records (five connect errors), then a long clean tail.
    let mut inputs = Vec::new();
    let mut t = T0_MS;
    for i in 0..1_000u64 {
        t += 10;
        let outcome = if i < 40 && i % 8 < 5 {
            OutcomeClass::ConnectError
        } else {
            OutcomeClass::Success
        };
        let ep = format!("ep-{}", (i / 8) % 5);
        inputs.push(signal_input(&call("stall", &ep, i, outcome, Some(300), t), t, 1));
    }
    produce(&topics.signals, &inputs).await;

    // The first batch (offsets up to 100) fails until the trigger is dropped.
    let pool = fail_offset_updates(&name, "NEW.next_offset <= 100", "57P01", "injected outage").await;
    let db = Db::connect(&name).await;
    let (mut p, port) = start_serving(
        &topics,
        &name,
        &name,
        &[
            "--batch-max-records",
            "100",
            "--batch-max-ms",
            "5000",
            "--shutdown-grace-secs",
            "2",
            "--stall-after-secs",
            "1",
        ],
    );
    wait_until("the first batch to fail and be retried", LONG, || async {
        metric(port, "vitals_processor_db_retries_total").await.unwrap_or(0.0) >= 3.0
    })
    .await;
    wait_until("readiness to report the stalled partition", LONG, || async {
        http_get(port, "/readyz")
            .await
            .is_some_and(|r| r.contains("made no progress"))
    })
    .await;
    let lag = metric(port, "vitals_processor_partition_lag{partition=\"0\"}").await;
    assert_eq!(
        lag,
        Some(inputs.len() as f64),
        "nothing is committed: the lag is everything"
    );

    assert!(p.terminate().success(), "a clean exit after giving up the stuck batch");
    assert_eq!(
        db.consumed(&name).await,
        0,
        "nothing after the abandoned batch was committed"
    );
    sqlx::query("DROP TRIGGER fail_offset_updates ON consumer_offsets")
        .execute(&pool)
        .await
        .unwrap();

    let _p = start_processor(&topics, &name, &name, &[]);
    db.wait_consumed(&name, inputs.len() as i64, LONG).await;
    let got = db.digest(true).await;
    let want = reference_digest(&topics, inputs.len() as i64, true).await;
    assert!(got.0 >= 5, "the inputs eject endpoints: {}", got.0);
    assert_eq!(got, want);
    assert_eq!(db.sequence_gaps().await, vec![]);
    db.drop_schema().await;
}

/// A data error from Postgres (SQLSTATE class 22: "timestamp out of range" was the one found)
/// fails the same way on every retry. It once held a batch in a retry loop forever, with every
/// pool of that processor stalled and `/readyz` still saying ready; now the processor stops
/// with an error that says so (and a supervisor or an operator sees it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_permanent_database_error_stops_the_processor_instead_of_retrying_forever() {
    let name = unique("permanent");
    let topics = create_topics(&name, 1).await;
    let inputs = workload(2, 300, 1, 3);
    produce(&topics.signals, &inputs).await;
    fail_offset_updates(&name, "true", "22008", "timestamp out of range").await;
    let mut p = start_processor(&topics, &name, &name, &[]);
    let mut status = None;
    wait_until("the processor to stop on the permanent error", LONG, || {
        status = status.or_else(|| p.child.try_wait().ok().flatten());
        std::future::ready(status.is_some())
    })
    .await;
    assert!(!status.unwrap().success(), "it exits with an error");
    let db = Db::connect(&name).await;
    assert_eq!(db.consumed(&name).await, 0);
    db.drop_schema().await;
}

/// A processor frozen (SIGSTOP) past its session timeout, then resumed, under a steady stream
/// of signals. While it is frozen the other processor takes over its partitions (the frozen
/// one's open transaction cannot hold the claim for longer than the idle-in-transaction
/// timeout) and the outbox relay (its lease expires), so events keep leaving. After it resumes,
/// its zombie batch is fenced, the group gives it partitions back, and it processes them
/// (before: it dropped every record of the partitions it was given back as "not ours", for
/// good, while claiming to be ready).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_processor_neither_stalls_the_group_nor_loses_partitions_after_it_resumes() {
    let name = unique("freeze");
    let topics = create_topics(&name, 4).await;
    let inputs = workload(24, 80_000, 4, 41);
    let upfront = inputs.len() / 4;
    produce(&topics.signals, &inputs[..upfront]).await;
    let db = Db::connect(&name).await;
    let args = [
        "--batch-max-records",
        "200",
        "--snapshot-every",
        "5000",
        "--kafka-option",
        "session.timeout.ms=6000",
    ];
    let (mut a, port_a) = start_serving(&topics, &name, &name, &args);
    let (mut b, port_b) = start_serving(&topics, &name, &name, &args);
    let ports = [port_a, port_b];
    let assigned = |port: u16| async move {
        metric(port, "vitals_processor_assigned_partitions")
            .await
            .unwrap_or(-1.0)
    };
    for port in ports {
        wait_until("both processors to hold partitions", LONG, || async {
            assigned(port).await > 0.0
        })
        .await;
    }
    // The rest arrives as a steady stream (about 4,000 signals a second) while one processor is
    // frozen and resumed, so that batches are in flight at every moment.
    let rest = inputs[upfront..].to_vec();
    let signals_topic = topics.signals.clone();
    let feeder = tokio::spawn(async move {
        for chunk in rest.chunks(400) {
            produce(&signals_topic, chunk).await;
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
    let holder: String = sqlx::query_scalar("SELECT holder FROM relay_lease")
        .fetch_one(&db.pool)
        .await
        .expect("a relay holds the lease");
    let (frozen, other, other_port) = if holder.contains(&format!("-{}-", a.child.id())) {
        (a.child.id(), b.child.id(), ports[1])
    } else {
        (b.child.id(), a.child.id(), ports[0])
    };
    signal(frozen, "-STOP");

    // The other processor takes every partition and the relay, and events keep leaving.
    wait_until("the running processor to own every partition", LONG, || async {
        assigned(other_port).await == 4.0
    })
    .await;
    wait_until("the relay lease to move to the running processor", LONG, || async {
        sqlx::query_scalar::<_, String>("SELECT holder FROM relay_lease")
            .fetch_one(&db.pool)
            .await
            .is_ok_and(|h| h.contains(&format!("-{other}-")))
    })
    .await;
    wait_until(
        "events committed while one processor is frozen to be published",
        LONG,
        || async {
            sqlx::query_scalar::<_, i64>("SELECT count(*) FROM outbox WHERE created_at < now() - interval '2 seconds'")
                .fetch_one(&db.pool)
                .await
                .is_ok_and(|n| n == 0)
        },
    )
    .await;

    signal(frozen, "-CONT");
    wait_until(
        "the group to give the resumed processor its share again",
        LONG,
        || async { assigned(other_port).await == 2.0 },
    )
    .await;
    feeder.await.expect("every signal produced");
    db.wait_consumed(&name, inputs.len() as i64, LONG).await;
    for port in ports {
        assert_eq!(http_get(port, "/readyz").await.as_deref(), Some("ready"));
    }
    assert!(a.terminate().success());
    assert!(b.terminate().success());
    let got = db.digest(true).await;
    let want = reference_digest(&topics, inputs.len() as i64, true).await;
    assert_eq!(got, want);
    assert_eq!(db.sequence_gaps().await, vec![]);
    db.drop_schema().await;
}

/// A relay frozen past its lease, then resumed, must not publish another round: another
/// relay took the lease meanwhile (and may have published the same rows). Before each round
/// the relay renews the lease only if it still holds it unexpired — taking an expired lease
/// back would hide that someone else held it in between.
#[tokio::test]
async fn a_relay_that_lost_its_lease_cannot_renew_it_before_a_publish_round() {
    use vitals_store::outbox::{hold_lease, release_lease, take_lease};
    let name = unique("lease");
    let pool = vitals_testkit::migrated_schema(&name).await;
    let mut conn = pool.acquire().await.unwrap();
    let lease = Duration::from_secs(3);
    assert!(take_lease(&mut conn, "a", lease).await.unwrap());
    assert!(
        hold_lease(&mut conn, "a", lease).await.unwrap(),
        "held and unexpired: renewed"
    );
    // `a` freezes past its lease; `b` takes over.
    sqlx::query("UPDATE relay_lease SET expires_at = clock_timestamp() - interval '1 second'")
        .execute(&mut *conn)
        .await
        .unwrap();
    assert!(
        !hold_lease(&mut conn, "a", lease).await.unwrap(),
        "expired: not renewed"
    );
    assert!(take_lease(&mut conn, "b", lease).await.unwrap());
    assert!(!hold_lease(&mut conn, "a", lease).await.unwrap(), "b holds it");
    // `b` hands over: the lease is free, yet `a` did not hold it all along.
    release_lease(&mut conn, "b").await.unwrap();
    assert!(
        !hold_lease(&mut conn, "a", lease).await.unwrap(),
        "b held it in between"
    );
    assert!(
        take_lease(&mut conn, "a", lease).await.unwrap(),
        "a takes it anew, then starts over"
    );
    drop(conn);
    vitals_testkit::drop_schema(&pool, &name).await;
}

/// A signals topic that stamps records with their producers' clocks (CreateTime, a topic made
/// by hand or by another tool): one record stamped 55 minutes ahead froze its partition's clock
/// for 55 minutes. The processor refuses it at start, naming the setting and both ways out;
/// `--accept-create-time true` runs on it as the tests that control stream time do, and then
/// dead-letters a record stamped beyond `--create-time-max-ahead-secs` (300) of the partition's time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_signals_topic_stamped_by_its_producers_is_refused_unless_accepted() {
    let name = unique("createtime");
    let topics = create_topics(&name, 1).await;
    assert_eq!(topics.stamp, vitals_testkit::Stamp::CreateTime);
    let mut refused = start_processor(&topics, &name, &name, &["--accept-create-time", "false"]);
    let status = refused.child.wait().unwrap();
    assert!(!status.success(), "it refuses to start");
    let log = std::fs::read_to_string(&refused.log).unwrap();
    assert!(
        log.contains(&format!(
            "the signals topic {} has message.timestamp.type=CreateTime",
            topics.signals
        )) && log.contains("--accept-create-time"),
        "{log}"
    );
    // Accepted: it runs and decides on what the topic holds, and a tick stamped 55 minutes
    // ahead of the partition's time is dead-lettered instead of moving its clock on.
    let mut inputs = workload(2, 300, 1, 5);
    let last = inputs.iter().map(|i| i.ts_ms).max().unwrap();
    let ahead = last + 55 * 60_000;
    inputs.extend(ticks(ahead, 1));
    inputs.extend(ticks(last + 1_000, 1));
    produce(&topics.signals, &inputs).await;
    let (_p, port) = start_serving(&topics, &name, &name, &["--accept-create-time", "true"]);
    let db = Db::connect(&name).await;
    let total = inputs.len() as i64;
    wait_until("every record consumed", LONG, || async {
        db.consumed(&name).await >= total
    })
    .await;
    assert_eq!(metric(port, "vitals_processor_stamped_ahead_total").await, Some(1.0));
    let dead = read_n(&topics.dlq, 1, LONG).await;
    assert_eq!(header(&dead[0], "vitals-error-code").as_deref(), Some("stamped_ahead"));
    assert!(
        header(&dead[0], "vitals-error")
            .unwrap()
            .contains("stamped 3300 s ahead"),
        "{:?}",
        header(&dead[0], "vitals-error")
    );
    // The partition's time is the last tick's in time, not the far one's.
    let (snapshot_time,): (i64,) =
        sqlx::query_as("SELECT coalesce(max((extract(epoch FROM stream_time) * 1000)::int8), 0) FROM transitions")
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert!(
        snapshot_time <= last + 1_000,
        "no decision stamped in the future: {snapshot_time} > {}",
        last + 1_000
    );
    db.drop_schema().await;
}

/// A reporter naming new pools without end (the OTLP port once made 55,000 in two requests)
/// cannot grow a partition's engine past `--max-pools-per-partition`: the signals of pools
/// beyond it are dead-lettered with the reason and counted, and the pools held go on deciding.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pools_beyond_the_partitions_cap_are_dead_lettered_and_counted() {
    let name = unique("poolcap");
    let topics = create_topics(&name, 1).await;
    let mut inputs = Vec::new();
    let mut t = 1_700_000_000_000i64;
    for i in 0..50u64 {
        t += 10;
        let pool = format!("pool-{}", i % 5);
        inputs.push(signal_input(&call(&pool, "a", i, OutcomeClass::Success, None, t), t, 1));
    }
    produce(&topics.signals, &inputs).await;
    let (_p, port) = start_serving(&topics, &name, &name, &["--max-pools-per-partition", "3"]);
    let db = Db::connect(&name).await;
    wait_until("every record consumed", LONG, || async {
        db.consumed(&name).await >= 50
    })
    .await;
    // pool-3 and pool-4 came fourth and fifth: their 20 calls are refused, 30 applied.
    assert_eq!(metric(port, "vitals_processor_pools_refused_total").await, Some(20.0));
    let dead = read_n(&topics.dlq, 20, LONG).await;
    assert!(dead
        .iter()
        .all(|m| header(m, "vitals-error-code").as_deref() == Some("too_many_pools")));
    assert!(header(&dead[0], "vitals-error").unwrap().contains("holds 3 pools"));
    db.drop_schema().await;
}

/// Events that a processor before migration 0017 left in the outbox, one a row, are published
/// with the packs written after them, in id order, each as it was written: an upgrade loses
/// none of them and puts none of them after newer events.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_left_one_a_row_by_an_older_processor_are_published_before_the_packs_after_them() {
    use rdkafka::consumer::Consumer;
    let name = unique("legacy_outbox");
    let topics = create_topics(&name, 1).await;
    let owner = vitals_testkit::migrated_schema(&name).await;
    for i in 0..2 {
        sqlx::query(
            "INSERT INTO outbox (dedup_key, topic, key, payload, headers) VALUES ($1, $2, 'legacy', $3, $4::json)",
        )
        .bind(format!("legacy/{i}"))
        .bind(&topics.changes)
        .bind(format!("payload {i}").into_bytes())
        .bind(format!("{{\"vitals-type\": \"Legacy\", \"n\": \"{i}\"}}"))
        .execute(&owner)
        .await
        .unwrap();
    }
    // Five connect errors in a row eject each of three endpoints; the rest pass.
    let mut inputs = Vec::new();
    let mut t = T0_MS;
    for i in 0..300u64 {
        t += 10;
        let outcome = if i < 45 {
            OutcomeClass::ConnectError
        } else {
            OutcomeClass::Success
        };
        let ep = format!("ep-{}", i % 3);
        inputs.push(signal_input(&call("legacy", &ep, i, outcome, Some(300), t), t, 1));
    }
    produce(&topics.signals, &inputs).await;
    let db = Db::connect(&name).await;
    let _p = start_processor(&topics, &name, &name, &[]);
    db.wait_consumed(&name, inputs.len() as i64, LONG).await;
    let want = db.transition_ids().await;
    assert!(want.len() >= 3, "the inputs eject endpoints: {}", want.len());

    // The changes topic in order, until both old events and every transition have come.
    let c = vitals_testkit::consumer(&unique("legacy_reader"));
    c.subscribe(&[&topics.changes]).expect("subscribe");
    let mut order: Vec<String> = Vec::new();
    let mut seen = std::collections::HashSet::new();
    let end = std::time::Instant::now() + LONG;
    while !(want.is_subset(&seen) && order.iter().filter(|o| o.starts_with("one a row")).count() == 2) {
        let left = end.saturating_duration_since(std::time::Instant::now());
        assert!(!left.is_zero(), "published so far: {order:?}");
        if let Ok(Ok(m)) = tokio::time::timeout(left, c.recv()).await {
            let m = m.detach();
            match header(&m, "vitals-type").as_deref() {
                Some("Legacy") => {
                    assert_eq!(rdkafka::Message::key(&m), Some(&b"legacy"[..]));
                    let n = header(&m, "n").unwrap();
                    let payload = String::from_utf8_lossy(rdkafka::Message::payload(&m).unwrap()).into_owned();
                    assert_eq!(payload, format!("payload {n}"));
                    order.push(format!("one a row {n}"));
                }
                Some("HealthChanged") => {
                    let h = decode::<HealthChanged>(rdkafka::Message::payload(&m).unwrap()).unwrap();
                    seen.insert(h.transition_id.clone());
                    order.push(h.transition_id);
                }
                _ => {}
            }
        }
    }
    assert_eq!(
        order[..2],
        ["one a row 0".to_string(), "one a row 1".to_string()],
        "{order:?}"
    );
    wait_until("the outbox to empty", LONG, || async {
        sqlx::query_scalar::<_, i64>("SELECT count(*) FROM outbox")
            .fetch_one(&db.pool)
            .await
            .unwrap()
            == 0
    })
    .await;
    db.drop_schema().await;
}

/// A batch whose commit went through while its writer heard an error is written again, and
/// meets its own rows. A first write inserts its transitions without `ON CONFLICT` (cheaper: a
/// replay emits nothing below the committed offset), so it refuses such a batch as written
/// already, an error the writer retries at once; the retry, a replay, lands nothing twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_written_twice_lands_once_through_the_replay_path() {
    use vitals_store::audit::{Attempt, AuditLog};
    use vitals_store::months::{Months, Retention};
    let name = unique("written_twice");
    let pool = vitals_testkit::migrated_schema(&name).await;
    let log = AuditLog {
        pool: pool.clone(),
        group: name.clone(),
        topic: "signals".into(),
        months: Months::new(Retention::default()),
    };
    let claimed = log.claim_partition(0).await.unwrap();
    let engine = vitals_engine::Engine::new(Policy::default());
    let mut p = vitals_pipeline::Partition::new(0, claimed.epoch, engine, None, claimed.committed_offset);
    let topics = vitals_pipeline::Topics {
        signals: "s".into(),
        changes: "c".into(),
        state: "st".into(),
        dlq: "d".into(),
    };
    let mut batch = vitals_pipeline::BatchWrite::default();
    for i in 0..400u64 {
        let t = T0_MS + i as i64 * 10;
        let outcome = if i < 80 && i % 8 < 5 {
            OutcomeClass::ConnectError
        } else {
            OutcomeClass::Success
        };
        let s = call("twice", &format!("ep-{}", i % 2), i, outcome, Some(300), t);
        let bytes = encode_signal(&s).unwrap();
        p.step(i as i64, Some(t), Some(b"twice"), Some(&bytes), &topics, &mut batch);
    }
    batch.partitions.extend(p.write(1_000, false, false));
    assert!(!batch.transitions.is_empty(), "the connect errors eject");

    log.write_batch(&batch, Attempt::First).await.unwrap();
    let again = log.write_batch(&batch, Attempt::First).await.unwrap_err();
    assert!(
        matches!(again, vitals_store::StoreError::AlreadyWritten(_)) && again.is_retryable(),
        "{again}"
    );
    log.write_batch(&batch, Attempt::Retry).await.unwrap();
    let (transitions, pool_events): (i64, i64) =
        sqlx::query_as("SELECT (SELECT count(*) FROM transitions), (SELECT count(*) FROM pool_events)")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(transitions, batch.transitions.len() as i64);
    assert_eq!(pool_events, batch.pool_events.len() as i64);
    vitals_testkit::drop_schema(&pool, &name).await;
}
