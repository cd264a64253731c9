//! The live stream: events as they happen, and an exact resume with Last-Event-ID.
//!
//! Needs the local stack (Kafka and Postgres, started by `scripts/test.sh`): run `scripts/test.sh`.
// Needs the local stack and its peers: `scripts/test.sh` runs it (`--features stack`).
#![cfg(feature = "stack")]

mod common;
use common::*;
use vitals_contracts::*;

fn change(endpoint: &str, seq: i64) -> HealthChanged {
    HealthChanged {
        weight: 0.25,
        reason_code: "degraded".into(),
        reason: format!("test {seq}"),
        evidence: Evidence {
            window_ms: 30_000,
            thresholds: vec!["score<60".into()],
            late: 0,
            ..Evidence::default()
        },
        stream_time: 1_700_000_000_000_000 + seq,
        ..vitals_testkit::health_changed("live", endpoint, seq, HealthState::Degraded)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_sees_changes_live_and_resumes_exactly_once() {
    let api = Api::start("sse", &[]).await;
    let p = producer();
    let send = |h: HealthChanged| {
        let p = p.clone();
        let topic = api.topics.changes.clone();
        async move { produce(&p, &topic, &format!("live/{}", h.endpoint), &encode(&h).unwrap()).await }
    };
    // Events from before the client connects are not replayed to a new client.
    send(change("old", 1)).await;

    let mut c = Sse::connect(&api, None).await;
    let ready = c.next().await;
    assert_eq!(ready.event, "ready");
    let mut seen: Vec<(String, i64)> = Vec::new();
    let mut last_id = ready.id.clone();
    // Five changes over four endpoints, and a republished duplicate in the middle.
    let first: Vec<(&str, i64)> = vec![("a", 1), ("b", 1), ("a", 2), ("c", 1), ("d", 1)];
    for (i, (e, s)) in first.iter().enumerate() {
        send(change(e, *s)).await;
        if i == 2 {
            send(change("a", 1)).await; // the relay republished after a crash
        }
    }
    for _ in 0..first.len() {
        let ev = c.next().await;
        assert_eq!(ev.event, "health_changed");
        let v: serde_json::Value = serde_json::from_str(&ev.data).unwrap();
        seen.push((v["endpoint"].as_str().unwrap().into(), v["seq"].as_i64().unwrap()));
        last_id = ev.id;
    }
    drop(c); // disconnect

    let second: Vec<(&str, i64)> = vec![("b", 2), ("a", 3), ("e", 1), ("c", 2)];
    for (e, s) in &second {
        send(change(e, *s)).await;
    }
    let mut c = Sse::connect(&api, Some(&last_id)).await;
    assert_eq!(c.next().await.event, "ready");
    for _ in 0..second.len() {
        let ev = c.next().await;
        let v: serde_json::Value = serde_json::from_str(&ev.data).unwrap();
        seen.push((v["endpoint"].as_str().unwrap().into(), v["seq"].as_i64().unwrap()));
    }
    // Nothing else follows: sentinels on many keys (so on every partition) come next, no repeat
    // of an earlier event before them.
    for i in 0..10 {
        send(change(&format!("zz{i}"), 1)).await;
    }
    for _ in 0..10 {
        let v: serde_json::Value = serde_json::from_str(&c.next().await.data).unwrap();
        assert!(
            v["endpoint"].as_str().unwrap().starts_with("zz"),
            "an unexpected event: {} {} after {seen:?} (resumed from {last_id})",
            v["endpoint"],
            v["seq"]
        );
    }
    // Exactly once each (order holds per endpoint; partitions interleave freely).
    for e in ["a", "b", "c", "d", "e"] {
        let seqs: Vec<i64> = seen.iter().filter(|(x, _)| x == e).map(|(_, s)| *s).collect();
        assert!(seqs.windows(2).all(|w| w[0] < w[1]), "{e}: {seqs:?}");
    }
    let mut want: Vec<(String, i64)> = first.iter().chain(&second).map(|(e, s)| (e.to_string(), *s)).collect();
    want.sort();
    seen.sort();
    assert_eq!(seen, want, "every event once, none from before the first connect");

    // A resume id that is not ours is refused.
    let r = api
        .http
        .get(api.url("/v1/stream"))
        .header("Last-Event-ID", "garbage")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 400);
    api.drop_schema().await;
}

/// One reader feeds many clients (more than one Kafka consumer each ever allowed); a client
/// resuming within the ring of recent events is replayed from it, one resuming from further back
/// is served from Kafka (and those are capped apart), each exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_reader_feeds_every_client_and_resumes_come_from_the_ring_or_kafka() {
    let api = Api::start(
        "fanout",
        &[
            "--stream-ring",
            "5",
            "--max-kafka-streams",
            "1",
            "--max-streams-per-client",
            "500",
        ],
    )
    .await;
    let p = producer();
    let send = |h: HealthChanged| {
        let p = p.clone();
        let topic = api.topics.changes.clone();
        async move { produce(&p, &topic, &format!("live/{}", h.endpoint), &encode(&h).unwrap()).await }
    };
    let mut clients = Vec::new();
    for _ in 0..150 {
        let mut c = Sse::connect(&api, None).await;
        assert_eq!(c.next().await.event, "ready");
        clients.push(c);
    }
    send(change("a", 1)).await;
    let mut after_first = String::new();
    for c in &mut clients {
        let ev = c.next().await;
        assert_eq!(ev.event, "health_changed");
        after_first = ev.id;
    }
    drop(clients);
    // Two more: a resume from after the first is inside the ring of 5.
    send(change("a", 2)).await;
    send(change("a", 3)).await;
    let seqs = |evs: Vec<Ev>| -> Vec<i64> {
        evs.iter()
            .map(|e| {
                serde_json::from_str::<serde_json::Value>(&e.data).unwrap()["seq"]
                    .as_i64()
                    .unwrap()
            })
            .collect()
    };
    let mut c = Sse::connect(&api, Some(&after_first)).await;
    assert_eq!(c.next().await.event, "ready");
    assert_eq!(
        seqs(vec![c.next().await, c.next().await]),
        [2, 3],
        "replayed from the ring"
    );
    drop(c);
    // Ten more push the first ones out of the ring: the same resume is served from Kafka.
    for s in 4..14 {
        send(change("a", s)).await;
    }
    let mut far = Sse::connect(&api, Some(&after_first)).await;
    assert_eq!(far.next().await.event, "ready");
    let mut got = Vec::new();
    for _ in 2..14 {
        got.push(far.next().await);
    }
    assert_eq!(
        seqs(got),
        (2..14).collect::<Vec<_>>(),
        "from Kafka, each once, in order"
    );
    // Its own consumer takes the only Kafka slot: another far resume must wait.
    let (s, b) = Sse::open(&api, "/v1/stream?pool=live", Some(&after_first), None)
        .await
        .err()
        .expect("refused while the Kafka slot is taken");
    assert_eq!(s, 503, "{b}");
    drop(far);
    api.drop_schema().await;
}

