//! Scale-out, measured: 1, 2 and 4 processors in one consumer group over one 16-partition
//! signals topic, each count on a fresh schema. The processors after the first join while the
//! first is working (a rebalance under load). Prints, per count: the group's total rate, how the
//! records spread over the processors (`vitals_processor_signals`), CPU per signal of each
//! processor and of Postgres and the broker, and whether the audit log is the same as with one
//! processor (the digest of every transition and pool event) — a rebalance must lose and double
//! nothing. On this machine the processors share two cores: what the figures show is that the
//! total holds and the work spreads, not a speed-up.
//!
//!   scripts/stack.sh up && cargo build --release -p vitals-processor -p vitals-bench
//!   target/release/scale-bench [--signals 5000000] [--processors 1,2,4] [--join-after-secs 0.5]

use clap::Parser;
use sqlx::postgres::PgPoolOptions;
use std::time::{Duration, Instant};
use vitals_bench::{cpu, stack, workload};

#[derive(Parser)]
struct Args {
    #[arg(long, default_value_t = 5_000_000)]
    signals: usize,
    #[arg(long, default_value_t = 16)]
    partitions: i32,
    /// Processor counts to run, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1,2,4")]
    processors: Vec<usize>,
    /// Each processor after the first starts this long after the one before (under load).
    #[arg(long, default_value_t = 0.5)]
    join_after_secs: f64,
}

struct Run {
    processors: usize,
    rate: f64,
    signals_each: Vec<f64>,
    cpu_each_us: Vec<f64>,
    cpu_postgres_us: f64,
    cpu_broker_us: f64,
    transitions: i64,
    digest: String,
}

fn metric(metrics: &str, name: &str) -> f64 {
    metrics
        .lines()
        .filter(|l| l.starts_with(name) && !l.starts_with('#'))
        .filter_map(|l| l.rsplit_once(' ').and_then(|(_, v)| v.trim().parse::<f64>().ok()))
        .sum()
}

async fn digest(db: &sqlx::PgPool, schema: &str) -> anyhow::Result<(i64, String)> {
    let q = format!(
        "SELECT count(*), coalesce(md5(string_agg(concat_ws('|', pool, endpoint, seq, transition_id, from_state,
           to_state, weight, ramp_ms, retry_at, reason_code, reason, window_calls,
           trigger_ids::text, policy_version, evidence::text, stream_time),
           E'\\n' ORDER BY pool, endpoint, seq)), '') FROM \"{schema}\".transitions"
    );
    let (n, d): (i64, String) = sqlx::query_as(&q).fetch_one(db).await?;
    let q = format!(
        "SELECT coalesce(md5(string_agg(concat_ws('|', pool, seq, endpoints, healthy, ejected, healthy_fraction,
           panic, correlated_outage, reason, policy_version, stream_time), E'\\n' ORDER BY pool, seq)), '')
         FROM \"{schema}\".pool_events"
    );
    let p: String = sqlx::query_scalar(&q).fetch_one(db).await?;
    Ok((n, format!("{d}/{p}")))
}

