//! Engine throughput (signals per CPU-second) and engine state per endpoint.
//!
//!   cargo run --release -p vitals-bench --bin engine-bench -- [--signals N]

use clap::Parser;
use vitals_bench::{alloc, cpu_seconds, workload};
use vitals_contracts::Policy;
use vitals_engine::{Decision, Engine};

#[global_allocator]
static ALLOC: alloc::Counting = alloc::Counting;

#[derive(Parser)]
struct Args {
    /// Signals to apply.
    #[arg(long, default_value_t = 3_000_000)]
    signals: usize,
    #[arg(long, default_value_t = 1_000)]
    pools: usize,
    #[arg(long, default_value_t = 10)]
    endpoints_per_pool: usize,
    /// Signals per second of stream time across the fleet.
    #[arg(long, default_value_t = 10_000)]
    rate: u64,
    /// Hash every decision and print the digest (a refactor of the rules must leave it
    /// unchanged); costs CPU inside the measured loop, so the throughput is not comparable.
    #[arg(long)]
    digest: bool,
}

fn main() {
    let args = Args::parse();
    let mix = workload::Mix {
        pools: args.pools,
        endpoints_per_pool: args.endpoints_per_pool,
        rate: args.rate,
    };
    eprintln!(
        "generating {} signals for {} endpoints…",
        args.signals,
        args.pools * args.endpoints_per_pool
    );
    let input = workload::generate(&mix, args.signals, 42);
    let before = alloc::live_bytes();
    let mut engine = Engine::new(Policy::default());
    let mut out: Vec<Decision> = Vec::with_capacity(1024);
    let (mut transitions, mut pool_events) = (0u64, 0u64);
    let mut digest = vitals_contracts::hash::Fnv64::new();
    let mut codes: std::collections::BTreeMap<String, u64> = Default::default();
    let cpu0 = cpu_seconds();
    let wall0 = std::time::Instant::now();
    for (i, (t, s)) in input.iter().enumerate() {
        engine.apply(*t, s, &mut out);
        for d in out.drain(..) {
            if args.digest {
                digest = digest.bytes(format!("{d:?}").bytes());
            }
            match d {
                Decision::Endpoint(h) => {
                    transitions += 1;
                    *codes.entry(h.reason_code).or_default() += 1;
                }
                Decision::Pool(_) => pool_events += 1,
            }
        }
        if i % 1_000_000 == 999_999 {
            eprintln!("  {} signals applied", i + 1);
        }
    }
    let cpu = cpu_seconds() - cpu0;
    let wall = wall0.elapsed().as_secs_f64();
    drop(out);
    let state_bytes = alloc::live_bytes() - before;
    let endpoints: usize = engine.pools().map(|p| p.total() as usize).sum();
    let snapshot = engine.snapshot().len();
    println!(
        "engine-bench: {} signals, {} pools, {} endpoints",
        input.len(),
        engine.pools().count(),
        endpoints
    );
    println!("  cpu time            {cpu:.3} s (wall {wall:.3} s)");
    println!(
        "  throughput          {:.0} signals per CPU-second",
        input.len() as f64 / cpu.max(1e-9)
    );
    println!("  per signal          {:.0} ns", cpu * 1e9 / input.len() as f64);
    println!("  decisions           {transitions} transitions, {pool_events} pool events");
    if args.digest {
        println!(
            "  decision digest     {:016x} (FNV-1a of every decision)",
            digest.finish()
        );
    }
    let by_code: Vec<String> = codes.iter().map(|(c, n)| format!("{c} {n}")).collect();
    println!("  by reason           {}", by_code.join(", "));
    println!(
        "  engine heap         {} bytes = {:.0} bytes per endpoint",
        state_bytes,
        state_bytes as f64 / endpoints as f64
    );
    let books: usize = engine.pools().map(|p| p.books_bytes()).sum();
    println!(
        "  scope books         {} bytes = {:.0} bytes per endpoint (in the heap above; one gateway here)",
        books,
        books as f64 / endpoints as f64
    );
    println!(
        "  snapshot (JSON)     {} bytes = {:.0} bytes per endpoint",
        snapshot,
        snapshot as f64 / endpoints as f64
    );
}
