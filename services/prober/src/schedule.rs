//! The schedule: one task per owned target, probing at its interval (its fast interval while the
//! endpoint is suspect, unhealthy or recovering; its traffic interval while it is healthy and
//! carries gateway calls), first probes spread over the interval, never two probes of one target
//! in flight, a completion's tokens within the target's daily budget, and no synthetic
//! completion while real calls bring first-token times.

use crate::config::{Kind, Target};
use crate::fnv;
use crate::metrics::Metrics;
use crate::probe::{Clients, Observation};
use crate::sink::Sink;
use crate::view::CadenceView;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use vitals_contracts::clock::now_us;
use vitals_contracts::{Micros, ProbeKind, ProbeResult};

/// Tokens a completion probe's prompt costs, counted against the budget with its output.
const PROMPT_TOKENS: u64 = 20;
const DAY_US: i64 = 86_400_000_000;

/// What every target task shares.
pub struct Context {
    /// `location/name`: every result names its prober and location.
    pub prober: String,
    pub clients: Clients,
    pub sink: Arc<dyn Sink>,
    pub view: Arc<CadenceView>,
    pub metrics: Arc<Metrics>,
    /// Per target: (day number, tokens spent that day).
    budgets: Mutex<HashMap<String, (i64, u64)>>,
}

impl Context {
    pub fn new(
        prober: String,
        clients: Clients,
        sink: Arc<dyn Sink>,
        view: Arc<CadenceView>,
        metrics: Arc<Metrics>,
    ) -> Context {
        Context {
            prober,
            clients,
            sink,
            view,
            metrics,
            budgets: Mutex::new(HashMap::new()),
        }
    }

    /// Whether a completion of `t` may run now, within its budget for today.
    fn may_spend(&self, t: &Target, now_us: Micros) -> bool {
        let Some(budget) = t.daily_token_budget else {
            return true;
        };
        let day = now_us / DAY_US;
        let budgets = self.budgets.lock().expect("budget lock");
        let spent = budgets.get(&t.id).filter(|(d, _)| *d == day).map_or(0, |(_, s)| *s);
        spent + PROMPT_TOKENS + u64::from(t.max_tokens) <= budget
    }

    fn spend(&self, t: &Target, now_us: Micros, tokens: u64) {
        if t.daily_token_budget.is_none() {
            return;
        }
        let day = now_us / DAY_US;
        let mut budgets = self.budgets.lock().expect("budget lock");
        let e = budgets.entry(t.id.clone()).or_insert((day, 0));
        if e.0 != day {
            *e = (day, 0);
        }
        e.1 += PROMPT_TOKENS + tokens;
    }

    /// Tokens left today over every target with a budget, for the metric.
    fn budget_left(&self, targets: &[Target], now_us: Micros) -> i64 {
        let day = now_us / DAY_US;
        let budgets = self.budgets.lock().expect("budget lock");
        targets
            .iter()
            .filter_map(|t| {
                let b = t.daily_token_budget?;
                let spent = budgets.get(&t.id).filter(|(d, _)| *d == day).map_or(0, |(_, s)| *s);
                Some(b.saturating_sub(spent) as i64)
            })
            .sum()
    }
}

/// Where in its interval a target's probes fall: spread by its id, so that targets with one
/// interval do not all start at once.
pub fn offset(id: &str, interval: Duration) -> Duration {
    let n = interval.as_nanos().max(1) as u64;
    Duration::from_nanos(fnv(&[id.as_bytes()]) % n)
}

/// The interval before the `seq`-th probe, within ±5 % of `interval` (deterministic per target
/// and probe): spread starts do not slowly line up again.
fn jittered(interval: Duration, id: &str, seq: u64) -> Duration {
    let j = (fnv(&[id.as_bytes(), &seq.to_le_bytes()]) % 1001) as f64 / 1000.0 - 0.5;
    interval.mul_f64(1.0 + 0.1 * j)
}

fn kind(k: Kind) -> ProbeKind {
    match k {
        Kind::Http | Kind::DeepHealth => ProbeKind::Http,
        Kind::Tcp => ProbeKind::Tcp,
        Kind::Completion => ProbeKind::SyntheticCompletion,
    }
}

fn kind_label(k: Kind) -> &'static str {
    match k {
        Kind::Http => "http",
        Kind::Tcp => "tcp",
        Kind::DeepHealth => "deep_health",
        Kind::Completion => "completion",
    }
}

/// The result record of one probe.
pub fn result(ctx: &Context, t: &Target, o: &Observation, at: Micros, interval: Duration) -> ProbeResult {
    ProbeResult {
        probe_id: format!("{}/{}/{at}", ctx.prober, t.id),
        pool: t.pool.clone(),
        endpoint: t.endpoint.clone(),
        prober: ctx.prober.clone(),
        occurred_at: at,
        kind: kind(t.kind),
        outcome: o.outcome,
        latency_us: o.latency.as_micros() as i64,
        ttft_us: o.ttft.map(|d| d.as_micros() as i64),
        http_status: o.http_status.map(i32::from),
        interval_ms: Some(interval.as_millis() as i64),
        dependencies: o.dependencies.clone(),
        detail: o.detail.clone(),
    }
}