/// Read from `s` until `text` has arrived (or fail after 10 s).
async fn read_until(s: &mut tokio::net::TcpStream, got: &mut String, text: &str) {
    use tokio::io::AsyncReadExt;
    let mut buf = [0u8; 4096];
    while !got.contains(text) {
        let n = tokio::time::timeout(std::time::Duration::from_secs(10), s.read(&mut buf))
            .await
            .unwrap_or_else(|_| panic!("no {text:?} within 10 s; got {got:?}"))
            .unwrap();
        assert!(n > 0, "closed before {text:?}; got {got:?}");
        got.push_str(&String::from_utf8_lossy(&buf[..n]));
    }
}

/// Streams the live-stream writers do not take are served by the HTTP server, the same events:
/// one asked for after another request on a kept-alive connection (always the server's), and
/// one whose request arrives in pieces (the server's when the first piece is read alone); a
/// stream the writers take is close-delimited.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_on_kept_alive_connections_and_split_requests_are_served_too() {
    use tokio::io::AsyncWriteExt;
    let api = Api::start("sse_paths", &[]).await;
    let stream_req = format!("GET /v1/stream?pool=live HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer {READER}\r\n\r\n");
    // A kept-alive connection: a health check, then the stream.
    let mut kept = tokio::net::TcpStream::connect(("127.0.0.1", api.port)).await.unwrap();
    kept.write_all(b"GET /healthz HTTP/1.1\r\nHost: t\r\n\r\n")
        .await
        .unwrap();
    let mut kept_text = String::new();
    read_until(&mut kept, &mut kept_text, "\r\n\r\n").await;
    assert!(kept_text.starts_with("HTTP/1.1 200"), "{kept_text}");
    kept.write_all(stream_req.as_bytes()).await.unwrap();
    // A request in two pieces.
    let mut split = tokio::net::TcpStream::connect(("127.0.0.1", api.port)).await.unwrap();
    let (a, b) = stream_req.split_at(12);
    split.write_all(a.as_bytes()).await.unwrap();
    split.flush().await.unwrap();
    tokio::task::yield_now().await;
    split.write_all(b.as_bytes()).await.unwrap();
    // A plain one, taken by the writers.
    let mut plain = tokio::net::TcpStream::connect(("127.0.0.1", api.port)).await.unwrap();
    plain.write_all(stream_req.as_bytes()).await.unwrap();
    let (mut split_text, mut plain_text) = (String::new(), String::new());
    for (s, text) in [
        (&mut kept, &mut kept_text),
        (&mut split, &mut split_text),
        (&mut plain, &mut plain_text),
    ] {
        read_until(s, text, "event: ready").await;
    }
    assert!(
        plain_text.contains("connection: close") && !plain_text.contains("transfer-encoding"),
        "taken by the writers: {plain_text}"
    );
    assert!(
        kept_text.contains("transfer-encoding: chunked"),
        "served by the HTTP server: {kept_text}"
    );
    let p = producer();
    let h = change("paths", 1);
    produce(&p, &api.topics.changes, "live/paths", &encode(&h).unwrap()).await;
    for (s, text) in [
        (&mut kept, &mut kept_text),
        (&mut split, &mut split_text),
        (&mut plain, &mut plain_text),
    ] {
        read_until(s, text, "\"endpoint\":\"paths\"").await;
        assert!(text.contains("event: health_changed"), "{text}");
    }
    api.drop_schema().await;
}

