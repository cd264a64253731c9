//! `vitals-otlp` as a client sees it, on the real broker: calls reach the signals topic; bad
//! input of every kind the OTLP specification names is refused or skipped with the status it
//! says, counted, and stops nothing; a Kafka that cannot keep up is answered "busy, send again
//! later" (429 with Retry-After; RESOURCE_EXHAUSTED with a RetryInfo) instead of queueing
//! without bound. Needs the local stack: run `scripts/test.sh`.
// Needs the local stack and its peers: `scripts/test.sh` runs it (`--features stack`).
#![cfg(feature = "stack")]

use opentelemetry_proto::tonic::collector::trace::v1::{ExportTraceServiceRequest, ExportTraceServiceResponse};
use opentelemetry_proto::tonic::common::v1::{any_value::Value, AnyValue, KeyValue};
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::span::SpanKind;
use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span};
use prost::Message as _;
use rdkafka::consumer::Consumer as _;
use rdkafka::Message as _;
use std::io::Write as _;
use std::time::Duration;
use vitals_contracts::{decode_signal, Signal};
use vitals_otlp::rpc::{RetryInfo, Status};
use vitals_testkit::{brokers, free_port, http_get, metric, unique, wait_until, Service, Stamp, Topics};

fn kv(k: &str, v: Value) -> KeyValue {
    KeyValue {
        key: k.into(),
        key_strindex: 0,
        value: Some(AnyValue { value: Some(v) }),
    }
}

/// A client span calling `host:443`, answered `status`; its ids from `n`.
fn call(n: u64, host: &str, status: i64) -> Span {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64;
    let mut trace_id = vec![0xab; 16];
    trace_id[..8].copy_from_slice(&n.to_be_bytes());
    Span {
        trace_id,
        span_id: (n + 1).to_be_bytes().to_vec(),
        name: "POST".into(),
        kind: SpanKind::Client as i32,
        start_time_unix_nano: now - 50_000_000,
        end_time_unix_nano: now,
        attributes: vec![
            kv("http.request.method", Value::StringValue("POST".into())),
            kv("server.address", Value::StringValue(host.into())),
            kv("server.port", Value::IntValue(443)),
            kv("http.response.status_code", Value::IntValue(status)),
        ],
        ..Default::default()
    }
}

fn request(spans: Vec<Span>) -> ExportTraceServiceRequest {
    ExportTraceServiceRequest {
        resource_spans: vec![ResourceSpans {
            resource: Some(Resource {
                attributes: vec![kv("service.name", Value::StringValue("svc".into()))],
                ..Default::default()
            }),
            scope_spans: vec![ScopeSpans {
                spans,
                ..Default::default()
            }],
            ..Default::default()
        }],
    }
}

struct Receiver {
    _service: Service,
    http: u16,
    grpc: u16,
    client: reqwest::Client,
    h2: reqwest::Client,
}

impl Receiver {
    /// The flags of a receiver on `brokers` and `topic`, serving on these ports.
    fn args(brokers: &str, topic: &str, http: u16, grpc: u16) -> Vec<String> {
        let mut a = Receiver::args_authenticated(brokers, topic, http, grpc);
        // Authentication has its own tests: these take every request as `anonymous`.
        a.extend(["--no-auth".into(), "true".into()]);
        a
    }

    /// The flags without `--no-auth`: the caller gives the tokens.
    fn args_authenticated(brokers: &str, topic: &str, http: u16, grpc: u16) -> Vec<String> {
        [
            "--brokers",
            brokers,
            "--signals-topic",
            topic,
            "--http-addr",
            &format!("127.0.0.1:{http}"),
            "--grpc-addr",
            &format!("127.0.0.1:{grpc}"),
        ]
        .iter()
        .map(|s| s.to_string())
        .collect()
    }

    async fn start(label: &str, brokers: &str, topic: &str, extra: &[&str]) -> Receiver {
        let (http, grpc) = (free_port(), free_port());
        let mut args = Receiver::args(brokers, topic, http, grpc);
        args.extend(extra.iter().map(|s| s.to_string()));
        Receiver::start_with(label, args, http, grpc).await
    }

    /// Start with the flags `args`, serving on `http` and `grpc`.
    async fn start_with(label: &str, args: Vec<String>, http: u16, grpc: u16) -> Receiver {
        let service = Service::start("vitals-otlp", label, &args);
        wait_until("vitals-otlp up", Duration::from_secs(30), || async move {
            http_get(http, "/readyz").await.as_deref() == Some("ready")
        })
        .await;
        Receiver {
            _service: service,
            http,
            grpc,
            client: reqwest::Client::builder()
                .timeout(Duration::from_secs(30))
                .build()
                .unwrap(),
            h2: reqwest::Client::builder()
                .http2_prior_knowledge()
                .timeout(Duration::from_secs(30))
                .build()
                .unwrap(),
        }
    }

    async fn post(
        &self,
        ctype: &str,
        encoding: Option<&str>,
        body: Vec<u8>,
    ) -> (u16, reqwest::header::HeaderMap, Vec<u8>) {
        self.post_as(None, ctype, encoding, body).await
    }

    async fn post_as(
        &self,
        token: Option<&str>,
        ctype: &str,
        encoding: Option<&str>,
        body: Vec<u8>,
    ) -> (u16, reqwest::header::HeaderMap, Vec<u8>) {
        let mut r = self
            .client
            .post(format!("http://127.0.0.1:{}/v1/traces", self.http))
            .header("content-type", ctype)
            .body(body);
        if let Some(t) = token {
            r = r.bearer_auth(t);
        }
        if let Some(e) = encoding {
            r = r.header("content-encoding", e);
        }
        let resp = r.send().await.expect("the receiver answers");
        let (status, headers) = (resp.status().as_u16(), resp.headers().clone());
        (status, headers, resp.bytes().await.unwrap().to_vec())
    }

