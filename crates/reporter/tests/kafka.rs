//! The reporter against the real broker, and against none.
//!
//! Needs the local stack (Kafka and Postgres, started by `scripts/test.sh`): run `scripts/test.sh`.
// Needs the local stack and its peers: `scripts/test.sh` runs it (`--features stack`).
#![cfg(feature = "stack")]

use rdkafka::Message;
use std::time::Duration;
use vitals_contracts::{decode_signal, OutcomeClass, Signal};
use vitals_reporter::{CallResult, CallTimer, Config, Reporter};
use vitals_testkit::{brokers, read_n, unique, Stamp, Topics};

fn outcome(i: usize) -> vitals_contracts::CallOutcome {
    let mut t = CallTimer::start(format!("pool-{}", i % 3), format!("ep-{}", i % 7));
    t.first_token();
    t.finish(
        "gw-test",
        format!("call-{i}"),
        CallResult::Status(if i.is_multiple_of(10) { 503 } else { 200 }),
        None,
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reported_outcomes_reach_the_signals_topic_keyed_by_pool() {
    let topics = Topics::create(&unique("reporter"), 3, Stamp::LogAppendTime).await;
    let mut cfg = Config::new(brokers());
    cfg.topic = topics.signals.clone();
    cfg.summarize = None;
    let reporter = Reporter::new(cfg).unwrap();
    for i in 0..1_000 {
        reporter.report(outcome(i));
    }
    assert!(reporter.flush(Duration::from_secs(20)));
    let c = reporter.counters();
    assert_eq!(
        (c.reported, c.delivered, c.dropped_queue_full),
        (1_000, 1_000, 0),
        "{c:?}"
    );
    let messages = read_n(&topics.signals, 1_000, Duration::from_secs(30)).await;
    let mut errors = 0;
    for m in &messages {
        let Ok(Signal::Call(call)) = decode_signal(m.payload().unwrap()) else {
            panic!("not a call outcome")
        };
        assert_eq!(m.key().unwrap(), call.pool.as_bytes(), "keyed by pool");
        assert_eq!(call.gateway, "gw-test");
        assert!(call.ttft_us.is_some());
        errors += (call.outcome == OutcomeClass::ServerError) as usize;
    }
    assert_eq!(errors, 100);
    assert!(reporter.close(Duration::from_secs(5)));
}

/// No broker at all: every report returns at once, what cannot be held is dropped and counted,
/// and what is held stays within the two queues' bounds.
#[test]
fn with_kafka_down_reports_never_block_and_what_is_held_stays_bounded() {
    let mut cfg = Config::new("127.0.0.1:1");
    cfg.summarize = None;
    cfg.queue_capacity = 1_000;
    cfg.producer_queue_messages = 2_000;
    cfg.kafka_options = vec![("message.timeout.ms".into(), "2000".into())];
    let reporter = Reporter::new(cfg).unwrap();
    for i in 0..100_000 {
        reporter.report(outcome(i));
    }
    let c = reporter.counters();
    assert_eq!(c.reported + c.dropped_queue_full, 100_000, "{c:?}");
    assert!(c.dropped_queue_full > 0, "the queue filled: {c:?}");
    // Wait for the worker to move what it accepted into the producer (or drop it).
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let c = reporter.counters();
        let held = c.reported - c.dropped_producer_full - c.dropped_invalid - c.delivered - c.delivery_failed;
        if held <= 2_000 {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "still holding {held}: {c:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
    let c = reporter.counters();
    assert!(c.dropped_producer_full > 0, "{c:?}");
    assert_eq!(c.delivered, 0);
    // Nothing can be delivered: flush gives up after its timeout, and the messages time out.
    assert!(!reporter.flush(Duration::from_millis(500)));
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    while reporter.counters().delivery_failed == 0 {
        assert!(std::time::Instant::now() < deadline, "messages never timed out");
        std::thread::sleep(Duration::from_millis(50));
    }
    reporter.close(Duration::from_secs(3));
}

/// A watched call whose first token is late is reported as a timeout when the deadline passes —
/// while the call is still running — and its own report at the end is skipped; a call whose
/// first token comes in time is reported once, at its end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_first_token_is_reported_when_its_deadline_passes() {
    let topics = Topics::create(&unique("reporter_early"), 1, Stamp::LogAppendTime).await;
    let mut cfg = Config::new(brokers());
    cfg.topic = topics.signals.clone();
    cfg.summarize = None;
    cfg.summarize = None;
    let reporter = Reporter::new(cfg).unwrap();
    let deadline = Duration::from_millis(100);
    let mut fast = reporter.start_call("p", "fast", "gw", "fast-1", deadline);
    fast.first_token();
    reporter.finish(fast, "gw", "fast-1", CallResult::Status(200), None);
    let slow = reporter.start_call("p", "slow", "gw", "slow-1", deadline);
    // The slow call has not ended (it is finished below): its early report is on the topic.
    let messages = read_n(&topics.signals, 2, Duration::from_secs(30)).await;
    let calls: Vec<_> = messages
        .iter()
        .map(|m| match decode_signal(m.payload().unwrap()) {
            Ok(Signal::Call(c)) => c,
            other => panic!("not a call: {other:?}"),
        })
        .collect();
    let early = calls.iter().find(|c| c.endpoint == "slow").expect("the early report");
    assert_eq!(early.outcome, OutcomeClass::Timeout);
    assert_eq!(early.event_id, "slow-1");
    assert_eq!(early.latency_us, 100_000);
    assert_eq!(
        early.attributes.get("vitals.early").map(String::as_str),
        Some("ttft_deadline")
    );
    let ok = calls.iter().find(|c| c.endpoint == "fast").expect("the fast call");
    assert_eq!(ok.outcome, OutcomeClass::Success);
    reporter.finish(slow, "gw", "slow-1-end", CallResult::Status(200), None);
    assert!(reporter.flush(Duration::from_secs(10)));
    let c = reporter.counters();
    assert_eq!((c.early_reports, c.superseded, c.delivered), (1, 1, 2), "{c:?}");
}

/// Summaries: 10,000 calls (10 % failures) to 21 endpoints become a few hundred records — each
/// endpoint's first failures of an interval one by one, the rest summed — and every call is on
/// the topic exactly once, counted in a record of its endpoint's pool.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn summarized_calls_reach_the_topic_once_each_in_far_fewer_records() {
    let topics = Topics::create(&unique("reporter_sum"), 3, Stamp::LogAppendTime).await;
    let mut cfg = Config::new(brokers());
    cfg.topic = topics.signals.clone();
    cfg.summarize = Some(vitals_contracts::SummaryConfig::default());
    let reporter = Reporter::new(cfg).unwrap();
    for i in 0..10_000 {
        reporter.report(outcome(i));
    }
    assert!(reporter.flush(Duration::from_secs(20)));
    let c = reporter.counters();
    let records = c.delivered as usize;
    assert_eq!(
        (c.reported, c.dropped_queue_full, c.delivery_failed),
        (10_000, 0, 0),
        "{c:?}"
    );
    assert!(c.summaries > 0 && records < 2_000, "{c:?}");
    let messages = read_n(&topics.signals, records, Duration::from_secs(30)).await;
    let (mut calls, mut failures, mut one_by_one) = (0i64, 0i64, 0);
    let mut ids = std::collections::HashSet::new();
    for m in &messages {
        match decode_signal(m.payload().unwrap()) {
            Ok(Signal::Call(call)) => {
                assert_eq!(m.key().unwrap(), call.pool.as_bytes(), "keyed by pool");
                assert_eq!(call.outcome, OutcomeClass::ServerError, "only failures come alone");
                assert!(ids.insert(call.event_id));
                calls += 1;
                failures += 1;
                one_by_one += 1;
            }
            Ok(Signal::Summary(s)) => {
                assert_eq!(m.key().unwrap(), s.pool.as_bytes(), "keyed by pool");
                assert!(ids.insert(s.summary_id.clone()), "summary ids are unique");
                assert_eq!(s.gateway, "gw-test");
                assert_eq!(s.ttft.count(), s.calls.success, "every success streamed");
                calls += s.calls.total();
                failures += s.calls.server_error;
            }
            other => panic!("neither a call nor a summary: {other:?}"),
        }
    }
    assert_eq!((calls, failures), (10_000, 1_000), "every call once");
    assert_eq!(c.summarized as i64 + one_by_one, 10_000, "{c:?}");
    eprintln!(
        "10,000 calls in {} records ({} summaries, {one_by_one} failures one by one)",
        messages.len(),
        c.summaries
    );
    assert!(reporter.close(Duration::from_secs(5)));
}
