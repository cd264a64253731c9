//! The prober at scale: N targets at a 1 s interval against the upstream simulator, through the
//! real `vitals-prober` binary and the real broker. Prints achieved probes per second, start
//! lateness p50/p99, CPU per probe and memory per target.
//!
//!   scripts/stack.sh up
//!   cargo run --release -p vitals-bench --bin prober-bench -- [--targets 10000] [--endpoints 20]

use clap::Parser;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};
use vitals_bench::cpu;
use vitals_testkit::{brokers, free_port, http_get, unique, Service, Stamp, Topics};
use vitals_upstream_sim::{Sim, SimConfig};

#[derive(Parser)]
struct Args {
    #[arg(long, default_value_t = 10_000)]
    targets: usize,
    /// Simulated endpoints the targets are spread over.
    #[arg(long, default_value_t = 20)]
    endpoints: usize,
    #[arg(long, default_value_t = 1_000)]
    interval_ms: u64,
    #[arg(long, default_value_t = 5)]
    warmup_secs: u64,
    #[arg(long, default_value_t = 20)]
    measure_secs: u64,
}

fn rss_bytes(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .unwrap_or(0)
        * 1024
}

/// The sum of a metric's series, and the lateness histogram's cumulative buckets.
struct Scrape {
    probes: f64,
    buckets: BTreeMap<String, f64>,
    configured: f64,
}

async fn scrape(port: u16) -> Scrape {
    let text = http_get(port, "/metrics").await.unwrap_or_default();
    let mut s = Scrape {
        probes: 0.0,
        buckets: BTreeMap::new(),
        configured: 0.0,
    };
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let Some((name, value)) = line.rsplit_once(' ') else {
            continue;
        };
        let v: f64 = value.parse().unwrap_or(0.0);
        if name.starts_with("vitals_prober_probes_total") {
            s.probes += v;
        } else if let Some(le) = name
            .strip_prefix("vitals_prober_start_lateness_seconds_bucket{le=\"")
            .and_then(|r| r.strip_suffix("\"}"))
        {
            s.buckets.insert(le.to_owned(), v);
        } else if name == "vitals_prober_configured_targets" {
            s.configured = v;
        }
    }
    s
}

/// The q-quantile (seconds) of the lateness observed between two scrapes, interpolated in its bucket.
fn quantile(before: &Scrape, after: &Scrape, q: f64) -> f64 {
    let mut bounds: Vec<(f64, f64)> = after
        .buckets
        .iter()
        .map(|(key, n)| {
            let le = if key == "+Inf" {
                f64::INFINITY
            } else {
                key.parse().unwrap_or(f64::INFINITY)
            };
            (le, n - before.buckets.get(key).copied().unwrap_or(0.0))
        })
        .collect();
    bounds.sort_by(|a, b| a.0.total_cmp(&b.0));
    let total = bounds.last().map_or(0.0, |b| b.1);
    let want = q * total;
    let (mut lo, mut below) = (0.0, 0.0);
    for (le, n) in bounds {
        if n >= want {
            if le.is_infinite() {
                return lo;
            }
            let share = if n > below { (want - below) / (n - below) } else { 0.0 };
            return lo + (le - lo) * share;
        }
        lo = le;
        below = n;
    }
    lo
}

fn targets_file(sim: &Sim, n: usize, interval_ms: u64) -> String {
    let eps = sim.endpoints();
    let mut text = format!(
        "[defaults]\ninterval_ms = {interval_ms}\nfast_interval_ms = {interval_ms}\ntimeout_ms = {}\n",
        interval_ms / 2
    );
    for i in 0..n {
        let (_, addr) = &eps[i % eps.len()];
        text.push_str(&format!(
            "[[target]]\nid = \"t{i}\"\npool = \"bench-{}\"\nendpoint = \"ep-{i}\"\nkind = \"http\"\nurl = \"http://{addr}/health\"\n",
            i / 10
        ));
    }
    text
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let sim = Sim::start(SimConfig::healthy(args.endpoints.max(1), 1)).await?;
    let topics = Topics::create(&unique("prober_bench"), 4, Stamp::LogAppendTime).await;
    let config = std::env::temp_dir().join(format!("{}.toml", unique("prober_bench")));
    std::fs::write(&config, targets_file(&sim, 1, args.interval_ms))?;
    let port = free_port();
    let flags: Vec<String> = [
        "--config",
        config.to_str().unwrap_or_default(),
        "--name",
        "bench",
        "--brokers",
        &brokers(),
        "--signals-topic",
        &topics.signals,
        "--state-topic",
        &topics.state,
        "--shard-topic",
        &unique("prober_bench_shards"),
        "--http-addr",
        &format!("127.0.0.1:{port}"),
        "--reload-poll-ms",
        "200",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let prober = Service::start("vitals-prober", "prober-bench", &flags);
    let pid = prober.child.id();
    let deadline = Instant::now() + Duration::from_secs(60);
    while http_get(port, "/readyz").await.as_deref() != Some("ready") {
        anyhow::ensure!(
            Instant::now() < deadline,
            "the prober never became ready (log {})",
            prober.log.display()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let rss_one = rss_bytes(pid);
    eprintln!(
        "prober ready with 1 target, RSS {} KB; loading {} targets…",
        rss_one / 1024,
        args.targets
    );
    std::fs::write(&config, targets_file(&sim, args.targets, args.interval_ms))?;
    while scrape(port).await.configured < args.targets as f64 {
        anyhow::ensure!(
            Instant::now() < deadline + Duration::from_secs(60),
            "the targets were not reloaded"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    eprintln!("warming up for {} s…", args.warmup_secs);
    tokio::time::sleep(Duration::from_secs(args.warmup_secs)).await;
    let (before, cpu0, t0) = (scrape(port).await, cpu::of_pid(pid), Instant::now());
    for s in 0..args.measure_secs {
        tokio::time::sleep(Duration::from_secs(1)).await;
        if s % 5 == 4 {
            eprintln!("  {} s measured", s + 1);
        }
    }
    let (after, cpu1, wall) = (scrape(port).await, cpu::of_pid(pid), t0.elapsed().as_secs_f64());
    let rss_all = rss_bytes(pid);
    let probes = after.probes - before.probes;
    println!(
        "prober-bench: {} targets at {} ms over {} simulated endpoints, {:.0} s measured",
        args.targets, args.interval_ms, args.endpoints, wall
    );
    println!(
        "  probes              {:.0} per second (expected {:.0})",
        probes / wall,
        args.targets as f64 * 1000.0 / args.interval_ms as f64
    );
    println!(
        "  start lateness      p50 {:.2} ms, p99 {:.2} ms",
        quantile(&before, &after, 0.5) * 1000.0,
        quantile(&before, &after, 0.99) * 1000.0
    );
    println!(
        "  prober CPU          {:.1} µs per probe ({:.0} % of one core)",
        (cpu1 - cpu0) * 1e6 / probes.max(1.0),
        (cpu1 - cpu0) * 100.0 / wall
    );
    println!(
        "  prober memory       {} KB RSS with 1 target, {} KB with {}: {:.0} bytes per target",
        rss_one / 1024,
        rss_all / 1024,
        args.targets,
        (rss_all.saturating_sub(rss_one)) as f64 / args.targets as f64
    );
    drop(prober);
    let _ = std::fs::remove_file(&config);
    sim.shutdown().await;
    Ok(())
}
