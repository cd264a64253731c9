//! A fleet at millions of calls a second, on this machine: simulated gateways hand their calls,
//! counted, to the reporter's summary code — one `Summarizer` per gateway, as each gateway runs
//! its own reporter — and every summary and every failure sent one by one is a real record on the
//! real broker, read by the real processor (through the real `vitals-merger` with `--merge`),
//! decided and written to Postgres. (Millions of `report` calls a second would not fit beside
//! the broker on two cores; the reporter's own cost per call is reporter-bench's.)
//!
//! The fleet's shape (`--shape`): `sharded`, each gateway serves one pool (a gateway deployed per
//! model group); `mesh`, every gateway calls every endpoint of every pool (LiteLLM proxy
//! replicas, HAProxy or nginx behind one load balancer). `--hot-share` of the traffic goes to one
//! pool (and, sharded, that share of the gateways).
//!
//! The calls: each gateway hands each endpoint's calls over every `--tick-ms` in two groups at
//! their own times (so summaries cover 250 ms and a little, as the reporter's do), successes with
//! latencies and first tokens drawn from a long-tailed spread; every endpoint has noise — 1 %
//! 5xx, 2 % 4xx, 0.5 % 429s — placed at random among the calls. Faults come one endpoint per pool
//! at a time (`--fault-secs` long, `--heal-secs` apart, the hot pool's too), cycling through five
//! kinds: refusing every call, failing 15 %, 30 % of streams hanging (first token after 12 s),
//! first tokens slow (3–4 s), and a 429 storm (40 % of calls, Retry-After 2 s).
//!
//! Prints: calls represented per second, records per second the gateways send, on the signals
//! topic and on the hot pool's partition, CPU per million calls per process (processor, merger,
//! Postgres, broker, the simulated gateways), Postgres' writes, detection p50/p99 per fault kind
//! (from the fault's first calls to the first change out of healthy, read_committed), missed
//! faults, ejections of endpoints without a fault, and the hot partition's lag.
//!
//!   scripts/stack.sh up && cargo build --release -p vitals-processor -p vitals-merger -p vitals-bench
//!   target/release/fleet-bench [--shape mesh] [--merge] [--calls-per-sec 1000000] [--gateways 100] [--secs 120]

use clap::{Parser, ValueEnum};
use rdkafka::consumer::{BaseConsumer, Consumer, StreamConsumer};
use rdkafka::producer::{BaseRecord, DeliveryResult, Producer, ProducerContext, ThreadedProducer};
use rdkafka::{ClientConfig, ClientContext, Message};
use sqlx::postgres::PgPoolOptions;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use vitals_bench::{cpu, now_us, stack, workload::Rng};
use vitals_contracts::*;

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Shape {
    /// Each gateway serves one pool.
    Sharded,
    /// Every gateway calls every endpoint of every pool.
    Mesh,
}

#[derive(Parser, Clone)]
struct Args {
    /// Calls per second the fleet represents.
    #[arg(long, default_value_t = 1_000_000.0)]
    calls_per_sec: f64,
    #[arg(long, default_value_t = 100)]
    gateways: usize,
    #[arg(long, value_enum, default_value_t = Shape::Mesh)]
    shape: Shape,
    /// Gateways report to the gateway-signals topic, keyed by endpoint, and a `vitals-merger`
    /// merges them onto the signals topic.
    #[arg(long)]
    merge: bool,
    #[arg(long, default_value_t = 100)]
    pools: usize,
    #[arg(long, default_value_t = 5)]
    endpoints_per_pool: usize,
    /// Share of the traffic (and, sharded, of the gateways) on the hot pool.
    #[arg(long, default_value_t = 0.30)]
    hot_share: f64,
    /// Seconds of traffic in all (warm-up included).
    #[arg(long, default_value_t = 120)]
    secs: u64,
    #[arg(long, default_value_t = 15)]
    warmup_secs: u64,
    /// How long each fault lasts.
    #[arg(long, default_value_t = 20.0)]
    fault_secs: f64,
    /// Healthy time between two faults of a pool.
    #[arg(long, default_value_t = 20.0)]
    heal_secs: f64,
    /// How often the gateways hand their counted calls over (ms); each pair's calls go in two
    /// groups at their own times.
    #[arg(long, default_value_t = 50)]
    tick_ms: u64,
    #[arg(long, default_value_t = 16)]
    partitions: i32,
    /// Noise on every endpoint, as a multiple of 1 % 5xx, 2 % 4xx and 0.5 % 429s (0: none, as
    /// the first version of this benchmark had).
    #[arg(long, default_value_t = 1.0)]
    noise: f64,
    /// Partitions of the gateway-signals topic (`--merge`).
    #[arg(long, default_value_t = 16)]
    input_partitions: i32,
}

#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
enum Fault {
    Dead,
    Failing,
    Hung,
    SlowTtft,
    RateLimited,
}

const KINDS: [Fault; 5] = [
    Fault::Dead,
    Fault::Failing,
    Fault::Hung,
    Fault::SlowTtft,
    Fault::RateLimited,
];

impl Fault {
    fn describe(self) -> &'static str {
        match self {
            Fault::Dead => "refusing every call (target p99 ≤ 1 s)",
            Fault::Failing => "failing 15 % of calls (target ≤ 10 s)",
            Fault::Hung => "30 % of streams hung (target ≤ 10 s)",
            Fault::SlowTtft => "first tokens 3–4 s",
            Fault::RateLimited => "429 storm, 40 % of calls",
        }
    }
}

