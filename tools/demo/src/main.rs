//! `vitals-demo`: the driver of `scripts/demo.sh`. With the stack, the processor, the API, the
//! prober, the simulator and the router running, it sends load through the router, plays a
//! fault timeline on the simulator, prints every transition as vitals publishes it, and ends
//! with a table per fault: detected after, back in rotation after, calls that failed for users.

mod load;
mod timeline;

use anyhow::Context as _;
use clap::Parser;
use serde::Deserialize;
use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use timeline::{Fault, Timeline};
use vitals_contracts::{HealthChanged, HealthState, PoolHealthChanged};
use vitals_healthview::{Event, HealthView};
use vitals_upstream_sim::Behaviour;

#[derive(Parser)]
#[command(
    name = "vitals-demo",
    about = "Load through the router, a fault timeline on the simulator, transitions live, a summary"
)]
struct Args {
    /// The router's base URL.
    #[arg(long, default_value = "http://127.0.0.1:8090")]
    router: String,
    /// A second gateway's base URL (a vitals-router with deploy/demo/routes-2.toml): the load of a
    /// gateway fault goes through it too, and only it must stop using the endpoint.
    #[arg(long)]
    second_router: Option<String>,
    /// A bearer token for the router (LiteLLM's proxy: its master key).
    #[arg(long, env = "VITALS_DEMO_ROUTER_KEY", hide_env_values = true)]
    router_key: Option<String>,
    /// The routes file the router runs with (pools and their models).
    #[arg(long, default_value = "deploy/demo/routes.toml")]
    routes: PathBuf,
    /// The simulator's admin API.
    #[arg(long, default_value = "http://127.0.0.1:9310")]
    sim_admin: String,
    /// The fault timeline.
    #[arg(long, default_value = "deploy/demo/timeline.toml")]
    timeline: PathBuf,
    /// The API's base URL (named in the closing lines; the audit log is counted through it).
    #[arg(long, default_value = "http://127.0.0.1:8080")]
    api: String,
    #[arg(long, env = "VITALS_KAFKA_BROKERS", default_value = "127.0.0.1:9092")]
    brokers: String,
    #[arg(long, default_value = vitals_contracts::topics::HEALTH_CHANGES)]
    changes_topic: String,
    #[arg(long, default_value = vitals_contracts::topics::HEALTH_STATE)]
    state_topic: String,
    /// Calls a second sent to each pool.
    #[arg(long, default_value_t = 10.0)]
    rate: f64,
    /// Exit 1 if a fault was not detected or its endpoints did not return to rotation.
    #[arg(long)]
    check: bool,
}

#[derive(Deserialize)]
struct Routes {
    #[serde(rename = "pool")]
    pools: Vec<RoutePool>,
}

#[derive(Deserialize)]
struct RoutePool {
    name: String,
    models: Vec<String>,
}

/// What the health view reported, with when it arrived.
enum Seen {
    Change(Box<HealthChanged>),
    Pool(PoolHealthChanged),
}

#[derive(Default)]
struct Observed(Mutex<Vec<(Instant, Seen)>>);

impl Observed {
    /// A gateway fault's scoped transition of an affected endpoint after `since`: out for the
    /// scope (`out`), or back for it.
    fn scoped(&self, f: &Fault, scope: &str, since: Instant, out: bool) -> Option<Instant> {
        let log = self.0.lock().expect("observed lock");
        log.iter()
            .filter(|(t, _)| *t >= since)
            .find(|(_, s)| match s {
                Seen::Change(h) => {
                    h.pool == f.pool
                        && f.endpoints.contains(&h.endpoint)
                        && h.scope.as_deref() == Some(scope)
                        && (h.to_state == HealthState::Unhealthy) == out
                }
                Seen::Pool(_) => false,
            })
            .map(|(t, _)| *t)
    }

