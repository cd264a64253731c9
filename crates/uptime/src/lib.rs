//! Uptime and incidents from the audit log. The definitions live here, once; the API computes
//! its answers with them and `vitals report` shows those answers. Pure: histories in, figures
//! out, no clock and no I/O (the caller clips a range's end to now).
//!
//! # Definitions
//!
//! * **In rotation** (available): an endpoint a router sends calls to — `healthy`, `suspect`,
//!   `recovering` (slow start and probation included) and `degraded`, each with weight > 0. A
//!   `degraded` endpoint at weight 0 (a policy's `degraded_weight` of 0) and `unhealthy` (ejected,
//!   cooling down, forced out) are **out**. `maintenance` is neither: planned, it is left out of
//!   availability's denominator and reported on its own.
//! * **Time in each state** over a range `[from, to)`: the state at `from` is the one the last
//!   transition before it set (an endpoint with no transition yet is healthy, the state it is
//!   first seen in); an endpoint first seen inside the range counts from then.
//! * **Availability** = seconds in rotation / (seconds observed − seconds in maintenance).
//! * **Incident**: from the transition that takes an endpoint out of rotation to the first
//!   transition that ends that (back in rotation, or into maintenance). Its *first sign* is the
//!   earliest departure from healthy to suspect or degraded since the previous incident ended
//!   that did not return to healthy (maintenance is no sign), or the start itself when there
//!   is none; *time to out* runs from the first sign to the
//!   start, *time to back* from the start to the end. An incident belongs to a range it overlaps:
//!   one that began before `from` is listed with its true start.
//! * **Pool**: seconds with at least one endpoint in rotation (`availability`) and with every
//!   known endpoint that is not in maintenance in rotation (`all_availability`), over the
//!   seconds with at least one endpoint known; seconds in panic mode and with a correlated outage
//!   suspected, from the pool's decisions.
//! * **Request availability**: the share of calls that succeeded — succeeded / (succeeded +
//!   failed + rate limited), 4xx and cancelled calls left out — from the processor's counts of
//!   every call and summary it read, by endpoint and minute of stream time. A range (or bucket)
//!   holds the minutes that start in it. For the pool, every endpoint's calls summed.
//! * **Traffic-weighted availability**: each endpoint's availability weighted by the calls it
//!   served in the range (every call counted). Over history without counts (before the
//!   processor counted calls) it is an estimate: weighted by the calls its transitions' evidence
//!   counted in the range, which follows the traffic an endpoint had when something changed.

use std::collections::BTreeMap;
use vitals_contracts::view::{self, EndpointUptime, PoolFigures, UptimeBucket};
use vitals_contracts::{HealthState, Micros, Requests};

const SEC: f64 = 1_000_000.0;

/// What a state and weight count as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// In rotation.
    Available,
    Out,
    Maintenance,
}

/// In rotation, out, or in maintenance (see the crate's definitions).
pub fn kind(state: HealthState, weight: f64) -> Kind {
    match state {
        HealthState::Maintenance => Kind::Maintenance,
        HealthState::Unhealthy => Kind::Out,
        HealthState::Healthy | HealthState::Suspect | HealthState::Recovering | HealthState::Degraded => {
            if weight > 0.0 {
                Kind::Available
            } else {
                Kind::Out
            }
        }
    }
}

/// One transition of an endpoint, as much as uptime needs.
#[derive(Debug, Clone, PartialEq)]
pub struct Change {
    pub at: Micros,
    pub seq: i64,
    pub from: HealthState,
    pub to: HealthState,
    pub weight: f64,
    pub code: String,
    /// Calls in the evidence window.
    pub calls: i64,
}

/// One endpoint's history around a range: when it was first seen and its transitions in order,
/// from far enough back — the last one before the range's start at least and, when that left it
/// anything but healthy, back to its last departure from healthy (so that an incident under way
/// at the start is seen whole).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct History {
    pub endpoint: String,
    pub seen: Micros,
    pub changes: Vec<Change>,
    /// Its calls by what they got, each at the start of the minutes they were counted in (or of
    /// a span of whole minutes summed, which lies inside one bucket of the range); in any order.
    pub requests: Vec<(Micros, Requests)>,
}

