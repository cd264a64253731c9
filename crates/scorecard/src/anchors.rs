//! The anchors' policies, modelled as far as the scorecard's router can follow them, so that the
//! scorecard can put the figures users feel side by side: what Envoy's outlier detection and
//! LiteLLM's router cooldown would have done in the same closed loop (same traffic, same faults,
//! same seeds). Both see only the calls a gateway makes (neither reads vitals' probes), and both
//! put an endpoint back at full weight when its time out is over.
//!
//! - [`Envoy`]: outlier detection with its defaults (envoy.config.cluster.v3.OutlierDetection):
//!   5 consecutive 5xx eject (a refused connection, a reset and a timeout count as 503/504, as
//!   they do without `split_external_local_origin_errors`), for `base_ejection_time` 30 s × the
//!   times ejected (at most `max_ejection_time` 300 s; the count falls by one each 10 s interval
//!   the host stays in), un-ejected on the 10 s interval timer, at most 10 % of the hosts out but
//!   always one; the success-rate rule (1.9 standard deviations below the mean, with ≥ 5 hosts of
//!   ≥ 100 requests in the interval). Latency is not a criterion.
//! - [`Litellm`]: the router's cooldown as LiteLLM 1.110.2 implements it
//!   (`router_utils/cooldown_handlers.py`, the version the plug-in's tests pin): a deployment of a
//!   group with alternatives cools down on a 429, or on a failure when more than 50 % of its calls
//!   this minute failed (at least 5), for the upstream's Retry-After or else 5 s; 4xx other
//!   than 429 do not. A refused connection and one dropped before the response reach the
//!   router as an `InternalServerError` 500 (measured with the installed 1.110.2 against a
//!   closed port and a server that closes at once: both cool down by the failure-rate rule),
//!   so the source's exception for `APIConnectionError` does not spare them. Its counts are
//!   kept for 60 s from the first of them. `integrations/litellm/tests/test_anchor.py` holds
//!   these against the real Router.

use crate::{Judge, MS, POOL, SEC};
use std::collections::HashMap;
use vitals_contracts::{CallOutcome, HealthChanged, HealthState, Micros, OutcomeClass, Signal};
use vitals_engine::Decision;

/// An anchor's verdict changing: `endpoint` in or out, published the way the engine publishes,
/// so that the scorecard's router and counters read both alike.
fn change(endpoint: &str, seq: &mut i64, out: bool, at: Micros, reason: String, decisions: &mut Vec<Decision>) {
    *seq += 1;
    let (from, to) = if out {
        (HealthState::Healthy, HealthState::Unhealthy)
    } else {
        (HealthState::Unhealthy, HealthState::Healthy)
    };
    decisions.push(Decision::Endpoint(Box::new(HealthChanged {
        reason,
        ..HealthChanged::new(POOL, endpoint, *seq, from, to, at)
    })));
}

fn call(signal: &Signal) -> Option<&CallOutcome> {
    match signal {
        Signal::Call(c) => Some(c),
        _ => None,
    }
}

/// Envoy's outlier detection with its defaults (see the module's notes).
#[derive(Debug)]
pub struct Envoy {
    hosts: HashMap<String, Host>,
    total: usize,
    next_interval: Option<Micros>,
}

#[derive(Debug, Default)]
struct Host {
    seq: i64,
    consecutive_5xx: u32,
    ejected_at: Option<Micros>,
    times_ejected: u32,
    /// Requests and successes in the current interval (the success-rate rule).
    requests: u32,
    successes: u32,
}

const ENVOY_INTERVAL: Micros = 10 * SEC;
const ENVOY_BASE_EJECTION: Micros = 30 * SEC;
const ENVOY_MAX_EJECTION: Micros = 300 * SEC;
const ENVOY_CONSECUTIVE_5XX: u32 = 5;
const ENVOY_MAX_EJECTION_PERCENT: usize = 10;

