//! End-to-end throughput: real Kafka → processor → Postgres, against a bare rdkafka consumer that
//! only decodes the same topic, interleaved run by run (bare, processor, bare, processor, ...) so
//! that a slow spell of the machine hits both. Prints each run, the median and range, the CPU
//! each part of the stack used per signal, and where the processor's time went.
//!
//!   scripts/stack.sh up && cargo build --release -p vitals-processor -p vitals-bench
//!   target/release/e2e-bench [--signals 1000000,5000000] [--runs 5] [--lanes 1,2]
//!   target/release/e2e-bench --peer tools/streams-peer   (and the Kafka Streams peer: build it
//!     first with `mvn -q -B -f tools/streams-peer/pom.xml package dependency:copy-dependencies`)
//!   target/release/e2e-bench --offline [--signals 5000000]   (the record step only; no stack)
//!   E2E_KEEP_SCHEMA=1 target/release/e2e-bench ...   (keeps each run's schema, to read its rows)

use clap::Parser;
use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::{ClientConfig, Message};
use sqlx::postgres::PgPoolOptions;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};
use vitals_bench::{cpu, median, spread, stack, workload};
use vitals_contracts::{decode_signal, encode_signal, Policy, Signal};
use vitals_engine::Engine;
use vitals_pipeline::{BatchWrite, Partition, Topics};

#[derive(Parser)]
struct Args {
    /// Run sizes, comma-separated; each size gets its own topic.
    #[arg(long, value_delimiter = ',', default_value = "1000000")]
    signals: Vec<usize>,
    /// Interleaved runs per size.
    #[arg(long, default_value_t = 1)]
    runs: usize,
    #[arg(long, default_value_t = 8)]
    partitions: i32,
    /// Extra flags for the processor (e.g. --extra=--batch-max-records=10000).
    #[arg(long, allow_hyphen_values = true)]
    extra: Vec<String>,
    /// Lanes of the processor (`--lanes`), comma-separated: each is run in every round, after
    /// the bare loop of one consumer and (above 1) a bare loop of as many consumers; both
    /// ratios are reported.
    #[arg(long, value_delimiter = ',', default_value = "1")]
    lanes: Vec<usize>,
    /// The Kafka Streams peer (tools/streams-peer, built with Maven): run in every round after
    /// the processor, exactly once, on the same topic; its rate and CPU are reported beside.
    #[arg(long)]
    peer: Option<std::path::PathBuf>,
    /// Stream threads of the peer.
    #[arg(long, default_value_t = 1)]
    peer_threads: usize,
    /// The peer's state store: `persistent` (RocksDB, Kafka Streams' default, as a production
    /// application runs) or `memory`; both changelogged.
    #[arg(long, default_value = "persistent", value_parser = ["persistent", "memory"])]
    peer_store: String,
    /// Only the record step offline, on the largest size: no Kafka, no Postgres.
    #[arg(long)]
    offline: bool,
}

/// One processor run.
struct ProcRun {
    rate: f64,
    transitions: i64,
    /// CPU seconds per signal (µs) of the processor, of Postgres (every backend and background
    /// process) and of the Kafka broker, from the processor's start to its last commit.
    cpu_processor_us: f64,
    cpu_postgres_us: f64,
    cpu_broker_us: f64,
    /// Seconds by phase, from the processor's `vitals_processor_time_seconds`.
    phases: BTreeMap<String, f64>,
    outbox_backlog: i64,
    /// Postgres' time in each statement (pg_stat_statements, when the stack has it): µs per
    /// signal and calls, by the statement's text.
    statements: BTreeMap<String, (f64, i64)>,
    /// Postgres' write-ahead log over the run: bytes per signal and MB/s.
    wal_bytes: f64,
    wal_mb_s: f64,
    /// The processor's peak resident memory (VmHWM), MB.
    peak_rss_mb: f64,
    /// Signals per second in each fifth of the run (the first from the first commit).
    fifths: Vec<f64>,
}

/// One bare run: its rate, its CPU µs per signal (this process, librdkafka's threads included),
/// and the rate in each fifth of the run.
struct BareRun {
    rate: f64,
    cpu_us: f64,
    /// The broker's CPU µs per signal while the loop read: what serving the fetches alone costs.
    cpu_broker_us: f64,
    fifths: Vec<f64>,
}

