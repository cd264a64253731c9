//! What the audit log costs Postgres, away from Kafka and from the processor's CPU: the record
//! step (the processor's own `Partition`) runs offline over e2e-bench's workload and its output
//! is cut into batches of `--batch-records` records; each batch is then written as the
//! processor's writer writes it (`AuditLog::write_batch`, a first attempt) into a fresh schema,
//! and its outbox is read and deleted as the relay does (without publishing). Postgres' CPU (every
//! process of it, from /proc), its write-ahead log and its time by statement are counted over the
//! writes alone, and given per transition. Inside e2e-bench a statement's time also counts its
//! wait for one of the machine's cores, which the processor and the broker share.
//!
//!   target/release/store-bench [--signals 1000000] [--batch-records 10000] [--runs 3]
//!
//! Postgres from `VITALS_TEST_DATABASE_URL` (scripts/stack.sh up). Run two builds' binaries in
//! turn to compare them: nothing else should run on the machine.

use clap::Parser;
use std::collections::BTreeMap;
use std::time::Instant;
use vitals_bench::{cpu, median, spread, stack, workload};
use vitals_contracts::{encode_signal, Policy};
use vitals_engine::Engine;
use vitals_pipeline::{BatchWrite, Partition, PartitionWrite, Topics};
use vitals_store::audit::{Attempt, AuditLog};
use vitals_store::months::{Months, Retention};

#[derive(Parser)]
struct Args {
    /// Signals of e2e-bench's mix (1,000 pools of 10 endpoints).
    #[arg(long, default_value_t = 1_000_000)]
    signals: usize,
    /// Records a batch (e2e-bench's processor commits ~10,000 at a time at 1 M).
    #[arg(long, default_value_t = 10_000)]
    batch_records: usize,
    /// Writes of the same batches, each into a fresh schema.
    #[arg(long, default_value_t = 3)]
    runs: usize,
}

struct Run {
    wall_s: f64,
    cpu_s: f64,
    wal_bytes: f64,
    /// µs by statement (pg_stat_statements), with calls.
    statements: BTreeMap<String, (f64, i64)>,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    anyhow::ensure!(args.batch_records >= 1, "--batch-records: at least 1");
    anyhow::ensure!(args.runs >= 1, "--runs: at least 1");
    let mix = workload::Mix {
        pools: 1_000,
        endpoints_per_pool: 10,
        rate: 10_000,
    };
    eprintln!("record step over {} signals…", args.signals);
    let mut batches = record_step(&workload::generate(&mix, args.signals, 42), args.batch_records);
    let count = |f: fn(&BatchWrite) -> usize| batches.iter().map(f).sum::<usize>();
    let transitions = count(|b| b.transitions.len());
    anyhow::ensure!(transitions > 0, "the workload made no transition");
    println!(
        "{} signals in {} batches: {transitions} transitions, {} pool events, {} endpoints discovered, {} outbox events",
        args.signals,
        batches.len(),
        count(|b| b.pool_events.len()),
        count(|b| b.discovered.len()),
        count(|b| b.outbox.len()),
    );

    let url = stack::database_url();
    let admin = sqlx::postgres::PgPoolOptions::new()
        .max_connections(1)
        .connect(&url)
        .await?;
    let counting = sqlx::query("SELECT pg_stat_statements_reset()")
        .execute(&admin)
        .await
        .is_ok();
    let mut runs = Vec::new();
    for run in 1..=args.runs {
        let schema = format!("{}_{run}", stack::unique("store_bench"));
        let r = write_all(&admin, &url, &schema, &mut batches, counting).await;
        sqlx::query(&format!("DROP SCHEMA \"{schema}\" CASCADE"))
            .execute(&admin)
            .await?;
        let r = r?;
        eprintln!(
            "  run {run}: {:.2} s, Postgres {:.1} µs of CPU a transition",
            r.wall_s,
            r.cpu_s * 1e6 / transitions as f64
        );
        runs.push(r);
    }
    let per_t = |f: &dyn Fn(&Run) -> f64| -> Vec<f64> { runs.iter().map(|r| f(r) / transitions as f64).collect() };
    println!("per transition (median, range over {} runs):", runs.len());
    println!("  Postgres CPU     {}", spread(&per_t(&|r| r.cpu_s * 1e6), "µs"));
    println!("  wall             {}", spread(&per_t(&|r| r.wall_s * 1e6), "µs"));
    println!("  WAL              {}", spread(&per_t(&|r| r.wal_bytes), "bytes"));
    println!(
        "  WAL a signal     {}",
        spread(
            &runs
                .iter()
                .map(|r| r.wal_bytes / args.signals as f64)
                .collect::<Vec<_>>(),
            "bytes"
        )
    );
    if counting {
        let mut by: BTreeMap<&String, (Vec<f64>, i64)> = BTreeMap::new();
        for r in &runs {
            for (q, (us, calls)) in &r.statements {
                let e = by.entry(q).or_default();
                e.0.push(us / transitions as f64);
                e.1 = *calls;
            }
        }
        let mut rows: Vec<(f64, i64, &String)> = by.into_iter().map(|(q, (v, c))| (median(&v), c, q)).collect();
        rows.sort_by(|a, b| b.0.total_cmp(&a.0));
        let total: f64 = rows.iter().map(|r| r.0).sum();
        println!("  Postgres' time by statement (pg_stat_statements, median, µs a transition; all: {total:.2}):");
        for (us, calls, q) in rows.iter().take(10) {
            println!(
                "    {us:>7.2} {calls:>6} calls  {}",
                q.chars().take(90).collect::<String>()
            );
        }
    } else {
        println!("  (no pg_stat_statements here: times by statement not shown)");
    }
    Ok(())
}

