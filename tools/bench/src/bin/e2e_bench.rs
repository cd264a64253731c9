//! End-to-end throughput: real Kafka → processor → Postgres, against a bare rdkafka consumer that
//! only decodes the same topic, in the same run.
//!
//!   scripts/stack.sh up && cargo build --release -p vitals-processor -p vitals-bench
//!   target/release/e2e-bench [--signals N]

use clap::Parser;
use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::{ClientConfig, Message};
use sqlx::postgres::PgPoolOptions;
use std::time::{Duration, Instant};
use vitals_bench::{stack, workload};
use vitals_contracts::decode_signal;

#[derive(Parser)]
struct Args {
    #[arg(long, default_value_t = 1_000_000)]
    signals: usize,
    #[arg(long, default_value_t = 8)]
    partitions: i32,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let name = stack::unique("e2e");
    let topics = stack::Topics::create(&name, args.partitions, stack::Stamp::CreateTime).await;
    let mix = workload::Mix {
        pools: 1_000,
        endpoints_per_pool: 10,
        rate: 10_000,
    };
    let input = workload::generate(&mix, args.signals, 42);
    eprintln!("producing {} signals to {}", input.len(), topics.signals);
    let p = stack::producer();
    let t = Instant::now();
    vitals_testkit::produce(&p, &topics.signals, stack::inputs(&input)).await;
    eprintln!("  produced in {:.1} s", t.elapsed().as_secs_f64());

    // 1. The bare loop: consume and decode, nothing else.
    let c: StreamConsumer = ClientConfig::new()
        .set("bootstrap.servers", stack::brokers())
        .set("group.id", format!("{name}-bare"))
        .set("auto.offset.reset", "earliest")
        .set("enable.auto.commit", "false")
        .create()?;
    c.subscribe(&[&topics.signals])?;
    let mut n = 0usize;
    let mut decoded = 0usize;
    let mut start = None;
    while n < input.len() {
        let m = c.recv().await?;
        start.get_or_insert_with(Instant::now);
        if decode_signal(m.payload().unwrap_or_default()).is_ok() {
            decoded += 1;
        }
        n += 1;
    }
    let bare = start.map_or(0.0, |s| s.elapsed().as_secs_f64());
    drop(c);
    eprintln!("bare consumer+decode: {n} records ({decoded} decoded) in {bare:.2} s");

    // 2. The processor: from its first committed batch to the last offset in Postgres.
    let pool = PgPoolOptions::new()
        .max_connections(2)
        .connect(&stack::database_url())
        .await?;
    let mut child = stack::start_processor(&topics, &name, &name, &[]);
    let query = format!("SELECT coalesce(sum(greatest(next_offset,0)),0)::bigint FROM \"{name}\".consumer_offsets");
    let consumed = |pool: sqlx::PgPool, q: String| async move {
        sqlx::query_scalar::<_, i64>(&q).fetch_one(&pool).await.unwrap_or(0)
    };
    let deadline = Instant::now() + Duration::from_secs(1800);
    let (mut first, mut first_at) = (0i64, None);
    let mut last_report = Instant::now();
    loop {
        let c = consumed(pool.clone(), query.clone()).await;
        if c > 0 && first_at.is_none() {
            first = c;
            first_at = Some(Instant::now());
        }
        if c >= input.len() as i64 {
            break;
        }
        if last_report.elapsed() > Duration::from_secs(5) {
            eprintln!("  processor: {c} of {} in Postgres", input.len());
            last_report = Instant::now();
        }
        anyhow::ensure!(Instant::now() < deadline, "processor did not finish");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let proc_secs = first_at.map_or(0.0, |t| t.elapsed().as_secs_f64());
    let counted = input.len() as i64 - first;
    child.terminate();
    let transitions: i64 = sqlx::query_scalar(&format!("SELECT count(*) FROM \"{name}\".transitions"))
        .fetch_one(&pool)
        .await?;
    let _ = sqlx::query(&format!("DROP SCHEMA \"{name}\" CASCADE"))
        .execute(&pool)
        .await;

    let bare_rate = n as f64 / bare;
    let proc_rate = counted as f64 / proc_secs;
    println!(
        "e2e-bench: {} signals, {} partitions, {} transitions recorded",
        input.len(),
        args.partitions,
        transitions
    );
    println!("  bare consumer + decode   {bare_rate:>10.0} signals/s");
    println!("  processor → Postgres     {proc_rate:>10.0} signals/s ({counted} signals after its first commit)");
    println!(
        "  ratio                    {:>10.2} (target ≥ 0.5)",
        proc_rate / bare_rate
    );
    Ok(())
}