    /// Fleet transitions of an affected endpoint out of `healthy` in `[from, to)`: what a gateway
    /// fault must not make.
    fn fleet_moves(&self, f: &Fault, from: Instant, to: Instant) -> usize {
        let log = self.0.lock().expect("observed lock");
        log.iter()
            .filter(|(t, s)| {
                *t >= from
                    && *t < to
                    && matches!(s, Seen::Change(h) if h.pool == f.pool
                        && f.endpoints.contains(&h.endpoint)
                        && h.scope.is_none()
                        && h.to_state != HealthState::Healthy)
            })
            .count()
    }

    /// When the fault was first seen after `since`: an affected endpoint left `healthy`, or the
    /// pool went into panic or a correlated outage.
    fn detected(&self, f: &Fault, since: Instant) -> Option<Instant> {
        let log = self.0.lock().expect("observed lock");
        log.iter()
            .filter(|(t, _)| *t >= since)
            .find(|(_, s)| match s {
                Seen::Change(h) => {
                    h.pool == f.pool && f.endpoints.contains(&h.endpoint) && h.to_state != HealthState::Healthy
                }
                Seen::Pool(p) => p.pool == f.pool && (p.panic || p.correlated_outage),
            })
            .map(|(t, _)| *t)
    }

    /// The last event about the fault's pool after `since`.
    fn last_about(&self, f: &Fault, since: Instant) -> Option<Instant> {
        let log = self.0.lock().expect("observed lock");
        log.iter()
            .rev()
            .filter(|(t, s)| {
                *t >= since
                    && match s {
                        Seen::Change(h) => h.pool == f.pool && f.endpoints.contains(&h.endpoint),
                        Seen::Pool(p) => p.pool == f.pool,
                    }
            })
            .map(|(t, _)| *t)
            .next()
    }
}

/// Every affected endpoint is in rotation (healthy, or readmitted and ramping up) and the pool
/// is out of panic and outage.
fn in_rotation(view: &HealthView, f: &Fault) -> bool {
    f.endpoints.iter().all(|e| {
        matches!(
            view.state(&f.pool, e),
            None | Some(HealthState::Healthy | HealthState::Recovering)
        )
    }) && !view.panic(&f.pool)
        && !view.correlated_outage(&f.pool)
}

struct Clock(Instant);

impl Clock {
    fn stamp(&self, at: Instant) -> String {
        format!("[{:>6.1}s]", at.duration_since(self.0).as_secs_f64())
    }
    fn now(&self) -> String {
        self.stamp(Instant::now())
    }
}

fn describe(h: &HealthChanged) -> String {
    let e = &h.evidence;
    let calls = e.success
        + e.timeout
        + e.connect_error
        + e.connection_dropped
        + e.rate_limited
        + e.server_error
        + e.client_error
        + e.invalid_response
        + e.cancelled;
    let mut ev = format!(
        "score {:.0}, {calls} calls, {:.0} % failed",
        e.score,
        e.failure_rate * 100.0
    );
    if let Some(p99) = e.ttft_p99_ms {
        ev.push_str(&format!(", first token p99 {p99:.0} ms"));
    }
    let scope = h.scope.as_deref().map_or(String::new(), |s| format!(" for {s} only"));
    format!(
        "{}/{}{scope}  {} → {}  [{}] {} ({ev})",
        h.pool,
        h.endpoint,
        h.from_state.as_str(),
        h.to_state.as_str(),
        h.reason_code,
        h.reason
    )
}

fn describe_pool(p: &PoolHealthChanged) -> String {
    let mut flags = Vec::new();
    if p.panic {
        flags.push("PANIC: spreading over every endpoint");
    }
    if p.correlated_outage {
        flags.push("correlated outage");
    }
    if flags.is_empty() {
        flags.push("normal");
    }
    format!(
        "{}  pool: {} of {} healthy, {} ejected — {}. {}",
        p.pool,
        p.healthy,
        p.endpoints,
        p.ejected,
        flags.join(", "),
        p.reason
    )
}

struct Row {
    name: String,
    detected: Option<Duration>,
    restored: Option<Duration>,
    calls: usize,
    failed: usize,
    slow: usize,
    /// A gateway fault's: what each router did while the endpoints were out for the one.
    scoped: Option<Scoped>,
}