/// A range `[from, to)` in µs, and optional buckets of `bucket` µs aligned to the epoch (UTC hours
/// and days).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Range {
    pub from: Micros,
    pub to: Micros,
    pub bucket: Option<Micros>,
}

impl Range {
    /// The buckets' bounds, the first and last clipped to the range.
    pub fn buckets(&self) -> Vec<(Micros, Micros)> {
        let Some(w) = self.bucket.filter(|w| *w > 0) else {
            return Vec::new();
        };
        let mut out = Vec::new();
        let mut start = self.from.div_euclid(w) * w;
        while start < self.to {
            out.push((start.max(self.from), (start + w).min(self.to)));
            start += w;
        }
        out
    }
}

/// A stretch of time in one state.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Segment {
    start: Micros,
    end: Micros,
    state: HealthState,
    kind: Kind,
}

impl History {
    /// Its calls counted in minutes that start in `[from, to)`.
    pub fn requests_in(&self, from: Micros, to: Micros) -> Requests {
        let mut r = Requests::default();
        for (at, n) in &self.requests {
            if *at >= from && *at < to {
                r.merge(n);
            }
        }
        r
    }

    /// Its calls added to the bucket each falls in (`buckets` in order, as [`Range::buckets`]
    /// gives them): one pass over its counts, not one per bucket.
    fn add_requests_by_bucket(&self, buckets: &[(Micros, Micros)], sums: &mut [Requests]) {
        for (at, n) in &self.requests {
            let i = buckets.partition_point(|b| b.1 <= *at);
            if buckets.get(i).is_some_and(|b| b.0 <= *at) {
                sums[i].merge(n);
            }
        }
    }

    /// The state (and weight) before the first change: what that change left.
    fn initial(&self) -> (HealthState, f64) {
        match self.changes.first() {
            Some(c) if c.from != HealthState::Healthy => (c.from, 0.0),
            _ => (HealthState::Healthy, 1.0),
        }
    }

    /// The stretches of the range this endpoint was known in, in order.
    fn segments(&self, range: &Range) -> Vec<Segment> {
        let start = range.from.max(self.seen);
        if start >= range.to {
            return Vec::new();
        }
        let (mut state, mut weight) = self.initial();
        let mut t = start;
        let mut out = Vec::new();
        for c in &self.changes {
            if c.at >= range.to {
                break;
            }
            if c.at > t {
                out.push(Segment {
                    start: t,
                    end: c.at,
                    state,
                    kind: kind(state, weight),
                });
                t = c.at;
            }
            state = c.to;
            weight = c.weight;
        }
        out.push(Segment {
            start: t,
            end: range.to,
            state,
            kind: kind(state, weight),
        });
        out
    }

    /// Its incidents that overlap the range, oldest first.
    pub fn incidents(&self, range: &Range) -> Vec<Span> {
        let (state, weight) = self.initial();
        let mut current = kind(state, weight);
        let mut sign: Option<Micros> = None;
        let mut open: Option<Span> = None;
        let mut out = Vec::new();
        for c in self.changes.iter().take_while(|c| c.at < range.to) {
            let next = kind(c.to, c.weight);
            // A sign is a departure from healthy to suspect or degraded: maintenance is planned,
            // and one that ends in slow start and then out is no sign of the outage.
            if c.from == HealthState::Healthy
                && matches!(c.to, HealthState::Suspect | HealthState::Degraded)
                && sign.is_none()
            {
                sign = Some(c.at);
            }
            if let Some(o) = open.as_mut() {
                push_code(&mut o.codes, &c.code);
                if next != Kind::Out {
                    o.end = Some((c.at, c.to));
                    let done = open.take().expect("open");
                    if c.at > range.from {
                        out.push(done);
                    }
                    sign = None;
                }
            } else if next == Kind::Out && current != Kind::Out {
                open = Some(Span {
                    seq: c.seq,
                    start: c.at,
                    first_sign: sign.unwrap_or(c.at),
                    end: None,
                    codes: vec![c.code.clone()],
                });
            }
            if c.to == HealthState::Healthy {
                sign = None;
            }
            current = next;
        }
        out.extend(open);
        out
    }
}

