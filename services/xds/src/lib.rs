//! `vitals-xds`: an xDS control plane for Envoy, the meshes built on it and proxyless gRPC. It
//! follows vitals' health topics (the health view: a cold start from the compacted state topic,
//! then the changes) and serves each pool `P` as a listener, a route configuration, a cluster and
//! a cluster load assignment named `P` ([`resources`]), over ADS and plain EDS, in both the
//! state-of-the-world and the incremental variants ([`protocol`]). A client's xDS node is its
//! identity: it gets the fleet's decisions plus its own gateway's and location's ([`table`]).
//!
//! When vitals goes silent (no tick for `--fail-open-after-secs`) every endpoint is served in
//! rotation at full weight, as the other followers do. Versions are hashes of the content, so a
//! restarted instance, or another behind the same address, serves the same versions; clients
//! keep their last assignment while they reconnect.

pub mod map;
pub mod protocol;
pub mod resources;
pub mod server;
pub mod table;

use anyhow::Context as _;
use axum::routing::get;
use clap::Parser;
use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_server::AggregatedDiscoveryServiceServer;
use envoy_types::pb::envoy::service::endpoint::v3::endpoint_discovery_service_server::EndpointDiscoveryServiceServer;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use vitals_contracts::clock::now_us;
use vitals_healthview::Identity;
use vitals_runtime::args::KafkaArgs;

#[derive(Parser)]
#[command(
    name = "vitals-xds",
    about = "Serves each pool's endpoints with vitals' health and weights over xDS (Envoy, proxyless gRPC)"
)]
pub struct Config {
    /// The xDS gRPC address (ADS and EDS).
    #[arg(long, env = "VITALS_XDS_ADDR", default_value = "127.0.0.1:18000")]
    pub grpc_addr: String,
    /// Liveness, readiness and metrics.
    #[arg(long, env = "VITALS_XDS_HTTP", default_value = "127.0.0.1:9470")]
    pub http_addr: String,
    /// Where endpoints whose names are not `host:port` are (TOML; see `vitals_xds::map`).
    #[arg(long, env = "VITALS_XDS_MAP")]
    pub map: Option<PathBuf>,
    /// The clusters' load-balancing policy: round_robin, least_request or ring_hash (which
    /// clients honour endpoint weights under which: docs/components.md).
    #[arg(long, env = "VITALS_XDS_LB_POLICY", default_value = "round_robin", value_parser = resources::LbPolicy::parse)]
    pub lb_policy: resources::LbPolicy,
    /// How a degraded endpoint is served: `auto` (DEGRADED to Envoy, which uses such hosts only
    /// when too few are healthy; HEALTHY at its lowered weight to every other client, since gRPC
    /// leaves DEGRADED endpoints out altogether), `degraded` or `healthy` for every client.
    #[arg(long, env = "VITALS_XDS_DEGRADED", default_value = "auto", value_parser = protocol::DegradedAs::parse)]
    pub degraded: protocol::DegradedAs,
    /// The part of a client's xDS node that names its gateway (scoped decisions of
    /// `gateway=...`): cluster, id or none.
    #[arg(long, env = "VITALS_XDS_NODE_GATEWAY", default_value = "cluster", value_parser = protocol::NodeField::parse)]
    pub node_gateway: protocol::NodeField,
    /// The part of a client's node locality that names its location (`location=...`): region,
    /// zone, sub_zone or none.
    #[arg(long, env = "VITALS_XDS_NODE_LOCATION", default_value = "zone", value_parser = protocol::NodeField::parse)]
    pub node_location: protocol::NodeField,
    #[command(flatten)]
    pub kafka: KafkaArgs,
    #[arg(long, env = "VITALS_CHANGES_TOPIC", default_value = vitals_contracts::topics::HEALTH_CHANGES)]
    pub changes_topic: String,
    #[arg(long, env = "VITALS_STATE_TOPIC", default_value = vitals_contracts::topics::HEALTH_STATE)]
    pub state_topic: String,
    /// Seconds without a word from the processor after which the view is stale (served as last
    /// known).
    #[arg(long, env = "VITALS_XDS_STALE_AFTER_SECS", default_value_t = 15)]
    pub stale_after_secs: u64,
    /// Seconds of silence after which every endpoint is served in rotation at full weight.
    #[arg(long, env = "VITALS_XDS_FAIL_OPEN_AFTER_SECS", default_value_t = 60)]
    pub fail_open_after_secs: u64,
}

/// The gRPC listener's connections, with Nagle's algorithm off (an update is one small write that
/// must not wait for the previous one's acknowledgement).
fn incoming(
    listener: tokio::net::TcpListener,
) -> impl tokio_stream::Stream<Item = std::io::Result<tokio::net::TcpStream>> {
    use tokio_stream::StreamExt as _;
    tokio_stream::wrappers::TcpListenerStream::new(listener).map(|conn| {
        let conn = conn?;
        conn.set_nodelay(true)?;
        Ok(conn)
    })
}