/// Far-back resumes (a Kafka consumer each) keep a share for token holders and are capped per
/// client: anonymous resumes from two addresses cannot take every slot, one address cannot take
/// more than its cap, and a reader's resume still gets in.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn far_back_resumes_keep_slots_for_tokens_and_are_capped_per_client() {
    let api = Api::start(
        "farback",
        &[
            "--stream-ring",
            "2",
            "--max-kafka-streams",
            "4",
            "--max-kafka-streams-per-client",
            "2",
        ],
    )
    .await;
    let p = producer();
    let mut c = Sse::connect(&api, None).await;
    let start = c.next().await.id;
    for s in 1..=6 {
        produce(&p, &api.topics.changes, "live/a", &encode(&change("a", s)).unwrap()).await;
    }
    for _ in 1..=6 {
        c.next().await;
    }
    drop(c);
    // `start` is behind the ring of 2 now: every resume from it is served from Kafka.
    let from = |ip: [u8; 4]| {
        reqwest::Client::builder()
            .local_address(std::net::IpAddr::from(ip))
            .build()
            .unwrap()
    };
    let (one, two) = (from([127, 0, 0, 1]), from([127, 0, 0, 2]));
    let open = |http: reqwest::Client, token: Option<&'static str>| {
        let (api, start) = (&api, start.clone());
        async move { Sse::open_with(&http, api, "/v1/stream?pool=live", Some(&start), token).await }
    };
    let mut held = Vec::new();
    for _ in 0..2 {
        let mut s = open(one.clone(), None).await.expect("within the per-client cap");
        assert_eq!(s.next().await.event, "ready");
        held.push(s);
    }
    let (status, body) = open(one.clone(), None).await.err().expect("a third from one address");
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (429, Some("too_many_requests")),
        "{body}"
    );
    held.push(open(two.clone(), None).await.expect("another address"));
    let (status, body) = open(two.clone(), None)
        .await
        .err()
        .expect("the anonymous share (3 of 4) is taken");
    assert_eq!(status, 503, "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("a token gets a reserved slot"),
        "{body}"
    );
    let mut reader = open(two, Some(READER)).await.expect("the reserved slot");
    assert_eq!(reader.next().await.event, "ready");
    assert_eq!(reader.next().await.event, "health_changed", "served from Kafka");
    drop(held);
    api.drop_schema().await;
}

