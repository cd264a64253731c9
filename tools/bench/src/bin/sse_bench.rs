//! The live stream at fleet scale: N concurrent SSE clients on one API instance (the real
//! binary), changes produced to the changes topic at a steady rate, and for every delivery the
//! time from the produce call to the client reading it; the API's memory per client.
//!
//!   scripts/stack.sh up && cargo run --release -p vitals-bench --bin sse-bench -- [--clients 10000] [--events 50] [--per-change]

use clap::Parser;
use rdkafka::producer::FutureRecord;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use vitals_bench::now_us;
use vitals_bench::stack;
use vitals_contracts::{encode, HealthChanged, HealthState};

#[derive(Parser)]
struct Args {
    #[arg(long, default_value_t = 10_000)]
    clients: usize,
    /// Changes produced (one every --gap-ms).
    #[arg(long, default_value_t = 50)]
    events: usize,
    #[arg(long, default_value_t = 200)]
    gap_ms: u64,
    /// Also print each change's first, median, p99 and last delivery, and a histogram.
    #[arg(long)]
    per_change: bool,
    /// Each client asks for `/healthz` first and for the stream second, on the same kept-alive
    /// connection (as a browser reusing an idle connection does): the stream is then served by
    /// the HTTP server (the hub's broadcast), not by the live-stream writers.
    #[arg(long)]
    kept_alive: bool,
    /// Instead of timing deliveries: fill the ring with this many changes, then open
    /// `--clients` streams from 50 loopback addresses that resume from the topic's start
    /// (`Last-Event-ID: 0:0,…`) and never read, and print the API's memory (the resume flood of
    /// before the bounded fan-out).
    #[arg(long, default_value_t = 0)]
    resume_flood: usize,
    /// A flag for the API (repeat it; e.g. `--api-arg=--stream-ring --api-arg=100`, so that a
    /// resume flood is served by Kafka consumers of the streams' own, not by the ring).
    #[arg(long, allow_hyphen_values = true)]
    api_arg: Vec<String>,
}

/// What a client sends on a kept-alive connection (`--kept-alive`): a request before the stream.
const FIRST: &[u8] = b"GET /healthz HTTP/1.1\r\nHost: bench\r\n\r\n";

fn rss_kb(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| {
            l.strip_prefix("VmRSS:")
                .and_then(|v| v.trim().trim_end_matches(" kB").trim().parse().ok())
        })
        .unwrap_or(0)
}

/// What the clients share with the driver.
#[derive(Default)]
struct Shared {
    /// Clients that got their `ready` event.
    connected: AtomicUsize,
    /// Of those, streams the HTTP server answered (chunked, on a kept-alive connection) rather
    /// than the live-stream writers (`connection: close`).
    by_server: AtomicUsize,
    /// Warm-up changes received (every client gets each).
    warmed: AtomicUsize,
    /// Clients that got every timed change (or failed).
    finished: AtomicUsize,
    failures: AtomicUsize,
    /// (sent, latency) in µs of every delivery.
    results: Mutex<Vec<(i64, i64)>>,
    /// Set when every client is done: only then do they close (closing 10,000 connections
    /// while the last change is delivered would be measured as its latency).
    closing: std::sync::atomic::AtomicBool,
}

const REQUEST: &[u8] = b"GET /v1/stream HTTP/1.1\r\nHost: bench\r\nAccept: text/event-stream\r\nAuthorization: Bearer sse-bench-reader-0001\r\n\r\n";
const KEY: &[u8] = b"\"reason\":\"sent:";
const WARM: &[u8] = b"\"reason\":\"warm-up\"";

/// One client's connection and what it read.
struct Conn {
    sock: mio::net::TcpStream,
    asked: bool,
    ready: bool,
    done: bool,
    pending: Vec<u8>,
    lat: Vec<(i64, i64)>,
}