fn push_code(codes: &mut Vec<String>, code: &str) {
    if !codes.iter().any(|c| c == code) {
        codes.push(code.to_owned());
    }
}

/// An incident as this crate finds it; the caller adds the pool, reason and evidence.
#[derive(Debug, Clone, PartialEq)]
pub struct Span {
    /// The seq of the transition that took the endpoint out.
    pub seq: i64,
    pub start: Micros,
    pub first_sign: Micros,
    /// When and in which state it ended.
    pub end: Option<(Micros, HealthState)>,
    pub codes: Vec<String>,
}

impl Span {
    /// The incident as the API shows it; `until` ends an ongoing one (the range's end, or now).
    pub fn view(&self, pool: &str, endpoint: &str, until: Micros) -> view::Incident {
        let end = self.end.map_or(until, |(at, _)| at);
        view::Incident {
            pool: pool.to_owned(),
            endpoint: endpoint.to_owned(),
            seq: self.seq,
            started_at: view::time(self.start),
            ended_at: self.end.map(|(at, _)| view::time(at)),
            ongoing: self.end.is_none(),
            duration_s: (end - self.start).max(0) as f64 / SEC,
            first_sign_at: view::time(self.first_sign),
            time_to_out_s: (self.start - self.first_sign) as f64 / SEC,
            time_to_back_s: self.end.map(|(at, _)| (at - self.start) as f64 / SEC),
            reason_codes: self.codes.clone(),
            ended_in: self.end.map(|(_, s)| s.into()),
            reason: String::new(),
            evidence: None,
        }
    }
}

/// Seconds observed, available and in maintenance, accumulated.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
struct Tally {
    observed: Micros,
    available: Micros,
    maintenance: Micros,
}

impl Tally {
    fn add(&mut self, kind: Kind, d: Micros) {
        self.observed += d;
        match kind {
            Kind::Available => self.available += d,
            Kind::Maintenance => self.maintenance += d,
            Kind::Out => {}
        }
    }

    fn availability(&self) -> Option<f64> {
        let base = self.observed - self.maintenance;
        (base > 0).then(|| self.available as f64 / base as f64)
    }

    fn bucket(&self, (start, end): (Micros, Micros), requests: Requests) -> UptimeBucket {
        UptimeBucket {
            start: view::time(start),
            end: view::time(end),
            observed_s: self.observed as f64 / SEC,
            available_s: self.available as f64 / SEC,
            maintenance_s: self.maintenance as f64 / SEC,
            availability: self.availability(),
            requests,
            request_availability: requests.availability(),
        }
    }
}

/// Spread a stretch `[start, end)` of `kind` over the buckets it overlaps.
fn spread(buckets: &[(Micros, Micros)], tallies: &mut [Tally], start: Micros, end: Micros, kind: Kind) {
    let first = buckets.partition_point(|b| b.1 <= start);
    for (i, b) in buckets.iter().enumerate().skip(first) {
        if b.0 >= end {
            break;
        }
        let d = end.min(b.1) - start.max(b.0);
        if d > 0 {
            tallies[i].add(kind, d);
        }
    }
}

