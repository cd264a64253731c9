//! The router-side health view: the cost of one pick with 10,000 pools (the view's weighted
//! random choice against smooth weighted round robin and power-of-two-choices on the same
//! weights), how closely each follows the weights, memory per endpoint, and the cold start from a
//! state topic of 100,000 endpoints on the real broker.
//!
//!   cargo run --release -p vitals-bench --bin healthview-bench -- [--pools 10000] [--per-pool 10] [--no-kafka]

use clap::Parser;
use rdkafka::producer::{BaseRecord, Producer, ThreadedProducer};
use std::sync::Mutex;
use std::time::{Duration, Instant};
use vitals_bench::alloc;
use vitals_contracts::{encode, EndpointState, HealthState};
use vitals_healthview::HealthView;
use vitals_testkit::{brokers, unique, Stamp, Topics};

#[global_allocator]
static ALLOC: alloc::Counting = alloc::Counting;

#[derive(Parser)]
struct Args {
    #[arg(long, default_value_t = 10_000)]
    pools: usize,
    #[arg(long, default_value_t = 10)]
    per_pool: usize,
    /// Picks timed per strategy.
    #[arg(long, default_value_t = 2_000_000)]
    picks: usize,
    /// Skip the cold start (which needs the broker of scripts/stack.sh).
    #[arg(long)]
    no_kafka: bool,
}

/// A deterministic generator for the bench's own choices.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// Endpoint `e` of pool `p`: mostly healthy, some degraded (0.25), some out (0), some ramping.
fn state(p: usize, e: usize) -> EndpointState {
    let mut s = EndpointState::first_seen(&format!("pool-{p:05}"), &format!("endpoint-{e:02}"), 0, 0);
    s.seq = 1;
    match (p * 31 + e * 7) % 10 {
        0 => {
            s.state = HealthState::Unhealthy;
            s.weight = 0.0;
        }
        1 => {
            s.state = HealthState::Degraded;
            s.weight = 0.25;
        }
        2 => {
            s.state = HealthState::Recovering;
            s.weight = 0.1;
            s.ramp_ms = 30_000;
        }
        _ => {}
    }
    s
}

fn percentiles(mut ns: Vec<u32>) -> (u32, u32, u32) {
    ns.sort_unstable();
    let at = |q: f64| ns[((ns.len() - 1) as f64 * q) as usize];
    (at(0.5), at(0.99), at(0.999))
}

/// Smooth weighted round robin (nginx): per pool, a current weight per endpoint; each pick adds
/// every weight and takes the largest, which then loses the total. Needs a write per pick.
struct Swrr {
    pools: Vec<Mutex<Vec<(f64, f64)>>>,
}

impl Swrr {
    fn pick(&self, pool: usize) -> Option<usize> {
        let mut eps = self.pools[pool].lock().expect("swrr lock");
        let total: f64 = eps.iter().map(|(w, _)| w).sum();
        if total <= 0.0 {
            return None;
        }
        let mut best = 0;
        for i in 0..eps.len() {
            eps[i].1 += eps[i].0;
            if eps[i].1 > eps[best].1 {
                best = i;
            }
        }
        eps[best].1 -= total;
        Some(best)
    }
}

/// Power of two choices by weight: two endpoints at random, the heavier one.
fn p2c(weights: &[f64], rng: &mut Rng) -> Option<usize> {
    let live: usize = weights.iter().filter(|w| **w > 0.0).count();
    if live == 0 {
        return None;
    }
    loop {
        let (a, b) = (rng.below(weights.len()), rng.below(weights.len()));
        let pick = if weights[a] >= weights[b] { a } else { b };
        if weights[pick] > 0.0 {
            return Some(pick);
        }
    }
}

/// Total variation distance between the picks' shares and the weights' shares, over one pool.
fn distance(counts: &[u64], weights: &[f64]) -> f64 {
    let n: u64 = counts.iter().sum();
    let total: f64 = weights.iter().sum();
    counts
        .iter()
        .zip(weights)
        .map(|(c, w)| (*c as f64 / n as f64 - w / total).abs())
        .sum::<f64>()
        / 2.0
}

/// `endpoint-07` → 7 (the bench's names), to count a pick's shares.
fn endpoint_index(name: &str) -> usize {
    name.rsplit('-').next().and_then(|n| n.parse().ok()).unwrap_or(0)
}

