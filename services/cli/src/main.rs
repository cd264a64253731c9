//! `vitals`: the engine as a filter for what-if simulation, and the HTTP API's routes as verbs.
//!
//!   vitals simulate [--policy FILE] < signals.jsonl > decisions.jsonl
//!   vitals health [POOL [ENDPOINT]]      vitals history [--pool P] [--endpoint E] [--from T] [--to T]
//!   vitals override POOL ENDPOINT ACTION --reason WHY
//!   vitals policy get|set POOL [FILE]    vitals tail [--pool P] [--endpoint E]
//!   vitals backtest --from T1 --to T2 --policy candidate.json [--pool P] [--html report.html]
//!   vitals scenarios [--policy candidate.json]
//!   vitals report [--from T] [--to T] [--pool P] [--json|--html]
//!
//! Exit codes: 0 done; 1 the API (or a file) could not be reached or read; 2 bad usage; 3 the API
//! refused the request (the message says why); 4 `simulate` met bad input lines (each has its
//! error line; the others were processed).

mod api;
mod backtest;
mod report;
mod scenarios;
mod simulate;

use anyhow::Context as _;
use api::{cell, rfc3339, table, transition_line, Api, Refused};
use clap::{Args, Parser, Subcommand};
use serde_json::{json, Value};
use std::path::PathBuf;
use vitals_contracts::{view, Policy};

#[derive(Parser)]
#[command(
    name = "vitals",
    version,
    about = "The vitals command: what-if simulation and the API's routes as verbs"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

/// Where the API is: flags, then the environment, then the config file
/// (`$XDG_CONFIG_HOME/vitals/config.toml` or `~/.config/vitals/config.toml`: `api = "…"`,
/// `token = "…"`).
#[derive(Args, Clone)]
struct Connection {
    /// The API's base URL [default: http://127.0.0.1:8080].
    #[arg(long, env = "VITALS_API", global = true)]
    api: Option<String>,
    /// An API token (reader for reads, admin for overrides and policies).
    #[arg(long, env = "VITALS_TOKEN", global = true, hide_env_values = true)]
    token: Option<String>,
    /// Print the API's JSON instead of a table.
    #[arg(long, global = true)]
    json: bool,
}