/// One fault: an endpoint, its kind, when it starts and ends (from the run's start).
#[derive(Clone, Debug)]
struct Episode {
    pool: u32,
    endpoint: u32,
    kind: Fault,
    start: Duration,
    end: Duration,
}

/// One fault per pool at a time, cycling through the kinds and the endpoints; the pools' first
/// faults are spread over one fault-and-heal period.
fn schedule(a: &Args) -> Vec<Episode> {
    let period = a.fault_secs + a.heal_secs;
    let mut v = Vec::new();
    for p in 0..a.pools as u32 {
        let offset = period * f64::from(p) / a.pools as f64;
        let mut k = 0u32;
        loop {
            let start = a.warmup_secs as f64 + offset + period * f64::from(k);
            // A fault must end, and have 5 s to be seen, before the traffic does.
            if start + a.fault_secs + 5.0 > a.secs as f64 {
                break;
            }
            v.push(Episode {
                pool: p,
                endpoint: k % a.endpoints_per_pool as u32,
                kind: KINDS[((p + k) % KINDS.len() as u32) as usize],
                start: Duration::from_secs_f64(start),
                end: Duration::from_secs_f64(start + a.fault_secs),
            });
            k += 1;
        }
    }
    v
}

/// One gateway's calls to one endpoint.
struct Pair {
    pool: u32,
    endpoint: u32,
    rate: f64,
    carry: f64,
}

struct Shared {
    calls: AtomicU64,
    /// Records the gateways sent (to the signals topic, or to the merger's input).
    records: AtomicU64,
    /// Bytes of the records (encoded, before the producer's compression).
    bytes: AtomicU64,
    one_by_one: AtomicU64,
    late_ticks: AtomicU64,
    /// The longest time between two hand-overs (ms): the simulated gateways stalled that long.
    longest_gap_ms: AtomicU64,
    started: Mutex<Option<Instant>>,
    /// When each fault's first calls were handed over (by its index in the schedule): a late
    /// tick of the simulated gateways delays them, and detection counts from them.
    applied: Mutex<HashMap<usize, Instant>>,
    /// When each fault's first record reached the broker (its append time, ms): where the
    /// service's own detection starts.
    appended: Mutex<HashMap<usize, i64>>,
    /// How long after it was handed over each record reached the broker (ms): the simulated
    /// gateways' own producer, on the machine the service shares.
    late_ms: Mutex<Vec<f64>>,
    stop: AtomicBool,
}

/// A record in flight: the fault it belongs to, and when it was handed to the producer.
struct InFlight {
    episode: Option<usize>,
    sent_ms: i64,
}

/// Reads the broker's append time of every record the producer delivers.
struct Delivered(Arc<Shared>);

impl ClientContext for Delivered {}

impl ProducerContext for Delivered {
    type DeliveryOpaque = Box<InFlight>;

    fn delivery(&self, result: &DeliveryResult<'_>, sent: Box<InFlight>) {
        let Some(at) = result.as_ref().ok().and_then(|m| m.timestamp().to_millis()) else {
            return;
        };
        self.0.late_ms.lock().unwrap().push((at - sent.sent_ms).max(0) as f64);
        if let Some(e) = sent.episode {
            let mut first = self.0.appended.lock().unwrap();
            let t = first.entry(e).or_insert(at);
            *t = (*t).min(at);
        }
    }
}

fn pool_name(p: u32) -> String {
    format!("pool-{p}")
}

fn endpoint_name(p: u32, e: u32) -> String {
    format!("ep-{p}-{e}")
}

/// The gateways and the endpoints each calls, with its share of the traffic.
fn fleet(a: &Args) -> Vec<Vec<Pair>> {
    let pool_rate = |p: u32| {
        if p == 0 {
            a.calls_per_sec * a.hot_share
        } else {
            a.calls_per_sec * (1.0 - a.hot_share) / (a.pools - 1) as f64
        }
    };
    let eps = a.endpoints_per_pool;
    match a.shape {
        Shape::Mesh => (0..a.gateways)
            .map(|_| {
                (0..a.pools as u32)
                    .flat_map(|p| {
                        (0..eps as u32).map(move |e| Pair {
                            pool: p,
                            endpoint: e,
                            rate: pool_rate(p) / (a.gateways * eps) as f64,
                            carry: 0.0,
                        })
                    })
                    .collect()
            })
            .collect(),
        Shape::Sharded => {
            let hot_gateways = ((a.gateways as f64 * a.hot_share).round() as usize).max(1);
            let mut pool_of_gateway: Vec<u32> = vec![0; hot_gateways];
            pool_of_gateway.extend((0..a.gateways - hot_gateways).map(|g| 1 + (g % (a.pools - 1)) as u32));
            let mut gateways_in = vec![0usize; a.pools];
            for &p in &pool_of_gateway {
                gateways_in[p as usize] += 1;
            }
            pool_of_gateway
                .iter()
                .map(|&p| {
                    (0..eps as u32)
                        .map(|e| Pair {
                            pool: p,
                            endpoint: e,
                            rate: pool_rate(p) / (gateways_in[p as usize] * eps) as f64,
                            carry: 0.0,
                        })
                        .collect()
                })
                .collect()
        }
    }
}

