//! `vitals-haproxy`: keeps a running HAProxy's servers where vitals' health view says they
//! belong, through the Runtime API. Every `--interval-ms` (and at once after a change) it reads
//! `show servers state` and sends the `set server` commands that differ: out of rotation
//! (`state maint`, or `drain`), back (`state ready`), and the weight (the slow-start ramp
//! included, as a share of the configured weight). Reading the state each time is the
//! reconciliation: at start, after HAProxy restarts, after the socket comes back. A view that
//! hears nothing from vitals for `--fail-open-after-secs` puts every server it steers back at full
//! weight. Servers an operator forced out are never touched (vitals' own forced states are kept
//! in `--state-file` across restarts), and a weight an operator set is the base vitals' weight
//! multiplies. A server out of rotation whose trial is due (the health view's rule, as vitals'
//! router and LiteLLM follow it) is let in at a tenth of its weight for [`TRIAL_WINDOW`]: the
//! requests HAProxy sends it are its trial, and the processor readmits it on them — no prober
//! needed.

use anyhow::Context as _;
use axum::routing::get;
use clap::Parser;
use std::collections::{BTreeSet, HashMap, HashSet};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;
use vitals_contracts::clock::now_us;
use vitals_contracts::HealthState;
use vitals_gateways::map::Map;
use vitals_gateways::runtime::{held_by_others, plan, Client, OutState, Server, Want};
use vitals_healthview::{Freshness, HealthView};
use vitals_runtime::args::KafkaArgs;

#[derive(Parser)]
#[command(
    name = "vitals-haproxy",
    about = "Applies vitals' decisions to HAProxy through its Runtime API"
)]
pub struct Config {
    /// HAProxy's Runtime API: a Unix socket path, or host:port (`stats socket ... level admin`).
    #[arg(long, env = "VITALS_HAPROXY_RUNTIME_API")]
    runtime_api: String,
    /// The backend → pool, server → endpoint table (TOML, the log bridge's).
    #[arg(long, env = "VITALS_HAPROXY_MAP")]
    map: Option<PathBuf>,
    /// How a server leaves rotation: `maint`, or `drain` (persistent sessions stay).
    #[arg(long, env = "VITALS_HAPROXY_OUT_STATE", default_value = "maint", value_parser = out_state)]
    out_state: OutState,
    /// How often HAProxy's state is read and brought to vitals' (changes are applied at once).
    #[arg(long, env = "VITALS_HAPROXY_INTERVAL_MS", default_value_t = 1000)]
    interval_ms: u64,
    /// Where the servers vitals itself forced out are remembered across restarts (so that they
    /// are not mistaken for an operator's).
    #[arg(long, env = "VITALS_HAPROXY_STATE_FILE")]
    state_file: Option<PathBuf>,
    #[command(flatten)]
    kafka: KafkaArgs,
    #[arg(long, env = "VITALS_CHANGES_TOPIC", default_value = vitals_contracts::topics::HEALTH_CHANGES)]
    changes_topic: String,
    #[arg(long, env = "VITALS_STATE_TOPIC", default_value = vitals_contracts::topics::HEALTH_STATE)]
    state_topic: String,
    /// Seconds without a word from the processor after which the view is stale (kept as last
    /// known).
    #[arg(long, env = "VITALS_HAPROXY_STALE_AFTER_SECS", default_value_t = 15)]
    stale_after_secs: u64,
    /// Seconds of silence after which every server vitals steers is put back at full weight.
    #[arg(long, env = "VITALS_HAPROXY_FAIL_OPEN_AFTER_SECS", default_value_t = 60)]
    fail_open_after_secs: u64,
    /// The gateway name this HAProxy's calls are reported under (vitals-logbridge's
    /// `--gateway`): it follows the decisions vitals makes for that gateway as well as the
    /// fleet's (docs/decisions.md, "Scoped health").
    #[arg(long, env = "VITALS_HAPROXY_GATEWAY")]
    gateway: Option<String>,
    /// Where this HAProxy runs (a region or zone): it follows its location's decisions too.
    #[arg(long, env = "VITALS_HAPROXY_LOCATION")]
    location: Option<String>,
    /// Liveness, readiness and metrics.
    #[arg(long, env = "VITALS_HAPROXY_HTTP", default_value = "127.0.0.1:9467")]
    http_addr: String,
}

