//! A closed loop around the engine: a simulated pool of upstream endpoints, Poisson traffic
//! through a router that follows the engine's weights and pool decisions, periodic probes, and
//! injected faults. Everything runs on simulated time, so a seed gives the same figures on every
//! machine.
//!
//! The router is what a user would build from the health events: an endpoint's weight is the
//! latest `weight` of its `HealthChanged` (ramped linearly over `ramp_ms` during slow start), an
//! endpoint at weight 0 gets no calls, and while the pool is in panic mode calls spread over
//! every endpoint. A call's outcome reaches the engine when the call completes, as a gateway
//! reports it; probes report when they finish.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::time::Duration;
use vitals_contracts::cadence::{calls_for_traffic, wants_fast, TRAFFIC_MEMORY};
use vitals_contracts::{CallOutcome, HealthState, Micros, OutcomeClass, Policy, ProbeKind, ProbeResult, Signal, Tick};
use vitals_engine::{Decision, Engine};

pub mod anchors;
pub mod fleet;

/// What decides the endpoints' health in a run: the engine under a policy, or an anchor's model
/// (see [`anchors`]). It hears every signal in stream order, as the processor would.
pub trait Judge {
    fn apply(&mut self, at: Micros, signal: &Signal, out: &mut Vec<Decision>);
}

impl Judge for Engine {
    fn apply(&mut self, at: Micros, signal: &Signal, out: &mut Vec<Decision>) {
        Engine::apply(self, at, signal, out);
    }
}

pub const SEC: Micros = 1_000_000;
pub const MS: Micros = 1_000;
/// Where the simulated clock starts (any fixed instant would do).
pub(crate) const T0: Micros = 1_700_000_000_000_000;
/// A call whose first token takes longer than this is a slow call for its user.
pub const SLOW_MS: i64 = 1_250;
/// An ejection within this long after the endpoint's fault ended still counts as caused by it
/// (the outcomes of calls made during the fault are still arriving).
const GRACE: Micros = SEC;

/// How long after a transition the prober follows it (the state topic, read by its cadence
/// view): from then an endpoint that wants the fast cadence gets it.
pub const PROBER_LAG: Micros = 500 * MS;

const POOL: &str = "sim";

/// A deterministic generator (splitmix64): no dependency, the same stream on every platform.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed ^ 0x9e37_79b9_7f4a_7c15)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Exponentially distributed gap for a Poisson process of `rate` per second.
    pub fn gap(&mut self, rate: f64) -> Micros {
        let u = 1.0 - self.unit();
        ((-u.ln() / rate) * SEC as f64).round().max(1.0) as Micros
    }
}

/// What is wrong with an endpoint while a fault is active.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Fault {
    /// Connections refused.
    Down,
    /// Every call and probe answers 503.
    ServerErrors,
    /// 200 OK, but the first token takes this long.
    SlowTtft { ttft_ms: i64 },
    /// This share of connections drops mid-call; the health route mostly still answers.
    Drops { share: f64 },
    /// This share of calls gets 429. With `retry_after_ms`, the upstream limits in windows of
    /// that length from the fault's start (the last one ends with the fault) and its 429s say
    /// when the current one ends, in whole seconds as a Retry-After header does.
    RateLimited { share: f64, retry_after_ms: Option<i64> },
    /// This share of calls is the callers' own fault (400): not an endpoint fault.
    ClientErrors { share: f64 },
    /// Background noise: this share of calls fails at random. Not a fault.
    Noise { share: f64 },
    /// This share of calls takes `factor` times as long (first token as usual, none failing):
    /// a latency tail, to be degraded, not taken out.
    LatencyTail { share: f64, factor: i64 },
}

impl Fault {
    /// Whether an endpoint with this fault should be taken out (4xx and noise are not faults).
    pub fn is_real(self) -> bool {
        !matches!(self, Fault::ClientErrors { .. } | Fault::Noise { .. })
    }

    /// How long after the fault its calls still report: a call begun during it.
    fn in_flight(self) -> Micros {
        match self {
            Fault::SlowTtft { ttft_ms } => ttft_ms * MS * 11 / 10 + 400 * MS,
            _ => 400 * MS,
        }
    }
}