    async fn proto(&self, req: &ExportTraceServiceRequest) -> (u16, Vec<u8>) {
        let (s, _, b) = self.post("application/x-protobuf", None, req.encode_to_vec()).await;
        (s, b)
    }

    /// A gRPC export of `message` (flag 0, or 1 with `encoding`): the HTTP status, the headers
    /// (a trailers-only answer has grpc-status there) and the body.
    async fn grpc(&self, message: &[u8], compressed: Option<&str>) -> (u16, reqwest::header::HeaderMap, Vec<u8>) {
        self.grpc_as(None, message, compressed).await
    }

    async fn grpc_as(
        &self,
        token: Option<&str>,
        message: &[u8],
        compressed: Option<&str>,
    ) -> (u16, reqwest::header::HeaderMap, Vec<u8>) {
        let mut framed = vec![u8::from(compressed.is_some())];
        framed.extend_from_slice(&(message.len() as u32).to_be_bytes());
        framed.extend_from_slice(message);
        let mut r = self
            .h2
            .post(format!(
                "http://127.0.0.1:{}/opentelemetry.proto.collector.trace.v1.TraceService/Export",
                self.grpc
            ))
            .header("content-type", "application/grpc")
            .header("te", "trailers")
            .body(framed);
        if let Some(e) = compressed {
            r = r.header("grpc-encoding", e);
        }
        if let Some(t) = token {
            r = r.bearer_auth(t);
        }
        let resp = r.send().await.expect("the receiver answers gRPC");
        let (status, headers) = (resp.status().as_u16(), resp.headers().clone());
        (status, headers, resp.bytes().await.unwrap().to_vec())
    }

    async fn metric(&self, name: &str) -> f64 {
        metric(self.http, name).await.unwrap_or(-1.0)
    }
}

fn gzip(b: &[u8]) -> Vec<u8> {
    let mut z = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    z.write_all(b).unwrap();
    z.finish().unwrap()
}

