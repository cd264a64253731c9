//! The merge stage's own cost: a backlog of a mesh fleet's gateway records (each gateway's
//! summaries of every endpoint per 250 ms interval, and its first failures one by one) on the
//! gateway-signals topic, drained by the real `vitals-merger` binary. Prints the merger's CPU per
//! record read (user + system, its librdkafka threads included), its rate, and checks that every
//! call reached the signals topic exactly once (read_committed).
//!
//! `--merger PATH` (repeatable) runs each binary in turn on the same input, for a before/after
//! comparison; by default the workspace's `target/release/vitals-merger`.
//!
//! ```sh
//! scripts/stack.sh up
//! cargo run --release -p vitals-bench --bin merger-bench -- --gateways 20 --endpoints 500 --intervals 40
//! ```

use clap::Parser;
use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::Message;
use std::path::PathBuf;
use std::time::{Duration, Instant};
use vitals_bench::{cpu, workload::Rng};
use vitals_contracts::{decode_signal, encode_signal, CallOutcome, OutcomeClass, Signal, Summarizer, SummaryConfig};
use vitals_testkit::{self as stack, Input, Service};

#[derive(Parser)]
struct Args {
    /// Gateways, each calling every endpoint (the mesh shape the merge stage is for).
    #[arg(long, default_value_t = 20)]
    gateways: usize,
    /// Endpoints, five to a pool.
    #[arg(long, default_value_t = 500)]
    endpoints: usize,
    /// Intervals of 250 ms of the gateways' time.
    #[arg(long, default_value_t = 40)]
    intervals: usize,
    /// Calls per gateway, endpoint and interval.
    #[arg(long, default_value_t = 10)]
    calls: usize,
    /// Share of calls that fail (a server error), in percent.
    #[arg(long, default_value_t = 2)]
    failure_pct: u64,
    #[arg(long, default_value_t = 16)]
    input_partitions: i32,
    /// Merger binaries to run, each in turn on the same input.
    #[arg(long)]
    merger: Vec<PathBuf>,
}

/// Calls a record stands for.
fn calls_of(s: &Signal) -> u64 {
    match s {
        Signal::Call(_) => 1,
        Signal::Summary(x) => u64::try_from(x.calls.total()).unwrap_or(0),
        _ => 0,
    }
}