/// Signals per second in each fifth of a run, from (seconds, signals done) samples taken along
/// it: the time each fifth was crossed is interpolated between the samples around it.
fn fifths(samples: &[(f64, f64)], n: f64) -> Vec<f64> {
    let crossed = |target: f64| {
        let i = samples.iter().position(|s| s.1 >= target)?;
        if i == 0 {
            return Some(samples[0].0);
        }
        let ((t0, c0), (t1, c1)) = (samples[i - 1], samples[i]);
        Some(t0 + (t1 - t0) * (target - c0) / (c1 - c0).max(1.0))
    };
    let start = samples.first().copied().unwrap_or_default();
    let mut marks = vec![start];
    for k in 1..=5 {
        let target = n * k as f64 / 5.0;
        if target > start.1 {
            if let Some(t) = crossed(target) {
                marks.push((t, target));
            }
        }
    }
    marks
        .windows(2)
        .map(|w| (w[1].1 - w[0].1) / (w[1].0 - w[0].0).max(1e-9))
        .collect()
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let mix = workload::Mix {
        pools: 1_000,
        endpoints_per_pool: 10,
        rate: 10_000,
    };
    // The processor checks the upper bound itself.
    anyhow::ensure!(args.lanes.iter().all(|l| *l >= 1), "--lanes: each at least 1");
    if args.offline {
        let n = args.signals.iter().copied().max().unwrap_or(1_000_000);
        offline_breakdown(&workload::generate(&mix, n, 42));
        return Ok(());
    }
    let mut sizes = Vec::new();
    for &n in &args.signals {
        let name = stack::unique(&format!("e2e{n}"));
        let topics = stack::Topics::create(&name, args.partitions, stack::Stamp::CreateTime).await;
        let input = workload::generate(&mix, n, 42);
        eprintln!("producing {} signals to {}", input.len(), topics.signals);
        let t = Instant::now();
        vitals_testkit::produce(&stack::producer(), &topics.signals, stack::inputs(&input)).await;
        eprintln!("  produced in {:.1} s", t.elapsed().as_secs_f64());
        sizes.push((n, name, topics, input));
    }

    let db = PgPoolOptions::new()
        .max_connections(2)
        .connect(&stack::database_url())
        .await?;
    let mut results: Vec<SizeResults> = sizes
        .iter()
        .map(|(n, ..)| SizeResults {
            n: *n,
            bare: Vec::new(),
            peer: Vec::new(),
            by_lanes: args
                .lanes
                .iter()
                .map(|l| LaneResults {
                    lanes: *l,
                    procs: Vec::new(),
                    wide: Vec::new(),
                })
                .collect(),
        })
        .collect();
    for run in 1..=args.runs {
        for (i, (n, name, topics, _)) in sizes.iter().enumerate() {
            let bare_run = bare_loop(&topics.signals, &format!("{name}-bare-{run}"), *n).await?;
            let bare = bare_run.rate;
            eprintln!(
                "run {run}, {n} signals: bare consumer+decode {bare:.0} signals/s, {:.2} µs CPU per signal (broker {:.2})",
                bare_run.cpu_us, bare_run.cpu_broker_us
            );
            results[i].bare.push(bare_run);
            for by in results[i].by_lanes.iter_mut() {
                let lanes = by.lanes;
                if lanes > 1 {
                    let wide = bare_lanes(&topics.signals, args.partitions, lanes, *n).await?;
                    eprintln!(
                        "run {run}, {n} signals: bare loop of {lanes} consumers {:.0} signals/s, {:.2} µs CPU per signal",
                        wide.rate, wide.cpu_us
                    );
                    by.wide.push(wide);
                }
                let schema = format!("{name}_{run}_l{lanes}");
                let mut extra = args.extra.clone();
                extra.extend(["--lanes".to_string(), lanes.to_string()]);
                let p = processor_run(&db, topics, &schema, *n, &extra).await?;
                eprintln!(
                    "run {run}, {n} signals: processor, {lanes} lane(s) {:.0} signals/s, ratio {:.2}; CPU µs/signal: processor {:.2}, postgres {:.2}, broker {:.2}",
                    p.rate,
                    p.rate / bare,
                    p.cpu_processor_us,
                    p.cpu_postgres_us,
                    p.cpu_broker_us
                );
                by.procs.push(p);
            }
            if let Some(dir) = &args.peer {
                let peer = peer_run(
                    dir,
                    &topics.signals,
                    &format!("{name}-peer-{run}"),
                    *n,
                    args.peer_threads,
                    &args.peer_store,
                )
                .await?;
                eprintln!(
                    "run {run}, {n} signals: Kafka Streams peer ({} thread(s), {} store, exactly once) {:.0} signals/s; CPU µs/signal: peer {:.2}, broker {:.2}",
                    args.peer_threads, args.peer_store, peer.rate, peer.cpu_peer_us, peer.cpu_broker_us
                );
                results[i].peer.push(peer);
            }
        }
    }

    println!(
        "e2e-bench: {} partitions, lanes {:?}, {} interleaved run(s) per size",
        args.partitions, args.lanes, args.runs
    );
    for r in &results {
        report(r);
    }
    let (_, _, _, input) = sizes.iter().max_by_key(|s| s.0).expect("at least one size");
    offline_breakdown(input);
    for (_, name, _, _) in &sizes {
        // Topics stay (they are named per run); the schemas went after each run.
        eprintln!("topic {name}-signals kept");
    }
    Ok(())
}

