//! A fleet at ten million calls a second, on this machine: simulated gateways hand their calls,
//! counted, to the reporter's summary code (`Summarizer::add_times`); every summary and every
//! failure sent one by one is a real record on the real broker, read by the real processor,
//! decided and written to Postgres. (Ten million `report` calls a second would not fit beside
//! the broker on two cores; the reporter's own cost per call is reporter-bench's.)
//!
//! The fleet: `--gateways` gateway instances, each serving one pool (a gateway is deployed per
//! model group, as a mesh shards them): `--hot-share` of the traffic and of the gateways on
//! one pool, the rest spread over the other pools; every gateway calls each endpoint of its pool.
//! After a warm-up, faults start one at a time in distinct pools (the hot pool's first):
//! alternately an endpoint that refuses every call and one that fails `--failure-share` of them.
//!
//! Prints: calls represented per second, records per second on the topic, CPU per million calls
//! represented (processor, Postgres, broker, the simulated gateways), Postgres' writes, detection
//! delay p50/p99 of each kind of fault (from the fault's first calls to the health change on the
//! changes topic, read_committed), transitions of endpoints that had no fault, and the hot
//! pool's partition: its records per second and its lag behind the processor.
//!
//!   scripts/stack.sh up && cargo build --release -p vitals-processor -p vitals-bench
//!   target/release/fleet-bench [--calls-per-sec 10000000] [--secs 90]

use clap::Parser;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::producer::{BaseRecord, Producer, ThreadedProducer};
use rdkafka::ClientConfig;
use sqlx::postgres::PgPoolOptions;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use vitals_bench::{cpu, now_us, stack, workload::Rng};
use vitals_contracts::*;

#[derive(Parser, Clone)]
struct Args {
    /// Calls per second the fleet represents.
    #[arg(long, default_value_t = 10_000_000.0)]
    calls_per_sec: f64,
    #[arg(long, default_value_t = 2_000)]
    gateways: usize,
    #[arg(long, default_value_t = 100)]
    pools: usize,
    #[arg(long, default_value_t = 5)]
    endpoints_per_pool: usize,
    /// Share of the traffic (and of the gateways) on the hot pool.
    #[arg(long, default_value_t = 0.30)]
    hot_share: f64,
    /// Seconds of traffic in all (warm-up included).
    #[arg(long, default_value_t = 90)]
    secs: u64,
    #[arg(long, default_value_t = 15)]
    warmup_secs: u64,
    /// Seconds between one fault's start and the next's.
    #[arg(long, default_value_t = 2.0)]
    fault_gap_secs: f64,
    /// Share of calls the failing endpoints fail.
    #[arg(long, default_value_t = 0.15)]
    failure_share: f64,
    /// How often the gateways hand their counted calls over (ms).
    #[arg(long, default_value_t = 125)]
    tick_ms: u64,
    #[arg(long, default_value_t = 16)]
    partitions: i32,
}

#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
enum Fault {
    Dead,
    Failing,
}

/// One gateway's calls to one endpoint.
struct Pair {
    gateway: u32,
    pool: u32,
    endpoint: u32,
    rate: f64,
    carry: f64,
}

struct Shared {
    calls: AtomicU64,
    records: AtomicU64,
    /// Bytes of the records (encoded, before the producer's compression).
    bytes: AtomicU64,
    one_by_one: AtomicU64,
    late_ticks: AtomicU64,
    /// When each fault began (endpoint name → kind, start).
    faults: Mutex<HashMap<String, (Fault, Instant)>>,
    stop: AtomicBool,
}

fn pool_name(p: u32) -> String {
    format!("pool-{p}")
}

fn endpoint_name(p: u32, e: u32) -> String {
    format!("ep-{p}-{e}")
}