fn status_of(body: &[u8]) -> Status {
    Status::decode(body).expect("an error body is a google.rpc.Status")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_reach_kafka_and_bad_input_is_refused_or_skipped_counted_and_stops_nothing() {
    let topics = Topics::create(&unique("otlp_in"), 1, Stamp::LogAppendTime).await;
    let r = Receiver::start("otlp-bad-input", &brokers(), &topics.signals, &["--summarize-ms", "0"]).await;
    let mut sent = Vec::new();

    // Good: protobuf, JSON, gzip, gRPC; each call reported.
    let (s, b) = r
        .proto(&request(vec![call(1, "api.a", 200), call(2, "api.b", 503)]))
        .await;
    assert_eq!(s, 200);
    assert_eq!(
        ExportTraceServiceResponse::decode(&b[..]).unwrap().partial_success,
        None
    );
    sent.extend([1u64, 2]);
    let json = serde_json::to_vec(&request(vec![call(3, "api.a", 429)])).unwrap();
    let (s, h, b) = r.post("application/json", None, json.clone()).await;
    assert_eq!(
        (s, h["content-type"].to_str().unwrap()),
        (200, "application/json"),
        "{}",
        String::from_utf8_lossy(&b)
    );
    sent.push(3);
    let (s, _, _) = r
        .post(
            "application/x-protobuf",
            Some("gzip"),
            gzip(&request(vec![call(4, "api.b", 200)]).encode_to_vec()),
        )
        .await;
    assert_eq!(s, 200);
    sent.push(4);
    let (s, h, b) = r
        .grpc(&request(vec![call(5, "api.a", 500)]).encode_to_vec(), None)
        .await;
    assert_eq!(s, 200);
    assert!(
        h.get("grpc-status").is_none(),
        "a success's status is in the trailers: {h:?}"
    );
    assert_eq!(b[0], 0);
    assert!(ExportTraceServiceResponse::decode(&b[5..]).is_ok());
    sent.push(5);
    let (s, _, _) = r
        .grpc(
            &gzip(&request(vec![call(6, "api.b", 200)]).encode_to_vec()),
            Some("gzip"),
        )
        .await;
    assert_eq!(s, 200);
    sent.push(6);

    // Partial success: one span with a zero trace id is rejected, the other reported.
    let mut bad_id = call(7, "api.a", 200);
    bad_id.trace_id = vec![0; 16];
    let (s, b) = r.proto(&request(vec![bad_id, call(8, "api.a", 200)])).await;
    assert_eq!(s, 200);
    let partial = ExportTraceServiceResponse::decode(&b[..])
        .unwrap()
        .partial_success
        .unwrap();
    assert_eq!(partial.rejected_spans, 1);
    assert!(partial.error_message.contains("trace_id"), "{partial:?}");
    sent.push(8);

    // Malformed protobuf; JSON with wrong types; invalid UTF-8 in a string: 400, a Status.
    let (s, b) = r.proto_raw(b"\xff\xff\xff\xff".to_vec()).await;
    assert_eq!((s, status_of(&b).code), (400, 3));
    let (s, _, b) = r
        .post(
            "application/json",
            None,
            br#"{"resourceSpans":[{"scopeSpans":[{"spans":[{"name":5}]}]}]}"#.to_vec(),
        )
        .await;
    assert_eq!(s, 400);
    let j: serde_json::Value = serde_json::from_slice(&b).unwrap();
    assert_eq!(j["code"], 3, "{j}");
    let mut bad_utf8 = request(vec![call(9, "api.a", 200)]).encode_to_vec();
    let at = bad_utf8.windows(4).position(|w| w == b"POST").unwrap();
    bad_utf8[at] = 0xff;
    let (s, b) = r.proto_raw(bad_utf8).await;
    assert_eq!((s, status_of(&b).code), (400, 3), "{}", status_of(&b).message);

    // Too large: a 10 MB body; a million spans in 2 MB; a JSON million spans; a gzip bomb: 413.
    let (s, _, _) = r.post("application/x-protobuf", None, vec![0x0a; 10 << 20]).await;
    assert_eq!(s, 413);
    let million = request(vec![Span::default(); 1_000_000]).encode_to_vec();
    assert!(million.len() < 4 << 20, "{} bytes", million.len());
    let (s, b) = r.proto_raw(million.clone()).await;
    assert_eq!(s, 413);
    assert!(
        status_of(&b).message.contains("1000000 spans"),
        "{}",
        status_of(&b).message
    );
    let json_million = format!(
        "{{\"resourceSpans\":[{{\"scopeSpans\":[{{\"spans\":[{}]}}]}}]}}",
        vec!["{}"; 1_000_000].join(",")
    );
    let (s, _, _) = r.post("application/json", None, json_million.into_bytes()).await;
    assert_eq!(s, 413);
    let (s, _, _) = r
        .post("application/x-protobuf", Some("gzip"), gzip(&vec![0u8; 100 << 20]))
        .await;
    assert_eq!(s, 413);
    let (s, h, _) = r.grpc(&million, None).await;
    assert_eq!((s, h["grpc-status"].to_str().unwrap()), (200, "8"));

    // Attributes of 1 MB: a name that long is skipped (counted); elsewhere it is carried.
    let mut long_name = call(10, &"x".repeat(1 << 20), 200);
    long_name.span_id = vec![1; 8];
    let mut long_other = call(11, "api.b", 200);
    long_other
        .attributes
        .push(kv("http.request.body", Value::StringValue("y".repeat(1 << 20))));
    let (s, _) = r.proto(&request(vec![long_name, long_other])).await;
    assert_eq!(s, 200);
    sent.push(11);

    // Not OTLP: another content type or encoding, another method, another gRPC compression.
    let (s, _, _) = r.post("text/plain", None, b"hi".to_vec()).await;
    assert_eq!(s, 415);
    let (s, _, _) = r.post("application/x-protobuf", Some("br"), b"hi".to_vec()).await;
    assert_eq!(s, 415);
    let get = r
        .client
        .get(format!("http://127.0.0.1:{}/v1/traces", r.http))
        .send()
        .await
        .unwrap();
    assert_eq!(get.status().as_u16(), 405);
    let (s, h, _) = r.grpc(b"x", Some("snappy")).await;
    assert_eq!((s, h["grpc-status"].to_str().unwrap()), (200, "12"));
    let (s, h, _) = r.grpc(b"\xff\xff\xff", None).await;
    assert_eq!((s, h["grpc-status"].to_str().unwrap()), (200, "3"));

    // Nothing stopped: a good request still goes through, and every refusal was counted.
    let (s, _) = r.proto(&request(vec![call(12, "api.a", 200)])).await;
    assert_eq!(s, 200);
    sent.push(12);
    for (name, want) in [
        ("vitals_otlp_requests_total{transport=\"http\",result=\"ok\"}", 5.0),
        ("vitals_otlp_requests_total{transport=\"http\",result=\"partial\"}", 1.0),
        (
            "vitals_otlp_requests_total{transport=\"http\",result=\"malformed\"}",
            3.0,
        ),
        (
            "vitals_otlp_requests_total{transport=\"http\",result=\"too_large\"}",
            4.0,
        ),
        (
            "vitals_otlp_requests_total{transport=\"http\",result=\"unsupported\"}",
            2.0,
        ),
        ("vitals_otlp_requests_total{transport=\"grpc\",result=\"ok\"}", 2.0),
        (
            "vitals_otlp_requests_total{transport=\"grpc\",result=\"malformed\"}",
            1.0,
        ),
        (
            "vitals_otlp_requests_total{transport=\"grpc\",result=\"too_large\"}",
            1.0,
        ),
        (
            "vitals_otlp_requests_total{transport=\"grpc\",result=\"unsupported\"}",
            1.0,
        ),
        ("vitals_otlp_spans_total{result=\"rejected\"}", 1.0),
        ("vitals_otlp_spans_skipped_total{reason=\"bad_name\"}", 1.0),
        ("vitals_otlp_outcomes_total{result=\"queued\"}", sent.len() as f64),
    ] {
        assert_eq!(r.metric(name).await, want, "{name}");
    }

    // Every call sent is on the signals topic, once, under its span's id.
    let want: std::collections::BTreeSet<String> = sent
        .iter()
        .map(|n| {
            let s = call(*n, "h", 200);
            vitals_spans::map::event_id(&s.trace_id, &s.span_id)
        })
        .collect();
    let c = vitals_testkit::consumer(&unique("otlp_reader"));
    let mut tpl = rdkafka::TopicPartitionList::new();
    tpl.add_partition_offset(&topics.signals, 0, rdkafka::Offset::Beginning)
        .unwrap();
    c.assign(&tpl).unwrap();
    let mut got = Vec::new();
    while got.len() < want.len() {
        let m = tokio::time::timeout(Duration::from_secs(60), c.recv())
            .await
            .expect("the calls reach the topic")
            .unwrap();
        if let Some(Ok(Signal::Call(call))) = m.payload().map(decode_signal) {
            assert_eq!(call.gateway, "svc");
            got.push(call.event_id);
        }
    }
    let got_set: std::collections::BTreeSet<String> = got.iter().cloned().collect();
    assert_eq!(got_set, want);
    assert_eq!(got.len(), want.len(), "each once");
}

impl Receiver {
    async fn proto_raw(&self, body: Vec<u8>) -> (u16, Vec<u8>) {
        let (s, _, b) = self.post("application/x-protobuf", None, body).await;
        (s, b)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kafka_that_cannot_keep_up_is_answered_busy_with_when_to_send_again() {
    // An unreachable broker and a producer queue of one record: the reporter's queue (8) fills
    // within a few requests, and the receiver answers busy from three quarters of it.
    let dead = free_port();
    let r = Receiver::start(
        "otlp-busy",
        &format!("127.0.0.1:{dead}"),
        "vitals.signals.v1",
        &[
            "--kafka-option",
            "queue.buffering.max.messages=1",
            "--summarize-ms",
            "0",
            "--queue",
            "8",
            "--retry-after-secs",
            "3",
        ],
    )
    .await;
    let mut busy = None;
    for n in 0..50u64 {
        let spans = (0..4).map(|i| call(100 * n + i * 2, "api.a", 200)).collect();
        let (s, h, b) = r
            .post("application/x-protobuf", None, request(spans).encode_to_vec())
            .await;
        if s == 429 {
            busy = Some((h, b));
            break;
        }
        assert_eq!(s, 200);
    }
    let (h, b) = busy.expect("a 429 before 50 requests of 4 calls, with room for 8");
    assert_eq!(h["retry-after"].to_str().unwrap(), "3");
    let st = status_of(&b);
    assert_eq!(st.code, 8);
    let (s, h, _) = r
        .grpc(&request(vec![call(9_999, "api.a", 200)]).encode_to_vec(), None)
        .await;
    assert_eq!((s, h["grpc-status"].to_str().unwrap()), (200, "8"));
    use base64::Engine as _;
    let details = base64::engine::general_purpose::STANDARD_NO_PAD
        .decode(h["grpc-status-details-bin"].to_str().unwrap())
        .unwrap();
    let st = Status::decode(&details[..]).unwrap();
    let retry = RetryInfo::decode(&st.details[0].value[..]).unwrap();
    assert_eq!(
        retry.retry_delay.unwrap().seconds,
        3,
        "RESOURCE_EXHAUSTED with a RetryInfo is retryable"
    );
    assert!(
        r.metric("vitals_otlp_requests_total{transport=\"http\",result=\"busy\"}")
            .await
            >= 1.0
    );
    assert!(
        r.metric("vitals_otlp_requests_total{transport=\"grpc\",result=\"busy\"}")
            .await
            >= 1.0
    );
    // Bounded: what the queue could not take was counted, nothing more is held than it has room for.
    assert!(r.metric("vitals_otlp_report_queue").await <= 8.0);
    let calls = r.metric("vitals_otlp_spans_total{result=\"call\"}").await;
    let queued = r.metric("vitals_otlp_outcomes_total{result=\"queued\"}").await;
    let dropped = r.metric("vitals_otlp_outcomes_total{result=\"dropped\"}").await;
    assert_eq!(queued + dropped, calls);
    assert_eq!(http_get(r.http, "/healthz").await.as_deref(), Some("ok"));
}

/// The receiver's peak resident memory (VmHWM), in MB.
fn peak_rss_mb(pid: u32) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let kb: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0.0);
    kb / 1024.0
}

/// A client that goes away in the middle of its body is counted as a broken request, not as a
/// body too large (it was); and a hundred small gzip requests at once, each inflating to nearly
/// the limit, do not each hold an inflated body while they wait: a request is inflated under a
/// decoder's permit, as it is decoded (before, 100 requests of 28 KiB took the receiver to
/// 873 MB). Every one is still answered, each for what it is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_cut_short_is_broken_not_too_large_and_gzip_bodies_inflate_only_under_a_decoder() {
    use tokio::io::AsyncWriteExt as _;
    let topics = Topics::create(&unique("otlp_cut"), 1, Stamp::LogAppendTime).await;
    let r = Receiver::start("otlp-cut", &brokers(), &topics.signals, &["--summarize-ms", "0"]).await;

    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", r.http)).await.unwrap();
    s.write_all(
        b"POST /v1/traces HTTP/1.1\r\nhost: vitals\r\ncontent-type: application/x-protobuf\r\n\
          content-length: 1000\r\n\r\n0123456789",
    )
    .await
    .unwrap();
    s.shutdown().await.unwrap();
    drop(s);
    let broken = "vitals_otlp_requests_total{transport=\"http\",result=\"broken\"}";
    wait_until("the cut request counted", Duration::from_secs(30), || async {
        r.metric(broken).await == 1.0
    })
    .await;
    let too_large = "vitals_otlp_requests_total{transport=\"http\",result=\"too_large\"}";
    assert!(r.metric(too_large).await <= 0.0, "a cut body is not a large one");

    // 7 MB of zeros (under the 8 MB limit) is ~7 KB gzipped, and not a protobuf request.
    let body = gzip(&vec![0u8; 7 << 20]);
    assert!(body.len() < 64 << 10, "{} bytes", body.len());
    let mut sends = tokio::task::JoinSet::new();
    for _ in 0..100 {
        let (client, url, body) = (
            r.client.clone(),
            format!("http://127.0.0.1:{}/v1/traces", r.http),
            body.clone(),
        );
        sends.spawn(async move {
            client
                .post(url)
                .header("content-type", "application/x-protobuf")
                .header("content-encoding", "gzip")
                .body(body)
                .send()
                .await
                .map(|resp| resp.status().as_u16())
        });
    }
    let mut statuses = std::collections::BTreeMap::new();
    while let Some(s) = sends.join_next().await {
        *statuses.entry(s.unwrap().expect("answered")).or_insert(0) += 1;
    }
    assert_eq!(statuses, [(400, 100)].into(), "each refused as malformed, none lost");
    let peak = peak_rss_mb(r._service.child.id());
    eprintln!("the receiver's peak RSS after 100 concurrent gzip requests: {peak:.0} MB");
    assert!(
        peak < 350.0,
        "100 gzip requests waiting for a decoder held {peak:.0} MB (two decoders inflate 7 MB each)"
    );

    // Bodies over the limit, ten at once: each client gets its 413 (not retryable), never a
    // connection reset mid-body (which OTLP exporters take as retryable, and send again).
    let mut large = tokio::task::JoinSet::new();
    for _ in 0..10 {
        let (client, url) = (r.client.clone(), format!("http://127.0.0.1:{}/v1/traces", r.http));
        large.spawn(async move {
            client
                .post(url)
                .header("content-type", "application/x-protobuf")
                .body(vec![0x0a; 10 << 20])
                .send()
                .await
                .map(|resp| resp.status().as_u16())
                .map_err(|e| format!("{e:?}"))
        });
    }
    while let Some(s) = large.join_next().await {
        assert_eq!(s.unwrap(), Ok(413));
    }
    let (s, _) = r.proto(&request(vec![call(40, "api.a", 200)])).await;
    assert_eq!(s, 200, "and the receiver goes on");
}