/// Every run of one size.
struct SizeResults {
    n: usize,
    /// The bare loop of one consumer.
    bare: Vec<BareRun>,
    peer: Vec<PeerRun>,
    by_lanes: Vec<LaneResults>,
}

/// The processor's runs with one number of lanes, and the bare loop with as many consumers.
struct LaneResults {
    lanes: usize,
    procs: Vec<ProcRun>,
    /// Empty for one lane (the bare loop of one consumer is that).
    wide: Vec<BareRun>,
}

fn report(r: &SizeResults) {
    let n = r.n;
    let bare: Vec<f64> = r.bare.iter().map(|b| b.rate).collect();
    let bare_cpu: Vec<f64> = r.bare.iter().map(|b| b.cpu_us).collect();
    println!("\n{n} signals");
    println!("  bare consumer + decode   {}", spread(&bare, "signals/s"));
    println!("  CPU, bare loop           {}", spread(&bare_cpu, "µs/signal"));
    let bare_broker: Vec<f64> = r.bare.iter().map(|b| b.cpu_broker_us).collect();
    println!("  CPU, broker for it       {}", spread(&bare_broker, "µs/signal"));
    if !r.peer.is_empty() {
        let rates: Vec<f64> = r.peer.iter().map(|p| p.rate).collect();
        let per = |f: fn(&PeerRun) -> f64| spread(&r.peer.iter().map(f).collect::<Vec<_>>(), "µs/signal");
        println!(
            "  Kafka Streams peer       {}   ({} changes)",
            spread(&rates, "signals/s"),
            r.peer[0].changes
        );
        println!("  CPU, peer                {}", per(|p| p.cpu_peer_us));
        println!("  CPU, broker with peer    {}", per(|p| p.cpu_broker_us));
        println!(
            "  CPU, the two             {}",
            per(|p| p.cpu_peer_us + p.cpu_broker_us)
        );
    }
    for by in &r.by_lanes {
        let procs = &by.procs;
        let lanes = by.lanes;
        let rates: Vec<f64> = procs.iter().map(|p| p.rate).collect();
        let ratios: Vec<f64> = rates.iter().zip(&bare).map(|(p, b)| p / b).collect();
        println!(
            "\n  processor with {lanes} lane(s) ({} transitions recorded)",
            procs.first().map_or(0, |p| p.transitions)
        );
        println!("  processor → Postgres     {}", spread(&rates, "signals/s"));
        println!("  ratio to one consumer    {}   target ≥ 0.8", spread(&ratios, ""));
        if !r.peer.is_empty() {
            let peer: Vec<f64> = r.peer.iter().map(|p| p.rate).collect();
            let ratios: Vec<f64> = rates.iter().zip(&peer).map(|(p, b)| p / b).collect();
            println!("  ratio to the peer        {}   target ≥ 2.5", spread(&ratios, ""));
        }
        if !by.wide.is_empty() {
            let wide: Vec<f64> = by.wide.iter().map(|b| b.rate).collect();
            let ratios: Vec<f64> = rates.iter().zip(&wide).map(|(p, b)| p / b).collect();
            let cpu: Vec<f64> = by.wide.iter().map(|b| b.cpu_us).collect();
            println!("  bare, {lanes} consumers        {}", spread(&wide, "signals/s"));
            println!("  ratio to {lanes} consumers     {}", spread(&ratios, ""));
            println!("  CPU, bare {lanes} consumers    {}", spread(&cpu, "µs/signal"));
        }
        let per = |f: fn(&ProcRun) -> f64| spread(&procs.iter().map(f).collect::<Vec<_>>(), "µs/signal");
        println!("  CPU, processor           {}", per(|p| p.cpu_processor_us));
        println!("  CPU, Postgres            {}", per(|p| p.cpu_postgres_us));
        println!("  CPU, Kafka broker        {}", per(|p| p.cpu_broker_us));
        println!(
            "  Postgres WAL             {}   {}",
            spread(&procs.iter().map(|p| p.wal_bytes).collect::<Vec<_>>(), "bytes/signal"),
            spread(&procs.iter().map(|p| p.wal_mb_s).collect::<Vec<_>>(), "MB/s")
        );
        println!(
            "  processor peak RSS       {}",
            spread(&procs.iter().map(|p| p.peak_rss_mb).collect::<Vec<_>>(), "MB")
        );
        println!(
            "  CPU, the three           {}",
            per(|p| p.cpu_processor_us + p.cpu_postgres_us + p.cpu_broker_us)
        );
        // Does the rate fall as the run grows? The median rate of each fifth, over the runs.
        let by_fifth = |runs: Vec<&Vec<f64>>| {
            (0..5)
                .map(|k| {
                    let v: Vec<f64> = runs.iter().filter_map(|f| f.get(k).copied()).collect();
                    if v.is_empty() {
                        "-".to_string()
                    } else {
                        format!("{:.0}", median(&v))
                    }
                })
                .collect::<Vec<_>>()
                .join(" / ")
        };
        println!(
            "  rate by fifth of the run, bare loop   {} signals/s",
            by_fifth(r.bare.iter().map(|b| &b.fifths).collect())
        );
        println!(
            "  rate by fifth of the run, processor   {} signals/s",
            by_fifth(procs.iter().map(|p| &p.fifths).collect())
        );
        println!(
            "  outbox events unpublished at the last commit: {}",
            procs
                .iter()
                .map(|p| p.outbox_backlog.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        );
        println!("  where the processor's time went (median over runs, µs per signal, summed over lanes; phases overlap: the writer runs beside the loop):");
        let phases: Vec<&String> = procs.first().map(|p| p.phases.keys().collect()).unwrap_or_default();
        for phase in phases {
            let v: Vec<f64> = procs
                .iter()
                .map(|p| p.phases.get(phase).copied().unwrap_or(0.0) * 1e6 / n as f64)
                .collect();
            println!("    {phase:<18} {:>8.3}", median(&v));
        }
        let mut by_statement: BTreeMap<&String, (Vec<f64>, Vec<i64>)> = BTreeMap::new();
        for p in procs {
            for (q, (us, calls)) in &p.statements {
                let e = by_statement.entry(q).or_default();
                e.0.push(*us);
                e.1.push(*calls);
            }
        }
        if !by_statement.is_empty() {
            let mut rows: Vec<(f64, i64, &String)> = by_statement
                .into_iter()
                .map(|(q, (us, calls))| (median(&us), calls.iter().sum::<i64>() / calls.len() as i64, q))
                .collect();
            rows.sort_by(|a, b| b.0.total_cmp(&a.0));
            let total: f64 = rows.iter().map(|r| r.0).sum();
            println!(
                "  Postgres' time by statement (pg_stat_statements, median over runs, µs per signal; all: {total:.3}):"
            );
            for (us, calls, q) in rows.iter().take(14) {
                println!("    {us:>7.3} {calls:>8} calls  {q}");
            }
        }
    }
}

/// One run of the Kafka Streams peer.
struct PeerRun {
    rate: f64,
    /// CPU µs per signal of the peer's JVM and of the broker, from the peer's first record to
    /// its last (start-up and group join left out).
    cpu_peer_us: f64,
    cpu_broker_us: f64,
    changes: i64,
}

/// Run the Kafka Streams peer over `topic` until it has read `n` records.
async fn peer_run(
    dir: &std::path::Path,
    topic: &str,
    app: &str,
    n: usize,
    threads: usize,
    store: &str,
) -> anyhow::Result<PeerRun> {
    use std::io::BufRead;
    let out = stack::Topics::create(app, 1, stack::Stamp::CreateTime).await;
    let cp = format!("{0}/target/classes:{0}/target/lib/*", dir.display());
    let schemas = concat!(env!("CARGO_MANIFEST_DIR"), "/../../schemas");
    let mut child = std::process::Command::new("java")
        .args([
            "-cp",
            &cp,
            "vitals.peer.Peer",
            "--brokers",
            &stack::brokers(),
            "--topic",
            topic,
        ])
        .args([
            "--output",
            &out.changes,
            "--records",
            &n.to_string(),
            "--schemas",
            schemas,
        ])
        .args(["--threads", &threads.to_string(), "--app-id", app, "--store", store])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .map_err(|e| anyhow::anyhow!("cannot start java for the peer: {e}"))?;
    let pid = child.id();
    let stdout = child.stdout.take().expect("piped");
    // (peer CPU, all java CPU) at the first record; the same at the last; the result line.
    let lines = tokio::task::spawn_blocking(move || {
        let mut first = None;
        for line in std::io::BufReader::new(stdout).lines().map_while(Result::ok) {
            if line == "peer: first record" {
                first = Some((cpu::of_pid(pid), cpu::of_command("java")));
            } else if line.starts_with("peer: ") {
                return Some((first?, (cpu::of_pid(pid), cpu::of_command("java")), line));
            }
        }
        None
    })
    .await?;
    let status = tokio::task::spawn_blocking(move || child.wait()).await??;
    let Some(((peer0, java0), (peer1, java1), line)) = lines else {
        anyhow::bail!("the peer ended ({status}) without a result");
    };
    // "peer: N records in S s, R records/s, C changes, D not decoded"
    let words: Vec<&str> = line.split_whitespace().collect();
    let secs: f64 = words.get(4).and_then(|w| w.parse().ok()).unwrap_or(f64::NAN);
    let changes: i64 = words.get(8).and_then(|w| w.parse().ok()).unwrap_or(-1);
    let per = |s: f64| s * 1e6 / n as f64;
    Ok(PeerRun {
        rate: n as f64 / secs,
        cpu_peer_us: per(peer1 - peer0),
        cpu_broker_us: per((java1 - java0) - (peer1 - peer0)),
        changes,
    })
}

/// A consumer of the bare loops, from the earliest offset, with the processor's fetch settings,
/// so that the ratio measures the processor's work and not a difference in consumer tuning.
fn bare_consumer(group: &str) -> anyhow::Result<StreamConsumer> {
    Ok(ClientConfig::new()
        .set("bootstrap.servers", stack::brokers())
        .set("group.id", group)
        .set("auto.offset.reset", "earliest")
        .set("enable.auto.commit", "false")
        .set("fetch.wait.max.ms", "20")
        .set("max.partition.fetch.bytes", "8388608")
        .create()?)
}

/// The bare loop: consume and decode, nothing else. Signals per second.
async fn bare_loop(topic: &str, group: &str, n: usize) -> anyhow::Result<BareRun> {
    let c = bare_consumer(group)?;
    c.subscribe(&[topic])?;
    let (cpu0, broker0) = (cpu::of_pid(std::process::id()), cpu::of_command("java"));
    let mut seen = 0usize;
    let mut decoded = 0usize;
    let mut start = None;
    // (seconds, records) at the first record and at each fifth; a comparison per record.
    let mut marks = Vec::new();
    let mut next_mark = 1;
    while seen < n {
        let m = c.recv().await?;
        let s = *start.get_or_insert_with(Instant::now);
        if decode_signal(m.payload().unwrap_or_default()).is_ok() {
            decoded += 1;
        }
        seen += 1;
        if seen == next_mark {
            marks.push((s.elapsed().as_secs_f64(), seen as f64));
            next_mark = (marks.len() * n / 5).max(seen + 1);
        }
    }
    anyhow::ensure!(decoded == n, "the bare loop decoded {decoded} of {n}");
    Ok(BareRun {
        rate: n as f64 / start.map_or(f64::INFINITY, |s| s.elapsed().as_secs_f64()),
        cpu_us: (cpu::of_pid(std::process::id()) - cpu0) * 1e6 / n as f64,
        cpu_broker_us: (cpu::of_command("java") - broker0) * 1e6 / n as f64,
        fifths: fifths(&marks, n as f64),
    })
}

/// The bare loop with the processor's parallelism: `lanes` consumers, each on a task of its
/// own, assigned every `lanes`-th partition (no group protocol: with no committed offsets a
/// rebalance would read records twice), consuming and decoding until `n` are read in all.
async fn bare_lanes(topic: &str, partitions: i32, lanes: usize, n: usize) -> anyhow::Result<BareRun> {
    use rdkafka::TopicPartitionList;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::{Arc, OnceLock};
    let seen = Arc::new(AtomicUsize::new(0));
    let decoded = Arc::new(AtomicUsize::new(0));
    let start: Arc<OnceLock<Instant>> = Arc::new(OnceLock::new());
    let (cpu0, broker0) = (cpu::of_pid(std::process::id()), cpu::of_command("java"));
    let mut tasks = tokio::task::JoinSet::new();
    for lane in 0..lanes {
        let c = bare_consumer(&stack::unique("e2e-bare-lanes"))?;
        let mut tpl = TopicPartitionList::new();
        for p in (0..partitions).filter(|p| *p as usize % lanes == lane) {
            tpl.add_partition_offset(topic, p, rdkafka::Offset::Beginning)?;
        }
        c.assign(&tpl)?;
        let (seen, decoded, start) = (seen.clone(), decoded.clone(), start.clone());
        tasks.spawn(async move {
            while seen.load(Ordering::Relaxed) < n {
                let Ok(Ok(m)) = tokio::time::timeout(Duration::from_millis(100), c.recv()).await else {
                    continue;
                };
                start.get_or_init(Instant::now);
                if decode_signal(m.payload().unwrap_or_default()).is_ok() {
                    decoded.fetch_add(1, Ordering::Relaxed);
                }
                seen.fetch_add(1, Ordering::Relaxed);
            }
        });
    }
    let mut samples = Vec::new();
    while seen.load(Ordering::Relaxed) < n {
        if let Some(s) = start.get() {
            samples.push((s.elapsed().as_secs_f64(), seen.load(Ordering::Relaxed) as f64));
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let secs = start.get().map_or(f64::INFINITY, |s| s.elapsed().as_secs_f64());
    samples.push((secs, n as f64));
    while tasks.join_next().await.is_some() {}
    let decoded = decoded.load(Ordering::Relaxed);
    anyhow::ensure!(
        decoded == n,
        "the bare loop of {lanes} consumers decoded {decoded} of {n}"
    );
    Ok(BareRun {
        rate: n as f64 / secs,
        cpu_us: (cpu::of_pid(std::process::id()) - cpu0) * 1e6 / n as f64,
        cpu_broker_us: (cpu::of_command("java") - broker0) * 1e6 / n as f64,
        fifths: fifths(&samples, n as f64),
    })
}

/// The processor on a fresh schema: rate from its first committed batch to the last offset in
/// Postgres.
async fn processor_run(
    db: &sqlx::PgPool,
    topics: &stack::Topics,
    schema: &str,
    n: usize,
    extra: &[String],
) -> anyhow::Result<ProcRun> {
    let port = vitals_testkit::free_port();
    let addr = format!("127.0.0.1:{port}");
    let mut flags = vec!["--http-addr", &addr];
    flags.extend(extra.iter().map(String::as_str));
    // Statement statistics count from here (an error: the stack runs without them).
    let counting = sqlx::query("SELECT pg_stat_statements_reset()")
        .execute(db)
        .await
        .is_ok();
    let (pg0, broker0) = (cpu::of_command("postgres"), cpu::of_command("java"));
    let wal = "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::float8";
    let wal0: f64 = sqlx::query_scalar(wal).fetch_one(db).await?;
    let mut child = stack::start_processor(topics, schema, schema, &flags);
    let pid = child.child.id();
    let query = format!("SELECT coalesce(sum(greatest(next_offset,0)),0)::bigint FROM \"{schema}\".consumer_offsets");
    let deadline = Instant::now() + Duration::from_secs(3600);
    let (mut first, mut first_at) = (0i64, None);
    let mut last_report = Instant::now();
    let mut samples = Vec::new();
    loop {
        let c: i64 = sqlx::query_scalar(&query).fetch_one(db).await.unwrap_or(0);
        if c > 0 && first_at.is_none() {
            first = c;
            first_at = Some(Instant::now());
        }
        if let Some(t) = first_at {
            samples.push((t.elapsed().as_secs_f64(), c as f64));
        }
        if c >= n as i64 {
            break;
        }
        if last_report.elapsed() > Duration::from_secs(10) {
            eprintln!("  processor: {c} of {n} in Postgres");
            last_report = Instant::now();
        }
        anyhow::ensure!(Instant::now() < deadline, "processor did not finish");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let secs = first_at.map_or(f64::INFINITY, |t| t.elapsed().as_secs_f64());
    let cpu_processor = cpu::of_pid(pid);
    let (pg1, broker1) = (cpu::of_command("postgres"), cpu::of_command("java"));
    let metrics = vitals_testkit::http_get(port, "/metrics").await.unwrap_or_default();
    let statements = if counting {
        statements(db, n).await?
    } else {
        BTreeMap::new()
    };
    let wal1: f64 = sqlx::query_scalar(wal).fetch_one(db).await?;
    let peak_rss_mb = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .map_or(f64::NAN, |kb| kb / 1024.0);
    let outbox_backlog: i64 = sqlx::query_scalar(&format!(
        "SELECT coalesce(sum(events), 0)::int8 FROM \"{schema}\".outbox"
    ))
    .fetch_one(db)
    .await?;
    child.terminate();
    let transitions: i64 = sqlx::query_scalar(&format!("SELECT count(*) FROM \"{schema}\".transitions"))
        .fetch_one(db)
        .await?;
    if std::env::var_os("E2E_KEEP_SCHEMA").is_none() {
        sqlx::query(&format!("DROP SCHEMA \"{schema}\" CASCADE"))
            .execute(db)
            .await?;
    }
    let per = |s: f64| s * 1e6 / n as f64;
    Ok(ProcRun {
        rate: (n as i64 - first) as f64 / secs,
        transitions,
        cpu_processor_us: per(cpu_processor),
        cpu_postgres_us: per(pg1 - pg0),
        cpu_broker_us: per(broker1 - broker0),
        phases: phases(&metrics),
        outbox_backlog,
        statements,
        wal_bytes: (wal1 - wal0) / n as f64,
        wal_mb_s: (wal1 - wal0) / 1e6 / secs,
        peak_rss_mb,
        fifths: fifths(&samples, n as f64),
    })
}

/// Postgres' execution time by statement since the reset, µs per signal, with the calls; the
/// statements of this benchmark and of the statistics themselves left out.
async fn statements(db: &sqlx::PgPool, n: usize) -> anyhow::Result<BTreeMap<String, (f64, i64)>> {
    let rows: Vec<(String, f64, i64)> = sqlx::query_as(
        "SELECT query, total_exec_time, calls FROM pg_stat_statements
         WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
           AND query NOT LIKE '%pg_stat_statements%' AND query NOT LIKE '%coalesce(sum(greatest(next_offset%'",
    )
    .fetch_all(db)
    .await?;
    let mut out: BTreeMap<String, (f64, i64)> = BTreeMap::new();
    for (query, ms, calls) in rows {
        let words: Vec<&str> = query.split_whitespace().collect();
        let mut label = words.join(" ");
        if label.len() > 90 {
            let cut = (0..=90).rev().find(|i| label.is_char_boundary(*i)).unwrap_or(0);
            label.truncate(cut);
        }
        let e = out.entry(label).or_default();
        e.0 += ms * 1e3 / n as f64;
        e.1 += calls;
    }
    Ok(out)
}

/// `vitals_processor_time_seconds_total{phase="..."} v` samples.
fn phases(metrics: &str) -> BTreeMap<String, f64> {
    metrics
        .lines()
        .filter_map(|l| l.strip_prefix("vitals_processor_time_seconds_total{phase=\""))
        .filter_map(|l| {
            let (phase, rest) = l.split_once("\"}")?;
            Some((phase.to_string(), rest.trim().parse().ok()?))
        })
        .collect()
}

/// The record step's parts, without Kafka or Postgres, on one core: decode, engine, the rest of
/// the step (validation and batch rows), and a snapshot of the whole fleet.
fn offline_breakdown(input: &[(i64, Signal)]) {
    let payloads: Vec<Vec<u8>> = input.iter().map(|(_, s)| encode_signal(s).expect("encodes")).collect();
    let n = input.len() as f64;
    let t = Instant::now();
    for p in &payloads {
        decode_signal(p).expect("decodes");
    }
    let decode = t.elapsed().as_secs_f64();
    let mut engine = Engine::new(Policy::default());
    let mut out = Vec::new();
    let mut decisions = 0usize;
    let mut by_million = Vec::new();
    // A digest of every decision, so that a change meant to be faster can be checked to decide
    // the same things.
    let mut digest = std::collections::hash_map::DefaultHasher::new();
    let t = Instant::now();
    for chunk in input.chunks(1_000_000) {
        let c = Instant::now();
        for (at, s) in chunk {
            engine.apply(*at, s, &mut out);
            decisions += out.len();
            for d in out.drain(..) {
                std::hash::Hash::hash(&format!("{d:?}"), &mut digest);
            }
        }
        by_million.push((c.elapsed().as_secs_f64() * 1e6 / chunk.len() as f64, decisions));
        decisions = 0;
    }
    let apply = t.elapsed().as_secs_f64();
    let topics = Topics {
        signals: "s".into(),
        changes: "c".into(),
        state: "st".into(),
        dlq: "d".into(),
    };
    let mut part = Partition::new(0, 1, Engine::new(Policy::default()), None, None);
    let mut batch = BatchWrite::default();
    let t = Instant::now();
    for (i, ((at, _), p)) in input.iter().zip(&payloads).enumerate() {
        part.step(i as i64, Some(at / 1000), None, Some(p), &topics, &mut batch);
        if i % 5_000 == 4_999 {
            batch = BatchWrite::default();
        }
    }
    let step = t.elapsed().as_secs_f64();
    let t = Instant::now();
    let snap = part.engine().partition_snapshot();
    let snapshot = t.elapsed().as_secs_f64();
    let bytes: usize = snap.pools.iter().map(|(_, b)| b.len()).sum();
    println!(
        "\nrecord step offline, one core, {} signals (µs per signal):",
        input.len()
    );
    println!("    decode             {:>8.3}", decode * 1e6 / n);
    println!("    engine             {:>8.3}", apply * 1e6 / n);
    println!("      decisions digest {:016x}", std::hash::Hasher::finish(&digest));
    for (i, (us, d)) in by_million.iter().enumerate() {
        println!("      signals {}M–{}M: {us:.3} µs/signal, {d} decisions", i, i + 1);
    }
    println!(
        "    validate + rows    {:>8.3}   (the whole step {:.3})",
        (step - decode - apply) * 1e6 / n,
        step * 1e6 / n
    );
    println!(
        "    snapshot of all {} pools: {:.1} ms, {:.1} MB",
        snap.pools.len(),
        snapshot * 1e3,
        bytes as f64 / 1e6
    );
}