/// CRC-32 (IEEE), librdkafka's default partitioner's hash of a key.
fn crc32(bytes: &[u8]) -> u32 {
    let mut c = !0u32;
    for &b in bytes {
        c ^= u32::from(b);
        for _ in 0..8 {
            c = if c & 1 == 1 { (c >> 1) ^ 0xEDB8_8320 } else { c >> 1 };
        }
    }
    !c
}

/// A draw of `n × p` calls: the whole part and, by chance, one more.
fn share(rng: &mut Rng, n: u32, p: f64) -> u32 {
    let f = f64::from(n) * p;
    (f.floor() + f64::from(u8::from((rng.below(1_000_000) as f64) < f.fract() * 1e6))) as u32
}

/// A latency from a long-tailed spread around `median_ms` (µs): a log-uniform draw over a
/// factor of 4 either side, most of it near the median.
fn spread(rng: &mut Rng, median_ms: f64) -> i64 {
    let u = (rng.below(1_000_000) as f64 / 1e6 + rng.below(1_000_000) as f64 / 1e6) / 2.0 - 0.5;
    (median_ms * 1000.0 * 4f64.powf(u * 2.0)) as i64
}

/// One group of a pair's calls at one time, placed in random order: successes, noise and the
/// fault's failures.
struct Group<'a> {
    pool: &'a str,
    endpoint: &'a str,
    gateway: &'a str,
    now: Micros,
    /// The noise's multiple (`--noise`).
    noise: f64,
}

/// Calls alike, in the order they came: (class, calls, latency µs, first token µs, Retry-After ms).
type Piece = (OutcomeClass, u32, i64, Option<i64>, Option<i64>);

fn hand_over(
    g: &Group<'_>,
    n: u32,
    fault: Option<Fault>,
    rng: &mut Rng,
    event: &mut u64,
    summarizer: &mut Summarizer,
    out: &mut Vec<Signal>,
) {
    if n == 0 {
        return;
    }
    let mut pieces: Vec<Piece> = Vec::with_capacity(8);
    if fault == Some(Fault::Dead) {
        pieces.push((OutcomeClass::ConnectError, n, 1_000, None, None));
    } else {
        let mut left = n;
        let mut take = |p: f64, rng: &mut Rng| {
            let k = share(rng, left, p).min(left);
            left -= k;
            k
        };
        let failing = if fault == Some(Fault::Failing) {
            take(0.15, rng)
        } else {
            0
        };
        let limited = if fault == Some(Fault::RateLimited) {
            take(0.40, rng)
        } else {
            0
        };
        let hung = if fault == Some(Fault::Hung) { take(0.30, rng) } else { 0 };
        let noise_5xx = take(0.01 * g.noise, rng);
        let noise_4xx = take(0.02 * g.noise, rng);
        let noise_429 = take(0.005 * g.noise, rng);
        // The rest succeed; every other call takes a place of its own among them, at random (a
        // noise 5xx next to another only by chance, as in a real stream of calls).
        let success = |k: u32, rng: &mut Rng| {
            let ttft = if fault == Some(Fault::SlowTtft) {
                3_000_000 + rng.below(1_000_000) as i64
            } else {
                spread(rng, 250.0)
            };
            (OutcomeClass::Success, k, ttft + spread(rng, 400.0), Some(ttft), None)
        };
        let kinds: [(Piece, u32); 5] = [
            ((OutcomeClass::ServerError, 1, 40_000, None, None), failing + noise_5xx),
            ((OutcomeClass::RateLimited, 1, 5_000, None, Some(2_000)), limited),
            ((OutcomeClass::RateLimited, 1, 5_000, None, Some(1_000)), noise_429),
            ((OutcomeClass::ClientError, 1, 20_000, None, None), noise_4xx),
            ((OutcomeClass::Success, 1, 13_000_000, Some(12_000_000), None), hung),
        ];
        let mut others: Vec<(u32, Piece)> = kinds
            .iter()
            .flat_map(|(piece, k)| std::iter::repeat_n(*piece, *k as usize))
            .map(|piece| (rng.below(u64::from(left) + 1) as u32, piece))
            .collect();
        others.sort_by_key(|(at, _)| *at);
        let mut done = 0;
        for (at, piece) in others {
            if at > done {
                pieces.push(success(at - done, rng));
                done = at;
            }
            pieces.push(piece);
        }
        pieces.push(success(left - done, rng));
    }
    for (class, k, latency_us, ttft_us, retry) in pieces {
        if k == 0 {
            continue;
        }
        *event += 1;
        let c = CallOutcome {
            latency_us,
            ttft_us,
            retry_after_ms: retry,
            http_status: match class {
                OutcomeClass::Success => Some(200),
                OutcomeClass::ServerError => Some(503),
                OutcomeClass::ClientError => Some(400),
                OutcomeClass::RateLimited => Some(429),
                _ => None,
            },
            ..CallOutcome::new(
                format!("f{event}"),
                g.pool,
                g.endpoint,
                g.gateway,
                g.now - latency_us,
                class,
            )
        };
        summarizer.add_times(c, k, g.now, out);
    }
}

/// Where a gateway's record goes: the topic, its key and partition.
struct Route {
    topic: String,
    partitions: i32,
    by_endpoint: bool,
}