/// A fault on one endpoint over [from, to) of the run, optionally switching on and off.
#[derive(Debug, Clone, Copy)]
pub struct Injection {
    pub endpoint: usize,
    pub fault: Fault,
    pub from: Micros,
    pub to: Micros,
    /// (on, off): the fault is active for `on`, then gone for `off`, repeating.
    pub period: Option<(Micros, Micros)>,
}

impl Injection {
    pub fn active(&self, at: Micros) -> bool {
        if at < self.from || at >= self.to {
            return false;
        }
        match self.period {
            None => true,
            Some((on, off)) => (at - self.from) % (on + off) < on,
        }
    }
}

/// One closed-loop experiment.
#[derive(Debug, Clone)]
pub struct Scenario {
    pub name: &'static str,
    pub what: &'static str,
    pub endpoints: usize,
    /// Calls per second into the pool (Poisson).
    pub rate: f64,
    pub duration: Micros,
    /// The prober's interval for an endpoint in rotation and healthy or degraded.
    pub probe_every: Micros,
    /// Its interval for such an endpoint that enough calls reached within this interval (three
    /// for each probe `probe_every` would send): the calls are evidence already (vitals-prober's
    /// `traffic_interval_ms`, by default 3 × the interval).
    pub traffic_probe_every: Micros,
    /// Its interval while the endpoint is suspect, out or recovering, as vitals-prober does
    /// (`fast_interval_ms`, 1 s by default): that is what brings an endpoint back quickly.
    /// From one follow lag after the transition ([`PROBER_LAG`]), the next probe comes one fast
    /// interval after the last.
    pub fast_probe_every: Micros,
    pub probe_kind: ProbeKind,
    pub faults: Vec<Injection>,
}

/// The figures of one run of a scenario.
#[derive(Debug, Clone, PartialEq)]
pub struct Score {
    pub name: &'static str,
    /// From the first fault to the first decision that lowered a faulty endpoint's weight.
    pub detection: Option<Micros>,
    /// From the first fault to the first decision that took a faulty endpoint out (weight 0).
    pub ejection: Option<Micros>,
    /// Ejections of an endpoint that had no real fault then (nor within 1 s before).
    pub false_ejections: u32,
    pub transitions: u32,
    /// Transitions of the faulty endpoints while a fault lasted (from its start to its end).
    pub fault_transitions: u32,
    /// Largest share of the pool at weight 0 at any moment.
    pub max_out: f64,
    pub calls: u32,
    /// Calls that failed for their user (5xx, timeouts, drops, 429s, no endpoint to call).
    pub failed: u32,
    /// Successful calls whose first token took longer than [`SLOW_MS`].
    pub slow: u32,
    /// From the end of the last fault until every faulty endpoint was back in rotation; None if
    /// none was ever out, `Err` with the time observed if one was still out when the run ended.
    pub restore: Option<Result<Micros, Micros>>,
    /// From the end of the last fault until every faulty endpoint was back at full weight (slow
    /// start and probation over); the same None / `Err` as `restore`.
    pub full_weight: Option<Result<Micros, Micros>>,
    /// Capacity the faulty endpoints did not give after their faults ended: the integral of
    /// (1 − the router's weight) over them from the end of the last fault to the end of the run,
    /// in endpoint-seconds (a healed endpoint kept at weight 0.01 for a minute costs 59.4).
    pub capacity_lost: f64,
    /// Every transition: (time since start, endpoint, from, to, reason).
    pub log: Vec<(Micros, String, HealthState, HealthState, String)>,
}

impl Scenario {
    fn fault_at(&self, ep: usize, at: Micros) -> Option<Fault> {
        self.faults
            .iter()
            .find(|f| f.endpoint == ep && f.active(at))
            .map(|f| f.fault)
    }

    /// The Retry-After a 429 of `ep` at `at` carries: the time to the end of its limit's
    /// window, rounded up to whole seconds (see [`Fault::RateLimited`]).
    fn retry_after(&self, ep: usize, at: Micros) -> Option<i64> {
        let f = self.faults.iter().find(|f| f.endpoint == ep && f.active(at))?;
        let Fault::RateLimited {
            retry_after_ms: Some(w),
            ..
        } = f.fault
        else {
            return None;
        };
        let w = (w * MS).max(1);
        let end = (f.from + ((at - f.from) / w + 1) * w).min(f.to);
        // `end` is after `at`: the fault is active at `at`.
        Some((end - at + SEC - 1) / SEC * 1000)
    }