async fn probe_once(ctx: &Context, t: &Target, interval: Duration) {
    let at = now_us();
    if t.kind == Kind::Completion && ctx.view.ttft_covered(&t.pool, &t.endpoint, interval) {
        // Real calls bring first-token times already: no need to pay for a synthetic one.
        ctx.metrics.covered_skipped.inc();
        return;
    }
    if t.kind == Kind::Completion && !ctx.may_spend(t, at) {
        ctx.metrics.budget_skipped.inc();
        return;
    }
    ctx.metrics.in_flight.inc();
    let nonce = fnv(&[ctx.prober.as_bytes(), t.id.as_bytes(), &at.to_le_bytes()]);
    let o = ctx.clients.probe(t, nonce).await;
    ctx.metrics.in_flight.dec();
    if t.kind == Kind::Completion {
        ctx.spend(t, at, o.tokens);
    }
    ctx.metrics
        .probes
        .get_or_create(&vec![
            ("kind", kind_label(t.kind).to_owned()),
            ("outcome", o.outcome.as_str().to_owned()),
        ])
        .inc();
    ctx.sink.publish(result(ctx, t, &o, at, interval));
}

/// One target's loop. It waits for `previous` (the task of the target's earlier version) so that
/// a reload never has two probes of one target in flight; cancellation is only looked at
/// between probes, so a probe in flight always finishes and is published.
async fn run_target(t: Target, ctx: Arc<Context>, cancel: CancellationToken, previous: Option<JoinHandle<()>>) {
    if let Some(p) = previous {
        let _ = p.await;
    }
    let mut fast = ctx.view.fast(&t.pool, &t.endpoint);
    let traffic_calls = vitals_contracts::cadence::calls_for_traffic(t.interval, t.traffic_interval);
    let interval_now = |fast: bool| {
        if fast {
            t.fast_interval
        } else if ctx
            .view
            .carries_traffic(&t.pool, &t.endpoint, t.traffic_interval, traffic_calls)
        {
            t.traffic_interval
        } else {
            t.interval
        }
    };
    let mut next = Instant::now() + offset(&t.id, interval_now(*fast.borrow()));
    let mut last_start: Option<Instant> = None;
    let mut seq = 0u64;
    loop {
        tokio::select! {
            biased;
            _ = cancel.cancelled() => return,
            changed = fast.changed() => {
                if changed.is_err() {
                    continue;
                }
                // Faster now: the next probe comes one fast interval after the last one.
                if *fast.borrow_and_update() {
                    let sooner = last_start.map_or_else(Instant::now, |l| l + t.fast_interval);
                    next = next.min(sooner.max(Instant::now()));
                }
                continue;
            }
            _ = tokio::time::sleep_until(next) => {}
        }
        let started = Instant::now();
        ctx.metrics.lateness.observe((started - next).as_secs_f64());
        last_start = Some(started);
        let interval = interval_now(*fast.borrow());
        probe_once(&ctx, &t, interval).await;
        seq += 1;
        let interval = interval_now(*fast.borrow());
        next = (next + jittered(interval, &t.id, seq)).max(Instant::now());
    }
}

struct Running {
    target: Target,
    cancel: CancellationToken,
    handle: JoinHandle<()>,
}

/// The running target tasks.
pub struct Scheduler {
    ctx: Arc<Context>,
    running: HashMap<String, Running>,
}

impl Scheduler {
    pub fn new(ctx: Arc<Context>) -> Scheduler {
        Scheduler {
            ctx,
            running: HashMap::new(),
        }
    }

    /// Run exactly the `targets` this instance `owns`: stop the others (after their probe in
    /// flight), start new ones, restart changed ones; unchanged ones keep their schedule.
    pub fn reconcile(&mut self, targets: &[Target], owns: impl Fn(&Target) -> bool) {
        let wanted: HashMap<&str, &Target> = targets.iter().filter(|t| owns(t)).map(|t| (t.id.as_str(), t)).collect();
        let mut previous: HashMap<String, JoinHandle<()>> = HashMap::new();
        let ids: Vec<String> = self.running.keys().cloned().collect();
        for id in ids {
            let keep = wanted.get(id.as_str()).is_some_and(|t| **t == self.running[&id].target);
            if !keep {
                let r = self.running.remove(&id).expect("listed above");
                r.cancel.cancel();
                previous.insert(id, r.handle);
            }
        }
        for (id, t) in wanted {
            if self.running.contains_key(id) {
                continue;
            }
            let cancel = CancellationToken::new();
            let handle = tokio::spawn(run_target(
                t.clone(),
                self.ctx.clone(),
                cancel.clone(),
                previous.remove(id),
            ));
            self.running.insert(
                id.to_owned(),
                Running {
                    target: t.clone(),
                    cancel,
                    handle,
                },
            );
        }
        // Stopped targets finish their probe in flight on their own.
        drop(previous);
        self.ctx.metrics.owned_targets.set(self.running.len() as i64);
        self.ctx.metrics.configured_targets.set(targets.len() as i64);
        self.ctx
            .metrics
            .budget_left
            .set(self.ctx.budget_left(targets, now_us()));
    }

    /// The ids of the targets running now.
    pub fn running(&self) -> Vec<String> {
        let mut v: Vec<String> = self.running.keys().cloned().collect();
        v.sort();
        v
    }

    /// Stop every target; returns once their probes in flight have finished.
    pub async fn stop(self) {
        for r in self.running.values() {
            r.cancel.cancel();
        }
        for (_, r) in self.running {
            let _ = r.handle.await;
        }
    }
}