/// The processor's record step over the signals, one partition, cut every `every` records.
fn record_step(input: &[(i64, vitals_contracts::Signal)], every: usize) -> Vec<BatchWrite> {
    let topics = Topics {
        signals: "signals".into(),
        changes: "changes".into(),
        state: "state".into(),
        dlq: "dlq".into(),
    };
    let mut part = Partition::new(0, 1, Engine::new(Policy::default()), None, None);
    let mut batches = Vec::new();
    let mut batch = BatchWrite::default();
    for (i, (at, s)) in input.iter().enumerate() {
        let payload = encode_signal(s).expect("generated signals encode");
        part.step(i as i64, Some(at / 1000), None, Some(&payload), &topics, &mut batch);
        if (i + 1) % every == 0 || i + 1 == input.len() {
            batch.partitions.push(PartitionWrite {
                partition: 0,
                epoch: 0,
                next_offset: i as i64 + 1,
                snapshot: None,
                requests: None,
            });
            batches.push(std::mem::take(&mut batch));
        }
    }
    batches
}

/// Every batch written into a fresh schema, its outbox taken after it as the relay takes it.
async fn write_all(
    admin: &sqlx::PgPool,
    url: &str,
    schema: &str,
    batches: &mut [BatchWrite],
    counting: bool,
) -> anyhow::Result<Run> {
    let pool = vitals_store::connect_owner(url, schema, 2).await?;
    let log = AuditLog {
        pool: pool.clone(),
        group: "store-bench".into(),
        topic: "signals".into(),
        months: Months::new(Retention { days: 0 }),
    };
    let epoch = log.claim_partition(0).await?.epoch;
    let mut relay = pool.acquire().await?;
    let lsn = || sqlx::query_scalar::<_, String>("SELECT pg_current_wal_lsn()::text").fetch_one(admin);
    let wal_at = |lsn: &str| -> u64 {
        let (hi, lo) = lsn.split_once('/').unwrap_or(("0", "0"));
        (u64::from_str_radix(hi, 16).unwrap_or(0) << 32) + u64::from_str_radix(lo, 16).unwrap_or(0)
    };
    if counting {
        sqlx::query("SELECT pg_stat_statements_reset()").execute(admin).await?;
    }
    let wal0 = wal_at(&lsn().await?);
    let cpu0 = cpu::of_command("postgres");
    let start = Instant::now();
    for b in batches.iter_mut() {
        for p in &mut b.partitions {
            p.epoch = epoch;
        }
        log.write_batch(b, Attempt::First).await?;
        loop {
            let rows = vitals_store::outbox::unpublished(&mut relay, 5_000).await?;
            if rows.is_empty() {
                break;
            }
            let ids: Vec<i64> = rows.iter().map(|r| r.id).collect();
            vitals_store::outbox::published(&mut relay, &ids).await?;
        }
    }
    let wall_s = start.elapsed().as_secs_f64();
    let cpu_s = cpu::of_command("postgres") - cpu0;
    let wal_bytes = wal_at(&lsn().await?).saturating_sub(wal0) as f64;
    let statements = if counting {
        let rows: Vec<(String, f64, i64)> = sqlx::query_as(
            "SELECT regexp_replace(query, '\\s+', ' ', 'g'), total_exec_time, calls FROM pg_stat_statements
             WHERE query NOT LIKE '%pg_stat_statements%' AND query NOT LIKE '%pg_current_wal_lsn%'",
        )
        .fetch_all(admin)
        .await?;
        rows.into_iter().map(|(q, ms, calls)| (q, (ms * 1e3, calls))).collect()
    } else {
        BTreeMap::new()
    };
    drop(relay);
    pool.close().await;
    Ok(Run {
        wall_s,
        cpu_s,
        wal_bytes,
        statements,
    })
}
