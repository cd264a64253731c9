//! xds-bench: one `vitals-xds` instance (the real binary, on the local stack) holding `--streams`
//! ADS streams (state of the world, each subscribed to one pool's assignment, spread over
//! `--connections` HTTP/2 connections), then `--rounds` transitions written to the changes topic
//! as the processor writes them: the time from a transition's write to each stream's receipt of
//! the assignment that shows it (p50, p99, max), and vitals-xds's memory per stream and CPU.
//!
//! The clients run in this process on the same machine, so their own decoding is in the figures.
//!
//!     cargo run --release -p vitals-bench --bin xds-bench -- --streams 10000

use clap::Parser;
use envoy_types::pb::envoy::config::core::v3::{HealthStatus, Node};
use envoy_types::pb::envoy::config::endpoint::v3::{lb_endpoint, ClusterLoadAssignment};
use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use envoy_types::pb::envoy::service::discovery::v3::DiscoveryRequest;
use prost::Message;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use vitals_bench::{cpu, now_us, stack, status_kb};
use vitals_contracts::{encode, EndpointState, HealthChanged, HealthState, Micros};

const EDS: &str = "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment";
const POOL: &str = "bench";

#[derive(Parser)]
struct Args {
    /// ADS streams held open at once.
    #[arg(long, default_value_t = 10_000)]
    streams: usize,
    /// HTTP/2 connections they share.
    #[arg(long, default_value_t = 50)]
    connections: usize,
    /// Endpoints in the pool.
    #[arg(long, default_value_t = 20)]
    endpoints: usize,
    /// Transitions timed.
    #[arg(long, default_value_t = 5)]
    rounds: usize,
}

fn endpoint(i: usize) -> String {
    format!("127.0.0.1:{}", 20_000 + i)
}

/// A transition as the processor publishes it: its state on the compacted state topic, then the
/// change (`p` a producer already connected, so that its start is not timed).
async fn publish(
    p: &rdkafka::producer::FutureProducer,
    topics: &stack::Topics,
    h: HealthChanged,
) -> anyhow::Result<()> {
    let key = format!("{}/{}", h.pool, h.endpoint);
    let input = |bytes: Vec<u8>| vitals_testkit::Input {
        partition: None,
        ts_ms: now_us() / 1000,
        key: Some(key.clone()),
        bytes,
    };
    vitals_testkit::produce(p, &topics.state, [input(encode(&EndpointState::from_change(&h))?)]).await;
    vitals_testkit::produce(p, &topics.changes, [input(encode(&h)?)]).await;
    Ok(())
}

fn change(ep: &str, seq: i64, to: HealthState) -> HealthChanged {
    HealthChanged {
        retry_at: (to == HealthState::Unhealthy).then_some(now_us() + 3_600_000_000),
        ..vitals_testkit::health_changed(POOL, ep, seq, to)
    }
}

/// The health status of endpoint `name` in an assignment.
fn first_status(cla: &ClusterLoadAssignment, name: &str) -> Option<i32> {
    cla.endpoints
        .iter()
        .flat_map(|l| &l.lb_endpoints)
        .find_map(|e| match &e.host_identifier {
            Some(lb_endpoint::HostIdentifier::Endpoint(ep)) if ep.hostname == name => Some(e.health_status),
            _ => None,
        })
}