async fn run(db: &sqlx::PgPool, topics: &stack::Topics, name: &str, k: usize, args: &Args) -> anyhow::Result<Run> {
    let schema = format!("{name}_p{k}");
    let n = args.signals;
    let (pg0, broker0) = (cpu::of_command("postgres"), cpu::of_command("java"));
    let mut procs = Vec::new();
    let query = format!("SELECT coalesce(sum(greatest(next_offset,0)),0)::bigint FROM \"{schema}\".consumer_offsets");
    let start = Instant::now();
    let mut first_at = None;
    let mut next_join = Instant::now();
    let deadline = Instant::now() + Duration::from_secs(3600);
    let mut last_report = Instant::now();
    loop {
        if procs.len() < k && Instant::now() >= next_join {
            let port = vitals_testkit::free_port();
            let addr = format!("127.0.0.1:{port}");
            let p = stack::start_processor(topics, &schema, &schema, &["--http-addr", &addr]);
            eprintln!(
                "  processor {} of {k} started at {:.1} s",
                procs.len() + 1,
                start.elapsed().as_secs_f64()
            );
            procs.push((p, port));
            next_join = Instant::now() + Duration::from_secs_f64(args.join_after_secs);
        }
        let c: i64 = sqlx::query_scalar(&query).fetch_one(db).await.unwrap_or(0);
        if c > 0 && first_at.is_none() {
            first_at = Some((Instant::now(), c));
        }
        if c >= n as i64 && procs.len() == k {
            break;
        }
        if last_report.elapsed() > Duration::from_secs(10) {
            eprintln!("  {c} of {n} in Postgres");
            last_report = Instant::now();
        }
        anyhow::ensure!(Instant::now() < deadline, "the processors did not finish");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (t1, first) = first_at.expect("records were consumed");
    let secs = t1.elapsed().as_secs_f64();
    let (pg1, broker1) = (cpu::of_command("postgres"), cpu::of_command("java"));
    let mut signals_each = Vec::new();
    let mut cpu_each_us = Vec::new();
    for (p, port) in &procs {
        let m = vitals_testkit::http_get(*port, "/metrics").await.unwrap_or_default();
        signals_each.push(metric(&m, "vitals_processor_signals"));
        cpu_each_us.push(cpu::of_pid(p.child.id()) * 1e6 / n as f64);
    }
    for (mut p, _) in procs {
        p.terminate();
    }
    let (transitions, digest) = digest(db, &schema).await?;
    sqlx::query(&format!("DROP SCHEMA \"{schema}\" CASCADE"))
        .execute(db)
        .await?;
    let per = |s: f64| s * 1e6 / n as f64;
    Ok(Run {
        processors: k,
        rate: (n as i64 - first) as f64 / secs,
        signals_each,
        cpu_each_us,
        cpu_postgres_us: per(pg1 - pg0),
        cpu_broker_us: per(broker1 - broker0),
        transitions,
        digest,
    })
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let mix = workload::Mix {
        pools: 1_000,
        endpoints_per_pool: 10,
        rate: 10_000,
    };
    let name = stack::unique("scale");
    let topics = stack::Topics::create(&name, args.partitions, stack::Stamp::CreateTime).await;
    let input = workload::generate(&mix, args.signals, 42);
    eprintln!("producing {} signals to {}", input.len(), topics.signals);
    vitals_testkit::produce(&stack::producer(), &topics.signals, stack::inputs(&input)).await;
    let db = PgPoolOptions::new()
        .max_connections(2)
        .connect(&stack::database_url())
        .await?;
    let mut runs = Vec::new();
    for &k in &args.processors {
        eprintln!("{k} processor(s):");
        runs.push(run(&db, &topics, &name, k, &args).await?);
    }
    println!(
        "scale-bench: {} signals over {} partitions (1,000 pools of 10 endpoints); processors join {} s apart",
        args.signals, args.partitions, args.join_after_secs
    );
    let reference = runs.first().map(|r| r.digest.clone()).unwrap_or_default();
    for r in &runs {
        let total: f64 = r.signals_each.iter().sum();
        let shares: Vec<String> = r
            .signals_each
            .iter()
            .map(|s| format!("{:.0} %", (100.0 * s / total.max(1.0)).abs()))
            .collect();
        let cpu: Vec<String> = r.cpu_each_us.iter().map(|c| format!("{c:.2}")).collect();
        println!(
            "{} processor(s): {:.0} signals/s in total; records each {}; CPU µs/signal each {} (sum {:.2}); Postgres {:.2}, broker {:.2}; {} transitions, audit log {}",
            r.processors,
            r.rate,
            shares.join(" / "),
            cpu.join(" / "),
            r.cpu_each_us.iter().sum::<f64>(),
            r.cpu_postgres_us,
            r.cpu_broker_us,
            r.transitions,
            if r.digest == reference { "identical to one processor's" } else { "DIFFERENT from one processor's" }
        );
    }
    anyhow::ensure!(
        runs.iter().all(|r| r.digest == reference),
        "a processor count changed the audit log"
    );
    Ok(())
}