    /// Whether a real fault of the endpoint could still explain a decision at `at`: active at
    /// some point of [at − GRACE − its calls' time in flight, at].
    fn faulty_near(&self, ep: usize, at: Micros) -> bool {
        self.faults
            .iter()
            .filter(|f| f.endpoint == ep && f.fault.is_real())
            .any(|f| {
                let span = GRACE + f.fault.in_flight();
                (0..=100).any(|i| f.active(at - span * i / 100))
            })
    }

    fn faulty_endpoints(&self) -> Vec<usize> {
        let mut v: Vec<usize> = self
            .faults
            .iter()
            .filter(|f| f.fault.is_real())
            .map(|f| f.endpoint)
            .collect();
        v.sort_unstable();
        v.dedup();
        v
    }
}

/// What a call or probe to an endpoint returns at `at`.
struct Answer {
    class: OutcomeClass,
    latency: Micros,
    ttft: Option<Micros>,
    retry_after_ms: Option<i64>,
}

fn answer(fault: Option<Fault>, rng: &mut Rng, health_route: bool) -> Answer {
    let ok = |rng: &mut Rng, ttft_ms: i64| {
        let ttft = ttft_ms * MS * (90 + (rng.unit() * 20.0) as i64) / 100;
        Answer {
            class: OutcomeClass::Success,
            latency: if health_route { 15 * MS } else { ttft + 400 * MS },
            ttft: (!health_route).then_some(ttft),
            retry_after_ms: None,
        }
    };
    let fail = |class, latency| Answer {
        class,
        latency,
        ttft: None,
        retry_after_ms: None,
    };
    match fault {
        None => ok(rng, 250),
        Some(Fault::Down) => fail(OutcomeClass::ConnectError, 2 * MS),
        Some(Fault::ServerErrors) => fail(OutcomeClass::ServerError, 30 * MS),
        // The health route answers at once; only a completion sees the first token.
        Some(Fault::SlowTtft { ttft_ms }) => ok(rng, if health_route { 250 } else { ttft_ms }),
        Some(Fault::Drops { share }) => {
            if rng.unit() < share {
                fail(OutcomeClass::ConnectionDropped, 300 * MS)
            } else {
                ok(rng, 250)
            }
        }
        Some(Fault::RateLimited { share, retry_after_ms }) => {
            if !health_route && rng.unit() < share {
                Answer {
                    retry_after_ms,
                    ..fail(OutcomeClass::RateLimited, 20 * MS)
                }
            } else {
                ok(rng, 250)
            }
        }
        Some(Fault::ClientErrors { share }) => {
            if !health_route && rng.unit() < share {
                fail(OutcomeClass::ClientError, 20 * MS)
            } else {
                ok(rng, 250)
            }
        }
        Some(Fault::LatencyTail { share, factor }) => {
            let a = ok(rng, 250);
            if !health_route && rng.unit() < share {
                Answer {
                    latency: a.latency * factor,
                    ..a
                }
            } else {
                a
            }
        }
        Some(Fault::Noise { share }) => {
            if rng.unit() < share {
                match rng.next_u64() % 3 {
                    0 => fail(OutcomeClass::ServerError, 30 * MS),
                    1 => fail(OutcomeClass::Timeout, 10 * SEC),
                    _ => fail(OutcomeClass::ConnectionDropped, 300 * MS),
                }
            } else {
                ok(rng, 250)
            }
        }
    }
}

#[derive(Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Event {
    Tick,
    /// The probe of an endpoint, in its schedule's generation (a change of cadence starts a
    /// new one: the probes of an older one are not sent).
    Probe(usize, u32),
    Arrival,
    /// A finished call or probe, reported to the engine.
    Report(usize),
}

/// The prober's schedule for one endpoint.
#[derive(Debug, Clone, Copy, Default)]
struct ProbeSchedule {
    generation: u32,
    fast: bool,
    next: Micros,
    last: Option<Micros>,
}

