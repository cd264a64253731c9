//! A frozen processor: its ticks on the changes topic stop, a router's health view goes stale and
//! then fails open (every endpoint, even an ejected one, takes calls again); when the processor
//! thaws, the view is fresh and routes by weight again.
//!
//! Needs the local stack (Kafka and Postgres, started by `scripts/test.sh`): run `scripts/test.sh`.
// Needs the local stack and its peers: `scripts/test.sh` runs it (`--features stack`).
#![cfg(feature = "stack")]

use std::time::Duration;
use vitals_healthview::{follow, Config, Freshness};
use vitals_testkit::{brokers, unique, wait_until, Stamp, Topics};

fn now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_micros() as i64
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_processor_makes_the_view_fail_open_and_a_thawed_one_fresh_again() {
    let name = unique("frozen");
    let topics = Topics::create(&name, 2, Stamp::LogAppendTime).await;
    let db = vitals_testkit::migrated_schema(&name).await;
    let processor = vitals_testkit::start_processor(&topics, &name, &name, &["--view-tick-interval-ms", "200"]);
    let mut cfg = Config::new(brokers());
    cfg.state_topic = topics.state.clone();
    cfg.changes_topic = topics.changes.clone();
    cfg.stale_after = Duration::from_secs(1);
    cfg.open_after = Duration::from_secs(2);
    let f = tokio::task::spawn_blocking(move || follow(cfg)).await.unwrap().unwrap();
    let view = f.view.clone();
    // An ejected endpoint the view knows: weight 0, its trial not due.
    view.apply_change(&vitals_contracts::HealthChanged {
        retry_at: Some(i64::MAX / 2),
        ..vitals_testkit::health_changed("p", "out", 1, vitals_contracts::HealthState::Unhealthy)
    });
    let freshness = |want: Freshness| {
        let v = view.clone();
        move || {
            let f = v.freshness(now());
            async move { f == want }
        }
    };
    // The processor ticks once it is ready: the view stays fresh past several stale periods.
    wait_until(
        "the view fresh from ticks",
        Duration::from_secs(60),
        freshness(Freshness::Fresh),
    )
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(view.freshness(now()), Freshness::Fresh, "ticks keep it fresh");
    for _ in 0..200 {
        assert_eq!(
            view.choose("p", &["in", "out"], now()),
            Some(0),
            "by weight: never the ejected one"
        );
    }

    processor.signal("-STOP");
    wait_until(
        "the view failed open",
        Duration::from_secs(30),
        freshness(Freshness::Open),
    )
    .await;
    let picks: std::collections::BTreeSet<usize> = (0..200)
        .filter_map(|_| view.choose("p", &["in", "out"], now()))
        .collect();
    assert_eq!(picks.len(), 2, "failed open: the ejected endpoint takes calls too");

    processor.signal("-CONT");
    wait_until(
        "fresh again after the thaw",
        Duration::from_secs(30),
        freshness(Freshness::Fresh),
    )
    .await;
    for _ in 0..200 {
        assert_eq!(view.choose("p", &["in", "out"], now()), Some(0), "by weight again");
    }
    drop(processor);
    vitals_testkit::drop_schema(&db, &name).await;
}