fn out_state(s: &str) -> Result<OutState, String> {
    match s {
        "maint" => Ok(OutState::Maint),
        "drain" => Ok(OutState::Drain),
        _ => Err(format!("{s:?}: expected maint or drain")),
    }
}

/// How long a server whose trial is due is let in.
const TRIAL_WINDOW: Duration = Duration::from_secs(3);
/// Its share of its weight meanwhile: enough calls for a trial at a few calls a second, few
/// failed ones if it is still down.
const TRIAL_SHARE: f64 = 0.1;

type Key = (String, String);

#[derive(Default)]
struct Stats {
    commands: AtomicU64,
    failed_commands: AtomicU64,
    api_errors: AtomicU64,
    reconciles: AtomicU64,
    trials: AtomicU64,
    connected: AtomicBool,
    operator_held: AtomicI64,
    out: AtomicI64,
    freshness: AtomicI64,
}

impl Stats {
    fn prometheus(&self) -> String {
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let i = |a: &AtomicI64| a.load(Ordering::Relaxed);
        format!(
            "# HELP vitals_haproxy_commands_total Runtime API commands sent, by result.\n# TYPE vitals_haproxy_commands_total counter\n\
vitals_haproxy_commands_total{{result=\"ok\"}} {}\nvitals_haproxy_commands_total{{result=\"refused\"}} {}\n\
# HELP vitals_haproxy_api_errors_total Times the Runtime API could not be reached or read.\n# TYPE vitals_haproxy_api_errors_total counter\nvitals_haproxy_api_errors_total {}\n\
# HELP vitals_haproxy_reconciles_total Times HAProxy's state was read and brought to vitals'.\n# TYPE vitals_haproxy_reconciles_total counter\nvitals_haproxy_reconciles_total {}\n\
# HELP vitals_haproxy_trials_total Times a server out of rotation was let in for its trial.\n# TYPE vitals_haproxy_trials_total counter\nvitals_haproxy_trials_total {}\n\
# HELP vitals_haproxy_connected Whether the last read of the Runtime API worked.\n# TYPE vitals_haproxy_connected gauge\nvitals_haproxy_connected {}\n\
# HELP vitals_haproxy_servers_out Servers vitals holds out of rotation.\n# TYPE vitals_haproxy_servers_out gauge\nvitals_haproxy_servers_out {}\n\
# HELP vitals_haproxy_operator_held Servers an operator forced out (left alone).\n# TYPE vitals_haproxy_operator_held gauge\nvitals_haproxy_operator_held {}\n\
# HELP vitals_haproxy_view_freshness The health view: 0 fresh, 1 stale, 2 failed open.\n# TYPE vitals_haproxy_view_freshness gauge\nvitals_haproxy_view_freshness {}\n",
            g(&self.commands),
            g(&self.failed_commands),
            g(&self.api_errors),
            g(&self.reconciles),
            g(&self.trials),
            u8::from(self.connected.load(Ordering::Relaxed)),
            i(&self.out),
            i(&self.operator_held),
            i(&self.freshness),
        )
    }
}

fn load_ours(path: Option<&PathBuf>) -> BTreeSet<(String, String)> {
    let Some(text) = path.and_then(|p| std::fs::read_to_string(p).ok()) else {
        return BTreeSet::new();
    };
    text.lines()
        .filter_map(|l| l.split_once('/'))
        .map(|(b, s)| (b.to_owned(), s.to_owned()))
        .collect()
}

fn save_ours(path: Option<&PathBuf>, ours: &BTreeSet<(String, String)>) {
    let Some(p) = path else { return };
    let text: String = ours.iter().map(|(b, s)| format!("{b}/{s}\n")).collect();
    let tmp = p.with_extension("tmp");
    if let Err(e) = std::fs::write(&tmp, text).and_then(|_| std::fs::rename(&tmp, p)) {
        tracing::warn!(path = %p.display(), error = %e, "cannot write the state file");
    }
}