/// A `Last-Event-ID` ahead of the topic (recreated since) would wait for offsets that never
/// come, in silence. It starts at the topic's end with a `reset` event that says so, and the
/// next change arrives.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resume_from_ahead_of_the_topic_restarts_at_its_end_with_a_reset_event() {
    let api = Api::start("ahead", &[]).await;
    let p = producer();
    let mut c = Sse::connect(&api, Some("0:999999,1:999999,2:999999,3:999999")).await;
    let ready = c.next().await;
    assert_eq!(ready.event, "ready");
    let reset = c.next().await;
    assert_eq!(reset.event, "reset");
    let v: serde_json::Value = serde_json::from_str(&reset.data).unwrap();
    assert_eq!(v["requested"], "0:999999,1:999999,2:999999,3:999999");
    assert!(
        !reset.id.contains("999999"),
        "the id resumes from the end: {}",
        reset.id
    );
    produce(&p, &api.topics.changes, "live/a", &encode(&change("a", 1)).unwrap()).await;
    let ev = c.next().await;
    assert_eq!(ev.event, "health_changed", "not silence");
    api.drop_schema().await;
}

/// A raw HTTP/1.1 exchange: the status, the header lines (lower case) and, for an answer with
/// a length, its body; the socket stays open for a stream's events.
async fn request(port: u16, before: Option<&str>, req: &str) -> (tokio::net::TcpStream, u16, Vec<String>, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    if let Some(first) = before {
        // A kept-alive connection: another request first, so the server serves the stream.
        s.write_all(first.as_bytes()).await.unwrap();
        let mut got = String::new();
        read_until(&mut s, &mut got, "\r\n\r\n").await;
        let len: usize = got
            .lines()
            .find_map(|l| {
                l.to_ascii_lowercase()
                    .strip_prefix("content-length: ")
                    .map(|v| v.trim().parse().unwrap())
            })
            .unwrap_or(0);
        let have = got.split_once("\r\n\r\n").unwrap().1.len();
        let mut rest = vec![0u8; len.saturating_sub(have)];
        s.read_exact(&mut rest).await.unwrap();
    }
    s.write_all(req.as_bytes()).await.unwrap();
    let mut got = String::new();
    read_until(&mut s, &mut got, "\r\n\r\n").await;
    let (head, body) = got.split_once("\r\n\r\n").unwrap();
    let status: u16 = head[9..12].parse().unwrap();
    let headers: Vec<String> = head.lines().skip(1).map(str::to_ascii_lowercase).collect();
    let len = headers.iter().find_map(|l| {
        l.strip_prefix("content-length: ")
            .map(|v| v.trim().parse::<usize>().unwrap())
    });
    let mut body = body.to_owned();
    if let Some(len) = len {
        let mut rest = vec![0u8; len.saturating_sub(body.len())];
        s.read_exact(&mut rest).await.unwrap();
        body.push_str(&String::from_utf8_lossy(&rest));
    }
    (s, status, headers, body)
}

/// The named headers of a response, without those of its framing.
fn content_headers(headers: &[String]) -> Vec<String> {
    let mut h: Vec<String> = headers
        .iter()
        .filter(|l| {
            !["connection:", "transfer-encoding:", "date:", "content-length:"]
                .iter()
                .any(|f| l.starts_with(f))
        })
        .cloned()
        .collect();
    h.sort();
    h
}