/// Gateways per pool: the hot pool's share, the rest round-robin over the others.
fn fleet(a: &Args) -> Vec<Pair> {
    let hot_gateways = ((a.gateways as f64 * a.hot_share).round() as usize).max(1);
    let mut pool_of_gateway: Vec<u32> = vec![0; hot_gateways];
    pool_of_gateway.extend((0..a.gateways - hot_gateways).map(|g| 1 + (g % (a.pools - 1)) as u32));
    let mut gateways_in = vec![0usize; a.pools];
    for &p in &pool_of_gateway {
        gateways_in[p as usize] += 1;
    }
    let pool_rate = |p: u32| {
        if p == 0 {
            a.calls_per_sec * a.hot_share
        } else {
            a.calls_per_sec * (1.0 - a.hot_share) / (a.pools - 1) as f64
        }
    };
    let mut pairs = Vec::new();
    for (g, &p) in pool_of_gateway.iter().enumerate() {
        for e in 0..a.endpoints_per_pool as u32 {
            pairs.push(Pair {
                gateway: g as u32,
                pool: p,
                endpoint: e,
                rate: pool_rate(p) / (gateways_in[p as usize] * a.endpoints_per_pool) as f64,
                carry: 0.0,
            });
        }
    }
    pairs
}

/// The simulated gateways: every tick, each pair's calls since the last one, counted, through
/// the summarizer; what it sends goes to the topic keyed by pool, stamped with the time.
fn generate(a: Args, topic: String, hot_partition: i32, shared: Arc<Shared>) -> anyhow::Result<()> {
    let producer: ThreadedProducer<_> = ClientConfig::new()
        .set("bootstrap.servers", stack::brokers())
        .set("linger.ms", "20")
        .set("batch.size", "1000000")
        .set("compression.type", "lz4")
        .set("queue.buffering.max.messages", "2000000")
        .set("queue.buffering.max.kbytes", "1048576")
        .create()?;
    let mut pairs = fleet(&a);
    let names: Vec<(String, Vec<String>)> = (0..a.pools as u32)
        .map(|p| {
            (
                pool_name(p),
                (0..a.endpoints_per_pool as u32).map(|e| endpoint_name(p, e)).collect(),
            )
        })
        .collect();
    let gateway_names: Vec<String> = (0..a.gateways).map(|g| format!("gw-{g}")).collect();
    let partitions: Vec<i32> = names
        .iter()
        .map(|(p, _)| stack::partition_of(p, a.partitions))
        .collect();
    assert_eq!(partitions[0], hot_partition);
    let mut summarizer = Summarizer::new(SummaryConfig::default(), "fleet");
    let mut rng = Rng::new(11);
    let mut out: Vec<Signal> = Vec::new();
    let start = Instant::now();
    let tick = Duration::from_millis(a.tick_ms);
    let mut last = start;
    let mut next = start + tick;
    let mut event = 0u64;
    // The fault schedule: (when, pool, kind); pool 0 is the hot one.
    let mut schedule: Vec<(Duration, u32, Fault)> = Vec::new();
    let mut t = a.warmup_secs as f64;
    let mut k = 0u32;
    while t + 12.0 <= a.secs as f64 && (k as usize) < a.pools {
        schedule.push((
            Duration::from_secs_f64(t),
            k,
            if k.is_multiple_of(2) {
                Fault::Dead
            } else {
                Fault::Failing
            },
        ));
        t += a.fault_gap_secs;
        k += 1;
    }
    let mut faulty: HashMap<(u32, u32), Fault> = HashMap::new();
    while start.elapsed() < Duration::from_secs(a.secs) {
        let now_i = Instant::now();
        if now_i < next {
            std::thread::sleep(next - now_i);
        } else if now_i > next + tick {
            shared.late_ticks.fetch_add(1, Relaxed);
        }
        let now_i = Instant::now();
        let dt = (now_i - last).as_secs_f64();
        last = now_i;
        next += tick;
        let elapsed = now_i - start;
        while let Some(&(at, pool, kind)) = schedule.first() {
            if at > elapsed {
                break;
            }
            schedule.remove(0);
            faulty.insert((pool, 0), kind);
            shared
                .faults
                .lock()
                .unwrap()
                .insert(endpoint_name(pool, 0), (kind, now_i));
        }
        let now = now_us();
        let mut calls = 0u64;
        for pair in &mut pairs {
            let want = pair.rate * dt + pair.carry;
            let n = want.floor();
            pair.carry = want - n;
            let n = n as u32;
            if n == 0 {
                continue;
            }
            calls += u64::from(n);
            let (pool, eps) = &names[pair.pool as usize];
            let gateway = &gateway_names[pair.gateway as usize];
            let mut hand = |class: OutcomeClass, count: u32, latency_ms: i64, out: &mut Vec<Signal>| {
                if count == 0 {
                    return;
                }
                event += 1;
                let success = class == OutcomeClass::Success;
                let call = CallOutcome {
                    latency_us: latency_ms * 1000,
                    ttft_us: success.then_some(latency_ms * 600),
                    http_status: Some(if success { 200 } else { 503 }),
                    ..CallOutcome::new(
                        format!("f{event}"),
                        pool.as_str(),
                        eps[pair.endpoint as usize].as_str(),
                        gateway.as_str(),
                        now - latency_ms * 1000,
                        class,
                    )
                };
                summarizer.add_times(call, count, now, out);
            };
            match faulty.get(&(pair.pool, pair.endpoint)) {
                Some(Fault::Dead) => hand(OutcomeClass::ConnectError, n, 1, &mut out),
                fault => {
                    let failures = if fault == Some(&Fault::Failing) {
                        let f = f64::from(n) * a.failure_share;
                        (f.floor()
                            + if (rng.below(1000) as f64) < f.fract() * 1000.0 {
                                1.0
                            } else {
                                0.0
                            }) as u32
                    } else {
                        0
                    };
                    let ok = n - failures;
                    let first = ok / 2;
                    hand(OutcomeClass::Success, first, 150 + rng.below(250) as i64, &mut out);
                    hand(OutcomeClass::ServerError, failures, 40, &mut out);
                    hand(OutcomeClass::Success, ok - first, 150 + rng.below(250) as i64, &mut out);
                }
            }
        }
        summarizer.flush_due(now, &mut out);
        shared.calls.fetch_add(calls, Relaxed);
        let ts = now / 1000;
        for s in out.drain(..) {
            if matches!(s, Signal::Call(_)) {
                shared.one_by_one.fetch_add(1, Relaxed);
            }
            let pool = s.pool().unwrap_or_default().to_owned();
            let bytes = encode_signal(&s)?;
            let partition = partitions[pool[5..].parse::<usize>().unwrap_or(0)];
            let mut record = BaseRecord::to(&topic)
                .key(&pool)
                .payload(&bytes)
                .partition(partition)
                .timestamp(ts);
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
    }
    summarizer.flush_all(&mut out);
    producer.flush(Duration::from_secs(30))?;
    shared.stop.store(true, Relaxed);
    Ok(())
}

/// The counters at one instant: calls and records sent, CPU seconds (processor, Postgres,
/// broker, this program), Postgres commits, the hot partition's end offset and the WAL position.
struct Mark {
    at: Instant,
    calls: u64,
    records: u64,
    bytes: u64,
    cpu: [f64; 4],
    commits: i64,
    hot_end: i64,
    wal: String,
}

async fn mark(db: &sqlx::PgPool, shared: &Shared, processor: u32, hot_end: i64) -> anyhow::Result<Mark> {
    Ok(Mark {
        at: Instant::now(),
        calls: shared.calls.load(Relaxed),
        records: shared.records.load(Relaxed),
        bytes: shared.bytes.load(Relaxed),
        cpu: [
            cpu::of_pid(processor),
            cpu::of_command("postgres"),
            cpu::of_command("java"),
            vitals_bench::cpu_seconds(),
        ],
        commits: sqlx::query_scalar("SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()")
            .fetch_one(db)
            .await?,
        hot_end,
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

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    anyhow::ensure!(
        args.pools >= 2 && args.gateways >= args.pools,
        "at least 2 pools and a gateway per pool"
    );
    let name = stack::unique("fleet");
    let topics = stack::Topics::create(&name, args.partitions, stack::Stamp::CreateTime).await;
    let hot_partition = stack::partition_of(&pool_name(0), args.partitions);
    let db = PgPoolOptions::new()
        .max_connections(2)
        .connect(&stack::database_url())
        .await?;
    let port = vitals_testkit::free_port();
    let addr = format!("127.0.0.1:{port}");
    let mut processor = stack::start_processor(&topics, &name, &name, &["--http-addr", &addr]);
    let shared = Arc::new(Shared {
        calls: AtomicU64::new(0),
        records: AtomicU64::new(0),
        bytes: AtomicU64::new(0),
        one_by_one: AtomicU64::new(0),
        late_ticks: AtomicU64::new(0),
        faults: Mutex::default(),
        stop: AtomicBool::new(false),
    });

    // The changes topic, read_committed: when each endpoint first left healthy.
    let unhealthy = stack::first_changes(&topics.changes, &format!("{name}-watch"), |h| {
        h.to_state != HealthState::Healthy
    })?;

    let pairs = fleet(&args).len();
    eprintln!(
        "fleet: {} gateways ({} on the hot pool), {} pools × {} endpoints, {pairs} gateway-endpoint pairs, {:.0} calls/s; {} s ({} s warm-up)",
        args.gateways,
        ((args.gateways as f64 * args.hot_share).round() as usize).max(1),
        args.pools,
        args.endpoints_per_pool,
        args.calls_per_sec,
        args.secs,
        args.warmup_secs
    );
    let generator = {
        let (a, topic, shared) = (args.clone(), topics.signals.clone(), shared.clone());
        std::thread::spawn(move || generate(a, topic, hot_partition, shared))
    };

    // Every second: progress, and the hot partition's lag (its end offset against the
    // processor's committed offset in Postgres).
    let offsets: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", stack::brokers())
        .set("group.id", format!("{name}-offsets"))
        .create()?;
    let committed_q =
        format!("SELECT partition, next_offset FROM \"{name}\".consumer_offsets WHERE consumer_group = $1");
    let started = Instant::now();
    let warm = Duration::from_secs(args.warmup_secs);
    let mut window: Option<Mark> = None;
    let (mut max_hot_lag, mut max_lag) = (0i64, 0i64);
    let mut hot_lags: Vec<f64> = Vec::new();
    let mut end_of_window = None;
    let mut last_print = Instant::now();
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
        let mut lag = 0;
        let mut hot_lag = 0;
        let mut hot_end = 0;
        for p in 0..args.partitions {
            let (_, high) =
                tokio::task::block_in_place(|| offsets.fetch_watermarks(&topics.signals, p, Duration::from_secs(5)))?;
            let l = high - committed.get(&p).copied().unwrap_or(0).max(0);
            lag += l;
            if p == hot_partition {
                hot_lag = l;
                hot_end = high;
            }
        }
        let in_window = started.elapsed() >= warm && generating;
        if in_window {
            if window.is_none() {
                window = Some(mark(&db, &shared, processor.child.id(), hot_end).await?);
            }
            max_hot_lag = max_hot_lag.max(hot_lag);
            max_lag = max_lag.max(lag);
            hot_lags.push(hot_lag as f64);
        }
        if !generating && end_of_window.is_none() {
            end_of_window = Some(mark(&db, &shared, processor.child.id(), hot_end).await?);
        }
        if last_print.elapsed() >= Duration::from_secs(5) {
            eprintln!(
                "  {:>3.0} s: {:.1} M calls, {} records, lag {lag} (hot partition {hot_lag}), {} changes seen",
                started.elapsed().as_secs_f64(),
                shared.calls.load(Relaxed) as f64 / 1e6,
                shared.records.load(Relaxed),
                unhealthy.lock().unwrap().len()
            );
            last_print = Instant::now();
        }
        if !generating && lag == 0 {
            break;
        }
        anyhow::ensure!(
            started.elapsed() < Duration::from_secs(args.secs + 300),
            "the processor did not catch up within 300 s of the end"
        );
    }
    let caught_up = started.elapsed().as_secs_f64() - args.secs as f64;
    generator
        .join()
        .map_err(|_| anyhow::anyhow!("the generator panicked"))??;
    // Changes of the last faults may still be on their way.
    let deadline = Instant::now() + Duration::from_secs(15);
    while Instant::now() < deadline && {
        let f = shared.faults.lock().unwrap();
        let u = unhealthy.lock().unwrap();
        f.keys().any(|e| !u.contains_key(e))
    } {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let metrics = vitals_testkit::http_get(port, "/metrics").await.unwrap_or_default();
    processor.terminate();

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
    let bytes_per_transition: f64 = sqlx::query_scalar(&format!(
        "SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0)::float8 / greatest((SELECT count(*) FROM \"{name}\".transitions), 1)
         FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid WHERE i.inhparent = '\"{name}\".transitions'::regclass"
    ))
    .fetch_one(&db)
    .await?;

    let faults = shared.faults.lock().unwrap().clone();
    let unhealthy = unhealthy.lock().unwrap().clone();
    let mut delays: HashMap<Fault, Vec<f64>> = HashMap::new();
    let mut missed = Vec::new();
    let mut early = Vec::new();
    for (ep, (kind, at)) in &faults {
        match unhealthy.get(ep) {
            Some(seen) if seen >= at => delays
                .entry(*kind)
                .or_default()
                .push((*seen - *at).as_secs_f64() * 1000.0),
            Some(_) => early.push(ep.clone()),
            None => missed.push(ep.clone()),
        }
    }
    let false_changes = unhealthy.keys().filter(|e| !faults.contains_key(*e)).count();
    let signals_metric: f64 = metrics
        .lines()
        .filter(|l| l.starts_with("vitals_processor_signals") && !l.starts_with('#'))
        .filter_map(|l| l.rsplit_once(' ').and_then(|(_, v)| v.trim().parse::<f64>().ok()))
        .sum();

    println!(
        "fleet-bench: {} gateways × {} endpoints each ({} pools of {}, {:.0} % of the traffic on one pool), summaries every 250 ms, up to 8 failures one by one",
        args.gateways,
        args.endpoints_per_pool,
        args.pools,
        args.endpoints_per_pool,
        args.hot_share * 100.0
    );
    println!(
        "  measured over {secs:.0} s: {:.2} M calls/s represented (asked {:.2} M), {:.0} records/s on the topic, {:.2} MB/s before compression ({:.0} calls a record; {} failures sent one by one), {} late ticks",
        calls / secs / 1e6,
        args.calls_per_sec / 1e6,
        records / secs,
        (w1.bytes - w0.bytes) as f64 / secs / 1e6,
        calls / records.max(1.0),
        shared.one_by_one.load(Relaxed),
        shared.late_ticks.load(Relaxed)
    );
    println!(
        "  CPU s per million calls represented: processor {:.4}, Postgres {:.4}, broker {:.4}, simulated gateways (summarizing + producing) {:.4}",
        per_m(0),
        per_m(1),
        per_m(2),
        per_m(3)
    );
    println!(
        "  Postgres: {:.0} commits/s, {:.2} MB/s of WAL; {transitions} transitions and {pool_events} pool events in the log, {:.0} bytes per transition on disk (table and indexes)",
        (w1.commits - w0.commits) as f64 / secs,
        wal_bytes / secs / 1e6,
        bytes_per_transition
    );
    for (kind, target) in [
        (Fault::Dead, "target p99 ≤ 1 s"),
        (Fault::Failing, "target ≤ 10 s + 250 ms"),
    ] {
        let mut d = delays.get(&kind).cloned().unwrap_or_default();
        println!(
            "  detection, {}: {} faults, p50 {:.0} ms, p99 {:.0} ms, max {:.0} ms ({target})",
            match kind {
                Fault::Dead => "endpoint refusing every call".to_owned(),
                Fault::Failing => format!("endpoint failing {:.0} % of calls", args.failure_share * 100.0),
            },
            d.len(),
            percentile(&mut d, 0.5),
            percentile(&mut d, 0.99),
            percentile(&mut d, 1.0)
        );
    }
    println!(
        "  missed faults {missed:?}, changes before their fault {early:?}, endpoints without a fault that left healthy: {false_changes}"
    );
    println!(
        "  hot pool's partition {hot_partition}: {:.0} records/s ({:.0} % of the topic); lag p50 {:.0}, max {max_hot_lag} records (all partitions: max {max_lag}); caught up {caught_up:.1} s after the traffic stopped; processor read {signals_metric:.0} signals",
        (w1.hot_end - w0.hot_end) as f64 / secs,
        100.0 * (w1.hot_end - w0.hot_end) as f64 / records.max(1.0),
        percentile(&mut hot_lags, 0.5)
    );
    let _ = sqlx::query(&format!("DROP SCHEMA \"{name}\" CASCADE"))
        .execute(&db)
        .await;
    anyhow::ensure!(missed.is_empty(), "faults not detected: {missed:?}");
    Ok(())
}