/// A gateway fault, as the two routers lived it.
struct Scoped {
    scope: String,
    /// Fleet transitions of the endpoints during it (none is right).
    fleet_moves: usize,
    /// Calls the unaffected router sent to the endpoints while they were out for the other.
    unaffected: usize,
    /// Calls the affected router sent them then (its trial at most).
    affected: usize,
}

impl Scoped {
    fn ok(&self) -> bool {
        self.fleet_moves == 0 && self.unaffected > 0 && self.affected <= 2
    }
}

/// Calls of `pool` in `[from, to)` that the endpoints `endpoints` served.
fn served(calls: &load::Calls, pool: &str, endpoints: &[String], from: Instant, to: Instant) -> usize {
    calls
        .between(pool, from, to)
        .iter()
        .filter(|c| c.endpoint.as_ref().is_some_and(|e| endpoints.contains(e)))
        .count()
}

fn secs(d: Option<Duration>) -> String {
    d.map_or("—".into(), |d| format!("{:.1} s", d.as_secs_f64()))
}

struct Sim {
    client: reqwest::Client,
    admin: String,
}

impl Sim {
    async fn get(&self, endpoint: &str) -> anyhow::Result<Behaviour> {
        #[derive(Deserialize)]
        struct View {
            behaviour: Behaviour,
        }
        let url = format!("{}/endpoints/{endpoint}", self.admin);
        let r = self.send(endpoint, self.client.get(url)).await?;
        Ok(r.json::<View>().await?.behaviour)
    }

    async fn set(&self, endpoint: &str, b: &Behaviour) -> anyhow::Result<()> {
        let url = format!("{}/endpoints/{endpoint}", self.admin);
        self.send(endpoint, self.client.put(url).json(b)).await?;
        Ok(())
    }

    /// Send a request to the admin API; an answer other than 2xx is an error with its body.
    async fn send(&self, endpoint: &str, req: reqwest::RequestBuilder) -> anyhow::Result<reqwest::Response> {
        let r = req
            .send()
            .await
            .with_context(|| format!("the simulator's admin API at {}", self.admin))?;
        anyhow::ensure!(
            r.status().is_success(),
            "simulator: endpoint {endpoint}: {}",
            r.text().await?
        );
        Ok(r)
    }
}

/// Transitions of `pool` since `from` in the audit log, read page by page through the API.
async fn audit_count(
    client: &reqwest::Client,
    api: &str,
    pool: &str,
    from: chrono::DateTime<chrono::Utc>,
) -> anyhow::Result<usize> {
    #[derive(Deserialize)]
    struct Page {
        items: Vec<serde_json::Value>,
        next_cursor: Option<String>,
    }
    let mut count = 0;
    let mut cursor: Option<String> = None;
    loop {
        let mut q = vec![
            ("pool", pool.to_owned()),
            ("from", from.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)),
            ("limit", "500".into()),
        ];
        if let Some(c) = cursor.take() {
            q.push(("cursor", c));
        }
        let r = client
            .get(format!("{api}/v1/transitions"))
            .query(&q)
            .send()
            .await
            .with_context(|| format!("the API at {api}"))?;
        anyhow::ensure!(r.status().is_success(), "the API: {}", r.text().await?);
        let page: Page = r.json().await?;
        count += page.items.len();
        match page.next_cursor {
            Some(c) => cursor = Some(c),
            None => return Ok(count),
        }
    }
}