/// The simulated gateways: every tick, each gateway's calls to each endpoint since the last
/// one, counted, through that gateway's summarizer; what it sends goes to the signals topic
/// keyed by pool (or, with `--merge`, to the gateway-signals topic keyed by endpoint).
fn generate(a: Args, route: Route, episodes: Vec<Episode>, shared: Arc<Shared>) -> anyhow::Result<()> {
    let producer: ThreadedProducer<Delivered> = ClientConfig::new()
        .set("bootstrap.servers", stack::brokers())
        .set("linger.ms", "20")
        .set("batch.size", "1000000")
        .set("compression.type", "lz4")
        .set("queue.buffering.max.messages", "2000000")
        .set("queue.buffering.max.kbytes", "1048576")
        .create_with_context(Delivered(shared.clone()))?;
    let mut gateways = fleet(&a);
    let names: Vec<(String, Vec<String>)> = (0..a.pools as u32)
        .map(|p| {
            (
                pool_name(p),
                (0..a.endpoints_per_pool as u32).map(|e| endpoint_name(p, e)).collect(),
            )
        })
        .collect();
    let keys: Vec<Vec<(String, i32)>> = names
        .iter()
        .map(|(p, eps)| {
            eps.iter()
                .map(|e| {
                    if route.by_endpoint {
                        let k = keys::endpoint_key(p, e);
                        let part = stack::partition_of(&k, route.partitions);
                        (k, part)
                    } else {
                        (p.clone(), stack::partition_of(p, route.partitions))
                    }
                })
                .collect()
        })
        .collect();
    let gateway_names: Vec<String> = (0..a.gateways).map(|g| format!("gw-{g}")).collect();
    let mut summarizers: Vec<Summarizer> = (0..a.gateways)
        .map(|g| Summarizer::new(SummaryConfig::default(), &format!("fleet{g}")))
        .collect();
    let mut rng = Rng::new(11);
    let mut out: Vec<Signal> = Vec::new();
    let start = Instant::now();
    *shared.started.lock().unwrap() = Some(start);
    let tick = Duration::from_millis(a.tick_ms);
    let mut last = start;
    let mut next = start + tick;
    let mut event = 0u64;
    let mut faulty: HashMap<(u32, u32), (Fault, usize)> = HashMap::new();
    let send =
        |out: &mut Vec<Signal>, ts_ms: i64, faulty: &HashMap<(u32, u32), (Fault, usize)>| -> anyhow::Result<()> {
            for s in out.drain(..) {
                if matches!(s, Signal::Call(_)) {
                    shared.one_by_one.fetch_add(1, Relaxed);
                }
                let (pool, ep) = (s.pool().unwrap_or_default(), s.endpoint().unwrap_or_default());
                let p: usize = pool[5..].parse().unwrap_or(0);
                let e: usize = ep.rsplit('-').next().and_then(|e| e.parse().ok()).unwrap_or(0);
                let (key, partition) = &keys[p][e];
                let bytes = encode_signal(&s)?;
                let sent = Box::new(InFlight {
                    episode: faulty.get(&(p as u32, e as u32)).map(|(_, i)| *i),
                    sent_ms: ts_ms,
                });
                let mut record = BaseRecord::with_opaque_to(&route.topic, sent)
                    .key(key)
                    .payload(&bytes)
                    .partition(*partition)
                    .timestamp(ts_ms);
                loop {
                    match producer.send(record) {
                        Ok(()) => break,
                        Err((e, r)) => {
                            anyhow::ensure!(
                                e.rdkafka_error_code() == Some(rdkafka::types::RDKafkaErrorCode::QueueFull),
                                "producing: {e}"
                            );
                            record = r;
                            std::thread::sleep(Duration::from_millis(1));
                        }
                    }
                }
                shared.records.fetch_add(1, Relaxed);
                shared.bytes.fetch_add(bytes.len() as u64, Relaxed);
            }
            Ok(())
        };
    while start.elapsed() < Duration::from_secs(a.secs) {
        let now_i = Instant::now();
        if now_i < next {
            std::thread::sleep(next - now_i);
        } else if now_i > next + tick {
            shared.late_ticks.fetch_add(1, Relaxed);
        }
        let now_i = Instant::now();
        let dt = (now_i - last).as_secs_f64();
        shared.longest_gap_ms.fetch_max((dt * 1000.0) as u64, Relaxed);
        last = now_i;
        next += tick;
        let elapsed = now_i - start;
        faulty.clear();
        for (i, e) in episodes.iter().enumerate() {
            if e.start <= elapsed && elapsed < e.end {
                faulty.insert((e.pool, e.endpoint), (e.kind, i));
                shared.applied.lock().unwrap().entry(i).or_insert(now_i);
            }
        }
        let now = now_us();
        let half = (dt * 500_000.0) as i64;
        let mut calls = 0u64;
        for (g, pairs) in gateways.iter_mut().enumerate() {
            let summarizer = &mut summarizers[g];
            for pair in pairs.iter_mut() {
                let want = pair.rate * dt + pair.carry;
                let n = want.floor();
                pair.carry = want - n;
                let n = n as u32;
                if n == 0 {
                    continue;
                }
                calls += u64::from(n);
                let (pool, eps) = &names[pair.pool as usize];
                let fault = faulty.get(&(pair.pool, pair.endpoint)).map(|(k, _)| *k);
                let first = n / 2 + share(&mut rng, n % 2, 0.5);
                for (k, at) in [(first, now - half), (n - first, now)] {
                    let group = Group {
                        pool,
                        endpoint: &eps[pair.endpoint as usize],
                        gateway: &gateway_names[g],
                        now: at,
                        noise: a.noise,
                    };
                    hand_over(&group, k, fault, &mut rng, &mut event, summarizer, &mut out);
                }
            }
            summarizer.flush_due(now, &mut out);
            send(&mut out, now / 1000, &faulty)?;
        }
        shared.calls.fetch_add(calls, Relaxed);
    }
    for s in &mut summarizers {
        s.flush_all(&mut out);
    }
    send(&mut out, now_us() / 1000, &faulty)?;
    producer.flush(Duration::from_secs(60))?;
    shared.stop.store(true, Relaxed);
    Ok(())
}

