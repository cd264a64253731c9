//! Simulated upstream endpoints with injectable faults: the ground that the prober, the router
//! and the demo are tested on.
//!
//! One process serves many endpoints, one port each on 127.0.0.1. Each speaks an
//! OpenAI-compatible `POST /v1/chat/completions` (streaming SSE and not), a plain health route
//! (`GET /health`), a deep-health route listing dependencies (`GET /health/deep`), and accepts raw
//! TCP. What each endpoint does is a [`Behaviour`], set at start and replaced live through the
//! admin API (`GET /endpoints`, `GET`/`PUT /endpoints/{name}`) or [`Sim::set`].
//!
//! Determinism: the fate of an endpoint's k-th request is a function of the seed, the endpoint's
//! name and k, so a run with the same seed and the same requests sees the same faults.

mod admin;
mod behaviour;
mod config;
mod endpoint;

pub use behaviour::{Behaviour, Dependency, DependencyStatus, Invalid, Period};
pub use config::{EndpointConfig, SimConfig};
pub use endpoint::{DECIDED_AT, DECIDED_TTFT};

use admin::*;
use axum::routing::get;
use axum::Router;
use endpoint::*;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// A running simulator.
pub struct Sim {
    admin: SocketAddr,
    endpoints: Endpoints,
    stop: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
}

impl Sim {
    /// Bind every endpoint and the admin API, then serve them in the background.
    pub async fn start(config: SimConfig) -> anyhow::Result<Sim> {
        config.validate()?;
        let (stop, _) = watch::channel(false);
        let mut endpoints = BTreeMap::new();
        let mut tasks = Vec::new();
        for e in config.endpoints {
            let listener = TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], e.port)))
                .await
                .map_err(|err| anyhow::anyhow!("endpoint {:?}: cannot listen on port {}: {err}", e.name, e.port))?;
            let port = listener.local_addr()?.port();
            let ep = Arc::new(Endpoint {
                seed: config.seed ^ fnv(&e.name),
                name: e.name.clone(),
                port,
                requests: AtomicU64::new(0),
                behaviour: watch::channel((e.behaviour, Instant::now())).0,
            });
            tasks.push(tokio::spawn(serve_endpoint(
                ep.clone(),
                Some(listener),
                stop.subscribe(),
            )));
            endpoints.insert(e.name, ep);
        }
        let endpoints: Endpoints = Arc::new(endpoints);
        let admin_listener = TcpListener::bind(config.admin)
            .await
            .map_err(|e| anyhow::anyhow!("admin API: cannot listen on {}: {e}", config.admin))?;
        let admin = admin_listener.local_addr()?;
        let app = Router::new()
            .route("/endpoints", get(admin_list))
            .route("/endpoints/{name}", get(admin_get).put(admin_put))
            .with_state(endpoints.clone());
        let mut admin_stop = stop.subscribe();
        tasks.push(tokio::spawn(async move {
            let shutdown = async move {
                let _ = admin_stop.changed().await;
            };
            if let Err(e) = axum::serve(admin_listener, app).with_graceful_shutdown(shutdown).await {
                tracing::error!(error = %e, "admin API failed");
            }
        }));
        Ok(Sim {
            admin,
            endpoints,
            stop,
            tasks,
        })
    }

    pub fn admin_addr(&self) -> SocketAddr {
        self.admin
    }

    /// The address of an endpoint.
    pub fn addr(&self, name: &str) -> Option<SocketAddr> {
        self.endpoints
            .get(name)
            .map(|e| SocketAddr::from(([127, 0, 0, 1], e.port)))
    }

    /// Every endpoint's name and address, in name order.
    pub fn endpoints(&self) -> Vec<(String, SocketAddr)> {
        self.endpoints
            .values()
            .map(|e| (e.name.clone(), SocketAddr::from(([127, 0, 0, 1], e.port))))
            .collect()
    }

    /// Replace an endpoint's behaviour (ramps and periods start again now).
    pub fn set(&self, name: &str, behaviour: Behaviour) -> anyhow::Result<()> {
        behaviour.validate()?;
        let ep = self
            .endpoints
            .get(name)
            .ok_or_else(|| anyhow::anyhow!("no endpoint {name:?}"))?;
        ep.behaviour.send_replace((behaviour, Instant::now()));
        Ok(())
    }

    /// Requests an endpoint has served.
    pub fn requests(&self, name: &str) -> u64 {
        self.endpoints
            .get(name)
            .map_or(0, |e| e.requests.load(Ordering::Relaxed))
    }

    /// Stop listening and end every task.
    pub async fn shutdown(self) {
        self.stop.send_replace(true);
        for t in self.tasks {
            t.abort();
            let _ = t.await;
        }
    }
}