/// One endpoint's uptime over the range.
pub fn endpoint(h: &History, range: &Range) -> EndpointUptime {
    let buckets = range.buckets();
    let mut tallies = vec![Tally::default(); buckets.len()];
    let mut total = Tally::default();
    let mut state_s: BTreeMap<String, f64> = BTreeMap::new();
    for s in h.segments(range) {
        let d = s.end - s.start;
        total.add(s.kind, d);
        *state_s.entry(s.state.as_str().to_owned()).or_default() += d as f64 / SEC;
        spread(&buckets, &mut tallies, s.start, s.end, s.kind);
    }
    state_s.retain(|_, v| *v > 0.0);
    let calls = h
        .changes
        .iter()
        .filter(|c| c.at >= range.from && c.at < range.to)
        .map(|c| c.calls.max(0))
        .sum();
    let requests = h.requests_in(range.from, range.to);
    let mut bucket_requests = vec![Requests::default(); buckets.len()];
    h.add_requests_by_bucket(&buckets, &mut bucket_requests);
    EndpointUptime {
        endpoint: h.endpoint.clone(),
        observed_s: total.observed as f64 / SEC,
        available_s: total.available as f64 / SEC,
        maintenance_s: total.maintenance as f64 / SEC,
        availability: total.availability(),
        state_s,
        incidents: h.incidents(range).len(),
        calls,
        requests,
        request_availability: requests.availability(),
        buckets: tallies
            .iter()
            .zip(&buckets)
            .zip(bucket_requests)
            .map(|((t, b), r)| t.bucket(*b, r))
            .collect(),
    }
}

/// The pool's flags over time: at the range's start, then each decision that changed them.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PoolFlags {
    /// (panic, correlated outage) in force at the range's start.
    pub initial: (bool, bool),
    /// (at, panic, correlated outage), in order.
    pub changes: Vec<(Micros, bool, bool)>,
}

/// The pool's figures over the range, from its endpoints' histories and its flags.
pub fn pool(histories: &[History], flags: &PoolFlags, range: &Range) -> PoolFigures {
    let endpoints: Vec<EndpointUptime> = histories.iter().map(|h| endpoint(h, range)).collect();
    pool_of(histories, &endpoints, flags, range)
}

/// The pool's figures (with their buckets) and each endpoint's without buckets, worst first:
/// what a page of endpoints is chosen from, whose buckets then come from [`endpoint`] one by
/// one. The figures are [`uptime`]'s; the memory is not a thousand endpoints' hourly buckets.
pub fn uptime_without_endpoint_buckets(
    histories: &[History],
    flags: &PoolFlags,
    range: &Range,
) -> (PoolFigures, Vec<EndpointUptime>) {
    let plain = Range { bucket: None, ..*range };
    let mut endpoints: Vec<EndpointUptime> = histories.iter().map(|h| endpoint(h, &plain)).collect();
    let figures = pool_of(histories, &endpoints, flags, range);
    worst_first(&mut endpoints);
    (figures, endpoints)
}

/// The pool's figures and each endpoint's (worst first), each computed once.
pub fn uptime(histories: &[History], flags: &PoolFlags, range: &Range) -> (PoolFigures, Vec<EndpointUptime>) {
    let mut endpoints: Vec<EndpointUptime> = histories.iter().map(|h| endpoint(h, range)).collect();
    let figures = pool_of(histories, &endpoints, flags, range);
    worst_first(&mut endpoints);
    (figures, endpoints)
}