fn pct(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let topics = stack::Topics::create(&stack::unique("xds_bench"), 1, stack::Stamp::LogAppendTime).await;
    let producer = stack::producer();
    for i in 0..args.endpoints {
        publish(&producer, &topics, change(&endpoint(i), 1, HealthState::Healthy)).await?;
    }
    let (grpc_port, http_port) = (vitals_testkit::free_port(), vitals_testkit::free_port());
    let cmd: Vec<String> = [
        "--brokers".to_owned(),
        stack::brokers(),
        "--changes-topic".into(),
        topics.changes.clone(),
        "--state-topic".into(),
        topics.state.clone(),
        "--grpc-addr".into(),
        format!("127.0.0.1:{grpc_port}"),
        "--http-addr".into(),
        format!("127.0.0.1:{http_port}"),
        // No ticks in this bench: the view must not fail open while it runs.
        "--fail-open-after-secs".into(),
        "3600".into(),
        "--stale-after-secs".into(),
        "3600".into(),
    ]
    .to_vec();
    let server = stack::Service::start("vitals-xds", "xds-bench", &cmd);
    let pid = server.child.id();
    let t = Instant::now();
    while vitals_testkit::http_get(http_port, "/readyz")
        .await
        .is_none_or(|b| !b.contains("ready"))
    {
        anyhow::ensure!(t.elapsed() < Duration::from_secs(60), "vitals-xds not ready in 60 s");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let idle_kb = status_kb(pid, "VmRSS:");
    eprintln!(
        "vitals-xds ready, RSS {idle_kb} kB; opening {} streams over {} connections",
        args.streams, args.connections
    );

    let url = format!("http://127.0.0.1:{grpc_port}");
    let mut channels = Vec::new();
    for _ in 0..args.connections {
        channels.push(tonic::transport::Channel::from_shared(url.clone())?.connect().await?);
    }
    let target = endpoint(0);
    // Per stream: the receipt time of each round's assignment (index 0: the first answer).
    let seen: Arc<Mutex<Vec<Vec<Micros>>>> = Arc::new(Mutex::new(vec![Vec::new(); args.rounds + 1]));
    let opened = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    for s in 0..args.streams {
        let mut client = AggregatedDiscoveryServiceClient::new(channels[s % channels.len()].clone());
        let (seen, opened, target) = (seen.clone(), opened.clone(), target.clone());
        tokio::spawn(async move {
            let (tx, rx) = tokio::sync::mpsc::channel(4);
            let _ = tx
                .send(DiscoveryRequest {
                    node: Some(Node {
                        id: format!("bench-{s}"),
                        cluster: format!("edge-{}", s % 10),
                        ..Default::default()
                    }),
                    type_url: EDS.into(),
                    resource_names: vec![POOL.into()],
                    ..Default::default()
                })
                .await;
            let Ok(resp) = client
                .stream_aggregated_resources(tokio_stream::wrappers::ReceiverStream::new(rx))
                .await
            else {
                return;
            };
            let mut inbound = resp.into_inner();
            let mut round = 0usize;
            while let Ok(Some(r)) = inbound.message().await {
                let at = now_us();
                let _ = tx
                    .send(DiscoveryRequest {
                        type_url: EDS.into(),
                        resource_names: vec![POOL.into()],
                        version_info: r.version_info.clone(),
                        response_nonce: r.nonce.clone(),
                        ..Default::default()
                    })
                    .await;
                let Some(any) = r.resources.first() else { continue };
                let Ok(cla) = ClusterLoadAssignment::decode(any.value.as_slice()) else {
                    continue;
                };
                let status = first_status(&cla, &target);
                // Round k (1-based) takes endpoint 0 out when k is odd, back when even.
                let want = |k: usize| {
                    if k % 2 == 1 {
                        HealthStatus::Unhealthy as i32
                    } else {
                        HealthStatus::Healthy as i32
                    }
                };
                if round == 0 {
                    opened.fetch_add(1, Ordering::Relaxed);
                    seen.lock().unwrap()[0].push(at);
                    round = 1;
                } else if round < seen.lock().unwrap().len() && status == Some(want(round)) {
                    seen.lock().unwrap()[round].push(at);
                    round += 1;
                }
            }
        });
    }
    while opened.load(Ordering::Relaxed) < args.streams {
        anyhow::ensure!(
            started.elapsed() < Duration::from_secs(300),
            "only {} streams opened in 300 s",
            opened.load(Ordering::Relaxed)
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let open_secs = started.elapsed().as_secs_f64();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let held_kb = status_kb(pid, "VmRSS:");
    println!(
        "{} streams open in {open_secs:.1} s; vitals-xds RSS {idle_kb} kB idle, {held_kb} kB with them: {:.1} kB per stream",
        args.streams,
        held_kb.saturating_sub(idle_kb) as f64 / args.streams as f64
    );
    let mut all = Vec::new();
    let cpu_before = cpu::of_pid(pid);
    for k in 1..=args.rounds {
        let to = if k % 2 == 1 {
            HealthState::Unhealthy
        } else {
            HealthState::Healthy
        };
        let written = now_us();
        publish(&producer, &topics, change(&target, 1 + k as i64, to)).await?;
        let t = Instant::now();
        while seen.lock().unwrap()[k].len() < args.streams {
            anyhow::ensure!(
                t.elapsed() < Duration::from_secs(120),
                "round {k}: {} of {} streams got the change in 120 s",
                seen.lock().unwrap()[k].len(),
                args.streams
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let mut ms: Vec<f64> = seen.lock().unwrap()[k]
            .iter()
            .map(|at| (at - written) as f64 / 1000.0)
            .collect();
        ms.sort_by(f64::total_cmp);
        println!(
            "round {k} ({}): every stream in {:.0} ms; p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms",
            to.as_str(),
            ms.last().copied().unwrap_or(f64::NAN),
            pct(&ms, 0.5),
            pct(&ms, 0.99),
            ms.last().copied().unwrap_or(f64::NAN)
        );
        all.extend(ms);
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    all.sort_by(f64::total_cmp);
    let cpu_used = cpu::of_pid(pid) - cpu_before;
    println!(
        "over {} rounds × {} streams: p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms; vitals-xds CPU {:.2} s ({:.1} µs per stream update)",
        args.rounds,
        args.streams,
        pct(&all, 0.5),
        pct(&all, 0.99),
        all.last().copied().unwrap_or(f64::NAN),
        cpu_used,
        cpu_used * 1e6 / all.len().max(1) as f64
    );
    drop(server);
    topics.delete().await;
    Ok(())
}
