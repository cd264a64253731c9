//! The view filled from the real broker: a cold start from the state topic, then live changes.
//!
//! Needs the local stack (Kafka and Postgres, started by `scripts/test.sh`): run `scripts/test.sh`.
// Needs the local stack and its peers: `scripts/test.sh` runs it (`--features stack`).
#![cfg(feature = "stack")]

use rdkafka::producer::FutureRecord;
use std::time::Duration;
use vitals_contracts::{encode, EndpointState, HealthChanged, HealthState, PoolHealthChanged};
use vitals_healthview::{follow, Config, Freshness};
use vitals_testkit::{brokers, producer, unique, wait_until, Stamp, Topics};

fn change(pool: &str, ep: &str, seq: i64, to: HealthState, weight: f64) -> HealthChanged {
    HealthChanged {
        weight,
        reason_code: "ejected".into(),
        ..vitals_testkit::health_changed(pool, ep, seq, to)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cold_start_from_the_state_topic_then_live_changes() {
    let topics = Topics::create(&unique("view"), 2, Stamp::LogAppendTime).await;
    let p = producer();
    for i in 0..2_000 {
        let s = EndpointState::first_seen(&format!("pool-{}", i % 20), &format!("ep-{i}"), 1, 0);
        let bytes = encode(&s).unwrap();
        let key = format!("{}/{}", s.pool, s.endpoint);
        p.send(
            FutureRecord::to(&topics.state).key(&key).payload(&bytes),
            Duration::from_secs(5),
        )
        .await
        .unwrap();
    }
    let before = encode(&change("pool-0", "ep-0", 1, HealthState::Unhealthy, 0.0)).unwrap();
    p.send(
        FutureRecord::to(&topics.changes).key("pool-0/ep-0").payload(&before),
        Duration::from_secs(5),
    )
    .await
    .unwrap();
    let mut cfg = Config::new(brokers());
    cfg.state_topic = topics.state.clone();
    cfg.changes_topic = topics.changes.clone();
    let f = tokio::task::spawn_blocking(move || follow(cfg)).await.unwrap().unwrap();
    assert_eq!(f.view.len(), 2_000, "every endpoint from the state topic");
    eprintln!("cold start of 2,000 endpoints: {:?}", f.cold_start);
    let view = f.view.clone();
    wait_until("the change written before the start", Duration::from_secs(10), || {
        let s = view.state("pool-0", "ep-0");
        async move { s == Some(HealthState::Unhealthy) }
    })
    .await;
    // Live: a readmission and a pool in panic.
    let after = encode(&change("pool-0", "ep-0", 2, HealthState::Recovering, 0.1)).unwrap();
    p.send(
        FutureRecord::to(&topics.changes).key("pool-0/ep-0").payload(&after),
        Duration::from_secs(5),
    )
    .await
    .unwrap();
    let panic = encode(&PoolHealthChanged {
        pool: "pool-1".into(),
        seq: 1,
        endpoints: 100,
        healthy: 10,
        ejected: 50,
        healthy_fraction: 0.1,
        panic: true,
        correlated_outage: true,
        reason: String::new(),
        policy_version: 0,
        stream_time: 1,
        faulty_reporters: vec![],
    })
    .unwrap();
    p.send(
        FutureRecord::to(&topics.changes).key("pool-1").payload(&panic),
        Duration::from_secs(5),
    )
    .await
    .unwrap();
    let view = f.view.clone();
    wait_until("live changes", Duration::from_secs(10), || {
        let ok = view.state("pool-0", "ep-0") == Some(HealthState::Recovering) && view.panic("pool-1");
        async move { ok }
    })
    .await;
    assert!(f.view.pick("pool-2", 0).unwrap().starts_with("ep-"));
}

/// A gap in an endpoint's `seq` makes the follower read the state topic again: what it had
/// missed (here, an endpoint written to the state topic after the cold start) is in the view.
/// A tick on the changes topic keeps the view fresh, and silence makes it stale.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gap_rereads_the_state_topic_and_ticks_keep_the_view_fresh() {
    let topics = Topics::create(&unique("view_gap"), 1, Stamp::LogAppendTime).await;
    let p = producer();
    let send = |topic: String, key: &'static str, bytes: Vec<u8>| {
        let p = p.clone();
        async move {
            p.send(
                FutureRecord::to(&topic).key(key).payload(&bytes),
                Duration::from_secs(5),
            )
            .await
            .unwrap();
        }
    };
    let mut cfg = Config::new(brokers());
    cfg.state_topic = topics.state.clone();
    cfg.changes_topic = topics.changes.clone();
    cfg.stale_after = Duration::from_millis(300);
    cfg.open_after = Duration::from_secs(60);
    cfg.reread_after_gap = Duration::ZERO;
    let f = tokio::task::spawn_blocking(move || follow(cfg)).await.unwrap().unwrap();
    let view = f.view.clone();
    send(
        topics.changes.clone(),
        "p/a",
        encode(&change("p", "a", 1, HealthState::Unhealthy, 0.0)).unwrap(),
    )
    .await;
    // Written to the state topic only: the view learns of it when it reads the state again.
    let missed = EndpointState::first_seen("p", "b", 7, 0);
    send(topics.state.clone(), "p/b", encode(&missed).unwrap()).await;
    send(
        topics.changes.clone(),
        "p/a",
        encode(&change("p", "a", 3, HealthState::Recovering, 0.1)).unwrap(),
    )
    .await;
    let v = view.clone();
    wait_until("the state re-read after the gap", Duration::from_secs(20), || {
        let known = v.state("p", "b").is_some() && v.counters.rereads.load(std::sync::atomic::Ordering::Relaxed) >= 1;
        async move { known }
    })
    .await;
    assert_eq!(view.counters.gaps.load(std::sync::atomic::Ordering::Relaxed), 1);
    assert_eq!(view.state("p", "a"), Some(HealthState::Recovering));

    // Silence: stale. A tick: fresh again.
    let now = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_micros() as i64
    };
    let v = view.clone();
    wait_until("stale after 300 ms of silence", Duration::from_secs(10), || {
        let f = v.freshness(now());
        async move { f == Freshness::Stale }
    })
    .await;
    let tick = vitals_contracts::Tick {
        ticker: "test".into(),
        emitted_at: now(),
    };
    send(topics.changes.clone(), "tick", encode(&tick).unwrap()).await;
    let v = view.clone();
    wait_until("fresh after a tick", Duration::from_secs(10), || {
        let f = v.freshness(now());
        async move { f == Freshness::Fresh }
    })
    .await;
}

/// A router started beside a broker that is not ready yet (here: its topics do not exist yet)
/// waits for it instead of exiting at start, or following nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_start_waits_for_topics_that_are_not_there_yet() {
    let name = unique("coldview");
    let mut cfg = Config::new(brokers());
    cfg.state_topic = format!("{name}.state");
    cfg.changes_topic = format!("{name}.changes");
    let following = tokio::task::spawn_blocking(move || follow(cfg));
    // The follower is retrying now (the topics are created a moment after it started).
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!following.is_finished(), "the start waits for the topics");
    let topics = Topics::create(&name, 2, Stamp::LogAppendTime).await;
    let f = following
        .await
        .unwrap()
        .expect("the start succeeds once the topics exist");
    let p = producer();
    let bytes = encode(&change("late", "e", 1, HealthState::Unhealthy, 0.0)).unwrap();
    p.send(
        FutureRecord::to(&topics.changes).key("late/e").payload(&bytes),
        Duration::from_secs(5),
    )
    .await
    .unwrap();
    let view = f.view.clone();
    wait_until("the change reaches the view", Duration::from_secs(30), || {
        let s = view.state("late", "e");
        async move { s == Some(HealthState::Unhealthy) }
    })
    .await;
}