/// The gateways' records, in the order they would send them, with the calls they stand for.
fn fleet_records(args: &Args, start_us: i64) -> (Vec<Input>, u64) {
    let cfg = SummaryConfig {
        interval_us: 250_000,
        failure_cap: 8,
        ..SummaryConfig::default()
    };
    let mut gateways: Vec<Summarizer> = (0..args.gateways)
        .map(|g| Summarizer::new(cfg, &format!("gw-{g}")))
        .collect();
    let mut rng = Rng::new(7);
    let mut inputs = Vec::new();
    let mut calls = 0u64;
    let mut out = Vec::new();
    let mut id = 0u64;
    for i in 0..args.intervals {
        let t0 = start_us + i as i64 * 250_000;
        for (g, summarizer) in gateways.iter_mut().enumerate() {
            for e in 0..args.endpoints {
                let (pool, endpoint) = (format!("pool-{}", e / 5), format!("ep-{e}"));
                for k in 0..args.calls {
                    let at = t0 + (k as i64 * 250_000) / args.calls as i64;
                    let outcome = if rng.below(100) < args.failure_pct {
                        OutcomeClass::ServerError
                    } else {
                        OutcomeClass::Success
                    };
                    id += 1;
                    let call = CallOutcome {
                        latency_us: 20_000 + rng.below(200_000) as i64,
                        ..CallOutcome::new(format!("c{id}"), &pool, &endpoint, format!("gw-{g}"), at, outcome)
                    };
                    summarizer.add(call, at + 20_000, &mut out);
                }
            }
            summarizer.flush_all(&mut out);
            for s in out.drain(..) {
                calls += calls_of(&s);
                let (Signal::Call(_) | Signal::Summary(_)) = &s else {
                    continue;
                };
                let key = s.endpoint().unwrap_or_default().to_string();
                inputs.push(Input {
                    partition: None,
                    ts_ms: (t0 + 250_000) / 1000,
                    key: Some(key),
                    bytes: encode_signal(&s).expect("encodes"),
                });
            }
        }
    }
    (inputs, calls)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let mergers = if args.merger.is_empty() {
        vec![stack::binary("vitals-merger")]
    } else {
        args.merger.clone()
    };
    let name = stack::unique("merger-bench");
    // A backlog from the recent past, as a merger finds after a restart or a burst.
    let start_us = vitals_bench::now_us() - args.intervals as i64 * 250_000 - 5_000_000;
    let (inputs, calls) = fleet_records(&args, start_us);
    let records = inputs.len();
    eprintln!(
        "merger-bench: {} gateways × {} endpoints × {} intervals: {records} gateway records, {calls} calls ({:.1} calls a record)",
        args.gateways,
        args.endpoints,
        args.intervals,
        calls as f64 / records as f64
    );
    let input = stack::Topics::create(&format!("{name}.in"), args.input_partitions, stack::Stamp::CreateTime).await;
    stack::produce(&stack::producer(), &input.signals, inputs).await;
    for (run, merger) in mergers.iter().enumerate() {
        let out = stack::Topics::create(&format!("{name}.out{run}"), 8, stack::Stamp::LogAppendTime).await;
        let argv: Vec<String> = [
            "--brokers",
            &stack::brokers(),
            "--input-topic",
            &input.signals,
            "--signals-topic",
            &out.signals,
            "--dlq-topic",
            &out.dlq,
            "--group",
            &format!("{name}-{run}"),
            "--transactional-id",
            &format!("{name}-{run}-txn"),
            "--create-topic",
            "false",
            "--http-addr",
            &format!("127.0.0.1:{}", stack::free_port()),
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let started = Instant::now();
        let mut service = Service::start_program(merger, "bench-merger", &argv);
        let pid = service.child.id();
        let reader: StreamConsumer = stack::consumer(&format!("{name}-read{run}"));
        reader.subscribe(&[&out.signals])?;
        let (mut seen, mut out_records, mut cpu_done) = (0u64, 0u64, 0.0);
        let mut last_report = Instant::now();
        while seen < calls {
            match tokio::time::timeout(Duration::from_secs(120), reader.recv()).await {
                Ok(Ok(m)) => {
                    let sig = decode_signal(m.payload().unwrap_or_default())?;
                    seen += calls_of(&sig);
                    out_records += 1;
                    cpu_done = cpu::of_pid(pid);
                }
                Ok(Err(e)) => anyhow::bail!("reading the merged records: {e}"),
                Err(_) => anyhow::bail!(
                    "no merged record for 120 s: {seen} of {calls} calls out (log: {})",
                    service.log.display()
                ),
            }
            if last_report.elapsed() > Duration::from_secs(5) {
                eprintln!("  {}: {seen} of {calls} calls out", merger.display());
                last_report = Instant::now();
            }
        }
        let wall = started.elapsed().as_secs_f64();
        // Nothing more may come: a call counted twice would show as more calls than sent.
        let extra = match tokio::time::timeout(Duration::from_secs(3), reader.recv()).await {
            Ok(Ok(m)) => calls_of(&decode_signal(m.payload().unwrap_or_default())?),
            _ => 0,
        };
        service.terminate();
        println!(
            "{}: {records} records read in {wall:.1} s ({:.0} records/s), {out_records} written; merger CPU {:.2} s, {:.2} µs per record read; calls in {calls}, out {}{}",
            merger.display(),
            records as f64 / wall,
            cpu_done,
            cpu_done * 1e6 / records as f64,
            seen + extra,
            if seen + extra == calls { " (exactly once)" } else { " (NOT exactly once)" }
        );
        out.delete().await;
    }
    input.delete().await;
    Ok(())
}
