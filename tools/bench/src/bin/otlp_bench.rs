//! The OTLP receiver's cost: realistic HTTP client spans (12 attributes, ~1 in 50 failing, over
//! 1,000 endpoints in 10 pools) in OTLP/HTTP protobuf requests of 512 spans (the SDKs' batch)
//! through the real `vitals-otlp` binary, with summaries on, to the real broker. Prints spans per
//! second, the receiver's CPU per span (spans per CPU-second: per core), its memory (peak RSS)
//! under the load and then under a flood of concurrent senders, what it refused as busy, and the
//! delay from a span's end to its report on the topic (the broker's append time) for calls sent
//! one by one (failures) and for summaries (successes: at most one summary interval later).
//!
//!   scripts/stack.sh up
//!   cargo build --release -p vitals-otlp
//!   cargo run --release -p vitals-bench --bin otlp-bench -- [--spans 2000000] [--senders 4]

use clap::Parser;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{any_value::Value, AnyValue, KeyValue};
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::span::SpanKind;
use opentelemetry_proto::tonic::trace::v1::status::StatusCode;
use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span, Status};
use prost::Message as _;
use rdkafka::consumer::Consumer as _;
use rdkafka::Message as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use vitals_bench::{cpu, status_kb};
use vitals_contracts::{decode_signal, Signal};
use vitals_testkit::{brokers, free_port, http_get, metric, unique, Service, Stamp, Topics};

#[derive(Parser)]
struct Args {
    /// Spans sent in the throughput phase.
    #[arg(long, default_value_t = 2_000_000)]
    spans: u64,
    /// Concurrent senders in the throughput phase.
    #[arg(long, default_value_t = 4)]
    senders: usize,
    /// Spans per request.
    #[arg(long, default_value_t = 512)]
    batch: usize,
    /// Seconds of the flood phase (32 senders, as fast as answered).
    #[arg(long, default_value_t = 10)]
    flood_secs: u64,
    /// Only the decode and map steps on one thread.
    #[arg(long)]
    steps_only: bool,
}

fn kv(k: &str, v: Value) -> KeyValue {
    KeyValue {
        key: k.into(),
        key_strindex: 0,
        value: Some(AnyValue { value: Some(v) }),
    }
}

fn now_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64
}

/// Span `i`: a client call to endpoint `i % 1000` of pool `i % 10`, ending now; every 50th a
/// refused connection.
fn span(i: u64, end_ns: u64) -> Span {
    let ep = i % 1000;
    let failed = i.is_multiple_of(50);
    let mut trace_id = [0x5au8; 16];
    trace_id[..8].copy_from_slice(&i.to_be_bytes());
    let mut attributes = vec![
        kv("http.request.method", Value::StringValue("POST".into())),
        kv("server.address", Value::StringValue(format!("api-{ep}.internal"))),
        kv("server.port", Value::IntValue(443)),
        kv(
            "url.full",
            Value::StringValue(format!("https://api-{ep}.internal/v1/chat/completions")),
        ),
        kv("network.protocol.version", Value::StringValue("1.1".into())),
        kv("gen_ai.request.model", Value::StringValue(format!("model-{}", i % 10))),
        kv("gen_ai.operation.name", Value::StringValue("chat".into())),
        kv("http.request.body.size", Value::IntValue(812)),
        kv("user_agent.original", Value::StringValue("python-httpx/0.28".into())),
        kv("peer.service", Value::StringValue("llm".into())),
    ];
    if failed {
        attributes.push(kv("error.type", Value::StringValue("httpx.ConnectError".into())));
    } else {
        attributes.push(kv("http.response.status_code", Value::IntValue(200)));
        attributes.push(kv("http.response.body.size", Value::IntValue(2048)));
    }
    Span {
        trace_id: trace_id.to_vec(),
        span_id: (i + 1).to_be_bytes().to_vec(),
        name: "POST".into(),
        kind: SpanKind::Client as i32,
        start_time_unix_nano: end_ns - 120_000_000,
        end_time_unix_nano: end_ns,
        attributes,
        status: failed.then(|| Status {
            code: StatusCode::Error as i32,
            message: "ConnectError: [Errno 111] Connection refused".into(),
        }),
        ..Default::default()
    }
}