/// The router's view of one endpoint.
#[derive(Debug, Clone, Copy)]
struct Route {
    weight: f64,
    ramp_from: Micros,
    ramp_ms: i64,
}

impl Route {
    fn weight(&self, at: Micros) -> f64 {
        if self.ramp_ms <= 0 || self.weight >= 1.0 {
            return self.weight;
        }
        let done = ((at - self.ramp_from) as f64 / (self.ramp_ms * MS) as f64).clamp(0.0, 1.0);
        self.weight + (1.0 - self.weight) * done
    }
}

fn endpoint_name(i: usize) -> String {
    format!("e{i}")
}

/// Run one scenario with one seed and score it.
pub fn run(s: &Scenario, seed: u64) -> Score {
    run_with(s, seed, &Policy::default())
}

/// [`run`] with every pool under `policy`.
pub fn run_with(s: &Scenario, seed: u64, policy: &Policy) -> Score {
    run_judged(s, seed, &mut Engine::new(policy.clone()))
}

/// [`run`] with `judge` deciding.
pub fn run_judged(s: &Scenario, seed: u64, engine: &mut dyn Judge) -> Score {
    let mut rng = Rng::new(seed);
    let mut queue: BinaryHeap<Reverse<(Micros, u64, Event)>> = BinaryHeap::new();
    let mut reports: Vec<Option<Signal>> = Vec::new();
    let mut order = 0u64;
    let mut push = |queue: &mut BinaryHeap<_>, at: Micros, e: Event| {
        order += 1;
        queue.push(Reverse((at, order, e)));
    };
    push(&mut queue, 0, Event::Tick);
    push(&mut queue, rng.gap(s.rate), Event::Arrival);
    // Each endpoint's probe schedule: its generation, fast or not, the next probe and the last.
    let mut probes = vec![ProbeSchedule::default(); s.endpoints];
    // When the latest calls reached each endpoint, newest first (the prober sees them on the
    // signals topic).
    let mut last_calls: Vec<[Option<Micros>; TRAFFIC_MEMORY]> = vec![[None; TRAFFIC_MEMORY]; s.endpoints];
    let traffic_calls = calls_for_traffic(
        Duration::from_micros(s.probe_every.max(1) as u64),
        Duration::from_micros(s.traffic_probe_every.max(1) as u64),
    );
    for (ep, p) in probes.iter_mut().enumerate() {
        // Probers are not in phase with each other.
        p.next = (rng.unit() * s.probe_every as f64) as Micros;
        push(&mut queue, p.next, Event::Probe(ep, 0));
    }
    let mut routes = vec![
        Route {
            weight: 1.0,
            ramp_from: 0,
            ramp_ms: 0,
        };
        s.endpoints
    ];
    let mut panic = false;
    let faulty = s.faulty_endpoints();
    let first_fault = s.faults.iter().filter(|f| f.fault.is_real()).map(|f| f.from).min();
    let last_fault_end = s.faults.iter().filter(|f| f.fault.is_real()).map(|f| f.to).max();
    let mut score = Score {
        name: s.name,
        detection: None,
        ejection: None,
        false_ejections: 0,
        transitions: 0,
        fault_transitions: 0,
        max_out: 0.0,
        calls: 0,
        failed: 0,
        slow: 0,
        restore: None,
        full_weight: None,
        capacity_lost: 0.0,
        log: Vec::new(),
    };
    // The capacity lost so far and the instant it is counted to.
    let mut lost_to = last_fault_end;
    let mut ever_out = false;
    // The last time every faulty endpoint was back in rotation after one was out.
    let mut back_at: Option<Micros> = None;
    // The last time every faulty endpoint was at full weight again after one was lowered.
    let mut full_at: Option<Micros> = None;
    let mut ever_lowered = false;
    let mut ids = 0u64;
    let mut decisions = Vec::new();
    while let Some(Reverse((at, _, event))) = queue.pop() {
        if at > s.duration {
            break;
        }
        if let Some(from) = lost_to.filter(|&f| at > f) {
            score.capacity_lost += capacity_lost(&routes, &faulty, from, at);
            lost_to = Some(at);
        }
        let signal = match event {
            Event::Tick => {
                push(&mut queue, at + SEC, Event::Tick);
                Signal::Tick(Tick {
                    ticker: "scorecard".into(),
                    emitted_at: T0 + at,
                })
            }
            Event::Arrival => {
                push(&mut queue, at + rng.gap(s.rate), Event::Arrival);
                score.calls += 1;
                let Some(ep) = pick(&routes, panic, at, &mut rng) else {
                    score.failed += 1;
                    continue;
                };
                last_calls[ep].rotate_right(1);
                last_calls[ep][0] = Some(at);
                let mut a = answer(s.fault_at(ep, at), &mut rng, false);
                if a.retry_after_ms.is_some() {
                    a.retry_after_ms = s.retry_after(ep, at);
                }
                if a.class.is_failure() {
                    score.failed += 1;
                } else if a.ttft.is_some_and(|t| t > SLOW_MS * MS) {
                    score.slow += 1;
                }
                ids += 1;
                let call = call_outcome(ep, ids, at, &a);
                reports.push(Some(Signal::Call(call)));
                push(&mut queue, at + a.latency, Event::Report(reports.len() - 1));
                continue;
            }
            Event::Probe(ep, generation) => {
                let p = &mut probes[ep];
                if generation != p.generation {
                    continue;
                }
                let every = if p.fast {
                    s.fast_probe_every
                } else if last_calls[ep][traffic_calls - 1].is_some_and(|c| at - c <= s.traffic_probe_every) {
                    s.traffic_probe_every
                } else {
                    s.probe_every
                };
                p.last = Some(at);
                p.next = at + every;
                push(&mut queue, p.next, Event::Probe(ep, generation));
                let health_route = s.probe_kind != ProbeKind::SyntheticCompletion;
                let a = answer(s.fault_at(ep, at), &mut rng, health_route);
                ids += 1;
                let probe = ProbeResult {
                    probe_id: format!("probe-{ids}"),
                    pool: POOL.into(),
                    endpoint: endpoint_name(ep),
                    prober: "scorecard".into(),
                    occurred_at: T0 + at,
                    kind: s.probe_kind,
                    outcome: a.class,
                    latency_us: a.latency,
                    ttft_us: a.ttft,
                    http_status: None,
                    interval_ms: Some(every / MS),
                    dependencies: vec![],
                    detail: String::new(),
                };
                reports.push(Some(Signal::Probe(probe)));
                push(&mut queue, at + a.latency, Event::Report(reports.len() - 1));
                continue;
            }
            Event::Report(i) => reports[i].take().expect("each report is delivered once"),
        };
        decisions.clear();
        engine.apply(T0 + at, &signal, &mut decisions);
        for d in &decisions {
            match d {
                Decision::Pool(p) => panic = p.panic,
                Decision::Endpoint(h) => {
                    let ep: usize = h.endpoint[1..].parse().expect("endpoints are e<N>");
                    routes[ep] = Route {
                        weight: h.weight,
                        ramp_from: at,
                        ramp_ms: h.ramp_ms,
                    };
                    score.transitions += 1;
                    // The prober follows: faster now, the next probe comes one fast interval
                    // after the last (slower, the one due is sent and the next is slower).
                    let p = &mut probes[ep];
                    p.fast = wants_fast(h.to_state);
                    let sooner = p.last.map_or(at, |l| l + s.fast_probe_every).max(at + PROBER_LAG);
                    if p.fast && sooner < p.next {
                        p.generation += 1;
                        p.next = sooner;
                        push(&mut queue, sooner, Event::Probe(ep, p.generation));
                    }
                    if first_fault.is_some_and(|f| at >= f)
                        && last_fault_end.is_some_and(|e| at < e)
                        && faulty.contains(&ep)
                    {
                        score.fault_transitions += 1;
                    }
                    score
                        .log
                        .push((at, h.endpoint.clone(), h.from_state, h.to_state, h.reason.clone()));
                    if let Some(f) = first_fault.filter(|f| at >= *f && faulty.contains(&ep)) {
                        if h.weight < 1.0 && score.detection.is_none() {
                            score.detection = Some(at - f);
                        }
                        if h.weight == 0.0 && score.ejection.is_none() {
                            score.ejection = Some(at - f);
                        }
                    }
                    if h.to_state == HealthState::Unhealthy
                        && h.from_state != HealthState::Unhealthy
                        && !s.faulty_near(ep, at)
                    {
                        score.false_ejections += 1;
                    }
                }
            }
        }
        if !decisions.is_empty() {
            let out = routes.iter().filter(|r| r.weight == 0.0).count();
            score.max_out = score.max_out.max(out as f64 / s.endpoints as f64);
            let any_out = faulty.iter().any(|&e| routes[e].weight == 0.0);
            if any_out {
                ever_out = true;
                back_at = None;
            } else if ever_out && back_at.is_none() {
                back_at = Some(at);
            }
            if faulty.iter().any(|&e| routes[e].weight < 1.0) {
                ever_lowered = true;
                full_at = None;
            } else if ever_lowered && full_at.is_none() {
                full_at = Some(at);
            }
        }
    }
    if let Some(from) = lost_to.filter(|&f| s.duration > f) {
        score.capacity_lost += capacity_lost(&routes, &faulty, from, s.duration);
    }
    if let Some(end) = last_fault_end {
        let out_at_end = faulty.iter().any(|&e| routes[e].weight == 0.0);
        let lowered_at_end = faulty.iter().any(|&e| routes[e].weight < 1.0);
        let after = |ever: bool, at_end: bool, back: Option<Micros>| match (ever, at_end, back) {
            (false, _, _) => None,
            (true, true, _) => Some(Err(s.duration - end)),
            (true, false, Some(b)) => Some(Ok((b - end).max(0))),
            (true, false, None) => Some(Ok(0)),
        };
        score.restore = after(ever_out, out_at_end, back_at);
        score.full_weight = after(ever_lowered, lowered_at_end, full_at);
    }
    score
}