/// Every client on one thread, one epoll loop over all the connections (the clients stand for
/// browsers on other machines: the less of the two cores they take, the more the figures are
/// the API's). Each client sends its request once connected, then reads events until `want`
/// timed changes arrived, recording each one's latency from the `sent:<µs>` its reason carries,
/// and holds its connection until `closing`.
fn clients(port: u16, n: usize, want: usize, request: &[u8], shared: &Shared) -> anyhow::Result<()> {
    use std::io::{Read, Write};
    let mut poll = mio::Poll::new()?;
    let mut events = mio::Events::with_capacity(4096);
    let mut conns: Vec<Conn> = Vec::with_capacity(n);
    let key = memchr::memmem::Finder::new(KEY);
    let warm = memchr::memmem::Finder::new(WARM);
    let mut buf = vec![0u8; 64 * 1024];
    let addr: std::net::SocketAddr = ([127, 0, 0, 1], port).into();
    let fail = |c: &mut Conn, e: &dyn std::fmt::Display| {
        c.done = true;
        if shared.failures.fetch_add(1, Ordering::Relaxed) < 3 {
            eprintln!("a client failed: {e}");
        }
        shared.finished.fetch_add(1, Ordering::Relaxed);
    };
    let mut next_batch = Instant::now();
    while !shared.closing.load(Ordering::Relaxed) {
        // Connect in batches of 500, 20 ms apart, so that the accept loop keeps up.
        if conns.len() < n && Instant::now() >= next_batch {
            for _ in 0..500.min(n - conns.len()) {
                let mut sock = mio::net::TcpStream::connect(addr)?;
                let token = mio::Token(conns.len());
                poll.registry()
                    .register(&mut sock, token, mio::Interest::READABLE | mio::Interest::WRITABLE)?;
                conns.push(Conn {
                    sock,
                    asked: false,
                    ready: false,
                    done: false,
                    pending: Vec::new(),
                    lat: Vec::with_capacity(want),
                });
            }
            next_batch = Instant::now() + Duration::from_millis(20);
        }
        poll.poll(&mut events, Some(Duration::from_millis(20)))?;
        for ev in events.iter() {
            let c = &mut conns[ev.token().0];
            if c.done {
                continue;
            }
            if ev.is_writable() && !c.asked {
                match c.sock.write(request) {
                    Ok(k) if k == request.len() => c.asked = true,
                    Ok(_) => fail(c, &"the request was not written whole"),
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                    Err(e) => fail(c, &e),
                }
            }
            if !ev.is_readable() || c.done {
                continue;
            }
            loop {
                let k = match c.sock.read(&mut buf) {
                    Ok(0) => {
                        let after = c.lat.len();
                        fail(c, &format!("the server closed the stream after {after} events"));
                        break;
                    }
                    Ok(k) => k,
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                    Err(e) => {
                        fail(c, &e);
                        break;
                    }
                };
                let at = now_us();
                c.pending.extend_from_slice(&buf[..k]);
                if !c.ready && memchr::memmem::find(&c.pending, b"event: ready").is_some() {
                    c.ready = true;
                    shared.connected.fetch_add(1, Ordering::Relaxed);
                    if memchr::memmem::find(&c.pending, b"transfer-encoding: chunked").is_some() {
                        shared.by_server.fetch_add(1, Ordering::Relaxed);
                    }
                }
                let warmed = warm.find_iter(&c.pending).count();
                if warmed > 0 {
                    shared.warmed.fetch_add(warmed, Ordering::Relaxed);
                }
                // Each timed change's data carries "reason":"sent:<µs>": keep an unfinished tail.
                let mut i = 0;
                while let Some(f) = key.find(&c.pending[i..]) {
                    let start = i + f + KEY.len();
                    let Some(len) = memchr::memchr(b'"', &c.pending[start..]) else {
                        break;
                    };
                    if let Some(sent) = std::str::from_utf8(&c.pending[start..start + len])
                        .ok()
                        .and_then(|v| v.parse::<i64>().ok())
                    {
                        c.lat.push((sent, at - sent));
                    }
                    i = start + len;
                }
                let keep = memchr::memmem::rfind(&c.pending, b"\n\n")
                    .map_or(0, |p| p + 2)
                    .max(i.min(c.pending.len()));
                c.pending.drain(..keep);
                if c.lat.len() >= want {
                    shared.results.lock().unwrap().append(&mut c.lat);
                    shared.finished.fetch_add(1, Ordering::Relaxed);
                    c.done = true;
                    break;
                }
            }
        }
    }
    Ok(())
}