fn main() {
    let args = Args::parse();
    let n = args.pools * args.per_pool;
    let states: Vec<EndpointState> = (0..args.pools)
        .flat_map(|p| (0..args.per_pool).map(move |e| state(p, e)))
        .collect();
    let pool_names: Vec<String> = (0..args.pools).map(|p| format!("pool-{p:05}")).collect();
    let endpoint_names: Vec<String> = (0..args.per_pool).map(|e| format!("endpoint-{e:02}")).collect();
    let candidates: Vec<&str> = endpoint_names.iter().map(String::as_str).collect();

    let before = alloc::live_bytes();
    let view = HealthView::new();
    for s in &states {
        view.apply_state(s);
    }
    let bytes = alloc::live_bytes() - before;
    println!(
        "view: {} pools x {} endpoints = {n} endpoints, {:.0} bytes per endpoint (names, state, indexes)",
        args.pools,
        args.per_pool,
        bytes as f64 / n as f64
    );

    let now = 15_000_000; // ramping endpoints are half way up
    let rng = std::cell::RefCell::new(Rng(0x9e37_79b9_7f4a_7c15));
    let weights: Vec<Vec<f64>> = (0..args.pools)
        .map(|p| {
            endpoint_names
                .iter()
                .map(|e| view.weight(&pool_names[p], e, now).unwrap_or(0.0))
                .collect()
        })
        .collect();
    let swrr = Swrr {
        pools: weights
            .iter()
            .map(|w| Mutex::new(w.iter().map(|w| (*w, 0.0)).collect()))
            .collect(),
    };
    println!("pick, one at a time over random pools ({} picks each):", args.picks);
    let time = |label: &str, f: &mut dyn FnMut(usize) -> Option<usize>| {
        let mut ns = Vec::with_capacity(args.picks);
        let mut counts = vec![0u64; args.per_pool];
        let mut rng = Rng(7);
        for _ in 0..args.picks {
            let p = rng.below(args.pools);
            let t = Instant::now();
            let i = f(p);
            ns.push(t.elapsed().as_nanos() as u32);
            if p == 0 {
                if let Some(i) = i {
                    counts[i] += 1;
                }
            }
        }
        // Shares on one pool, over many picks of it alone.
        let mut counts = vec![0u64; args.per_pool];
        for _ in 0..200_000 {
            if let Some(i) = f(0) {
                counts[i] += 1;
            }
        }
        let (p50, p99, p999) = percentiles(ns);
        println!(
            "  {label:<46} p50 {p50:>4} ns  p99 {p99:>5} ns  p99.9 {p999:>6} ns   off the weights by {:.4} (total variation, pool 0)",
            distance(&counts, &weights[0])
        );
    };
    time("HealthView::pick (pool lookup + weighted)", &mut |p| {
        view.pick(&pool_names[p], now).map(|name| endpoint_index(&name))
    });
    time("HealthView::pick, pool 0 only (cache-warm)", &mut |_| {
        view.pick(&pool_names[0], now).map(|name| endpoint_index(&name))
    });
    time("HealthView::choose (+ a lookup per candidate)", &mut |p| {
        view.choose(&pool_names[p], &candidates, now)
    });
    println!("selection alone, over a pool's weights already at hand:");
    time("weighted random (the view's)", &mut |p| {
        vitals_healthview::select_weighted(&weights[p], rng.borrow_mut().next())
    });
    time("smooth weighted round robin", &mut |p| swrr.pick(p));
    time("power of two choices by weight", &mut |p| {
        p2c(&weights[p], &mut rng.borrow_mut())
    });
    println!("  (each includes the timer: two Instant::now() calls, about 40 ns)");

    if args.no_kafka {
        return;
    }
    cold_start(&states);
}

fn cold_start(states: &[EndpointState]) {
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let topics = rt.block_on(Topics::create(&unique("view_bench"), 8, Stamp::LogAppendTime));
    let producer: ThreadedProducer<_> = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", brokers())
        .set("linger.ms", "20")
        .set("queue.buffering.max.messages", "1000000")
        .create()
        .expect("producer");
    for s in states {
        let key = format!("{}/{}", s.pool, s.endpoint);
        let bytes = encode(s).expect("encodes");
        while producer
            .send(BaseRecord::to(&topics.state).key(&key).payload(&bytes))
            .is_err()
        {
            producer.poll(Duration::from_millis(10));
        }
    }
    producer.flush(Duration::from_secs(60)).expect("flushed");
    let mut cfg = vitals_healthview::Config::new(brokers());
    cfg.state_topic = topics.state.clone();
    cfg.changes_topic = topics.changes.clone();
    let f = vitals_healthview::follow(cfg).expect("follows");
    println!(
        "cold start: {} endpoints from the state topic in {:.2} s ({:.0} endpoints/s)",
        f.view.len(),
        f.cold_start.as_secs_f64(),
        f.view.len() as f64 / f.cold_start.as_secs_f64()
    );
}