/// Started with a soft open-file limit far below its hard one (systemd's default soft limit is
/// 1,024), the receiver raises it to the hard one before it serves: at 1,024, 1,100 idle clients
/// made good exports time out with "Too many open files".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_receiver_raises_its_open_file_limit_before_it_serves() {
    let topics = Topics::create(&unique("otlp_nofile"), 1, Stamp::LogAppendTime).await;
    let (http, grpc) = (free_port(), free_port());
    let bin = vitals_testkit::binary("vitals-otlp");
    let script = "ulimit -S -n 256 && exec \"$0\" \"$@\"";
    let mut args: Vec<String> = vec!["-c".into(), script.into(), bin.to_str().unwrap().into()];
    args.extend(Receiver::args(&brokers(), &topics.signals, http, grpc));
    let service = Service::start_program(std::path::Path::new("/bin/sh"), "otlp-nofile", &args);
    wait_until("vitals-otlp up", Duration::from_secs(30), || async move {
        http_get(http, "/healthz").await.as_deref() == Some("ok")
    })
    .await;
    let limits = std::fs::read_to_string(format!("/proc/{}/limits", service.child.id())).unwrap();
    let line = limits.lines().find(|l| l.starts_with("Max open files")).unwrap();
    let nums: Vec<&str> = line.split_whitespace().skip(3).take(2).collect();
    assert_eq!(nums[0], nums[1], "soft raised to hard: {line}");
    assert_ne!(nums[0], "256", "{line}");
}

