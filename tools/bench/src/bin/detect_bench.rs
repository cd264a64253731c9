//! Detection latency: from producing the decisive signal to the health change being visible to
//! a `read_committed` consumer of the changes topic, under a steady background load.
//!
//!   scripts/stack.sh up && cargo build --release -p vitals-processor -p vitals-bench
//!   target/release/detect-bench [--samples 200] [--background 170000]

use clap::Parser;
use rdkafka::producer::FutureRecord;
use std::sync::Arc;
use std::time::{Duration, Instant};
use vitals_bench::{now_us, stack};
use vitals_contracts::*;

#[derive(Parser)]
struct Args {
    /// Decisive signals to time.
    #[arg(long, default_value_t = 200)]
    samples: usize,
    /// Background load, signals per second (default: about half of the processor's sustained
    /// end-to-end throughput on this machine, from e2e-bench).
    #[arg(long, default_value_t = 170_000)]
    background: u64,
    /// Pause between decisive signals, ms.
    #[arg(long, default_value_t = 50)]
    gap_ms: u64,
}

fn probe(pool: &str, ep: &str, id: String, critical_down: bool) -> Signal {
    Signal::Probe(ProbeResult {
        probe_id: id,
        pool: pool.into(),
        endpoint: ep.into(),
        prober: "detect-bench".into(),
        occurred_at: now_us(),
        kind: ProbeKind::Http,
        outcome: OutcomeClass::Success,
        latency_us: 3_000,
        ttft_us: None,
        http_status: Some(200),
        interval_ms: None,
        dependencies: if critical_down {
            vec![DependencyReport {
                name: "db".into(),
                critical: true,
                status: DependencyStatus::Down,
            }]
        } else {
            vec![]
        },
        detail: String::new(),
    })
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let name = stack::unique("detect");
    let topics = stack::Topics::create(&name, 8, stack::Stamp::LogAppendTime).await;
    let mut child = stack::start_processor(&topics, &name, &name, &["--tick-interval-ms", "1000"]);

    // The read_committed consumer: when did each endpoint's first change arrive?
    let seen = stack::first_changes(&topics.changes, &format!("{name}-watch"), |_| true)?;
    let producer = stack::producer();
    let send = |s: &Signal| {
        let bytes = encode_signal(s).expect("encodes");
        let pool = s.pool().unwrap_or_default().to_string();
        (pool, bytes)
    };

    // Background: healthy probes over 200 pools × 5 endpoints.
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let background_sent = Arc::new(std::sync::atomic::AtomicU64::new(0));
    {
        let producer = producer.clone();
        let topic = topics.signals.clone();
        let stop = stop.clone();
        let counted = background_sent.clone();
        let rate = args.background;
        tokio::spawn(async move {
            let mut i = 0u64;
            let mut tick = tokio::time::interval(Duration::from_millis(10));
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                tick.tick().await;
                for _ in 0..(rate / 100).max(1) {
                    i += 1;
                    let s = probe(
                        &format!("bg-{}", i % 200),
                        &format!("ep-{}", i % 5),
                        format!("bg-{i}"),
                        false,
                    );
                    let (pool, bytes) = send(&s);
                    // A full producer queue drops the record; the rate actually sent is reported.
                    if producer
                        .send_result(FutureRecord::to(&topic).key(&pool).payload(&bytes))
                        .is_ok()
                    {
                        counted.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    }
                }
            }
        });
    }
    // Let the processor join its group and the background flow reach steady state.
    eprintln!("warming up…");
    let warm = Instant::now();
    let warm_ep = "warm".to_string();
    loop {
        let s = probe("warmup", &warm_ep, format!("w-{}", warm.elapsed().as_millis()), true);
        let (pool, bytes) = send(&s);
        producer
            .send_result(FutureRecord::to(&topics.signals).key(&pool).payload(&bytes))
            .map_err(|(e, _)| e)?
            .await
            .ok();
        if seen.lock().unwrap().contains_key(&warm_ep) {
            break;
        }
        anyhow::ensure!(
            warm.elapsed() < Duration::from_secs(60),
            "processor did not start within 60 s"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    eprintln!(
        "measuring {} decisive signals under {} signals/s",
        args.samples, args.background
    );
    let mut sent: Vec<(String, Instant)> = Vec::new();
    let (measuring, sent_before) = (
        Instant::now(),
        background_sent.load(std::sync::atomic::Ordering::Relaxed),
    );
    for k in 0..args.samples {
        // One endpoint per pool of 2, so max-ejection (≥1) always lets the decisive probe eject.
        let pool = format!("victim-{k}");
        let ep = format!("victim-{k}-a");
        let s = probe(&pool, &ep, format!("decisive-{k}"), true);
        let (key, bytes) = send(&s);
        let t = Instant::now();
        producer
            .send_result(FutureRecord::to(&topics.signals).key(&key).payload(&bytes))
            .map_err(|(e, _)| e)?;
        sent.push((ep, t));
        tokio::time::sleep(Duration::from_millis(args.gap_ms)).await;
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    while Instant::now() < deadline && sent.iter().any(|(ep, _)| !seen.lock().unwrap().contains_key(ep)) {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let background_rate = (background_sent.load(std::sync::atomic::Ordering::Relaxed) - sent_before) as f64
        / measuring.elapsed().as_secs_f64();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let seen = seen.lock().unwrap().clone();
    let mut lat: Vec<f64> = sent
        .iter()
        .filter_map(|(ep, t)| seen.get(ep).map(|s| s.duration_since(*t).as_secs_f64() * 1000.0))
        .collect();
    child.terminate();
    anyhow::ensure!(
        lat.len() == sent.len(),
        "only {} of {} changes seen",
        lat.len(),
        sent.len()
    );
    lat.sort_by(f64::total_cmp);
    let q = |p: f64| lat[((lat.len() as f64 - 1.0) * p).round() as usize];
    println!(
        "detect-bench: {} decisive signals under {:.0} signals/s background (asked {})",
        lat.len(),
        background_rate,
        args.background
    );
    println!(
        "  p50 {:>7.1} ms   p90 {:>7.1} ms   p99 {:>7.1} ms   max {:>7.1} ms (target p99 ≤ 100 ms)",
        q(0.5),
        q(0.9),
        q(0.99),
        q(1.0)
    );
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(1)
        .connect(&stack::database_url())
        .await?;
    let _ = sqlx::query(&format!("DROP SCHEMA \"{name}\" CASCADE"))
        .execute(&pool)
        .await;
    Ok(())
}