/// The endpoint-seconds of capacity `faulty` did not give over [from, to], the routes unchanged
/// between (a ramp is linear, so the trapezoid is exact).
fn capacity_lost(routes: &[Route], faulty: &[usize], from: Micros, to: Micros) -> f64 {
    let secs = (to - from) as f64 / SEC as f64;
    faulty
        .iter()
        .map(|&e| {
            let r = &routes[e];
            // A ramp that ends between the two instants bends once: split there.
            let end = r.ramp_from + r.ramp_ms * MS;
            if r.ramp_ms > 0 && end > from && end < to {
                capacity_lost(routes, &[e], from, end) + capacity_lost(routes, &[e], end, to)
            } else {
                (2.0 - r.weight(from) - r.weight(to)) / 2.0 * secs
            }
        })
        .sum()
}

/// The router: weighted random over the endpoints' current weights; every endpoint in panic
/// mode; none when every weight is 0.
fn pick(routes: &[Route], panic: bool, at: Micros, rng: &mut Rng) -> Option<usize> {
    if panic {
        return Some((rng.next_u64() % routes.len() as u64) as usize);
    }
    let total: f64 = routes.iter().map(|r| r.weight(at)).sum();
    if total <= 0.0 {
        return None;
    }
    let mut x = rng.unit() * total;
    for (i, r) in routes.iter().enumerate() {
        let w = r.weight(at);
        if x < w {
            return Some(i);
        }
        x -= w;
    }
    routes.iter().rposition(|r| r.weight(at) > 0.0)
}

