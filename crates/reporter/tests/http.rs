//! The reporter over HTTP ingest, against the real API and broker: batches are delivered item
//! by item (a bad item is rejected and counted), and while the API is away reports are held,
//! retried, and delivered once it comes back.
//!
//! Needs the local stack (Kafka and Postgres, started by `scripts/test.sh`): run `scripts/test.sh`.
// Needs the local stack and its peers: `scripts/test.sh` runs it (`--features stack`).
#![cfg(feature = "stack")]

use rdkafka::Message;
use std::time::{Duration, Instant};
use vitals_contracts::{decode_signal, Signal};
use vitals_reporter::{CallResult, CallTimer, Config, Reporter};
use vitals_testkit::{free_port, read_n, start_api, unique, Stamp, Topics};

const TOKEN: &str = "reporter-writer-secret-0001";

fn call(i: usize) -> vitals_contracts::CallOutcome {
    let mut t = CallTimer::start("http-pool", format!("ep-{}", i % 4));
    t.first_token();
    t.finish("gw-http", format!("http-{i}"), CallResult::Status(200), None)
}

fn wait(reporter: &Reporter, what: &str, cond: impl Fn(&vitals_reporter::Snapshot) -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !cond(&reporter.counters()) {
        assert!(
            Instant::now() < deadline,
            "{what}: {:?}, last error {:?}",
            reporter.counters(),
            reporter.last_error()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reports_go_through_http_ingest_and_wait_for_an_api_that_is_away() {
    let name = unique("reporter_http");
    let topics = Topics::create(&name, 2, Stamp::LogAppendTime).await;
    let db = vitals_testkit::migrated_schema(&name).await;
    let port = free_port();
    let mut cfg = Config::http(format!("http://127.0.0.1:{port}"), Some(TOKEN.into()));
    cfg.summarize = None;
    let reporter = Reporter::new(cfg).unwrap();

    // The API is not there yet: reports are held and retried.
    for i in 0..300 {
        reporter.report(call(i));
    }
    wait(&reporter, "retries while the API is away", |c| c.retries >= 2);
    assert_eq!(reporter.counters().delivered, 0);
    assert!(reporter.last_error().is_some_and(|e| e.contains("/v1/signals")));

    // It comes up: everything held is delivered; then a batch of more than one request, with
    // one invalid report (a negative latency), rejected and counted.
    let _api = start_api(&topics, &name, port, &[&format!("gw:writer:{TOKEN}")]).await;
    let r = &reporter;
    tokio::task::block_in_place(|| wait(r, "the held reports delivered", |c| c.delivered == 300));
    for i in 300..1_500 {
        reporter.report(call(i));
    }
    let mut bad = call(1_500);
    bad.latency_us = -1;
    reporter.report(bad);
    assert!(tokio::task::block_in_place(|| reporter.flush(Duration::from_secs(30))));
    let c = reporter.counters();
    assert_eq!((c.reported, c.delivered, c.dropped_invalid), (1_501, 1_500, 1), "{c:?}");
    let messages = read_n(&topics.signals, 1_500, Duration::from_secs(30)).await;
    let mut ids: Vec<String> = messages
        .iter()
        .map(|m| match decode_signal(m.payload().unwrap()) {
            Ok(Signal::Call(c)) => {
                assert_eq!(m.key(), Some(c.pool.as_bytes()));
                c.event_id
            }
            other => panic!("not a call: {other:?}"),
        })
        .collect();
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), 1_500, "every report once");
    vitals_testkit::drop_schema(&db, &name).await;
}

#[test]
fn a_bad_ingest_url_is_refused_at_once() {
    let e = Reporter::new(Config::http("127.0.0.1:8080", None))
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("http://"), "{e}");
}

/// Summaries go through HTTP ingest too: the API takes them as items of type `summary`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn summaries_go_through_http_ingest() {
    let name = unique("reporter_http_sum");
    let topics = Topics::create(&name, 2, Stamp::LogAppendTime).await;
    let db = vitals_testkit::migrated_schema(&name).await;
    let port = free_port();
    let _api = start_api(&topics, &name, port, &[&format!("gw:writer:{TOKEN}")]).await;
    let mut cfg = Config::http(format!("http://127.0.0.1:{port}"), Some(TOKEN.into()));
    cfg.summarize = Some(vitals_contracts::SummaryConfig::default());
    let reporter = Reporter::new(cfg).unwrap();
    for i in 0..2_000 {
        reporter.report(call(i));
    }
    assert!(tokio::task::block_in_place(|| reporter.flush(Duration::from_secs(30))));
    let c = reporter.counters();
    assert_eq!(
        (c.reported, c.summarized, c.dropped_invalid),
        (2_000, 2_000, 0),
        "{c:?}"
    );
    assert_eq!(c.delivered, c.summaries, "{c:?}");
    let messages = read_n(&topics.signals, c.delivered as usize, Duration::from_secs(30)).await;
    let calls: i64 = messages
        .iter()
        .map(|m| match decode_signal(m.payload().unwrap()) {
            Ok(Signal::Summary(s)) => {
                assert_eq!(m.key(), Some(s.pool.as_bytes()));
                s.calls.success
            }
            other => panic!("not a summary: {other:?}"),
        })
        .sum();
    assert_eq!(calls, 2_000, "every call once");
    vitals_testkit::drop_schema(&db, &name).await;
}