impl Envoy {
    pub fn new(endpoints: usize) -> Envoy {
        Envoy {
            hosts: HashMap::new(),
            total: endpoints,
            next_interval: None,
        }
    }

    fn may_eject(&self) -> bool {
        let ejected = self.hosts.values().filter(|h| h.ejected_at.is_some()).count();
        ejected == 0 || (ejected + 1) * 100 <= ENVOY_MAX_EJECTION_PERCENT * self.total
    }

    fn eject(&mut self, name: &str, at: Micros, reason: String, out: &mut Vec<Decision>) {
        if !self.may_eject() {
            return;
        }
        let h = self.hosts.get_mut(name).expect("known host");
        h.ejected_at = Some(at);
        h.times_ejected += 1;
        change(name, &mut h.seq, true, at, reason, out);
    }

    /// The interval timer: un-eject hosts whose time is over, decay the counts of the others,
    /// and judge success rates.
    fn interval(&mut self, at: Micros, out: &mut Vec<Decision>) {
        let mut names: Vec<String> = self.hosts.keys().cloned().collect();
        names.sort();
        for name in &names {
            let h = self.hosts.get_mut(name).expect("known host");
            match h.ejected_at {
                Some(e) => {
                    let time = (ENVOY_BASE_EJECTION * i64::from(h.times_ejected)).min(ENVOY_MAX_EJECTION);
                    if at >= e + time {
                        h.ejected_at = None;
                        h.consecutive_5xx = 0;
                        let reason = format!("ejection of {} s over", time / SEC);
                        change(name, &mut h.seq, false, at, reason, out);
                    }
                }
                None => h.times_ejected = h.times_ejected.saturating_sub(1),
            }
        }
        let rates: Vec<(String, f64)> = names
            .iter()
            .filter_map(|n| {
                let h = &self.hosts[n];
                (h.requests >= 100).then(|| (n.clone(), f64::from(h.successes) / f64::from(h.requests)))
            })
            .collect();
        if rates.len() >= 5 {
            let mean = rates.iter().map(|r| r.1).sum::<f64>() / rates.len() as f64;
            let var = rates.iter().map(|r| (r.1 - mean).powi(2)).sum::<f64>() / rates.len() as f64;
            let floor = mean - 1.9 * var.sqrt();
            for (name, rate) in rates {
                if rate < floor && self.hosts[&name].ejected_at.is_none() {
                    let reason = format!("success rate {:.1} % below {:.1} %", rate * 100.0, floor * 100.0);
                    self.eject(&name, at, reason, out);
                }
            }
        }
        for h in self.hosts.values_mut() {
            h.requests = 0;
            h.successes = 0;
        }
    }
}

impl Judge for Envoy {
    fn apply(&mut self, at: Micros, signal: &Signal, out: &mut Vec<Decision>) {
        // The timer's ticks that fell since the last signal, each at its own time.
        let mut next = *self.next_interval.get_or_insert(at + ENVOY_INTERVAL);
        while at >= next {
            self.interval(next, out);
            next += ENVOY_INTERVAL;
        }
        self.next_interval = Some(next);
        let Some(c) = call(signal) else { return };
        let h = self.hosts.entry(c.endpoint.clone()).or_default();
        h.requests += 1;
        let five_xx = matches!(
            c.outcome,
            OutcomeClass::ServerError
                | OutcomeClass::ConnectError
                | OutcomeClass::ConnectionDropped
                | OutcomeClass::Timeout
                | OutcomeClass::InvalidResponse
        );
        if !five_xx {
            h.successes += u32::from(c.outcome == OutcomeClass::Success);
            if c.outcome != OutcomeClass::Cancelled {
                h.consecutive_5xx = 0;
            }
            return;
        }
        h.consecutive_5xx += 1;
        if h.consecutive_5xx >= ENVOY_CONSECUTIVE_5XX && h.ejected_at.is_none() {
            let reason = format!("{ENVOY_CONSECUTIVE_5XX} consecutive 5xx");
            self.eject(&c.endpoint, at, reason, out);
        }
    }
}

