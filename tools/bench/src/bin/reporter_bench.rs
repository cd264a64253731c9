//! The reporter's cost to its caller: ns per `report` (p50/p99/p99.9/max) and reports per
//! second per core, with Kafka up and with Kafka down; with `--summarize`, also with call
//! summaries on (the records it sent, and calls summed per CPU-second).
//!
//!   scripts/stack.sh up
//!   cargo run --release -p vitals-bench --bin reporter-bench -- [--reports 1000000] [--summarize]
//!     [--idle-secs 10]   (first: the CPU of a reporter with nothing to report)

use clap::Parser;
use std::time::{Duration, Instant};
use vitals_bench::cpu_seconds;
use vitals_reporter::{CallResult, CallTimer, Config, Reporter};
use vitals_testkit::{brokers, unique, Stamp, Topics};

#[derive(Parser)]
struct Args {
    #[arg(long, default_value_t = 1_000_000)]
    reports: usize,
    /// Reports per second offered (0: as fast as the caller can).
    #[arg(long, default_value_t = 200_000)]
    rate: u64,
    /// Also run with call summaries on (Kafka up).
    #[arg(long)]
    summarize: bool,
    /// Then leave a reporter idle this many seconds (Kafka up) and print the CPU it took.
    #[arg(long, default_value_t = 10)]
    idle_secs: u64,
}

/// The CPU an idle reporter takes: its worker thread's wake-ups and librdkafka's own threads.
fn idle(cfg: Config, secs: u64) {
    let reporter = Reporter::new(cfg).expect("reporter");
    // One report, so that the producer is connected and the worker has started.
    let mut t = CallTimer::start("pool-idle", "ep-idle");
    t.first_token();
    reporter.report(t.finish("bench", "idle-0", CallResult::Status(200), None));
    reporter.flush(Duration::from_secs(10));
    let cpu0 = cpu_seconds();
    let start = Instant::now();
    std::thread::sleep(Duration::from_secs(secs));
    let cpu = cpu_seconds() - cpu0;
    let wall = start.elapsed().as_secs_f64();
    println!(
        "idle reporter (Kafka up): {:.2} % of a core over {wall:.1} s (process CPU, librdkafka's threads included)",
        100.0 * cpu / wall
    );
}

fn percentile(sorted: &[u32], q: f64) -> u32 {
    sorted[((sorted.len() - 1) as f64 * q).round() as usize]
}

fn run(label: &str, cfg: Config, n: usize, rate: u64) {
    let reporter = Reporter::new(cfg).expect("reporter");
    let outcomes: Vec<_> = (0..n)
        .map(|i| {
            let mut t = CallTimer::start(format!("pool-{}", i % 100), format!("ep-{}", i % 1000));
            t.first_token();
            t.finish("bench", format!("call-{i}"), CallResult::Status(200), None)
        })
        .collect();
    let mut ns = Vec::with_capacity(n);
    let cpu0 = cpu_seconds();
    let start = Instant::now();
    let gap = if rate == 0 {
        Duration::ZERO
    } else {
        Duration::from_secs_f64(1.0 / rate as f64)
    };
    for (i, o) in outcomes.into_iter().enumerate() {
        if !gap.is_zero() {
            let due = start + gap * i as u32;
            while Instant::now() < due {
                std::hint::spin_loop();
            }
        }
        let t = Instant::now();
        reporter.report(o);
        ns.push(t.elapsed().as_nanos() as u32);
    }
    let wall = start.elapsed().as_secs_f64();
    let flushed = reporter.flush(Duration::from_secs(10));
    let cpu = cpu_seconds() - cpu0;
    let c = reporter.counters();
    ns.sort_unstable();
    println!(
        "{label}: {n} reports offered at {} per second",
        if rate == 0 { "max".to_owned() } else { rate.to_string() }
    );
    println!(
        "  caller cost         p50 {} ns, p99 {} ns, p99.9 {} ns, max {} ns",
        percentile(&ns, 0.5),
        percentile(&ns, 0.99),
        percentile(&ns, 0.999),
        ns[n - 1]
    );
    println!(
        "  throughput          {:.0} reports/s offered over {:.2} s; {:.0} reports per CPU-second (caller, encoder and producer threads)",
        n as f64 / wall,
        wall,
        n as f64 / cpu.max(1e-9)
    );
    println!(
        "  counters            reported {}, dropped (queue full) {}, dropped (producer full) {}, delivered {}, failed {}; flushed: {flushed}",
        c.reported, c.dropped_queue_full, c.dropped_producer_full, c.delivered, c.delivery_failed
    );
    if c.summaries > 0 {
        println!(
            "  summaries           {} calls summed into {} summaries; {} records sent for {} calls ({:.1} calls a record)",
            c.summarized,
            c.summaries,
            c.delivered,
            c.reported,
            c.reported as f64 / c.delivered.max(1) as f64
        );
    }
    reporter.close(Duration::from_secs(1));
}

#[tokio::main]
async fn main() {
    let args = Args::parse();
    let topics = Topics::create(&unique("reporter_bench"), 8, Stamp::LogAppendTime).await;
    let mut up = Config::new(brokers());
    up.topic = topics.signals.clone();
    up.summarize = None;
    let mut summed = up.clone();
    summed.summarize = Some(vitals_contracts::SummaryConfig::default());
    let quiet = up.clone();
    tokio::task::spawn_blocking(move || {
        if args.idle_secs > 0 {
            idle(quiet, args.idle_secs);
        }
        run("kafka up", up, args.reports, args.rate);
        if args.summarize {
            run("kafka up, summaries", summed, args.reports, args.rate);
        }
        let mut down = Config::new("127.0.0.1:1");
        down.summarize = None;
        down.kafka_options = vec![("message.timeout.ms".into(), "1000".into())];
        run("kafka down", down, args.reports, args.rate);
    })
    .await
    .expect("benchmark thread");
}