/// Why vitals wants what it wants of a server (formatted only when a command is logged).
enum Why<'a> {
    FailedOpen,
    Panic(&'a str),
    State(&'a str, &'a str, HealthState, f64),
    Trial(&'a str, &'a str),
    Unknown(&'a str, &'a str),
}

impl std::fmt::Display for Why<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Why::FailedOpen => write!(f, "vitals silent: failed open"),
            Why::Panic(pool) => write!(f, "pool {pool} in panic: every server"),
            Why::State(pool, ep, state, w) => write!(f, "{pool}/{ep} {} at weight {w:.2}", state.as_str()),
            Why::Trial(pool, ep) => write!(f, "{pool}/{ep} out of rotation, its trial due: let in briefly"),
            Why::Unknown(pool, ep) => write!(f, "{pool}/{ep} not known to vitals"),
        }
    }
}

/// What vitals wants of `s` (its weight a share of `base`: the operator's weight, else the
/// configured one; let in for its trial when `trial`), and why.
fn want<'a>(
    view: &HealthView,
    map: &'a Map,
    s: &'a Server,
    now: i64,
    base: u32,
    trial: bool,
) -> Option<(Want, Why<'a>)> {
    let (pool, endpoint) = map.resolve(&s.backend, &s.name)?;
    let full = Want::Ready(base);
    if view.freshness(now) == Freshness::Open {
        return Some((full, Why::FailedOpen));
    }
    if view.panic(pool) {
        return Some((full, Why::Panic(pool)));
    }
    match (view.weight(pool, endpoint, now), view.state(pool, endpoint)) {
        (Some(_), Some(HealthState::Unhealthy)) if trial => {
            Some((Want::from_weight(TRIAL_SHARE, base), Why::Trial(pool, endpoint)))
        }
        (Some(w), Some(state)) => Some((Want::from_weight(w, base), Why::State(pool, endpoint, state, w))),
        _ => Some((full, Why::Unknown(pool, endpoint))),
    }
}

struct Steer {
    client: Client,
    map: Map,
    view: Arc<HealthView>,
    out_state: OutState,
    state_file: Option<PathBuf>,
    stats: Arc<Stats>,
    ours: BTreeSet<(String, String)>,
    last_freshness: Freshness,
    /// The weight vitals last set (or agreed with) per server: another weight there is an
    /// operator's.
    commanded: HashMap<Key, u32>,
    /// Weights operators set: the base vitals' weight multiplies.
    bases: HashMap<Key, u32>,
    /// Servers let in for their trial, since when.
    trials: HashMap<Key, Instant>,
}

const API_TIMEOUT: Duration = Duration::from_secs(3);