/// LiteLLM's router cooldown (see the module's notes).
#[derive(Debug, Default)]
pub struct Litellm {
    deployments: HashMap<String, Deployment>,
}

#[derive(Debug, Default)]
struct Deployment {
    seq: i64,
    /// When this minute's counts began (they expire 60 s later).
    counted_from: Option<Micros>,
    successes: u32,
    fails: u32,
    cooling_until: Option<Micros>,
}

const LITELLM_COOLDOWN: Micros = 5 * SEC;
const LITELLM_MINUTE: Micros = 60 * SEC;
const LITELLM_MIN_REQUESTS: u32 = 5;

impl Litellm {
    pub fn new() -> Litellm {
        Litellm::default()
    }
}

impl Judge for Litellm {
    fn apply(&mut self, at: Micros, signal: &Signal, out: &mut Vec<Decision>) {
        // Most signals end no cooldown: look for the ones that ended (in name order) only then.
        let over = |d: &Deployment| d.cooling_until.is_some_and(|u| at >= u);
        if self.deployments.values().any(over) {
            let mut ended: Vec<String> = self
                .deployments
                .iter()
                .filter(|(_, d)| over(d))
                .map(|(n, _)| n.clone())
                .collect();
            ended.sort();
            for name in ended {
                let d = self.deployments.get_mut(&name).expect("known deployment");
                d.cooling_until = None;
                change(&name, &mut d.seq, false, at, "cooldown over".into(), out);
            }
        }
        let Some(c) = call(signal) else { return };
        let d = self.deployments.entry(c.endpoint.clone()).or_default();
        if d.counted_from.is_none_or(|f| at >= f + LITELLM_MINUTE) {
            *d = Deployment {
                counted_from: Some(at),
                seq: d.seq,
                cooling_until: d.cooling_until,
                ..Deployment::default()
            };
        }
        if matches!(c.outcome, OutcomeClass::Success | OutcomeClass::Cancelled) {
            d.successes += u32::from(c.outcome == OutcomeClass::Success);
            return;
        }
        d.fails += 1;
        let cools = match c.outcome {
            OutcomeClass::RateLimited => true,
            OutcomeClass::ClientError => false,
            _ => {
                let total = d.fails + d.successes;
                f64::from(d.fails) / f64::from(total) > 0.5 && total >= LITELLM_MIN_REQUESTS
            }
        };
        if !cools {
            return;
        }
        let time = c.retry_after_ms.map_or(LITELLM_COOLDOWN, |ms| ms * MS);
        let until = at + time;
        match d.cooling_until {
            // A call that ends while it cools sets the cooldown again.
            Some(u) => d.cooling_until = Some(u.max(until)),
            None => {
                d.cooling_until = Some(until);
                let reason = format!("{} : cooldown {:.1} s", c.outcome.as_str(), time as f64 / 1e6);
                change(&c.endpoint, &mut d.seq, true, at, reason, out);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn outcome(ep: &str, at: Micros, class: OutcomeClass, retry_after_ms: Option<i64>) -> Signal {
        Signal::Call(CallOutcome {
            retry_after_ms,
            ..CallOutcome::new(format!("c{at}"), POOL, ep, "t", at, class)
        })
    }

    fn moves(d: &[Decision]) -> Vec<(String, HealthState)> {
        d.iter()
            .filter_map(|d| match d {
                Decision::Endpoint(h) => Some((h.endpoint.clone(), h.to_state)),
                Decision::Pool(_) => None,
            })
            .collect()
    }

    #[test]
    fn envoy_ejects_on_the_fifth_5xx_in_a_row_and_lets_it_back_on_the_interval_after_30_s() {
        let mut envoy = Envoy::new(4);
        let mut out = Vec::new();
        for i in 0..4 {
            envoy.apply(
                i * SEC,
                &outcome("e0", i * SEC, OutcomeClass::ConnectError, None),
                &mut out,
            );
        }
        // A success in between starts the count again.
        envoy.apply(4 * SEC, &outcome("e0", 4 * SEC, OutcomeClass::Success, None), &mut out);
        for i in 5..9 {
            envoy.apply(
                i * SEC,
                &outcome("e0", i * SEC, OutcomeClass::ServerError, None),
                &mut out,
            );
        }
        assert!(out.is_empty(), "four in a row eject nothing");
        envoy.apply(9 * SEC, &outcome("e0", 9 * SEC, OutcomeClass::Timeout, None), &mut out);
        assert_eq!(moves(&out), vec![("e0".to_owned(), HealthState::Unhealthy)]);
        // Only one host of four may be out (10 %, but always one).
        out.clear();
        for i in 10..15 {
            envoy.apply(
                i * SEC,
                &outcome("e1", i * SEC, OutcomeClass::ServerError, None),
                &mut out,
            );
        }
        assert!(out.is_empty(), "a second host of four stays in");
        // The interval timer (every 10 s from the first signal) lets it back at 40 s, not 39.
        envoy.apply(
            39 * SEC,
            &outcome("e2", 39 * SEC, OutcomeClass::Success, None),
            &mut out,
        );
        assert!(out.is_empty());
        envoy.apply(
            40 * SEC,
            &outcome("e2", 40 * SEC, OutcomeClass::Success, None),
            &mut out,
        );
        assert_eq!(moves(&out), vec![("e0".to_owned(), HealthState::Healthy)]);
    }

    #[test]
    fn litellm_cools_down_on_a_429_for_its_retry_after_and_on_most_of_five_calls_failing() {
        let mut litellm = Litellm::new();
        let mut out = Vec::new();
        for i in 0..4 {
            litellm.apply(
                i * SEC,
                &outcome("e0", i * SEC, OutcomeClass::ConnectError, None),
                &mut out,
            );
        }
        assert!(out.is_empty(), "four calls are not enough");
        litellm.apply(
            4 * SEC,
            &outcome("e0", 4 * SEC, OutcomeClass::ConnectionDropped, None),
            &mut out,
        );
        assert_eq!(moves(&out), vec![("e0".to_owned(), HealthState::Unhealthy)]);
        out.clear();
        litellm.apply(9 * SEC, &outcome("e9", 9 * SEC, OutcomeClass::Success, None), &mut out);
        assert_eq!(moves(&out), vec![("e0".to_owned(), HealthState::Healthy)], "5 s later");
        out.clear();
        litellm.apply(
            20 * SEC,
            &outcome("e1", 20 * SEC, OutcomeClass::RateLimited, Some(2_000)),
            &mut out,
        );
        assert_eq!(moves(&out), vec![("e1".to_owned(), HealthState::Unhealthy)]);
        out.clear();
        litellm.apply(
            21 * SEC,
            &outcome("e2", 21 * SEC, OutcomeClass::Success, None),
            &mut out,
        );
        assert!(out.is_empty());
        litellm.apply(
            22 * SEC,
            &outcome("e2", 22 * SEC, OutcomeClass::Success, None),
            &mut out,
        );
        assert_eq!(moves(&out), vec![("e1".to_owned(), HealthState::Healthy)]);
        // 503s cool down once more than half of at least five calls this minute failed.
        out.clear();
        for (i, class) in [
            OutcomeClass::Success,
            OutcomeClass::Success,
            OutcomeClass::ServerError,
            OutcomeClass::ServerError,
        ]
        .into_iter()
        .enumerate()
        {
            litellm.apply(30 * SEC + i as i64, &outcome("e3", 30 * SEC, class, None), &mut out);
        }
        assert!(out.is_empty(), "2 of 4 failed: not over half of five");
        litellm.apply(
            31 * SEC,
            &outcome("e3", 31 * SEC, OutcomeClass::ServerError, None),
            &mut out,
        );
        assert_eq!(moves(&out), vec![("e3".to_owned(), HealthState::Unhealthy)]);
    }
}