pub async fn run(cfg: Config, cancel: CancellationToken) -> anyhow::Result<()> {
    cfg.kafka.check().map_err(anyhow::Error::msg)?;
    let map = match &cfg.map {
        Some(p) => {
            let text = std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?;
            map::AddressMap::parse(&text).map_err(|e| anyhow::anyhow!("{}: {e}", p.display()))?
        }
        None => map::AddressMap::default(),
    };
    let grpc_addr: std::net::SocketAddr = cfg
        .grpc_addr
        .parse()
        .with_context(|| format!("--grpc-addr {:?} is not host:port", cfg.grpc_addr))?;
    // Bound first: a port in use fails the start at once, and /readyz is true only once xDS is
    // served.
    let grpc = tokio::net::TcpListener::bind(grpc_addr)
        .await
        .with_context(|| format!("binding {grpc_addr}"))?;
    let http = tokio::net::TcpListener::bind(&cfg.http_addr)
        .await
        .with_context(|| format!("binding {}", cfg.http_addr))?;
    let counters = Arc::new(server::Counters::default());
    let ready = Arc::new(AtomicBool::new(false));
    let app = {
        let (ready, counters) = (ready.clone(), counters.clone());
        vitals_runtime::probes::router(
            move || ready.load(Ordering::Relaxed),
            "not ready: loading the health state",
        )
        .route(
            "/metrics",
            get(move || std::future::ready(vitals_runtime::metrics::response(&counters.registry))),
        )
    };
    let http_cancel = cancel.clone();
    let http_server = tokio::spawn(async move {
        axum::serve(http, app)
            .with_graceful_shutdown(async move { http_cancel.cancelled().await })
            .await
    });

    let mut vc = vitals_healthview::Config::new(cfg.kafka.brokers.clone());
    vc.kafka_options = cfg.kafka.pairs().map(|(k, v)| (k.to_owned(), v.to_owned())).collect();
    vc.state_topic = cfg.state_topic.clone();
    vc.changes_topic = cfg.changes_topic.clone();
    vc.stale_after = Duration::from_secs(cfg.stale_after_secs);
    vc.open_after = Duration::from_secs(cfg.fail_open_after_secs);
    vc.identity = Identity::every();
    // The table exists before the view is loaded, so that the follower's listener can wake it.
    let (tx, mut rx) = tokio::sync::mpsc::channel::<()>(1);
    let follower = tokio::task::spawn_blocking(move || {
        vitals_healthview::follow_with(vc, move |_| {
            let _ = tx.try_send(());
        })
    })
    .await??;
    tracing::info!(endpoints = follower.view.len(), cold_start = ?follower.cold_start, "health view loaded");
    let table = Arc::new(table::Table::new(
        follower.view.clone(),
        map,
        cfg.lb_policy,
        counters.unmapped.clone(),
    ));
    table.tick(now_us());
    ready.store(true, Ordering::Relaxed);
    // Changes wake the streams at once; the tick moves ramps, trials and freshness each second.
    let waker = {
        let (table, cancel) = (table.clone(), cancel.clone());
        tokio::spawn(async move {
            let mut every = tokio::time::interval(Duration::from_secs(1));
            every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
            loop {
                tokio::select! {
                    _ = cancel.cancelled() => break,
                    got = rx.recv() => {
                        if got.is_none() {
                            break;
                        }
                        table.bump();
                    }
                    _ = every.tick() => table.tick(now_us()),
                }
            }
        })
    };
    let xds = server::Xds {
        table: table.clone(),
        scopes: protocol::NodeScopes {
            gateway: cfg.node_gateway,
            location: cfg.node_location,
            degraded: cfg.degraded,
        },
        counters: counters.clone(),
    };
    tracing::info!(%grpc_addr, pools = table.pools().len(), "serving xDS");
    let grpc_cancel = cancel.clone();
    tonic::transport::Server::builder()
        .http2_keepalive_interval(Some(Duration::from_secs(30)))
        .http2_keepalive_timeout(Some(Duration::from_secs(10)))
        .max_concurrent_streams(Some(100_000))
        .add_service(AggregatedDiscoveryServiceServer::new(xds.clone()))
        .add_service(EndpointDiscoveryServiceServer::new(xds))
        .serve_with_incoming_shutdown(incoming(grpc), async move { grpc_cancel.cancelled().await })
        .await
        .with_context(|| format!("serving xDS on {grpc_addr}"))?;
    waker.abort();
    drop(follower);
    http_server.await??;
    Ok(())
}