impl Steer {
    fn reconcile(&mut self) {
        let now = now_us();
        let freshness = self.view.freshness(now);
        self.stats.freshness.store(freshness as i64, Ordering::Relaxed);
        if freshness != self.last_freshness {
            match freshness {
                Freshness::Open => {
                    tracing::warn!("vitals silent: failing open, every steered server ready at full weight")
                }
                Freshness::Stale => tracing::warn!("vitals silent: keeping the last known decisions"),
                Freshness::Fresh => tracing::info!("vitals heard again: following its decisions"),
            }
            self.last_freshness = freshness;
        }
        let servers = match self.client.servers(API_TIMEOUT) {
            Ok(s) => s,
            Err(e) => {
                self.stats.api_errors.fetch_add(1, Ordering::Relaxed);
                if self.stats.connected.swap(false, Ordering::Relaxed) {
                    tracing::warn!(error = %e, "HAProxy's Runtime API is not answering; retrying");
                }
                return;
            }
        };
        if !self.stats.connected.swap(true, Ordering::Relaxed) {
            tracing::info!(
                servers = servers.len(),
                "HAProxy's Runtime API answered: reconciling every server"
            );
        }
        self.stats.reconciles.fetch_add(1, Ordering::Relaxed);
        self.operator_weights(&servers, now);
        let in_trial = self.trials_due(&servers, now);
        let (view, map, bases) = (&self.view, &self.map, &self.bases);
        let base = |s: &Server| bases.get(&s.key()).copied().unwrap_or(s.initial_weight);
        let wants: HashMap<Key, (Want, Why<'_>)> = servers
            .iter()
            .filter_map(|s| Some((s.key(), want(view, map, s, now, base(s), in_trial.contains(&s.key()))?)))
            .collect();
        let before = self.ours.clone();
        // Servers an operator (or HAProxy itself) holds out: vitals sets nothing on them.
        let held_out: HashSet<Key> = servers
            .iter()
            .filter(|s| held_by_others(s, &self.ours))
            .map(Server::key)
            .collect();
        // Counted against the forced states vitals held when the state was read.
        let held = servers
            .iter()
            .filter(|s| s.forced_out() && !self.ours.contains(&s.key()) && map.resolve(&s.backend, &s.name).is_some())
            .count();
        self.stats.operator_held.store(held as i64, Ordering::Relaxed);
        let cmds = plan(
            &servers,
            |s| wants.get(&s.key()).map(|w| w.0),
            &mut self.ours,
            self.out_state,
        );
        let mut refused = HashSet::new();
        for c in &cmds {
            let key = (c.backend.clone(), c.server.clone());
            // Formatted only when a command is sent.
            let why = wants.get(&key).map(|w| w.1.to_string()).unwrap_or_default();
            match self.client.set(&c.line, API_TIMEOUT) {
                Ok(()) => {
                    self.stats.commands.fetch_add(1, Ordering::Relaxed);
                    tracing::info!(command = %c.line, why = %why, "changed HAProxy");
                }
                Err(e) => {
                    self.stats.failed_commands.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(command = %c.line, answer = %e, "HAProxy refused a command");
                    refused.insert(key);
                }
            }
        }
        // The weights HAProxy has now from vitals (sent, or already right).
        for s in &servers {
            let key = s.key();
            if refused.contains(&key) || held_out.contains(&key) {
                continue;
            }
            if let Some((Want::Ready(w), _)) = wants.get(&key) {
                self.commanded.insert(key, *w);
            }
        }
        self.stats.out.store(self.ours.len() as i64, Ordering::Relaxed);
        if self.ours != before {
            save_ours(self.state_file.as_ref(), &self.ours);
        }
    }

    /// A weight on a server that vitals did not set is an operator's: from then on the base
    /// vitals' weight multiplies (`weight 50` stays 50 at full health, 25 at half). On first
    /// sight (a restart of vitals-haproxy) a weight other than the configured one is taken for
    /// the operator's unless vitals' own ramp explains it.
    fn operator_weights(&mut self, servers: &[Server], now: i64) {
        for s in servers {
            let key = s.key();
            if held_by_others(s, &self.ours) {
                continue;
            }
            let operators = match self.commanded.get(&key) {
                Some(w) => *w != s.weight,
                None => {
                    let ramping = self
                        .map
                        .resolve(&s.backend, &s.name)
                        .and_then(|(p, e)| self.view.weight(p, e, now))
                        .is_some_and(|w| w < 1.0);
                    !ramping && !s.forced_out() && s.weight != s.initial_weight
                }
            };
            if operators && self.bases.get(&key) != Some(&s.weight) {
                tracing::info!(server = %format!("{}/{}", s.backend, s.name), weight = s.weight,
                    "an operator set this weight: vitals' weight multiplies it from now on");
                self.bases.insert(key.clone(), s.weight);
                self.commanded.insert(key, s.weight);
            }
        }
    }

    /// The servers let in for their trial this round: those already in their window, and those
    /// whose trial the view says is due now (claimed: one window per trial).
    fn trials_due(&mut self, servers: &[Server], now: i64) -> HashSet<Key> {
        let mut due = HashSet::new();
        for s in servers {
            let key = s.key();
            let Some((pool, ep)) = self.map.resolve(&s.backend, &s.name) else {
                continue;
            };
            if self.view.state(pool, ep) != Some(HealthState::Unhealthy) {
                self.trials.remove(&key);
                continue;
            }
            let open = self.trials.get(&key).is_some_and(|t| t.elapsed() < TRIAL_WINDOW);
            if open {
                due.insert(key);
            } else if self.view.claim_trial_of(pool, ep, now) {
                self.stats.trials.fetch_add(1, Ordering::Relaxed);
                self.trials.insert(key.clone(), Instant::now());
                due.insert(key);
            } else {
                self.trials.remove(&key);
            }
        }
        due
    }
}

/// Steer HAProxy by vitals' decisions until `cancel`.
pub async fn run(cfg: Config, cancel: CancellationToken) -> anyhow::Result<()> {
    cfg.kafka.check().map_err(anyhow::Error::msg)?;
    if cfg.interval_ms == 0 {
        anyhow::bail!("--interval-ms must be above 0");
    }
    let map = match &cfg.map {
        Some(p) => {
            let text = std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?;
            Map::parse(&text).map_err(|e| anyhow::anyhow!("{}: {e}", p.display()))?
        }
        None => Map::default(),
    };
    let mut vc = vitals_healthview::Config::new(cfg.kafka.brokers.clone());
    vc.kafka_options = cfg.kafka.pairs().map(|(k, v)| (k.to_owned(), v.to_owned())).collect();
    vc.state_topic = cfg.state_topic.clone();
    vc.changes_topic = cfg.changes_topic.clone();
    vc.stale_after = Duration::from_secs(cfg.stale_after_secs);
    vc.open_after = Duration::from_secs(cfg.fail_open_after_secs);
    vc.identity = vitals_healthview::Identity::new(cfg.gateway.as_deref(), cfg.location.as_deref(), &[]);
    let (tx, rx) = mpsc::sync_channel::<()>(1);
    let follower = tokio::task::spawn_blocking(move || {
        vitals_healthview::follow_with(vc, move |_| {
            let _ = tx.try_send(());
        })
    })
    .await??;
    tracing::info!(endpoints = follower.view.len(), cold_start = ?follower.cold_start, "health view loaded");
    let stats = Arc::new(Stats::default());
    let ours = load_ours(cfg.state_file.as_ref());
    let mut steer = Steer {
        client: Client::parse(&cfg.runtime_api),
        map,
        view: follower.view.clone(),
        out_state: cfg.out_state,
        state_file: cfg.state_file.clone(),
        stats: stats.clone(),
        ours,
        last_freshness: Freshness::Fresh,
        commanded: HashMap::new(),
        bases: HashMap::new(),
        trials: HashMap::new(),
    };
    let stop = Arc::new(AtomicBool::new(false));
    let interval = Duration::from_millis(cfg.interval_ms);
    let worker = {
        let stop = stop.clone();
        std::thread::Builder::new()
            .name("vitals-haproxy".into())
            .spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    steer.reconcile();
                    // Woken early by a change; several changes at once are one reconcile.
                    if rx.recv_timeout(interval).is_ok() {
                        while rx.try_recv().is_ok() {}
                    }
                }
            })?
    };
    let app = {
        let (m, r) = (stats.clone(), stats.clone());
        vitals_runtime::probes::router(
            move || r.connected.load(Ordering::Relaxed),
            "HAProxy's Runtime API is not answering",
        )
        .route("/metrics", get(move || std::future::ready(m.prometheus())))
    };
    let listener = tokio::net::TcpListener::bind(&cfg.http_addr)
        .await
        .with_context(|| format!("binding {}", cfg.http_addr))?;
    tracing::info!(addr = %listener.local_addr()?, runtime_api = %cfg.runtime_api, "steering HAProxy");
    axum::serve(listener, app)
        .with_graceful_shutdown(async move { cancel.cancelled().await })
        .await?;
    stop.store(true, Ordering::Relaxed);
    tokio::task::spawn_blocking(move || worker.join()).await?.ok();
    drop(follower);
    Ok(())
}
