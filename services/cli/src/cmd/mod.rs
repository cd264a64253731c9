//! One file per verb, each with its flags (`Args`) and its `run`; what they share is here: where
//! the API is ([`Connection`]), reading a policy file, printing JSON.

pub mod backtest;
pub mod health;
pub mod history;
pub mod overrides;
pub mod policy;
pub mod report;
pub mod scenarios;
pub mod simulate;
pub mod tail;

use crate::api::Api;
use anyhow::Context as _;
use clap::{Args, Subcommand};
use serde_json::Value;
use std::path::PathBuf;
use vitals_contracts::Policy;

#[derive(Subcommand)]
pub enum Command {
    /// The engine on stdin/stdout: one JSON signal per line in (call, probe, tick, policy,
    /// override, each with `t_us`), one JSON decision per line out; a tick is acknowledged with
    /// {"kind":"tick_done","t_us":T} after the decisions it caused.
    Simulate(simulate::Args),
    /// Current health: every pool, one pool's endpoints, or one endpoint.
    Health(health::Args),
    /// Transitions from the audit log, newest first, with their reasons.
    History(history::Args),
    /// An operator action on an endpoint: force_healthy, force_unhealthy, maintenance_on,
    /// maintenance_off or clear.
    Override(overrides::Args),
    /// Replay the signals of a time range under a candidate policy and compare with the audit
    /// log: ejections added and removed, detection and restore moved, time out of rotation.
    Backtest(backtest::Args),
    /// The scorecard's closed-loop fault scenarios under a candidate policy, side by side with
    /// the default one (same seeds).
    Scenarios(scenarios::Args),
    /// Availability and incidents over a range, worst pools and endpoints first: time out of
    /// rotation, and per incident its time to out of rotation and back (definitions:
    /// docs/uptime.md).
    Report(report::Args),
    /// A pool's policy.
    Policy(policy::Args),
    /// Live transitions (and pool events) from the API's stream; resumes after a reconnect.
    Tail(tail::Args),
}

impl Command {
    /// Run the verb; its exit code when it is not 0 or an error's (see main.rs).
    pub async fn run(self) -> anyhow::Result<u8> {
        match self {
            Command::Simulate(a) => simulate::run(a).await,
            Command::Health(a) => health::run(a).await,
            Command::History(a) => history::run(a).await,
            Command::Override(a) => overrides::run(a).await,
            Command::Backtest(a) => backtest::run(a).await,
            Command::Scenarios(a) => scenarios::run(a).await,
            Command::Report(a) => report::run(a).await,
            Command::Policy(a) => policy::run(a).await,
            Command::Tail(a) => tail::run(a).await,
        }
    }
}

/// Where the API is: flags, then the environment, then the config file
/// (`$XDG_CONFIG_HOME/vitals/config.toml` or `~/.config/vitals/config.toml`: `api = "…"`,
/// `token = "…"`).
#[derive(Args, Clone)]
pub struct Connection {
    /// The API's base URL [default: http://127.0.0.1:8080].
    #[arg(long, env = "VITALS_API", global = true)]
    pub api: Option<String>,
    /// An API token (reader for reads, admin for overrides and policies).
    #[arg(long, env = "VITALS_TOKEN", global = true, hide_env_values = true)]
    pub token: Option<String>,
    /// Print the API's JSON instead of a table.
    #[arg(long, global = true)]
    pub json: bool,
}

fn config_file() -> Option<PathBuf> {
    let base = std::env::var_os("XDG_CONFIG_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".config")))?;
    Some(base.join("vitals").join("config.toml"))
}

impl Connection {
    pub fn api(&self) -> anyhow::Result<Api> {
        let mut api = self.api.clone();
        let mut token = self.token.clone();
        if let Some(path) = config_file().filter(|p| p.is_file()) {
            let text = std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
            let v: toml::Table = text.parse().with_context(|| format!("{}", path.display()))?;
            api = api.or_else(|| v.get("api").and_then(|s| s.as_str()).map(str::to_owned));
            token = token.or_else(|| v.get("token").and_then(|s| s.as_str()).map(str::to_owned));
        }
        Ok(Api {
            base: api.unwrap_or_else(|| "http://127.0.0.1:8080".into()),
            token,
            client: reqwest::Client::builder()
                .connect_timeout(std::time::Duration::from_secs(5))
                .build()?,
        })
    }
}

/// A policy file (JSON), checked to be one before anything is sent.
pub fn read_policy(path: &PathBuf) -> anyhow::Result<Value> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let v: Value = serde_json::from_str(&text).with_context(|| format!("{}: not JSON", path.display()))?;
    // Checked here too, so that a mistake is named before anything is sent.
    serde_json::from_value::<Policy>(v.clone()).with_context(|| format!("{}: not a policy", path.display()))?;
    Ok(v)
}

/// A candidate policy from `path`, or the default one.
pub fn policy_or_default(path: Option<&PathBuf>) -> anyhow::Result<Policy> {
    Ok(match path {
        Some(p) => serde_json::from_value(read_policy(p)?)?,
        None => Policy::default(),
    })
}

pub fn print_typed(v: &impl serde::Serialize) -> anyhow::Result<()> {
    println!("{}", serde_json::to_string_pretty(v)?);
    Ok(())
}