fn call_outcome(ep: usize, id: u64, at: Micros, a: &Answer) -> CallOutcome {
    CallOutcome {
        http_status: match a.class {
            OutcomeClass::Success => Some(200),
            OutcomeClass::ServerError => Some(503),
            OutcomeClass::RateLimited => Some(429),
            OutcomeClass::ClientError => Some(400),
            _ => None,
        },
        latency_us: a.latency,
        ttft_us: a.ttft,
        retry_after_ms: a.retry_after_ms,
        ..CallOutcome::new(
            format!("call-{id}"),
            POOL,
            endpoint_name(ep),
            "scorecard",
            T0 + at,
            a.class,
        )
    }
}

/// e0 of `endpoints`, each called `per_endpoint` times a second, takes 10× as long on 15 % of
/// its calls for five minutes (measured before the latency rule had hysteresis: it flapped 65 times in 90 s at 10 calls
/// a second and 1,521 times at 200).
fn latency_tail(name: &'static str, endpoints: usize, per_endpoint: f64) -> Scenario {
    Scenario {
        name,
        what: match (endpoints, per_endpoint as i64) {
            (5, 10) => "e0 of five (10 calls/s each) takes 10× as long on 15 % of its calls for 5 minutes",
            (10, 10) => "e0 of ten (10 calls/s each) takes 10× as long on 15 % of its calls for 5 minutes",
            (5, _) => "e0 of five (200 calls/s each) takes 10× as long on 15 % of its calls for 5 minutes",
            _ => "e0 of ten (200 calls/s each) takes 10× as long on 15 % of its calls for 5 minutes",
        },
        endpoints,
        rate: per_endpoint * endpoints as f64,
        duration: 420 * SEC,
        probe_every: 5 * SEC,
        traffic_probe_every: 15 * SEC,
        fast_probe_every: SEC,
        probe_kind: ProbeKind::Http,
        faults: vec![Injection {
            endpoint: 0,
            fault: Fault::LatencyTail {
                share: 0.15,
                factor: 10,
            },
            from: 30 * SEC,
            to: 330 * SEC,
            period: None,
        }],
    }
}