#[derive(Subcommand)]
enum Command {
    /// The engine on stdin/stdout: one JSON signal per line in (call, probe, tick, policy,
    /// override, each with `t_us`), one JSON decision per line out; a tick is acknowledged with
    /// {"kind":"tick_done","t_us":T} after the decisions it caused.
    Simulate {
        /// The policy every pool starts with (JSON, fields as in PUT /v1/pools/{pool}/policy;
        /// missing fields keep their defaults).
        #[arg(long)]
        policy: Option<PathBuf>,
    },
    /// Current health: every pool, one pool's endpoints, or one endpoint.
    Health {
        pool: Option<String>,
        endpoint: Option<String>,
        #[command(flatten)]
        conn: Connection,
    },
    /// Transitions from the audit log, newest first, with their reasons.
    History {
        #[arg(long)]
        pool: Option<String>,
        #[arg(long)]
        endpoint: Option<String>,
        /// RFC 3339.
        #[arg(long)]
        from: Option<String>,
        /// RFC 3339.
        #[arg(long)]
        to: Option<String>,
        /// Only transitions into this state.
        #[arg(long)]
        state: Option<String>,
        /// At most this many (pages are followed).
        #[arg(long, default_value_t = 50)]
        limit: usize,
        #[command(flatten)]
        conn: Connection,
    },
    /// An operator action on an endpoint: force_healthy, force_unhealthy, maintenance_on,
    /// maintenance_off or clear.
    Override {
        pool: String,
        endpoint: String,
        action: String,
        /// Why (recorded in the audit log with the token's name).
        #[arg(long)]
        reason: String,
        #[command(flatten)]
        conn: Connection,
    },
    /// Replay the signals of a time range under a candidate policy and compare with the audit
    /// log: ejections added and removed, detection and restore moved, time out of rotation.
    Backtest {
        /// Start of the range (RFC 3339).
        #[arg(long)]
        from: String,
        /// End of the range (RFC 3339).
        #[arg(long)]
        to: String,
        /// The candidate policy (JSON; missing fields keep their defaults).
        #[arg(long)]
        policy: PathBuf,
        /// Only this pool.
        #[arg(long)]
        pool: Option<String>,
        /// Signals read before --from so that windows and scores are warm, seconds.
        #[arg(long, default_value_t = 900)]
        warmup_secs: i64,
        /// Also write a page with the timelines (current and candidate) per endpoint.
        #[arg(long)]
        html: Option<PathBuf>,
        #[arg(long, env = "VITALS_KAFKA_BROKERS", default_value = "127.0.0.1:9092")]
        brokers: String,
        #[arg(long, env = "VITALS_SIGNALS_TOPIC", default_value = vitals_contracts::topics::SIGNALS)]
        signals_topic: String,
        #[command(flatten)]
        conn: Connection,
    },
    /// The scorecard's closed-loop fault scenarios under a candidate policy, side by side with
    /// the default one (same seeds).
    Scenarios {
        /// The candidate policy (JSON; missing fields keep their defaults); default: the default.
        #[arg(long)]
        policy: Option<PathBuf>,
        /// Only this scenario.
        #[arg(long)]
        scenario: Option<String>,
        /// Seeds per scenario (medians are shown).
        #[arg(long, default_value_t = 5)]
        runs: u64,
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Availability and incidents over a range, worst pools and endpoints first: time out of
    /// rotation, and per incident its time to out of rotation and back (definitions: the
    /// README's Uptime section).
    Report {
        /// Start of the range (RFC 3339) [default: seven days before --to].
        #[arg(long)]
        from: Option<String>,
        /// End of the range (RFC 3339) [default: now].
        #[arg(long)]
        to: Option<String>,
        /// Only this pool [default: every pool].
        #[arg(long)]
        pool: Option<String>,
        /// One self-contained HTML page on stdout (redirect it to a file to send it).
        #[arg(long, conflicts_with = "json")]
        html: bool,
        #[command(flatten)]
        conn: Connection,
    },
    /// A pool's policy.
    Policy {
        #[command(subcommand)]
        action: PolicyAction,
    },
    /// Live transitions (and pool events) from the API's stream; resumes after a reconnect.
    Tail {
        #[arg(long)]
        pool: Option<String>,
        #[arg(long)]
        endpoint: Option<String>,
        /// Stop after this many events (0: never).
        #[arg(long, default_value_t = 0)]
        max: usize,
        #[command(flatten)]
        conn: Connection,
    },
}

#[derive(Subcommand)]
enum PolicyAction {
    /// The policy the engine applies to a pool (from the processor's latest snapshot of it).
    Get {
        pool: String,
        #[command(flatten)]
        conn: Connection,
    },
    /// Replace a pool's policy with the one in FILE (JSON; missing fields keep their defaults).
    Set {
        pool: String,
        file: PathBuf,
        #[command(flatten)]
        conn: Connection,
    },
}

fn config_file() -> Option<PathBuf> {
    let base = std::env::var_os("XDG_CONFIG_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".config")))?;
    Some(base.join("vitals").join("config.toml"))
}

impl Connection {
    fn api(&self) -> anyhow::Result<Api> {
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

fn read_policy(path: &PathBuf) -> anyhow::Result<Value> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let v: Value = serde_json::from_str(&text).with_context(|| format!("{}: not JSON", path.display()))?;
    // Checked here too, so that a mistake is named before anything is sent.
    serde_json::from_value::<Policy>(v.clone()).with_context(|| format!("{}: not a policy", path.display()))?;
    Ok(v)
}

fn print_typed(v: &impl serde::Serialize) -> anyhow::Result<()> {
    println!("{}", serde_json::to_string_pretty(v)?);
    Ok(())
}

async fn health(pool: Option<String>, endpoint: Option<String>, conn: &Connection) -> anyhow::Result<()> {
    let api = conn.api()?;
    let f2 = |v: f64| format!("{v:.2}");
    match (pool, endpoint) {
        (None, _) => {
            let pools = report::all_pools(&api).await?;
            if conn.json {
                return print_typed(&view::PoolPage {
                    pools,
                    next_after: None,
                });
            }
            let rows = pools
                .iter()
                .map(|p| {
                    let out = p
                        .by_state
                        .get(view::StateName::Unhealthy.as_str())
                        .copied()
                        .unwrap_or(0);
                    vec![p.pool.clone(), format!("{}/{}", p.healthy, p.total), out.to_string()]
                })
                .collect::<Vec<_>>();
            table(&["pool", "healthy", "unhealthy"], &rows);
        }
        (Some(pool), None) => {
            // Every endpoint of the pool, a page at a time.
            let path = format!("/v1/pools/{}", api::seg(&pool));
            let mut p: view::PoolHealth = api.get_as(&path, &[("limit", "1000".into())]).await?;
            while let Some(after) = p.next_after.take() {
                let next: view::PoolHealth = api.get_as(&path, &[("limit", "1000".into()), ("after", after)]).await?;
                p.endpoints.extend(next.endpoints);
                p.next_after = next.next_after;
            }
            if conn.json {
                return print_typed(&p);
            }
            let rows = p
                .endpoints
                .iter()
                .map(|e| {
                    vec![
                        e.endpoint.clone(),
                        e.state.as_str().to_owned(),
                        f2(e.weight),
                        f2(e.score),
                        f2(e.failure_rate),
                        rfc3339(&e.since),
                        e.reason.clone(),
                    ]
                })
                .collect::<Vec<_>>();
            table(
                &[
                    "endpoint",
                    "state",
                    "weight",
                    "score",
                    "failure rate",
                    "since",
                    "reason",
                ],
                &rows,
            );
        }
        (Some(pool), Some(ep)) => {
            let d: view::EndpointDetail = api
                .get_as(
                    &format!("/v1/pools/{}/endpoints/{}", api::seg(&pool), api::seg(&ep)),
                    &[],
                )
                .await?;
            if conn.json {
                return print_typed(&d);
            }
            let c = &d.current;
            for (k, v) in [
                ("state", c.state.as_str().to_owned()),
                ("weight", f2(c.weight)),
                ("ramp_ms", c.ramp_ms.to_string()),
                ("score", f2(c.score)),
                ("failure_rate", f2(c.failure_rate)),
                ("since", rfc3339(&c.since)),
                ("reason", c.reason.clone()),
                ("seq", c.seq.to_string()),
            ] {
                println!("{k:<13} {v}");
            }
            if let Some(t) = &d.last_transition {
                println!("last          {}", transition_line(t));
            }
        }
    }
    Ok(())
}

#[allow(clippy::too_many_arguments)]
async fn history(
    pool: Option<String>,
    endpoint: Option<String>,
    from: Option<String>,
    to: Option<String>,
    state: Option<String>,
    limit: usize,
    conn: &Connection,
) -> anyhow::Result<()> {
    let api = conn.api()?;
    let mut q: Vec<(&str, String)> = [
        ("pool", pool),
        ("endpoint", endpoint),
        ("from", from),
        ("to", to),
        ("state", state),
    ]
    .into_iter()
    .filter_map(|(k, v)| v.map(|v| (k, v)))
    .collect();
    q.push(("limit", limit.clamp(1, 500).to_string()));
    let mut items: Vec<view::Transition> = Vec::new();
    loop {
        let page: view::HistoryPage = api.get_as("/v1/transitions", &q).await?;
        items.extend(page.items);
        match page.next_cursor {
            Some(c) if items.len() < limit => {
                q.retain(|(k, _)| *k != "cursor");
                q.push(("cursor", c));
            }
            _ => break,
        }
    }
    items.truncate(limit);
    if conn.json {
        print_typed(&items)?;
    } else {
        for t in &items {
            println!("{}", transition_line(t));
        }
    }
    Ok(())
}

async fn run(cli: Cli) -> anyhow::Result<u8> {
    match cli.command {
        Command::Simulate { policy } => {
            let policy: Policy = match &policy {
                Some(p) => serde_json::from_value(read_policy(p)?)?,
                None => Policy::default(),
            };
            let totals = tokio::task::spawn_blocking(move || {
                let stdin = std::io::stdin().lock();
                let stdout = std::io::BufWriter::with_capacity(1 << 16, std::io::stdout().lock());
                simulate::run(policy, stdin, stdout)
            })
            .await??;
            eprintln!(
                "vitals simulate: {} lines, {} decisions, {} errors",
                totals.lines, totals.decisions, totals.errors
            );
            return Ok(if totals.errors > 0 { 4 } else { 0 });
        }
        Command::Health { pool, endpoint, conn } => health(pool, endpoint, &conn).await?,
        Command::Report {
            from,
            to,
            pool,
            html,
            conn,
        } => {
            for (flag, v) in [("--from", &from), ("--to", &to)] {
                if let Some(v) = v
                    .as_deref()
                    .filter(|v| chrono::DateTime::parse_from_rfc3339(v).is_err())
                {
                    eprintln!("vitals: {flag} {v:?} is not an RFC 3339 time (e.g. 2026-11-24T00:00:00Z)");
                    return Ok(2);
                }
            }
            let now = chrono::Utc::now();
            let to = to.unwrap_or_else(|| now.to_rfc3339());
            let from = match from {
                Some(f) => f,
                None => (chrono::DateTime::parse_from_rfc3339(&to)? - chrono::Duration::days(7)).to_rfc3339(),
            };
            let r = report::read(&conn.api()?, &from, &to, pool).await?;
            if conn.json {
                print_typed(&r)?;
            } else if html {
                print!("{}", report::html(&r));
            } else {
                report::print(&r);
            }
        }
        Command::Scenarios {
            policy,
            scenario,
            runs,
            seed,
            json,
        } => {
            let candidate: Policy = match &policy {
                Some(p) => serde_json::from_value(read_policy(p)?)?,
                None => Policy::default(),
            };
            let rows =
                tokio::task::spawn_blocking(move || scenarios::compare(&candidate, seed, runs, scenario.as_deref()))
                    .await??;
            if json {
                print_typed(&rows)?;
            } else {
                scenarios::print(&rows);
            }
        }
        Command::Backtest {
            from,
            to,
            policy,
            pool,
            warmup_secs,
            html,
            brokers,
            signals_topic,
            conn,
        } => {
            let time = |flag: &str, v: &str| -> anyhow::Result<i64> {
                chrono::DateTime::parse_from_rfc3339(v)
                    .map(|t| t.timestamp_micros())
                    .with_context(|| format!("--{flag} {v:?} is not an RFC 3339 time"))
            };
            let range = backtest::Range {
                from_us: time("from", &from)?,
                to_us: time("to", &to)?,
                warmup_us: warmup_secs.max(0) * 1_000_000,
                pool,
            };
            anyhow::ensure!(range.to_us > range.from_us, "--to must be after --from");
            let candidate: Policy = serde_json::from_value(read_policy(&policy)?)?;
            let api = conn.api()?;
            let current = backtest::current(&api, &range).await?;
            let (candidate, range) = tokio::task::spawn_blocking(move || {
                backtest::replay(&brokers, &signals_topic, &range, &candidate).map(|o| (o, range))
            })
            .await??;
            let diffs = backtest::compare(&current, &candidate, &range);
            if let Some(path) = &html {
                std::fs::write(path, backtest::html(&diffs, &range))
                    .with_context(|| format!("writing {}", path.display()))?;
                eprintln!("vitals backtest: timelines in {}", path.display());
            }
            if conn.json {
                print_typed(&diffs)?;
            } else {
                backtest::print_table(&diffs);
            }
        }
        Command::History {
            pool,
            endpoint,
            from,
            to,
            state,
            limit,
            conn,
        } => history(pool, endpoint, from, to, state, limit, &conn).await?,
        Command::Override {
            pool,
            endpoint,
            action,
            reason,
            conn,
        } => {
            let a = conn
                .api()?
                .send_accepted(
                    false,
                    &format!(
                        "/v1/pools/{}/endpoints/{}/override",
                        api::seg(&pool),
                        api::seg(&endpoint)
                    ),
                    &json!({"action": action, "reason": reason}),
                )
                .await?;
            if conn.json {
                print_typed(&a)?;
            } else {
                println!("accepted: {action} on {pool}/{endpoint} (record {})", a.id);
            }
        }
        Command::Policy {
            action: PolicyAction::Get { pool, conn },
        } => {
            let p: view::PoolPolicy = conn
                .api()?
                .get_as(&format!("/v1/pools/{}/policy", api::seg(&pool)), &[])
                .await?;
            if conn.json {
                print_typed(&p)?;
            } else {
                println!("pool {pool}, policy version {}", p.version);
                if let Value::Object(fields) = serde_json::to_value(&p.policy)? {
                    for (k, val) in &fields {
                        println!("  {k:<28} {}", cell(val));
                    }
                }
            }
        }
        Command::Policy {
            action: PolicyAction::Set { pool, file, conn },
        } => {
            let body = read_policy(&file)?;
            let a = conn
                .api()?
                .send_accepted(true, &format!("/v1/pools/{}/policy", api::seg(&pool)), &body)
                .await?;
            if conn.json {
                print_typed(&a)?;
            } else {
                println!(
                    "accepted: the policy of {pool} from {} (record {})",
                    file.display(),
                    a.id
                );
            }
        }
        Command::Tail {
            pool,
            endpoint,
            max,
            conn,
        } => {
            let q: Vec<(&str, String)> = [("pool", pool), ("endpoint", endpoint)]
                .into_iter()
                .filter_map(|(k, v)| v.map(|v| (k, v)))
                .collect();
            let mut seen = 0;
            conn.api()?
                .tail(&q, |event, data| {
                    if event == "ready" {
                        eprintln!("vitals tail: following the live stream");
                        return true;
                    }
                    if event != "health_changed" && event != "pool_changed" {
                        return true;
                    }
                    if conn.json {
                        println!("{}", json!({"event": event, "data": data}));
                    } else if event == "health_changed" {
                        match serde_json::from_value::<view::Transition>(data.clone()) {
                            Ok(t) => println!("{}", transition_line(&t)),
                            Err(e) => eprintln!("vitals tail: a health_changed event this build cannot read: {e}"),
                        }
                    } else {
                        match serde_json::from_value::<view::PoolEvent>(data.clone()) {
                            Ok(p) => println!(
                                "{}  {} pool: {}/{} healthy, panic={} correlated_outage={}",
                                rfc3339(&p.stream_time),
                                p.pool,
                                p.healthy,
                                p.endpoints,
                                p.panic,
                                p.correlated_outage
                            ),
                            Err(e) => eprintln!("vitals tail: a pool_changed event this build cannot read: {e}"),
                        }
                    }
                    seen += 1;
                    max == 0 || seen < max
                })
                .await?;
        }
    }
    Ok(0)
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    match run(cli).await {
        Ok(code) => std::process::ExitCode::from(code),
        Err(e) => {
            eprintln!("vitals: {e:#}");
            let refused = e.downcast_ref::<Refused>().is_some();
            std::process::ExitCode::from(if refused { 3 } else { 1 })
        }
    }
}