/// Every health change of an endpoint as a read_committed consumer (a router) sees it: (to
/// state, when).
/// Each endpoint's changes: the state, when this program read it, why, and its stream time (ms).
type Changes = Arc<Mutex<HashMap<String, Vec<(HealthState, Instant, String, i64)>>>>;

fn watch_changes(topic: &str, group: &str) -> anyhow::Result<Changes> {
    let c: StreamConsumer = ClientConfig::new()
        .set("bootstrap.servers", stack::brokers())
        .set("group.id", group)
        .set("auto.offset.reset", "earliest")
        .set("isolation.level", "read_committed")
        .set("fetch.wait.max.ms", "10")
        .create()?;
    c.subscribe(&[topic])?;
    let seen: Changes = Default::default();
    let filled = seen.clone();
    tokio::spawn(async move {
        while let Ok(m) = c.recv().await {
            let at = Instant::now();
            if let Ok(h) = decode::<HealthChanged>(m.payload().unwrap_or_default()) {
                filled
                    .lock()
                    .expect("changes")
                    .entry(h.endpoint.clone())
                    .or_default()
                    .push((h.to_state, at, h.reason.clone(), h.stream_time / 1000));
            }
        }
    });
    Ok(seen)
}

/// The counters at one instant: calls and gateway records sent, CPU seconds (processor, merger,
/// Postgres, broker, this program), Postgres commits, the signals topic's and the hot
/// partition's end offsets and the WAL position.
struct Mark {
    at: Instant,
    calls: u64,
    records: u64,
    bytes: u64,
    cpu: [f64; 5],
    commits: i64,
    signals_end: i64,
    hot_end: i64,
    wal: String,
}

async fn mark(db: &sqlx::PgPool, shared: &Shared, pids: (u32, Option<u32>), ends: (i64, i64)) -> anyhow::Result<Mark> {
    Ok(Mark {
        at: Instant::now(),
        calls: shared.calls.load(Relaxed),
        records: shared.records.load(Relaxed),
        bytes: shared.bytes.load(Relaxed),
        cpu: [
            cpu::of_pid(pids.0),
            pids.1.map_or(0.0, cpu::of_pid),
            cpu::of_command("postgres"),
            cpu::of_command("java"),
            vitals_bench::cpu_seconds(),
        ],
        commits: sqlx::query_scalar("SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()")
            .fetch_one(db)
            .await?,
        signals_end: ends.0,
        hot_end: ends.1,
        wal: sqlx::query_scalar("SELECT pg_current_wal_lsn()::text")
            .fetch_one(db)
            .await?,
    })
}

fn percentile(v: &mut [f64], p: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    v[((v.len() as f64 - 1.0) * p).round() as usize]
}