/// `/v1/stream` requests counted by `/metrics` with this status.
async fn counted(api: &Api, status: u16) -> u64 {
    let text = api.text("/metrics").await;
    text.lines()
        .filter(|l| {
            l.starts_with("vitals_api_requests_total{")
                && l.contains("route=\"/v1/stream\"")
                && l.contains(&format!("status=\"{status}\""))
        })
        .map(|l| l.rsplit(' ').next().unwrap().parse::<u64>().unwrap())
        .sum()
}

/// The writers' path (a connection taken over before the router sees it) and the server's (a
/// stream asked for on a kept-alive connection) apply the same rules: the same headers, one
/// count of a client's streams, the same refusals, the same metrics.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_writers_path_and_the_servers_path_apply_the_same_headers_limits_refusals_and_metrics() {
    let api = Api::start(
        "sse_same",
        &["--read-requires-token", "true", "--max-streams-per-client", "1"],
    )
    .await;
    let port = api.port;
    let health = "GET /healthz HTTP/1.1\r\nHost: t\r\n\r\n";
    let stream = |query: &str, token: Option<&str>| {
        let auth = token
            .map(|t| format!("Authorization: Bearer {t}\r\n"))
            .unwrap_or_default();
        format!("GET /v1/stream?{query} HTTP/1.1\r\nHost: t\r\n{auth}\r\n")
    };
    let ok_before = counted(&api, 200).await;
    let refused_before = counted(&api, 429).await;

    // The writers' stream takes the reader's one place; the server's path is refused for it.
    let (mut taken, s, taken_headers, mut text) = request(port, None, &stream("pool=live", Some(READER))).await;
    assert_eq!(s, 200);
    read_until(&mut taken, &mut text, "event: ready").await;
    let (_, s, _, body) = request(port, Some(health), &stream("pool=live", Some(READER))).await;
    assert_eq!(s, 429, "the server's path counts the writers' stream: {body}");
    let mut refused = 1;

    // Gone, its place is free again (the writers notice the close): the server's path gets it,
    // and then the writers' path is refused for it.
    drop(taken);
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
    let (mut served, served_headers, mut text) = loop {
        let (sock, s, headers, body) = request(port, Some(health), &stream("pool=live", Some(READER))).await;
        if s == 200 {
            break (sock, headers, body);
        }
        assert_eq!(s, 429, "{body}");
        refused += 1;
        assert!(tokio::time::Instant::now() < deadline, "the place was never given back");
        tokio::task::yield_now().await;
    };
    read_until(&mut served, &mut text, "event: ready").await;
    let (_, s, _, body) = request(port, None, &stream("pool=live", Some(READER))).await;
    assert_eq!(s, 429, "the writers' path counts the server's stream: {body}");
    refused += 1;

    assert_eq!(
        content_headers(&taken_headers),
        content_headers(&served_headers),
        "the same headers on both paths"
    );
    assert!(taken_headers.contains(&"x-content-type-options: nosniff".to_owned()));

    // The same refusals, with the same bodies, whichever path the request came by.
    for (req, status) in [
        (stream("pool=live", None), 401),
        (stream("pool=live", Some("not-a-real-token-at-all")), 401),
        (stream("pool=", Some(READER)), 400),
        (stream("pool=a%00", Some(READER)), 400),
        (stream("endpoint=e&endpoint=f", Some(READER)), 400),
    ] {
        let (_, s1, h1, b1) = request(port, None, &req).await;
        let (_, s2, h2, b2) = request(port, Some(health), &req).await;
        assert_eq!((s1, &b1), (status, &b2), "{req}");
        assert_eq!(s2, status, "{req}");
        assert_eq!(content_headers(&h1), content_headers(&h2), "{req}");
    }

    // Every stream and every refusal counted once, whichever path.
    assert_eq!(counted(&api, 200).await - ok_before, 2);
    assert_eq!(counted(&api, 429).await - refused_before, refused);
    drop(served);
    api.drop_schema().await;
}