/// Wait (with progress, up to `limit`) until `count` reaches `want`.
async fn wait_for(what: &str, count: impl Fn() -> usize, want: usize, limit: Duration) -> anyhow::Result<()> {
    let t = Instant::now();
    let mut last = Instant::now();
    while count() < want {
        anyhow::ensure!(t.elapsed() < limit, "{what}: {} of {want} after {limit:?}", count());
        if last.elapsed() >= Duration::from_secs(1) {
            eprintln!("  {what}: {} of {want}", count());
            last = Instant::now();
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(())
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let name = stack::unique("sse_bench");
    let topics = stack::Topics::create(&name, 4, stack::Stamp::LogAppendTime).await;
    vitals_testkit::migrated_schema(&name).await;
    let port = vitals_testkit::free_port();
    let limit = (args.clients + 100).to_string();
    let mut cmd: Vec<String> = [
        "--http-addr",
        &format!("127.0.0.1:{port}"),
        "--db-schema",
        &name,
        "--database-url",
        &vitals_testkit::reader_url(),
        "--brokers",
        &stack::brokers(),
        "--max-streams",
        &limit,
        "--max-connections",
        &limit,
        "--max-streams-per-client",
        &limit,
        "--token",
        "bench:reader:sse-bench-reader-0001",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    cmd.extend(topics.args());
    cmd.extend(args.api_arg.iter().cloned());
    let api = stack::Service::start("vitals-api", "sse-bench-api", &cmd);
    let pid = api.child.id();
    let deadline = Instant::now() + Duration::from_secs(30);
    while vitals_testkit::http_get(port, "/healthz").await.is_none() {
        anyhow::ensure!(
            Instant::now() < deadline,
            "the API did not start ({})",
            api.log.display()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let idle = rss_kb(pid);
    if args.resume_flood > 0 {
        return resume_flood(&args, &topics, port, pid, idle).await;
    }
    eprintln!("API up, RSS {idle} kB; connecting {} clients", args.clients);
    let shared = Arc::new(Shared::default());
    let t = Instant::now();
    let driver = {
        let (shared, clients_n, want) = (shared.clone(), args.clients, args.events);
        let request = if args.kept_alive {
            [FIRST, REQUEST].concat()
        } else {
            REQUEST.to_vec()
        };
        std::thread::spawn(move || {
            if let Err(e) = clients(port, clients_n, want, &request, &shared) {
                eprintln!("the clients stopped: {e}");
                shared.failures.store(clients_n, Ordering::Relaxed);
            }
        })
    };
    let up = || shared.connected.load(Ordering::Relaxed) + shared.failures.load(Ordering::Relaxed);
    wait_for("connected", up, args.clients, Duration::from_secs(300)).await?;
    let rss = rss_kb(pid);
    eprintln!(
        "{} clients connected in {:.1} s; API RSS {rss} kB",
        shared.connected.load(Ordering::Relaxed),
        t.elapsed().as_secs_f64()
    );
    // No linger: a change is on the topic as soon as it is sent (the test producer's 5 ms of
    // batching would be counted as the API's).
    let p: rdkafka::producer::FutureProducer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", stack::brokers())
        .set("linger.ms", "0")
        .create()?;
    // Warm the producer up (its metadata and a connection to each partition's leader) with
    // records the clients do not time.
    for part in 0..4 {
        let warm = encode(&HealthChanged {
            reason: "warm-up".into(),
            stream_time: now_us(),
            ..vitals_testkit::health_changed("bench", &format!("warm{part}"), 1, HealthState::Healthy)
        })?;
        p.send(
            FutureRecord::<str, _>::to(&topics.changes)
                .partition(part)
                .payload(&warm),
            Duration::from_secs(5),
        )
        .await
        .map_err(|(e, _)| e)?;
    }
    // Every client has the warm-up changes before the timed ones start (their fan-out would
    // otherwise be measured as the first timed change's latency).
    let live = shared.connected.load(Ordering::Relaxed);
    wait_for(
        "warm-up changes delivered",
        || shared.warmed.load(Ordering::Relaxed),
        live * 4,
        Duration::from_secs(60),
    )
    .await?;
    let cpu0 = vitals_bench::cpu::of_stat(&std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default());
    let own0 = vitals_bench::cpu::of_pid(std::process::id());
    let t = Instant::now();
    for i in 0..args.events {
        let h = HealthChanged {
            reason: format!("sent:{}", now_us()),
            stream_time: now_us(),
            ..vitals_testkit::health_changed("bench", &format!("e{i}"), 1, HealthState::Unhealthy)
        };
        let key = format!("bench/e{i}");
        let bytes = encode(&h)?;
        p.send(
            FutureRecord::to(&topics.changes).key(&key).payload(&bytes),
            Duration::from_secs(5),
        )
        .await
        .map_err(|(e, _)| e)?;
        tokio::time::sleep(Duration::from_millis(args.gap_ms)).await;
    }
    let done = || shared.finished.load(Ordering::Relaxed);
    let waited = wait_for("clients done", done, args.clients, Duration::from_secs(60)).await;
    let api_cpu =
        vitals_bench::cpu::of_stat(&std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default()) - cpu0;
    let clients_cpu = vitals_bench::cpu::of_pid(std::process::id()) - own0;
    shared.closing.store(true, Ordering::Relaxed);
    let _ = driver.join();
    if let Err(e) = waited {
        eprintln!("{e}");
    }
    let pairs: Vec<(i64, i64)> = shared.results.lock().unwrap().clone();
    if args.per_change {
        let mut per = std::collections::BTreeMap::<i64, Vec<i64>>::new();
        for (s, l) in &pairs {
            per.entry(*s).or_default().push(*l);
        }
        for (s, mut v) in per {
            v.sort_unstable();
            eprintln!(
                "  change at {s}: first {} ms, p50 {} ms, p99 {} ms, last {} ms",
                v[0] / 1000,
                v[v.len() / 2] / 1000,
                v[v.len() * 99 / 100] / 1000,
                v[v.len() - 1] / 1000
            );
        }
    }
    let mut lat: Vec<i64> = pairs.iter().map(|p| p.1).collect();
    lat.sort_unstable();
    anyhow::ensure!(!lat.is_empty(), "no delivery measured");
    if args.per_change {
        let mut h = std::collections::BTreeMap::<i64, usize>::new();
        for l in &lat {
            *h.entry(l / 10_000 * 10).or_default() += 1;
        }
        for (b, n) in h {
            eprintln!("  {b:>4} ms: {n}");
        }
    }
    let at = |q: f64| lat[((lat.len() - 1) as f64 * q) as usize] as f64 / 1000.0;
    let expected = args.clients * args.events;
    println!(
        "{} clients, {} changes each ({} deliveries of {expected}; {} clients failed)",
        args.clients,
        args.events,
        lat.len(),
        shared.failures.load(Ordering::Relaxed)
    );
    println!(
        "  streams served by the HTTP server (kept-alive connection, hub broadcast): {}; by the live-stream writers: {}",
        shared.by_server.load(Ordering::Relaxed),
        shared.connected.load(Ordering::Relaxed) - shared.by_server.load(Ordering::Relaxed)
    );
    println!(
        "  delivery latency (produce → client read): p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms",
        at(0.5),
        at(0.99),
        at(1.0)
    );
    println!(
        "  API memory: {idle} kB idle, {rss} kB with every client: {:.1} kB per client",
        (rss.saturating_sub(idle)) as f64 / args.clients as f64
    );
    println!(
        "  API CPU over the {:.1} s of changes: {api_cpu:.2} s ({:.1} µs per delivery)",
        t.elapsed().as_secs_f64(),
        api_cpu * 1e6 / lat.len().max(1) as f64
    );
    println!(
        "  clients' CPU (this process: one epoll thread, the producer included): {clients_cpu:.2} s ({:.1} µs per delivery)",
        clients_cpu * 1e6 / lat.len().max(1) as f64
    );
    drop(api);
    Ok(())
}

/// The resume flood: the ring filled, then `args.clients` streams from 50 addresses resuming
/// from the topic's start, none reading. Prints the API's memory before and after.
async fn resume_flood(args: &Args, topics: &stack::Topics, port: u16, pid: u32, idle: u64) -> anyhow::Result<()> {
    use std::io::{Read, Write};
    // A reader of the live feed, to know when the API holds every change.
    let mut live = std::net::TcpStream::connect(("127.0.0.1", port))?;
    live.write_all(REQUEST)?;
    let mut buf = vec![0u8; 64 * 1024];
    let mut seen = Vec::new();
    while memchr::memmem::find(&seen, b"event: ready").is_none() {
        let n = live.read(&mut buf)?;
        anyhow::ensure!(n > 0, "the live stream ended");
        seen.extend_from_slice(&buf[..n]);
    }
    let p: rdkafka::producer::FutureProducer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", stack::brokers())
        .create()?;
    let mut sends = Vec::with_capacity(args.resume_flood);
    let mut topic_bytes = 0usize;
    for i in 0..args.resume_flood {
        let h = HealthChanged {
            reason: format!("flood {i}: a reason of a realistic length, with the thresholds it crossed"),
            stream_time: now_us(),
            ..vitals_testkit::health_changed(
                "bench",
                &format!("e{}", i % 500),
                1 + (i / 500) as i64,
                HealthState::Degraded,
            )
        };
        let (key, bytes) = (format!("bench/e{}", i % 500), encode(&h)?);
        topic_bytes += key.len() + bytes.len();
        sends.push(
            p.send_result(FutureRecord::to(&topics.changes).key(&key).payload(&bytes))
                .map_err(|(e, _)| e)?,
        );
    }
    for s in sends {
        let _ = s.await;
    }
    let mut events = 0;
    let mut tail = Vec::new();
    while events < args.resume_flood {
        let n = live.read(&mut buf)?;
        if n == 0 {
            // Dropped as lagged (a fill faster than this reader): every change is on the topic
            // (each send was acknowledged), which is all a far-back resume needs.
            eprintln!("the live reader was dropped after {events} events; the topic holds them all");
            break;
        }
        tail.extend_from_slice(&buf[..n]);
        events += memchr::memmem::find_iter(&tail, b"event: health_changed").count();
        let keep = tail.len().saturating_sub(32);
        tail.drain(..keep);
    }
    let filled = rss_kb(pid);
    eprintln!(
        "ring filled with {events} changes ({:.1} MB of keys and values on the topic): API RSS {filled} kB; {} resuming streams from 50 addresses…",
        topic_bytes as f64 / 1e6,
        args.clients
    );
    let resume = format!(
        "GET /v1/stream HTTP/1.1\r\nHost: bench\r\nLast-Event-ID: {}\r\n\r\n",
        (0..topics.partitions)
            .map(|p| format!("{p}:0"))
            .collect::<Vec<_>>()
            .join(",")
    );
    let mut held = Vec::with_capacity(args.clients);
    for i in 0..args.clients {
        let ip = std::net::Ipv4Addr::new(127, 0, 0, 1 + (i % 50) as u8);
        let sock = tokio::net::TcpSocket::new_v4()?;
        sock.set_recv_buffer_size(4096)?;
        sock.bind((ip, 0).into())?;
        let mut s = sock.connect(([127, 0, 0, 1], port).into()).await?;
        tokio::io::AsyncWriteExt::write_all(&mut s, resume.as_bytes()).await?;
        held.push(s);
    }
    // Memory grows while the writers fill what the sockets take (and Kafka consumers of far-back
    // streams prefetch); the peak over twenty seconds.
    let mut peak = rss_kb(pid);
    for _ in 0..40 {
        tokio::time::sleep(Duration::from_millis(500)).await;
        peak = peak.max(rss_kb(pid));
    }
    println!(
        "resume flood: {} streams resuming from the start of a topic of {} changes ({:.1} MB), none reading",
        held.len(),
        args.resume_flood,
        topic_bytes as f64 / 1e6
    );
    println!(
        "  API memory: {idle} kB idle, {filled} kB with the ring, peak {peak} kB with the streams: {:.1} kB per stream",
        peak.saturating_sub(filled) as f64 / held.len().max(1) as f64
    );
    drop(held);
    // What the API gives back once the streams are gone: their writers, buffers and consumers
    // are dropped; the allocator returns what it freed to the system within seconds.
    let mut after = rss_kb(pid);
    for _ in 0..30 {
        tokio::time::sleep(Duration::from_millis(500)).await;
        after = rss_kb(pid);
        if after <= filled + filled / 4 {
            break;
        }
    }
    println!(
        "  after the streams left: API RSS {after} kB ({:.0} % of what they took kept)",
        100.0 * after.saturating_sub(filled) as f64 / peak.saturating_sub(filled).max(1) as f64
    );
    Ok(())
}