/// The end offsets of a topic's partitions, and the committed offsets of `group` on them.
fn ends_and_committed(c: &BaseConsumer, topic: &str, partitions: i32) -> anyhow::Result<Vec<(i64, i64)>> {
    let mut tpl = rdkafka::TopicPartitionList::new();
    for p in 0..partitions {
        tpl.add_partition(topic, p);
    }
    let committed = c.committed_offsets(tpl, Duration::from_secs(5))?;
    (0..partitions)
        .map(|p| {
            let (_, high) = c.fetch_watermarks(topic, p, Duration::from_secs(5))?;
            let done = committed
                .find_partition(topic, p)
                .and_then(|e| e.offset().to_raw())
                .unwrap_or(0)
                .max(0);
            Ok((high, done))
        })
        .collect()
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    anyhow::ensure!(
        args.pools >= 2 && args.gateways >= 1 && (args.shape == Shape::Mesh || args.gateways >= args.pools),
        "at least 2 pools and (sharded) a gateway per pool"
    );
    let name = stack::unique("fleet");
    let topics = stack::Topics::create(&name, args.partitions, stack::Stamp::LogAppendTime).await;
    let input = if args.merge {
        Some(
            stack::Topics::create(
                &format!("{name}_in"),
                args.input_partitions,
                stack::Stamp::LogAppendTime,
            )
            .await
            .signals,
        )
    } else {
        None
    };
    // The hot pool's partition: the bench's own hash when it writes the signals topic, the
    // producer's default (CRC-32 of the key) when the merger does.
    let hot_partition = if args.merge {
        (crc32(pool_name(0).as_bytes()) % args.partitions as u32) as i32
    } else {
        stack::partition_of(&pool_name(0), args.partitions)
    };
    let db = PgPoolOptions::new()
        .max_connections(2)
        .connect(&stack::database_url())
        .await?;
    let port = vitals_testkit::free_port();
    let addr = format!("127.0.0.1:{port}");
    // Ticks as in production (every second): they also carry the processor past a merger's
    // last transaction marker, which a partition's high watermark counts.
    let mut processor = stack::start_processor(
        &topics,
        &name,
        &name,
        &["--http-addr", &addr, "--tick-interval-ms", "1000"],
    );
    let merger_group = format!("{name}-merger");
    let mut merger = input.as_ref().map(|input| {
        let args: Vec<String> = [
            "--brokers",
            &stack::brokers(),
            "--input-topic",
            input,
            "--signals-topic",
            &topics.signals,
            "--group",
            &merger_group,
            "--transactional-id",
            &format!("{name}-txn"),
            "--create-topic",
            "false",
            "--http-addr",
            &format!("127.0.0.1:{}", vitals_testkit::free_port()),
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        stack::Service::start("vitals-merger", "fleet-merger", &args)
    });
    let shared = Arc::new(Shared {
        calls: AtomicU64::new(0),
        records: AtomicU64::new(0),
        bytes: AtomicU64::new(0),
        one_by_one: AtomicU64::new(0),
        late_ticks: AtomicU64::new(0),
        longest_gap_ms: AtomicU64::new(0),
        started: Mutex::new(None),
        applied: Mutex::default(),
        appended: Mutex::default(),
        late_ms: Mutex::default(),
        stop: AtomicBool::new(false),
    });
    let changes = watch_changes(&topics.changes, &format!("{name}-watch"))?;
    let episodes = schedule(&args);
    let pairs: usize = fleet(&args).iter().map(Vec::len).sum();
    eprintln!(
        "fleet: {} gateways, {:?}, {} pools × {} endpoints, {pairs} gateway-endpoint pairs, {:.0} calls/s{}; {} s ({} s warm-up), {} faults",
        args.gateways,
        args.shape,
        args.pools,
        args.endpoints_per_pool,
        args.calls_per_sec,
        if args.merge { ", through vitals-merger" } else { "" },
        args.secs,
        args.warmup_secs,
        episodes.len()
    );
    let generator = {
        let route = Route {
            topic: input.clone().unwrap_or_else(|| topics.signals.clone()),
            partitions: if args.merge {
                args.input_partitions
            } else {
                args.partitions
            },
            by_endpoint: args.merge,
        };
        let (a, shared, episodes) = (args.clone(), shared.clone(), episodes.clone());
        std::thread::spawn(move || generate(a, route, episodes, shared))
    };

    // Every half second: progress, the processor's lag (end offsets against its committed
    // offsets in Postgres) and the merger's (against its group's committed offsets).
    let offsets: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", stack::brokers())
        .set("group.id", &merger_group)
        .create()?;
    let committed_q =
        format!("SELECT partition, next_offset FROM \"{name}\".consumer_offsets WHERE consumer_group = $1");
    let started = Instant::now();
    let warm = Duration::from_secs(args.warmup_secs);
    let mut window: Option<Mark> = None;
    let (mut max_hot_lag, mut max_lag, mut max_merge_lag) = (0i64, 0i64, 0i64);
    let mut hot_lags: Vec<f64> = Vec::new();
    let mut end_of_window = None;
    let mut last_print = Instant::now();
    let pids = (processor.child.id(), merger.as_ref().map(|m| m.child.id()));
    loop {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let generating = !shared.stop.load(Relaxed);
        let committed: HashMap<i32, i64> = sqlx::query_as::<_, (i32, i64)>(&committed_q)
            .bind(&name)
            .fetch_all(&db)
            .await
            .unwrap_or_default()
            .into_iter()
            .collect();
        let ends = tokio::task::block_in_place(|| ends_and_committed(&offsets, &topics.signals, args.partitions))?;
        let (mut lag, mut hot_lag, mut hot_end, mut signals_end) = (0, 0, 0, 0);
        for (p, (high, _)) in ends.iter().enumerate() {
            let l = high - committed.get(&(p as i32)).copied().unwrap_or(0).max(0);
            lag += l;
            signals_end += high;
            if p as i32 == hot_partition {
                hot_lag = l;
                hot_end = *high;
            }
        }
        let merge_lag: i64 = match &input {
            Some(input) => tokio::task::block_in_place(|| ends_and_committed(&offsets, input, args.input_partitions))?
                .iter()
                .map(|(high, done)| high - done)
                .sum(),
            None => 0,
        };
        let in_window = started.elapsed() >= warm && generating;
        if in_window {
            if window.is_none() {
                window = Some(mark(&db, &shared, pids, (signals_end, hot_end)).await?);
            }
            max_hot_lag = max_hot_lag.max(hot_lag);
            max_lag = max_lag.max(lag);
            max_merge_lag = max_merge_lag.max(merge_lag);
            hot_lags.push(hot_lag as f64);
        }
        if !generating && end_of_window.is_none() {
            end_of_window = Some(mark(&db, &shared, pids, (signals_end, hot_end)).await?);
        }
        if last_print.elapsed() >= Duration::from_secs(5) {
            eprintln!(
                "  {:>3.0} s: {:.1} M calls, {} gateway records, processor lag {lag} (hot partition {hot_lag}), merger lag {merge_lag}, {} endpoints changed",
                started.elapsed().as_secs_f64(),
                shared.calls.load(Relaxed) as f64 / 1e6,
                shared.records.load(Relaxed),
                changes.lock().unwrap().len()
            );
            last_print = Instant::now();
        }
        if !generating && lag == 0 && merge_lag == 0 {
            break;
        }
        anyhow::ensure!(
            started.elapsed() < Duration::from_secs(args.secs + 300),
            "the pipeline did not catch up within 300 s of the end"
        );
    }
    let caught_up = started.elapsed().as_secs_f64() - args.secs as f64;
    generator
        .join()
        .map_err(|_| anyhow::anyhow!("the generator panicked"))??;
    let metrics = vitals_testkit::http_get(port, "/metrics").await.unwrap_or_default();
    processor.terminate();
    if let Some(m) = merger.as_mut() {
        m.terminate();
    }

    let (w0, w1) = (window.expect("a measured window"), end_of_window.expect("an end"));
    let secs = (w1.at - w0.at).as_secs_f64();
    let calls = (w1.calls - w0.calls) as f64;
    let records = (w1.records - w0.records) as f64;
    let per_m = |i: usize| (w1.cpu[i] - w0.cpu[i]) / (calls / 1e6);
    let wal_bytes: f64 = sqlx::query_scalar(&format!("SELECT pg_wal_lsn_diff('{}', '{}')::float8", w1.wal, w0.wal))
        .fetch_one(&db)
        .await?;
    let (transitions, pool_events): (i64, i64) = sqlx::query_as(&format!(
        "SELECT (SELECT count(*) FROM \"{name}\".transitions), (SELECT count(*) FROM \"{name}\".pool_events)"
    ))
    .fetch_one(&db)
    .await?;

    // Detection: from a fault's first calls (the tick that handed them over) to its endpoint's
    // first change out of healthy (a slow first token: degraded is the decision; the others:
    // out of rotation, or for a 429 storm any change) before the fault ended and 5 s more.
    let start = shared.started.lock().unwrap().expect("the generator started");
    let changes = changes.lock().unwrap().clone();
    let mut delays: HashMap<Fault, Vec<f64>> = HashMap::new();
    let mut missed: HashMap<Fault, Vec<String>> = HashMap::new();
    let mut already_out: HashMap<Fault, usize> = HashMap::new();
    let mut counted: HashMap<Fault, usize> = HashMap::new();
    let applied = shared.applied.lock().unwrap().clone();
    // The service's own part: from the fault's first record on the broker to the decision's
    // stream time (the broker's append time of the record that decided it).
    let appended = shared.appended.lock().unwrap().clone();
    let mut on_broker: HashMap<Fault, Vec<f64>> = HashMap::new();
    for (i, e) in episodes.iter().enumerate() {
        *counted.entry(e.kind).or_default() += 1;
        let ep = endpoint_name(e.pool, e.endpoint);
        let from = applied.get(&i).copied().unwrap_or(start + e.start);
        let to = start + e.end + Duration::from_secs(5);
        let decided = |s: HealthState| match e.kind {
            Fault::SlowTtft | Fault::RateLimited => s != HealthState::Healthy,
            _ => matches!(s, HealthState::Unhealthy),
        };
        let seen = changes
            .get(&ep)
            .and_then(|v| v.iter().find(|(s, at, _, _)| *at >= from && *at < to && decided(*s)));
        // Out of rotation when the fault began (a cooldown or an isolation before it): nothing
        // to detect, counted apart.
        let out_at_start = changes
            .get(&ep)
            .and_then(|v| v.iter().rev().find(|(_, at, _, _)| *at < from))
            .is_some_and(|(s, _, _, _)| *s == HealthState::Unhealthy);
        match seen {
            None if out_at_start => *already_out.entry(e.kind).or_default() += 1,
            Some((_, at, _, stream_ms)) => {
                if let Some(first) = appended.get(&i) {
                    on_broker
                        .entry(e.kind)
                        .or_default()
                        .push((*stream_ms - first).max(0) as f64);
                }
                delays
                    .entry(e.kind)
                    .or_default()
                    .push((*at - from).as_secs_f64() * 1000.0);
            }
            None => missed
                .entry(e.kind)
                .or_default()
                .push(format!("{ep}@{:.0}s", e.start.as_secs_f64())),
        }
    }
    // Ejections of an endpoint with no fault then (nor in the 60 s after one, its recovery).
    let false_ejections: Vec<String> = changes
        .iter()
        .flat_map(|(ep, v)| v.iter().map(move |(s, at, why, _)| (ep, *s, *at, why)))
        .filter(|(_, s, _, _)| *s == HealthState::Unhealthy)
        .filter(|(ep, _, at, _)| {
            !episodes.iter().any(|e| {
                endpoint_name(e.pool, e.endpoint) == **ep
                    && *at >= start + e.start
                    && *at < start + e.end + Duration::from_secs(60)
            })
        })
        .map(|(ep, _, at, why)| format!("{ep}@{:.0}s: {why}", (at - start).as_secs_f64()))
        .collect();
    let signals_metric: f64 = metrics
        .lines()
        .filter(|l| l.starts_with("vitals_processor_signals") && !l.starts_with('#'))
        .filter_map(|l| l.rsplit_once(' ').and_then(|(_, v)| v.trim().parse::<f64>().ok()))
        .sum();

    let on_topic = (w1.signals_end - w0.signals_end) as f64;
    let hot = (w1.hot_end - w0.hot_end) as f64;
    println!(
        "fleet-bench: {:?}, {} gateways, {} pools × {} endpoints ({pairs} gateway-endpoint pairs), {:.0} % of the traffic on one pool, {}; each gateway's own summarizer (250 ms, 8 failures one by one); noise × {}",
        args.shape,
        args.gateways,
        args.pools,
        args.endpoints_per_pool,
        args.hot_share * 100.0,
        if args.merge {
            format!("gateways → {} partitions keyed by endpoint → vitals-merger → signals", args.input_partitions)
        } else {
            "gateways → signals topic keyed by pool".to_owned()
        },
        args.noise
    );
    println!(
        "  measured over {secs:.0} s: {:.2} M calls/s represented (asked {:.2} M); gateways sent {:.0} records/s ({:.2} MB/s before compression, {:.0} calls a record, {} failures one by one in all); {} late ticks, the longest gap between two {:.0} ms",
        calls / secs / 1e6,
        args.calls_per_sec / 1e6,
        records / secs,
        (w1.bytes - w0.bytes) as f64 / secs / 1e6,
        calls / records.max(1.0),
        shared.one_by_one.load(Relaxed),
        shared.late_ticks.load(Relaxed),
        shared.longest_gap_ms.load(Relaxed) as f64
    );
    println!(
        "  signals topic: {:.0} records/s; the hot pool's partition {hot_partition}: {:.0} records/s ({:.0} % of the topic)",
        on_topic / secs,
        hot / secs,
        100.0 * hot / on_topic.max(1.0),
    );
    println!(
        "  CPU s per million calls represented: processor {:.4}, merger {:.4}, Postgres {:.4}, broker {:.4}, simulated gateways (summarizing + producing) {:.4}",
        per_m(0),
        per_m(1),
        per_m(2),
        per_m(3),
        per_m(4)
    );
    println!(
        "  Postgres: {:.0} commits/s, {:.2} MB/s of WAL; {transitions} transitions and {pool_events} pool events in the log",
        (w1.commits - w0.commits) as f64 / secs,
        wal_bytes / secs / 1e6,
    );
    for kind in KINDS {
        let mut d = delays.get(&kind).cloned().unwrap_or_default();
        let miss = missed.get(&kind).cloned().unwrap_or_default();
        let mut b = on_broker.get(&kind).cloned().unwrap_or_default();
        println!(
            "  detection, {}: {} faults ({} out of rotation when it began), p50 {:.0} ms, p99 {:.0} ms, max {:.0} ms (from the fault's first record on the broker to the decision's stream time: p50 {:.0}, p99 {:.0}, max {:.0}); missed {}{}",
            kind.describe(),
            counted.get(&kind).copied().unwrap_or(0),
            already_out.get(&kind).copied().unwrap_or(0),
            percentile(&mut d, 0.5),
            percentile(&mut d, 0.99),
            percentile(&mut d, 1.0),
            percentile(&mut b, 0.5),
            percentile(&mut b, 0.99),
            percentile(&mut b, 1.0),
            miss.len(),
            if miss.is_empty() {
                String::new()
            } else {
                format!(" {:?}", &miss[..miss.len().min(5)])
            }
        );
    }
    let cooled = false_ejections.iter().filter(|e| e.contains("rate limited")).count();
    let others: Vec<&String> = false_ejections.iter().filter(|e| !e.contains("rate limited")).collect();
    println!(
        "  out of rotation without a fault: {} cooldowns (429s among the noise, the upstream's Retry-After), {} ejections{}",
        cooled,
        others.len(),
        if others.is_empty() {
            String::new()
        } else {
            format!(" {:?}", &others[..others.len().min(4)])
        }
    );
    let mut late = std::mem::take(&mut *shared.late_ms.lock().unwrap());
    println!(
        "  the simulated gateways' records reached the broker p50 {:.0} ms, p99 {:.0} ms, max {:.0} ms after they were handed over (their producer, on the machine the service shares)",
        percentile(&mut late, 0.5),
        percentile(&mut late, 0.99),
        percentile(&mut late, 1.0)
    );
    println!(
        "  lag: hot partition p50 {:.0}, max {max_hot_lag} records (all partitions: max {max_lag}; merger input: max {max_merge_lag}); caught up {caught_up:.1} s after the traffic stopped; processor read {signals_metric:.0} signals",
        percentile(&mut hot_lags, 0.5)
    );
    let _ = sqlx::query(&format!("DROP SCHEMA \"{name}\" CASCADE"))
        .execute(&db)
        .await;
    // The broker as it was: a day of runs left dozens of topics behind.
    topics.delete().await;
    if args.merge {
        let names: Vec<String> = ["signals", "changes", "state", "dlq"]
            .iter()
            .map(|t| format!("{name}_in.{t}"))
            .collect();
        vitals_testkit::delete_topics(&names.iter().map(String::as_str).collect::<Vec<_>>()).await;
    }
    Ok(())
}