/// The scenarios the table of docs/decisions.md reports.
pub fn scenarios() -> Vec<Scenario> {
    let base = Scenario {
        name: "",
        what: "",
        endpoints: 4,
        rate: 20.0,
        duration: 150 * SEC,
        probe_every: 5 * SEC,
        traffic_probe_every: 15 * SEC,
        fast_probe_every: SEC,
        probe_kind: ProbeKind::Http,
        faults: vec![],
    };
    let on_e0 = |fault, from: i64, to: i64| Injection {
        endpoint: 0,
        fault,
        from: from * SEC,
        to: to * SEC,
        period: None,
    };
    let everywhere = |n: usize, fault, from: i64, to: i64| -> Vec<Injection> {
        (0..n)
            .map(|endpoint| Injection {
                endpoint,
                fault,
                from: from * SEC,
                to: to * SEC,
                period: None,
            })
            .collect()
    };
    vec![
        Scenario {
            name: "hard-down",
            what: "e0 refuses connections for 60 s",
            faults: vec![on_e0(Fault::Down, 30, 90)],
            ..base.clone()
        },
        Scenario {
            name: "slow-ttft",
            what: "e0 answers 200 with a 6 s first token for 60 s; health-route probes",
            faults: vec![on_e0(Fault::SlowTtft { ttft_ms: 6_000 }, 30, 90)],
            ..base.clone()
        },
        Scenario {
            name: "slow-ttft-completion-probes",
            what: "the same, probed with synthetic completions",
            probe_kind: ProbeKind::SyntheticCompletion,
            faults: vec![on_e0(Fault::SlowTtft { ttft_ms: 6_000 }, 30, 90)],
            ..base.clone()
        },
        Scenario {
            name: "drops-15pct",
            what: "e0 drops 15 % of connections for 60 s",
            faults: vec![on_e0(Fault::Drops { share: 0.15 }, 30, 90)],
            ..base.clone()
        },
        Scenario {
            name: "429-storm",
            what: "e0 rate-limits 40 % of calls (Retry-After 5 s) for 60 s",
            faults: vec![on_e0(
                Fault::RateLimited {
                    share: 0.4,
                    retry_after_ms: Some(5_000),
                },
                30,
                90,
            )],
            ..base.clone()
        },
        Scenario {
            name: "4xx-storm",
            what: "60 % of e0's calls are the callers' 400s for 60 s (not a fault)",
            faults: vec![on_e0(Fault::ClientErrors { share: 0.6 }, 30, 90)],
            ..base.clone()
        },
        Scenario {
            name: "periodic",
            what: "e0 down 5 s, up 5 s, for 60 s",
            faults: vec![Injection {
                period: Some((5 * SEC, 5 * SEC)),
                ..on_e0(Fault::Down, 30, 90)
            }],
            ..base.clone()
        },
        Scenario {
            name: "shared-outage",
            what: "every endpoint answers 503 for 30 s",
            faults: everywhere(4, Fault::ServerErrors, 30, 60),
            ..base.clone()
        },
        Scenario {
            name: "noise-1pct",
            what: "1 % of calls fail at random everywhere (not a fault)",
            faults: everywhere(4, Fault::Noise { share: 0.01 }, 0, 150),
            ..base.clone()
        },
        Scenario {
            name: "low-traffic",
            what: "0.5 calls/s into the pool; e0 down for 60 s",
            rate: 0.5,
            faults: vec![on_e0(Fault::Down, 30, 90)],
            ..base.clone()
        },
        Scenario {
            name: "drops-15pct-5min",
            what: "e0 drops 15 % of connections for 5 minutes",
            duration: 420 * SEC,
            faults: vec![on_e0(Fault::Drops { share: 0.15 }, 30, 330)],
            ..base.clone()
        },
        Scenario {
            name: "drops-15pct-3-endpoints",
            what: "e0 of three drops 15 % of connections for 5 minutes",
            endpoints: 3,
            rate: 15.0,
            duration: 420 * SEC,
            faults: vec![on_e0(Fault::Drops { share: 0.15 }, 30, 330)],
            ..base.clone()
        },
        Scenario {
            name: "periodic-10s",
            what: "e0 down 10 s, up 10 s, for 5 minutes",
            duration: 420 * SEC,
            faults: vec![Injection {
                period: Some((10 * SEC, 10 * SEC)),
                ..on_e0(Fault::Down, 30, 330)
            }],
            ..base.clone()
        },
        Scenario {
            name: "periodic-503",
            what: "e0 answers 503 for 5 s, then fine for 15 s, for 5 minutes",
            duration: 420 * SEC,
            faults: vec![Injection {
                period: Some((5 * SEC, 15 * SEC)),
                ..on_e0(Fault::ServerErrors, 30, 330)
            }],
            ..base.clone()
        },
        Scenario {
            name: "slow-ttft-5min",
            what: "e0 answers 200 with a 5 s first token for 5 minutes; health-route probes",
            duration: 420 * SEC,
            faults: vec![on_e0(Fault::SlowTtft { ttft_ms: 5_000 }, 30, 330)],
            ..base.clone()
        },
        Scenario {
            name: "429-5min",
            what: "e0 rate-limits 40 % of calls (no Retry-After) for 5 minutes",
            duration: 420 * SEC,
            faults: vec![on_e0(
                Fault::RateLimited {
                    share: 0.4,
                    retry_after_ms: None,
                },
                30,
                330,
            )],
            ..base.clone()
        },
        latency_tail("latency-tail", 5, 10.0),
        latency_tail("latency-tail-10-endpoints", 10, 10.0),
        latency_tail("latency-tail-busy", 5, 200.0),
        latency_tail("latency-tail-busy-10-endpoints", 10, 200.0),
        Scenario {
            name: "recovery",
            what: "e0 down for 5 minutes, then fine",
            duration: 420 * SEC,
            faults: vec![on_e0(Fault::Down, 30, 330)],
            ..base.clone()
        },
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capacity_lost_is_the_area_above_the_routers_weight() {
        // Back at 0.1 at 10 s, ramping to 1 over 30 s: (1 − 0.1) / 2 × 30 s lost, counted over
        // any cut of time.
        let routes = [Route {
            weight: 0.1,
            ramp_from: 10 * SEC,
            ramp_ms: 30_000,
        }];
        let whole = capacity_lost(&routes, &[0], 10 * SEC, 100 * SEC);
        assert!((whole - 13.5).abs() < 1e-9, "{whole}");
        let cuts = [10, 17, 33, 39, 41, 100];
        let pieces: f64 = cuts
            .windows(2)
            .map(|w| capacity_lost(&routes, &[0], w[0] * SEC, w[1] * SEC))
            .sum();
        assert!((pieces - 13.5).abs() < 1e-9, "{pieces}");
        let out = [Route {
            weight: 0.0,
            ramp_from: 0,
            ramp_ms: 0,
        }];
        assert!((capacity_lost(&out, &[0], 0, 3 * SEC) - 3.0).abs() < 1e-9);
    }
}