fn request(first: u64, n: usize) -> Vec<u8> {
    let end = now_ns();
    ExportTraceServiceRequest {
        resource_spans: vec![ResourceSpans {
            resource: Some(Resource {
                attributes: vec![
                    kv("service.name", Value::StringValue("bench".into())),
                    kv("service.instance.id", Value::StringValue("bench-1".into())),
                ],
                ..Default::default()
            }),
            scope_spans: vec![ScopeSpans {
                spans: (first..first + n as u64).map(|i| span(i, end)).collect(),
                ..Default::default()
            }],
            ..Default::default()
        }],
    }
    .encode_to_vec()
}

/// Send requests of `batch` spans from `senders` tasks until `total` spans or `until`: (spans
/// accepted, requests refused as busy).
async fn send(url: &str, senders: usize, batch: usize, total: u64, until: Instant, start: u64) -> (u64, u64) {
    let next = Arc::new(AtomicU64::new(start));
    let (sent, busy) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let mut tasks = Vec::new();
    for _ in 0..senders {
        let (next, sent, busy, url) = (next.clone(), sent.clone(), busy.clone(), url.to_owned());
        tasks.push(tokio::spawn(async move {
            let client = reqwest::Client::new();
            loop {
                let first = next.fetch_add(batch as u64, Ordering::Relaxed);
                if first - start >= total || Instant::now() >= until {
                    return;
                }
                let body = request(first, batch);
                let r = client
                    .post(&url)
                    .header("content-type", "application/x-protobuf")
                    .body(body)
                    .send()
                    .await
                    .expect("the receiver answers");
                match r.status().as_u16() {
                    200 => sent.fetch_add(batch as u64, Ordering::Relaxed),
                    429 => {
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        busy.fetch_add(1, Ordering::Relaxed)
                    }
                    s => panic!("status {s}"),
                };
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    (sent.load(Ordering::Relaxed), busy.load(Ordering::Relaxed))
}

fn percentile(v: &mut [i64], p: f64) -> i64 {
    if v.is_empty() {
        return 0;
    }
    v.sort_unstable();
    v[((v.len() - 1) as f64 * p).round() as usize]
}

/// Decoding and mapping alone, on this thread (no I/O): microseconds per span for each step.
fn steps(batch: usize) {
    let limits = vitals_spans::decode::Limits::default();
    let map = vitals_spans::Map::default();
    let bodies: Vec<Vec<u8>> = (0..200u64).map(|r| request(r * batch as u64, batch)).collect();
    let spans = (bodies.len() * batch) as f64;
    // What the receiver does with a protobuf body: limits on the wire, then span by span.
    let t = Instant::now();
    let mut n = 0;
    for b in &bodies {
        vitals_spans::decode::protobuf_within(b, &limits).unwrap();
        let (mut out, mut tally) = (Vec::new(), vitals_spans::Tally::default());
        map.convert_wire(b, &mut out, &mut tally).unwrap();
        n += out.len();
    }
    let wire = t.elapsed().as_secs_f64();
    // prost's whole decoding, then the same table (OTLP/JSON's path, after serde).
    let t = Instant::now();
    let reqs: Vec<_> = bodies
        .iter()
        .map(|b| vitals_spans::decode::request(vitals_spans::decode::Format::Protobuf, b, &limits).unwrap())
        .collect();
    let decode = t.elapsed().as_secs_f64();
    let t = Instant::now();
    for r in &reqs {
        let (mut out, mut tally) = (Vec::new(), vitals_spans::Tally::default());
        map.convert(r, &mut out, &mut tally);
    }
    let convert = t.elapsed().as_secs_f64();
    println!(
        "steps on one thread: off the wire {:.2} µs per span ({n} calls, {:.0} spans per second); prost's decoding {:.2} µs, then the table {:.2} µs",
        wire / spans * 1e6,
        spans / wire,
        decode / spans * 1e6,
        convert / spans * 1e6
    );
}

#[tokio::main]
async fn main() {
    let a = Args::parse();
    steps(a.batch);
    if a.steps_only {
        return;
    }
    let topics = Topics::create(&unique("otlp_bench"), 8, Stamp::LogAppendTime).await;
    let http = free_port();
    let otlp = Service::start(
        "vitals-otlp",
        "otlp-bench",
        &[
            "--brokers".into(),
            brokers(),
            "--signals-topic".into(),
            topics.signals.clone(),
            "--http-addr".into(),
            format!("127.0.0.1:{http}"),
            "--grpc-addr".into(),
            String::new(),
            "--no-auth".into(),
            "true".into(),
            // One sender's budget would be the bench's ceiling: measure the receiver.
            "--reporter-spans-per-sec".into(),
            "100000000".into(),
        ],
    );
    let pid = otlp.child.id();
    for _ in 0..300 {
        if http_get(http, "/readyz").await.as_deref() == Some("ready") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let url = format!("http://127.0.0.1:{http}/v1/traces");

    // 1. Throughput: spans per second and per CPU-second of the receiver.
    let (cpu0, t0) = (cpu::of_pid(pid), Instant::now());
    let far = Instant::now() + Duration::from_secs(3600);
    let (sent, busy) = send(&url, a.senders, a.batch, a.spans, far, 0).await;
    let (secs, cpu_s) = (t0.elapsed().as_secs_f64(), cpu::of_pid(pid) - cpu0);
    let rss_load = status_kb(pid, "VmHWM:") / 1024;
    println!(
        "throughput: {sent} spans in {secs:.2} s = {:.0} spans/s; receiver CPU {cpu_s:.2} s = {:.0} spans per CPU-second; {busy} busy answers; peak RSS {rss_load} MB",
        sent as f64 / secs,
        sent as f64 / cpu_s
    );

    // 2. Flood: 32 senders as fast as answered; what memory it takes and what it refuses.
    let until = Instant::now() + Duration::from_secs(a.flood_secs);
    let (flood_sent, flood_busy) = send(&url, 32, a.batch, u64::MAX / 4, until, 1 << 40).await;
    println!(
        "flood: {flood_sent} spans accepted in {} s, {flood_busy} requests answered busy (429); peak RSS {} MB; report queue now {:.0}",
        a.flood_secs,
        status_kb(pid, "VmHWM:") / 1024,
        metric(http, "vitals_otlp_report_queue").await.unwrap_or(-1.0)
    );

    // 3. Delay from span end to report on the topic, at a moderate rate: 20 requests of 100
    // spans, 50 ms apart, after the flood has drained.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let c = vitals_testkit::consumer(&unique("otlp_bench_reader"));
    let mut tpl = rdkafka::TopicPartitionList::new();
    for p in 0..topics.partitions {
        tpl.add_partition_offset(&topics.signals, p, rdkafka::Offset::End)
            .unwrap();
    }
    c.assign(&tpl).unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let client = reqwest::Client::new();
    let base = 1u64 << 50;
    for r in 0..20u64 {
        let body = request(base + r * 100, 100);
        let s = client
            .post(&url)
            .header("content-type", "application/x-protobuf")
            .body(body)
            .send()
            .await
            .unwrap()
            .status();
        assert_eq!(s.as_u16(), 200);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (mut calls, mut summaries) = (Vec::new(), Vec::new());
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        let Ok(Ok(m)) = tokio::time::timeout(Duration::from_secs(2), c.recv()).await else {
            break;
        };
        let Some(at_us) = m.timestamp().to_millis().map(|ms| ms * 1000) else {
            continue;
        };
        match m.payload().map(decode_signal) {
            Some(Ok(Signal::Call(o))) if o.gateway == "bench" => calls.push(at_us - (o.occurred_at + o.latency_us)),
            // A summary's calls ended by its end.
            Some(Ok(Signal::Summary(s))) if s.gateway == "bench" => summaries.push(at_us - s.ended_at),
            _ => {}
        }
        if calls.len() >= 40 && summaries.len() >= 40 {
            break;
        }
    }
    println!(
        "delay span end → on the topic: calls one by one (failures) p50 {} ms, p99 {} ms over {}; summaries (their last call's end) p50 {} ms, p99 {} ms over {}",
        percentile(&mut calls, 0.5) / 1000,
        percentile(&mut calls, 0.99) / 1000,
        calls.len(),
        percentile(&mut summaries, 0.5) / 1000,
        percentile(&mut summaries, 0.99) / 1000,
        summaries.len()
    );
    for name in [
        "vitals_otlp_spans_total{result=\"call\"}",
        "vitals_otlp_outcomes_total{result=\"dropped\"}",
        "vitals_reporter_reports_total{result=\"delivered\"}",
        "vitals_reporter_summaries_total",
    ] {
        println!("{name} {}", metric(http, name).await.unwrap_or(-1.0));
    }
}