/// The pool's figures from its histories (for the sweep over time) and its endpoints' figures
/// over the same range (for incidents and the traffic weights).
fn pool_of(histories: &[History], endpoints: &[EndpointUptime], flags: &PoolFlags, range: &Range) -> PoolFigures {
    // Sweep the endpoints' stretches in time order with a count of those known (not in
    // maintenance) and of those in rotation.
    let mut events: Vec<(Micros, i32, i32, i32)> = Vec::new(); // (at, Δknown, Δserving-eligible, Δavailable)
    let incidents = endpoints.iter().map(|e| e.incidents).sum();
    for h in histories {
        for s in h.segments(range) {
            let (eligible, available) = match s.kind {
                Kind::Available => (1, 1),
                Kind::Out => (1, 0),
                Kind::Maintenance => (0, 0),
            };
            events.push((s.start, 1, eligible, available));
            events.push((s.end, -1, -eligible, -available));
        }
    }
    events.sort_unstable_by_key(|e| e.0);
    let buckets = range.buckets();
    let mut any = Tally::default();
    let mut all = Tally::default();
    let mut any_b = vec![Tally::default(); buckets.len()];
    let (mut known, mut eligible, mut available) = (0, 0, 0);
    let mut i = 0;
    while i < events.len() {
        let t = events[i].0;
        while i < events.len() && events[i].0 == t {
            known += events[i].1;
            eligible += events[i].2;
            available += events[i].3;
            i += 1;
        }
        let Some(next) = events.get(i).map(|e| e.0) else { break };
        let d = next - t;
        if known > 0 && d > 0 {
            let k = if eligible == 0 {
                Kind::Maintenance
            } else if available > 0 {
                Kind::Available
            } else {
                Kind::Out
            };
            any.add(k, d);
            spread(&buckets, &mut any_b, t, next, k);
            let k_all = match k {
                Kind::Available if available == eligible => Kind::Available,
                Kind::Maintenance => Kind::Maintenance,
                _ => Kind::Out,
            };
            all.add(k_all, d);
        }
    }
    let (mut panic_s, mut outage_s) = (0, 0);
    let mut state = flags.initial;
    let mut t = range.from;
    let mut flag_time = |state: (bool, bool), a: Micros, b: Micros| {
        let d = b.min(range.to) - a.max(range.from);
        if d > 0 {
            panic_s += if state.0 { d } else { 0 };
            outage_s += if state.1 { d } else { 0 };
        }
    };
    for (at, p, o) in &flags.changes {
        if *at >= range.to {
            break;
        }
        flag_time(state, t, *at);
        t = t.max(*at);
        state = (*p, *o);
    }
    flag_time(state, t, range.to);
    let mut requests = Requests::default();
    for e in endpoints {
        requests.merge(&e.requests);
    }
    // Weighted by every call each endpoint served where the range has counts; by the calls in
    // its evidence (the estimate) where it has none at all.
    let counted = requests.total() > 0;
    let weighted = {
        let (mut num, mut den) = (0.0, 0.0);
        for e in endpoints {
            let w = if counted { e.requests.total() } else { e.calls };
            if let (Some(a), true) = (e.availability, w > 0) {
                num += a * w as f64;
                den += w as f64;
            }
        }
        (den > 0.0).then(|| num / den)
    };
    let mut bucket_requests = vec![Requests::default(); buckets.len()];
    for h in histories {
        h.add_requests_by_bucket(&buckets, &mut bucket_requests);
    }
    PoolFigures {
        observed_s: any.observed as f64 / SEC,
        any_available_s: any.available as f64 / SEC,
        all_available_s: all.available as f64 / SEC,
        maintenance_s: any.maintenance as f64 / SEC,
        panic_s: panic_s as f64 / SEC,
        correlated_outage_s: outage_s as f64 / SEC,
        availability: any.availability(),
        all_availability: all.availability(),
        traffic_weighted_availability: weighted,
        requests,
        request_availability: requests.availability(),
        incidents,
        buckets: any_b
            .iter()
            .zip(&buckets)
            .zip(bucket_requests)
            .map(|((t, b), r)| t.bucket(*b, r))
            .collect(),
    }
}

/// Worst first: lowest availability, then most incidents, then name; endpoints with nothing
/// observed last.
pub fn worst_first(endpoints: &mut [EndpointUptime]) {
    endpoints.sort_by(|a, b| worst_first_order(rank(a), rank(b)));
}

/// What orders an endpoint worst first: (availability, incidents, name).
pub type Rank<'a> = (Option<f64>, usize, &'a str);

/// An endpoint's [`Rank`].
pub fn rank(e: &EndpointUptime) -> Rank<'_> {
    (e.availability, e.incidents, &e.endpoint)
}

/// The order of [`worst_first`]: lowest availability (none last), then most incidents, then name.
pub fn worst_first_order(a: Rank<'_>, b: Rank<'_>) -> std::cmp::Ordering {
    let key = |a: Option<f64>| a.unwrap_or(f64::INFINITY);
    key(a.0).total_cmp(&key(b.0)).then(b.1.cmp(&a.1)).then(a.2.cmp(b.2))
}