/// Wait for `done` (checked every 100 ms) up to `within`, printing progress every 10 s.
async fn wait_for(
    clock: &Clock,
    what: &str,
    within: Duration,
    calls: &load::Calls,
    mut done: impl FnMut() -> Option<Instant>,
) -> Option<Instant> {
    let start = Instant::now();
    let mut said = Instant::now();
    loop {
        if let Some(t) = done() {
            return Some(t);
        }
        if start.elapsed() >= within {
            println!("{}   ✗ {what}: not within {} s", clock.now(), within.as_secs());
            return None;
        }
        if said.elapsed() >= Duration::from_secs(10) {
            println!(
                "{}   … waiting {:.0} s for {what} ({} calls sent so far)",
                clock.now(),
                start.elapsed().as_secs_f64(),
                calls.len()
            );
            said = Instant::now();
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::main]
async fn main() {
    let args = Args::parse();
    match run(args).await {
        Ok(true) => {}
        Ok(false) => std::process::exit(1),
        Err(e) => {
            eprintln!("vitals-demo: {e:#}");
            std::process::exit(2);
        }
    }
}

async fn run(args: Args) -> anyhow::Result<bool> {
    let read = |p: &PathBuf| std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()));
    let timeline = Timeline::parse(&read(&args.timeline)?).with_context(|| args.timeline.display().to_string())?;
    let routes: Routes = toml::from_str(&read(&args.routes)?).with_context(|| args.routes.display().to_string())?;
    let pools: Vec<(String, String)> = routes
        .pools
        .iter()
        .filter_map(|p| p.models.first().map(|m| (p.name.clone(), m.clone())))
        .collect();
    for f in &timeline.faults {
        anyhow::ensure!(
            pools.iter().any(|(p, _)| *p == f.pool),
            "fault {:?}: the router has no pool {:?}",
            f.name,
            f.pool
        );
        anyhow::ensure!(
            f.gateway.is_none() || args.second_router.is_some(),
            "fault {:?} breaks a second gateway's route: give --second-router",
            f.name
        );
    }
    let rate_ok = args.rate > 0.0 && args.rate.is_finite();
    anyhow::ensure!(rate_ok, "--rate must be a positive number of calls a second");
    let clock = Arc::new(Clock(Instant::now()));
    let started_at = chrono::Utc::now() - chrono::Duration::seconds(5);
    let sim = Sim {
        client: reqwest::Client::new(),
        admin: args.sim_admin.trim_end_matches('/').to_owned(),
    };

    // The health view, as a router holds it; every change it applies is printed as it arrives.
    let observed = Arc::new(Observed::default());
    let mut vc = vitals_healthview::Config::new(args.brokers.clone());
    vc.changes_topic = args.changes_topic.clone();
    vc.state_topic = args.state_topic.clone();
    let follower = {
        let (observed, clock) = (observed.clone(), clock.clone());
        let started_us = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_micros() as i64);
        tokio::task::spawn_blocking(move || {
            vitals_healthview::follow_with(vc, move |e| {
                let now = Instant::now();
                let seen = match e {
                    // Changes made before the demo began (replayed from the topic) are not news.
                    Event::Change(h, _) if h.stream_time < started_us - 5_000_000 => return,
                    Event::Change(h, _) => {
                        println!("{} {}", clock.stamp(now), describe(h));
                        Seen::Change(Box::new(h.clone()))
                    }
                    Event::Pool(p) if p.stream_time < started_us - 5_000_000 => return,
                    Event::Pool(p) => {
                        println!("{} {}", clock.stamp(now), describe_pool(p));
                        Seen::Pool(p.clone())
                    }
                };
                observed.0.lock().expect("observed lock").push((now, seen));
            })
        })
        .await?
        .with_context(|| format!("following the health topics on {}", args.brokers))?
    };
    let view = follower.view.clone();
    println!(
        "{} health view loaded: {} endpoints known ({:.0} ms)",
        clock.now(),
        view.len(),
        follower.cold_start.as_secs_f64() * 1000.0
    );

    let generator = load::Generator::start(&args.router, args.router_key.as_deref(), &pools, args.rate);
    println!(
        "{} load: {} calls/s to each of {} through the router at {}",
        clock.now(),
        args.rate,
        pools
            .iter()
            .map(|(p, m)| format!("{p} (model {m})"))
            .collect::<Vec<_>>()
            .join(", "),
        args.router
    );
    let calls = generator.calls.clone();
    // Warm up: every endpoint gets a history, and whatever an earlier run left is back in rotation.
    let warm = Instant::now() + Duration::from_secs(timeline.warmup_s);
    let all: Vec<Fault> = timeline.faults.clone();
    wait_for(
        &clock,
        "warm-up",
        Duration::from_secs(timeline.restore_within_s),
        &calls,
        || (Instant::now() >= warm && all.iter().all(|f| in_rotation(&view, f))).then(Instant::now),
    )
    .await;
    let baseline = {
        let from = clock.0;
        let c: Vec<load::Call> = pools
            .iter()
            .flat_map(|(p, _)| calls.between(p, from, Instant::now()))
            .collect();
        (c.len(), c.iter().filter(|c| !c.ok).count())
    };
    println!(
        "{} warm-up done: {} calls, {} failed",
        clock.now(),
        baseline.0,
        baseline.1
    );
    anyhow::ensure!(
        baseline.0 > 0,
        "no call reached the router at {}: is it running?",
        args.router
    );

    let mut rows = Vec::new();
    for (i, f) in timeline.faults.iter().enumerate() {
        if f.gateway.is_some() {
            // One gateway's failures on an endpoint on probation are the fleet's (its probation
            // is held): a gateway fault starts on endpoints healthy at full weight.
            wait_for(
                &clock,
                &format!("{} healthy before {:?}", f.endpoints.join(", "), f.name),
                Duration::from_secs(timeline.restore_within_s),
                &calls,
                || {
                    f.endpoints
                        .iter()
                        .all(|e| matches!(view.state(&f.pool, e), None | Some(HealthState::Healthy)))
                        .then(Instant::now)
                },
            )
            .await;
        }
        let mut before = Vec::new();
        for e in f.sim_endpoints() {
            before.push(sim.get(e).await?);
        }
        // A gateway fault: the second router carries load of the pool while it lasts.
        let second = match (&f.gateway, &args.second_router) {
            (Some(g), Some(url)) => {
                let pool: Vec<(String, String)> = pools.iter().filter(|(p, _)| *p == f.pool).cloned().collect();
                println!(
                    "{} load: {} calls/s to {} through the second router ({g}) at {url}",
                    clock.now(),
                    args.rate,
                    f.pool
                );
                Some(load::Generator::start(url, None, &pool, args.rate))
            }
            _ => None,
        };
        for e in f.sim_endpoints() {
            sim.set(e, &f.behaviour).await?;
        }
        let start = Instant::now();
        println!(
            "{} ▶ fault {}/{}: {} — {} in pool {}",
            clock.now(),
            i + 1,
            timeline.faults.len(),
            f.name,
            f.endpoints.join(", "),
            f.pool
        );
        let scope = f.scope();
        let detected = wait_for(
            &clock,
            &format!("vitals to detect {:?}", f.name),
            Duration::from_secs(timeline.detect_within_s),
            &calls,
            || match &scope {
                Some(s) => observed.scoped(f, s, start, true),
                None => observed.detected(f, start),
            },
        )
        .await;
        let out_from = Instant::now();
        tokio::time::sleep(Duration::from_secs(f.hold_s)).await;
        for (e, b) in f.sim_endpoints().iter().zip(&before) {
            sim.set(e, b).await?;
        }
        let healed = Instant::now();
        println!(
            "{} ✓ healed: {} behave as before",
            clock.now(),
            f.sim_endpoints().join(", ")
        );
        let restored = wait_for(
            &clock,
            &match &scope {
                Some(s) => format!("{} back in rotation for {s} (its trial)", f.endpoints.join(", ")),
                None => format!("{} back in rotation", f.endpoints.join(", ")),
            },
            Duration::from_secs(timeline.restore_within_s),
            &calls,
            || match &scope {
                Some(s) => observed.scoped(f, s, healed, false),
                None => in_rotation(&view, f).then(|| observed.last_about(f, healed).unwrap_or(healed)),
            },
        )
        .await;
        let end = restored.unwrap_or_else(Instant::now).max(healed);
        let scoped = match (scope, second) {
            (Some(scope), Some(second)) => {
                // From a second after the decision (calls already on their way) to the heal.
                let from = out_from + Duration::from_secs(1);
                let s = Scoped {
                    fleet_moves: observed.fleet_moves(f, start, end),
                    unaffected: served(&calls, &f.pool, &f.endpoints, from, healed),
                    affected: served(&second.calls, &f.pool, &f.endpoints, from, healed),
                    scope,
                };
                second.stop().await;
                println!(
                    "{}   while {} was out for {}: the first router sent it {} calls, the second {}; {} fleet transitions",
                    clock.now(),
                    f.endpoints.join(", "),
                    s.scope,
                    s.unaffected,
                    s.affected,
                    s.fleet_moves
                );
                Some(s)
            }
            _ => None,
        };
        let c = calls.between(&f.pool, start, end);
        rows.push(Row {
            name: f.name.clone(),
            detected: detected.map(|t| t.duration_since(start)),
            restored: restored.map(|t| t.duration_since(healed)),
            calls: c.len(),
            failed: c.iter().filter(|c| !c.ok).count(),
            slow: c
                .iter()
                .filter(|c| c.ok && c.first_token.is_some_and(|t| t > Duration::from_secs(1)))
                .count(),
            scoped,
        });
        println!(
            "{} ■ {}: detected after {}, back in rotation {} after the heal",
            clock.now(),
            f.name,
            secs(rows.last().and_then(|r| r.detected)),
            secs(rows.last().and_then(|r| r.restored))
        );
    }
    // Calls still in flight finish before the count.
    tokio::time::sleep(Duration::from_secs(2)).await;
    generator.stop().await;
    drop(follower);

    println!();
    println!(
        "{:<34} {:>14} {:>16} {:>7} {:>17} {:>20}",
        "fault", "detected after", "back after heal", "calls", "failed for users", "slow (first token)"
    );
    for r in &rows {
        println!(
            "{:<34} {:>14} {:>16} {:>7} {:>17} {:>20}",
            r.name,
            secs(r.detected),
            secs(r.restored),
            r.calls,
            r.failed,
            r.slow
        );
    }
    println!();
    println!("'detected after': from the fault to the first transition the router's health view received;");
    println!("'back after heal': from the heal to the endpoints back in rotation (healthy or ramping up);");
    println!("calls: the pool's calls from the fault to its end, as the load generator's users saw them;");
    println!("slow: calls that succeeded but waited more than 1 s for their first token.");
    for (r, s) in rows.iter().filter_map(|r| r.scoped.as_ref().map(|s| (r, s))) {
        println!(
            "{}: decided for {} only — {} fleet transitions; while it was out for {}, the other router still sent {} calls to it, the affected one {}{}",
            r.name,
            s.scope,
            s.fleet_moves,
            s.scope,
            s.unaffected,
            s.affected,
            if s.ok() { "" } else { "  ✗ (expected: no fleet transition, the other router using it, the affected one at most its trial)" }
        );
    }
    // Every transition the router saw is in the audit log, with its evidence.
    let api = args.api.trim_end_matches('/');
    let faulted: BTreeSet<&str> = timeline.faults.iter().map(|f| f.pool.as_str()).collect();
    let seen = observed
        .0
        .lock()
        .expect("observed lock")
        .iter()
        .filter(|(_, s)| matches!(s, Seen::Change(_)))
        .count();
    let mut recorded = 0;
    for pool in &faulted {
        recorded += audit_count(&sim.client, api, pool, started_at).await?;
    }
    println!(
        "The audit log holds {recorded} transitions of this run ({seen} seen live). Every decision with its evidence:"
    );
    for pool in &faulted {
        println!(
            "  curl '{api}/v1/transitions?pool={pool}&from={}'",
            started_at.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
        );
    }
    let mut ok = rows
        .iter()
        .all(|r| r.detected.is_some() && r.restored.is_some() && r.scoped.as_ref().is_none_or(Scoped::ok));
    if args.check && !ok {
        eprintln!("vitals-demo: a fault was missed or did not heal (see the table)");
    }
    if recorded < seen {
        eprintln!(
            "vitals-demo: the audit log holds fewer transitions ({recorded}) than the health topic carried ({seen})"
        );
        ok = false;
    }
    Ok(ok || !args.check)
}