/// A request whose resource names `service` (or no service), of client spans calling `host`
/// for the pool `pool` (their `peer.service`).
fn request_from(service: Option<&str>, pool: &str, first: u64, n: u64, host: &str) -> ExportTraceServiceRequest {
    let spans = (first..first + n)
        .map(|i| {
            let mut s = call(i, host, 503);
            s.attributes.push(kv("peer.service", Value::StringValue(pool.into())));
            s
        })
        .collect();
    let mut r = request(spans);
    r.resource_spans[0].resource = Some(Resource {
        attributes: service
            .map(|n| vec![kv("service.name", Value::StringValue(n.into()))])
            .unwrap_or_default(),
        ..Default::default()
    });
    r
}

const EU: &str = "edge-eu-reporter-secret-1";
const FLOOD: &str = "flood-reporter-secret-001";
const SPREAD: &str = "spread-reporter-secret-01";
const READER: &str = "viewer-reader-secret-0001";

/// Every way in needs a token that may report; a token reports only for its gateways and pools
/// (a resource that names no service is the token's own gateway); one reporter over its budget
/// is slowed with when to send again and no other is; /metrics needs a reader on the OTLP ports;
/// a token added to the file works without a restart. What reached the topic is exactly what was
/// allowed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_is_needed_a_binding_holds_and_one_flooding_reporter_is_slowed_alone() {
    let topics = Topics::create(&unique("otlp_trust"), 1, Stamp::LogAppendTime).await;
    let dir = std::env::temp_dir().join(unique("otlp-tokens"));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("tokens");
    let tokens = format!(
        "edge-eu-main:reporter;gateways=edge-eu-*;pools=chat:{EU}\nflood:reporter:{FLOOD}\nspread:reporter:{SPREAD}\nviewer:reader:{READER}\n"
    );
    std::fs::write(&file, &tokens).unwrap();
    let (http, grpc, metrics) = (free_port(), free_port(), free_port());
    let mut args = Receiver::args_authenticated(&brokers(), &topics.signals, http, grpc);
    for a in [
        "--summarize-ms",
        "0",
        "--tokens-file",
        file.to_str().unwrap(),
        "--metrics-addr",
        &format!("127.0.0.1:{metrics}"),
        "--reporter-spans-per-sec",
        "20",
        "--reporter-endpoints-per-min",
        "5",
    ] {
        args.push(a.into());
    }
    let r = Receiver::start_with("otlp-trust", args, http, grpc).await;
    let body = |service: Option<&str>, pool: &str, first: u64, n: u64| {
        request_from(service, pool, first, n, "api.a").encode_to_vec()
    };
    let ctype = "application/x-protobuf";

    // No token, a made-up one, a reader's: refused before anything is read.
    for token in [None, Some("made-up-token-of-some-length")] {
        let (s, h, b) = r
            .post_as(token, ctype, None, body(Some("edge-eu-1"), "chat", 1, 50))
            .await;
        assert_eq!((s, h["www-authenticate"].to_str().unwrap()), (401, "Bearer"));
        assert_eq!(status_of(&b).code, 16, "UNAUTHENTICATED");
        let (s, h, _) = r.grpc_as(token, &body(Some("edge-eu-1"), "chat", 1, 50), None).await;
        assert_eq!((s, h["grpc-status"].to_str().unwrap()), (200, "16"));
    }
    let (s, _, _) = r
        .post_as(Some(READER), ctype, None, body(Some("edge-eu-1"), "chat", 1, 50))
        .await;
    assert_eq!(s, 403);
    let (_, h, _) = r
        .grpc_as(Some(READER), &body(Some("edge-eu-1"), "chat", 1, 50), None)
        .await;
    assert_eq!(h["grpc-status"].to_str().unwrap(), "7", "PERMISSION_DENIED");

    // The binding: its gateways and pools are taken; others are refused as a partial success.
    let eu = |service: Option<&'static str>, first: u64, n: u64| {
        let r = &r;
        async move {
            let (s, _, b) = r.post_as(Some(EU), ctype, None, body(service, "chat", first, n)).await;
            assert_eq!(s, 200);
            ExportTraceServiceResponse::decode(&b[..]).unwrap().partial_success
        }
    };
    assert_eq!(eu(Some("edge-eu-1"), 100, 3).await, None);
    // The same export again (its answer lost, the exporter retries): taken, reported once.
    assert_eq!(eu(Some("edge-eu-1"), 100, 3).await, None);
    assert_eq!(eu(None, 200, 2).await, None, "the token's own name");
    let partial = eu(Some("edge-us-1"), 300, 4).await.unwrap();
    assert_eq!(partial.rejected_spans, 4);
    assert!(partial.error_message.contains("edge-eu-*"), "{}", partial.error_message);
    let (s, h, b) = r
        .grpc_as(Some(EU), &body(Some("edge-eu-2"), "embed", 400, 2), None)
        .await;
    assert_eq!((s, h.get("grpc-status").map(|v| v.to_str().unwrap())), (200, None));
    let m = &b[5..];
    let partial = ExportTraceServiceResponse::decode(m).unwrap().partial_success.unwrap();
    assert_eq!(partial.rejected_spans, 2);
    assert!(
        partial.error_message.contains("pools chat"),
        "{}",
        partial.error_message
    );

    // A flooding reporter is slowed, with when to send again; another goes on. Its burst (two
    // seconds' worth) is spent at once: the next request fits only two seconds later.
    let (s, _, _) = r
        .post_as(Some(FLOOD), ctype, None, body(Some("f"), "bulk", 1_000, 40))
        .await;
    assert_eq!(s, 200);
    let (s, h, b) = r
        .post_as(Some(FLOOD), ctype, None, body(Some("f"), "bulk", 2_000, 40))
        .await;
    assert_eq!(s, 429, "{}", status_of(&b).message);
    assert!(h["retry-after"].to_str().unwrap().parse::<u64>().unwrap() >= 1);
    let st = status_of(&b);
    assert!(st.message.contains("20 spans a second"), "{}", st.message);
    assert!(RetryInfo::decode(&st.details[0].value[..])
        .unwrap()
        .retry_delay
        .is_some());
    let (_, h, _) = r.grpc_as(Some(FLOOD), &body(Some("f"), "bulk", 3_000, 40), None).await;
    assert_eq!(h["grpc-status"].to_str().unwrap(), "8", "RESOURCE_EXHAUSTED");
    assert!(h.contains_key("grpc-status-details-bin"), "with a RetryInfo");
    let (s, _, _) = r
        .post_as(Some(EU), ctype, None, body(Some("edge-eu-1"), "chat", 500, 1))
        .await;
    assert_eq!(s, 200, "another reporter is not slowed");
    // Too many endpoints in a minute: refused whole.
    let spread: Vec<Span> = (0..6)
        .map(|i| {
            let mut s = call(4_000 + i, &format!("host-{i}"), 200);
            s.attributes.push(kv("peer.service", Value::StringValue("wide".into())));
            s
        })
        .collect();
    let (s, _, b) = r
        .post_as(Some(SPREAD), ctype, None, request(spread).encode_to_vec())
        .await;
    assert_eq!(s, 429);
    assert!(status_of(&b).message.contains("5 endpoints a minute"));

    // /metrics: a reader's token on the OTLP port; open on the metrics port.
    let get = |port: u16, token: Option<&'static str>| {
        let client = r.client.clone();
        async move {
            let mut q = client.get(format!("http://127.0.0.1:{port}/metrics"));
            if let Some(t) = token {
                q = q.bearer_auth(t);
            }
            q.send().await.unwrap().status().as_u16()
        }
    };
    assert_eq!(get(http, None).await, 401);
    assert_eq!(get(http, Some(EU)).await, 403, "a reporter reads nothing");
    assert_eq!(get(http, Some(READER)).await, 200);
    assert_eq!(get(metrics, None).await, 200);
    let m = |name: &'static str| async move { metric(metrics, name).await.unwrap_or(-1.0) };
    assert_eq!(
        m("vitals_otlp_reporter_spans_total{token=\"edge-eu-main\",result=\"unbound\"}").await,
        6.0
    );
    assert_eq!(
        m("vitals_otlp_reporter_spans_total{token=\"edge-eu-main\",result=\"taken\"}").await,
        9.0
    );
    assert_eq!(
        m("vitals_otlp_spans_total{result=\"repeat\"}").await,
        3.0,
        "the retried export"
    );
    assert_eq!(
        m("vitals_otlp_reporter_spans_total{token=\"flood\",result=\"limited\"}").await,
        80.0
    );
    assert_eq!(
        m("vitals_otlp_requests_total{transport=\"http\",result=\"unauthenticated\"}").await,
        2.0
    );
    assert_eq!(
        m("vitals_otlp_requests_total{transport=\"grpc\",result=\"forbidden\"}").await,
        1.0
    );

    // A token added to the file reports without a restart; one removed is refused.
    std::fs::write(
        &file,
        tokens.replace(
            &format!("flood:reporter:{FLOOD}\n"),
            "late:reporter:late-reporter-secret-001\n",
        ),
    )
    .unwrap();
    wait_until("the new token to be taken", Duration::from_secs(30), || async {
        let (s, _, _) = r
            .post_as(
                Some("late-reporter-secret-001"),
                ctype,
                None,
                body(Some("late"), "late", 6_000, 1),
            )
            .await;
        s == 200
    })
    .await;
    let (s, _, _) = r
        .post_as(Some(FLOOD), ctype, None, body(Some("f"), "bulk", 7_000, 1))
        .await;
    assert_eq!(s, 401, "the removed token");

    // On the topic: exactly the calls allowed, each once, under the gateway they were allowed as.
    let c = vitals_testkit::consumer(&unique("otlp_trust_reader"));
    let mut tpl = rdkafka::TopicPartitionList::new();
    tpl.add_partition_offset(&topics.signals, 0, rdkafka::Offset::Beginning)
        .unwrap();
    c.assign(&tpl).unwrap();
    let mut got = std::collections::BTreeMap::<String, usize>::new();
    let want_total = 3 + 2 + 40 + 1 + 1;
    let mut seen = 0;
    while seen < want_total {
        let m = tokio::time::timeout(Duration::from_secs(60), c.recv())
            .await
            .expect("the calls reach the topic")
            .unwrap();
        if let Some(Ok(Signal::Call(call))) = m.payload().map(decode_signal) {
            *got.entry(format!("{}/{}", call.gateway, call.pool)).or_default() += 1;
            seen += 1;
        }
    }
    let want: std::collections::BTreeMap<String, usize> = [
        ("edge-eu-1/chat", 4),
        ("edge-eu-main/chat", 2),
        ("f/bulk", 40),
        ("late/late", 1),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect();
    assert_eq!(got, want);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A CA, a server certificate for 127.0.0.1 and a client certificate it signed, made by the
/// `openssl` command in `dir`: (CA, server cert, server key, client cert, client key) paths.
fn certificates(dir: &std::path::Path) -> [std::path::PathBuf; 5] {
    let run = |args: &[&str]| {
        let out = std::process::Command::new("openssl")
            .args(args)
            .current_dir(dir)
            .output()
            .expect("openssl runs");
        assert!(
            out.status.success(),
            "openssl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    run(&[
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "ca.key",
        "-out",
        "ca.pem",
        "-days",
        "2",
        "-subj",
        "/CN=vitals-test-ca",
    ]);
    for (who, ext) in [
        ("server", "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n"),
        ("client", "extendedKeyUsage=clientAuth\n"),
    ] {
        std::fs::write(dir.join(format!("{who}.ext")), ext).unwrap();
        run(&[
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            &format!("{who}.key"),
            "-out",
            &format!("{who}.csr"),
            "-subj",
            &format!("/CN={who}"),
        ]);
        run(&[
            "x509",
            "-req",
            "-in",
            &format!("{who}.csr"),
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            &format!("{who}.pem"),
            "-days",
            "2",
            "-extfile",
            &format!("{who}.ext"),
        ]);
    }
    ["ca.pem", "server.pem", "server.key", "client.pem", "client.key"].map(|f| dir.join(f))
}

/// TLS with client certificates on both ports; connections beyond the cap are closed at once,
/// and connections that send nothing are closed after the header timeout, so that neither
/// holds the receiver's descriptors; a good client is served throughout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_with_client_certificates_and_silent_or_surplus_connections_are_closed() {
    use tokio::io::AsyncReadExt as _;
    let topics = Topics::create(&unique("otlp_tls"), 1, Stamp::LogAppendTime).await;
    let dir = std::env::temp_dir().join(unique("otlp-tls"));
    std::fs::create_dir_all(&dir).unwrap();
    let [ca, cert, key, client_cert, client_key] = certificates(&dir);
    let (http, grpc, metrics) = (free_port(), free_port(), free_port());
    let mut args = Receiver::args_authenticated(&brokers(), &topics.signals, http, grpc);
    for a in [
        "--token",
        &format!("edge:reporter:{EU}"),
        "--metrics-addr",
        &format!("127.0.0.1:{metrics}"),
        "--tls-cert",
        cert.to_str().unwrap(),
        "--tls-key",
        key.to_str().unwrap(),
        "--tls-client-ca",
        ca.to_str().unwrap(),
        "--max-connections",
        "20",
        "--header-read-timeout-ms",
        "3000",
    ] {
        args.push(a.into());
    }
    let service = Service::start("vitals-otlp", "otlp-tls", &args);
    wait_until("vitals-otlp up", Duration::from_secs(30), || async move {
        http_get(metrics, "/readyz").await.as_deref() == Some("ready")
    })
    .await;
    let ca_pem = std::fs::read(&ca).unwrap();
    let identity = reqwest::Identity::from_pkcs8_pem(
        &std::fs::read(&client_cert).unwrap(),
        &std::fs::read(&client_key).unwrap(),
    )
    .unwrap();
    let tls_client = |with_cert: bool| {
        let mut b = reqwest::Client::builder()
            .add_root_certificate(reqwest::Certificate::from_pem(&ca_pem).unwrap())
            .timeout(Duration::from_secs(30));
        if with_cert {
            b = b.identity(identity.clone());
        }
        b.build().unwrap()
    };
    let export = |client: reqwest::Client, port: u16| async move {
        client
            .post(format!("https://127.0.0.1:{port}/v1/traces"))
            .header("content-type", "application/x-protobuf")
            .bearer_auth(EU)
            .body(request(vec![call(1, "api.a", 200)]).encode_to_vec())
            .send()
            .await
            .map(|r| r.status().as_u16())
    };
    assert_eq!(export(tls_client(true), http).await.unwrap(), 200);
    assert_eq!(
        export(tls_client(true), grpc).await.unwrap(),
        200,
        "both ports speak TLS"
    );
    assert!(
        export(tls_client(false), http).await.is_err(),
        "no client certificate: no handshake"
    );
    let plain = reqwest::Client::new()
        .post(format!("http://127.0.0.1:{http}/v1/traces"))
        .body("x")
        .send()
        .await;
    assert!(
        plain.map(|r| r.status().as_u16() != 200).unwrap_or(true),
        "cleartext is not served"
    );

    // Twenty-five silent connections: twenty take every place and are closed after the header
    // timeout; the rest are closed at once. Every one ends.
    let mut silent = Vec::new();
    for _ in 0..25 {
        silent.push(tokio::net::TcpStream::connect(("127.0.0.1", http)).await.unwrap());
    }
    for mut s in silent {
        let mut b = [0u8; 1];
        let r = tokio::time::timeout(Duration::from_secs(60), s.read(&mut b)).await;
        assert!(matches!(r, Ok(Ok(0) | Err(_))), "a silent connection is closed: {r:?}");
    }
    let closed = |reason: &'static str| async move {
        metric(
            metrics,
            &format!("vitals_otlp_connections_closed_total{{reason=\"{reason}\"}}"),
        )
        .await
        .unwrap_or(0.0)
    };
    let (refused, quiet) = (closed("refused").await, closed("silent").await);
    assert!(
        refused >= 1.0 && refused + quiet >= 25.0,
        "refused {refused}, silent {quiet}"
    );
    assert_eq!(export(tls_client(true), http).await.unwrap(), 200, "served again");
    drop(service);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Spans that ended 70 s before they arrive (an exporter's retry queue, a clock behind), beside
/// fresh ones, with summaries on: every record on the topic is one the processor takes, and
/// late successes count as late failures do (100 late successes were dead-lettered whole while
/// their failures counted: an endpoint failing 10 % was ejected as failing 100 %).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn late_spans_among_fresh_ones_count_alike_and_every_record_is_taken() {
    let topics = Topics::create(&unique("otlp_late"), 1, Stamp::LogAppendTime).await;
    let r = Receiver::start("otlp-late", &brokers(), &topics.signals, &[]).await;
    let late = |mut s: Span| {
        s.start_time_unix_nano -= 70_000_000_000;
        s.end_time_unix_nano -= 70_000_000_000;
        s
    };
    // One request: 100 late spans (1 in 10 a 503) and 100 fresh ones (the same).
    let spans: Vec<Span> = (0..200u64)
        .map(|i| {
            let s = call(10_000 + i * 2, "api.late", if i % 10 == 0 { 503 } else { 200 });
            if i % 2 == 0 {
                late(s)
            } else {
                s
            }
        })
        .collect();
    let (s, _) = r.proto(&request(spans)).await;
    assert_eq!(s, 200);
    let c = vitals_testkit::consumer(&unique("otlp_late_reader"));
    let mut tpl = rdkafka::TopicPartitionList::new();
    tpl.add_partition_offset(&topics.signals, 0, rdkafka::Offset::Beginning)
        .unwrap();
    c.assign(&tpl).unwrap();
    let (mut ok, mut failed) = (0i64, 0i64);
    while ok + failed < 200 {
        let m = tokio::time::timeout(Duration::from_secs(60), c.recv())
            .await
            .expect("the calls reach the topic")
            .unwrap();
        let sig = decode_signal(m.payload().unwrap()).unwrap();
        // As the processor validates it, against the record's time.
        let at = m.timestamp().to_millis().unwrap() * 1000;
        assert_eq!(vitals_contracts::validate_signal(&sig, Some(at)), Ok(()), "{sig:?}");
        match sig {
            Signal::Summary(x) => {
                ok += x.calls.success;
                failed += x.calls.total() - x.calls.success;
            }
            Signal::Call(_) => failed += 1,
            other => panic!("{other:?}"),
        }
    }
    assert_eq!((ok, failed), (180, 20));
}
