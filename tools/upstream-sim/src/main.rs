//! `vitals-upstream-sim`: simulated upstream endpoints with injectable faults.
//!
//!   vitals-upstream-sim --config sim.toml
//!   vitals-upstream-sim --endpoints 4 --base-port 9101 --admin 127.0.0.1:9100 --seed 7
//!
//! Each endpoint serves `POST /v1/chat/completions`, `GET /health`, `GET /health/deep` and raw
//! TCP on its own port; the admin API lists endpoints and replaces their behaviour live
//! (`PUT /endpoints/{name}` with a behaviour as JSON).

use clap::Parser;
use std::net::SocketAddr;
use std::path::PathBuf;
use vitals_upstream_sim::{Sim, SimConfig};

#[derive(Parser)]
#[command(
    name = "vitals-upstream-sim",
    about = "Simulated upstream endpoints with injectable faults"
)]
struct Args {
    /// A TOML file: `seed`, `admin`, and `[[endpoint]]` tables with `name`, `port` and
    /// `[endpoint.behaviour]`.
    #[arg(long, env = "VITALS_SIM_CONFIG", conflicts_with = "endpoints")]
    config: Option<PathBuf>,
    /// Without a file: this many healthy endpoints e0, e1, …
    #[arg(long)]
    endpoints: Option<usize>,
    /// Without a file: the first endpoint's port (the others follow); 0 picks free ports.
    #[arg(long, default_value_t = 0)]
    base_port: u16,
    /// Without a file: the admin API's address.
    #[arg(long, default_value = "127.0.0.1:9100")]
    admin: SocketAddr,
    /// Without a file: the seed of every endpoint's fault draws.
    #[arg(long, default_value_t = 0)]
    seed: u64,
}

fn config(args: &Args) -> anyhow::Result<SimConfig> {
    if let Some(path) = &args.config {
        let text = std::fs::read_to_string(path).map_err(|e| anyhow::anyhow!("cannot read {}: {e}", path.display()))?;
        return SimConfig::from_toml(&text).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()));
    }
    let n = args.endpoints.unwrap_or(1);
    let mut c = SimConfig::healthy(n, args.seed);
    c.admin = args.admin;
    if args.base_port != 0 {
        for (i, e) in c.endpoints.iter_mut().enumerate() {
            let port = usize::from(args.base_port) + i;
            e.port = u16::try_from(port).map_err(|_| anyhow::anyhow!("port {port} is out of range"))?;
        }
    }
    Ok(c)
}

#[tokio::main]
async fn main() {
    tracing_subscriber::fmt().with_writer(std::io::stderr).init();
    let args = Args::parse();
    let sim = match config(&args) {
        Ok(c) => Sim::start(c).await,
        Err(e) => Err(e),
    };
    let sim = match sim {
        Ok(s) => s,
        Err(e) => {
            eprintln!("vitals-upstream-sim: {e}");
            std::process::exit(2);
        }
    };
    for (name, addr) in sim.endpoints() {
        println!("endpoint {name} http://{addr}");
    }
    println!("admin http://{}", sim.admin_addr());
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).expect("SIGTERM handler");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
    sim.shutdown().await;
}
