//! Ejection: the rules that take an endpoint in rotation out (a hard break, consecutive
//! failures, the failure rate, the peer comparison, slow first tokens, a critical dependency
//! down, heartbeat silence), what the ejection is for, and Envoy's max-ejection rule, which may
//! refuse it and make the pool suspect a shared dependency instead.

use super::cause::{crossed, thresholds, Cause};
use super::degradation::degradable;
use super::{Change, PoolState};
use crate::endpoint::{us, Dimension, Tracker};
use crate::endpoint::{Entry, InRotation};
use crate::window::Rate;
use std::ops::ControlFlow;
use vitals_contracts::{HealthState, Micros, Policy, ReasonCode};

/// The runs of hard failures and of failures that eject `t`: the policy's (3 and 5 by default)
/// up to ~11 calls a second, and one more for each hundredfold of traffic beyond, where noise of
/// 1 % would make the policy's runs more than once a day (`endpoint::noise_run`: the hard break 4 from
/// ~12 calls a second, 5 from ~1,157). The traffic is only summed once a run reaches the
/// policy's.
pub(super) fn runs_to_eject(t: &Tracker, policy: &Policy, now: Micros) -> (u32, u32) {
    let (hard, failures) = (
        policy.hard_break_after.max(1) as u32,
        policy.consecutive_failures.max(1) as u32,
    );
    if t.consecutive_failures() < hard.min(failures) {
        return (hard, failures);
    }
    let more = t.run_growth(now, policy);
    (hard + more, failures + more)
}

/// The ejection rules `t` crosses.
///
/// Fresh evidence only: the rules that look back over the window (failure rate, the peer
/// comparison) never eject an endpoint whose latest outcome succeeded.
fn eject_rules(t: &Tracker, totals: &Rate, policy: &Policy, now: Micros) -> impl Iterator<Item = Cause> {
    let silent = t.heartbeat_silence(now).is_some_and(|silence| {
        silence >= us(t.heartbeat_interval(policy)).saturating_mul(policy.heartbeat_unhealthy_intervals.into())
    });
    let fresh = t.consecutive_successes() == 0;
    let (hard, failures) = runs_to_eject(t, policy, now);
    crossed([
        (t.consecutive_hard() >= hard, Cause::HardBreak(hard)),
        (
            t.consecutive_failures() >= failures,
            Cause::ConsecutiveFailures(failures),
        ),
        (
            fresh
                && totals.counted() >= policy.min_volume as u64
                && totals.failure_rate() > policy.failure_rate_threshold,
            Cause::FailureRate,
        ),
        (fresh && t.failure_outlier(), Cause::PeerFailures),
        (t.ttft_outlier(), Cause::TtftOutlier),
        (!t.critical_down().is_empty(), Cause::CriticalDown),
        (silent, Cause::HeartbeatSilence),
    ])
}

/// What an ejection on these rules is for. `slow` says the outcome that crossed them was a 200
/// whose first token came too late. Only the rate rules (the failure rate, the peer comparison)
/// make it an ejection for a share of failed calls, and only while its latest failures are not
/// a run as long as the hard break's: such a run says the endpoint is down (a refused
/// connection is often out on the peer comparison before five failures in a row).
fn dimension(t: &Tracker, totals: &Rate, policy: &Policy, now: Micros, slow: bool) -> Dimension {
    let down = t.consecutive_failures() >= runs_to_eject(t, policy, now).0;
    let mut dims = eject_rules(t, totals, policy, now).map(|c| match c {
        Cause::TtftOutlier => Dimension::Ttft,
        Cause::CriticalDown => Dimension::Dependency,
        Cause::HeartbeatSilence => Dimension::Heartbeat,
        _ if slow => Dimension::Ttft,
        Cause::FailureRate | Cause::PeerFailures if !down => Dimension::ErrorRate,
        _ => Dimension::Errors,
    });
    let first = dims.next().unwrap_or(Dimension::Errors);
    dims.fold(first, |a, b| match (a, b) {
        // Slow first tokens and errors together: only a first token shows both gone.
        (_, Dimension::Ttft) => Dimension::Ttft,
        // A run of failures with the rate: down, not partly failing.
        (Dimension::ErrorRate, Dimension::Errors) => Dimension::Errors,
        (a, _) => a,
    })
}

impl PoolState {
    /// The ejection rules for an endpoint in rotation. Breaks when one holds: with the ejection,
    /// with a refusal (kept serving, degraded), or with nothing for a degraded endpoint whose
    /// ejection is still refused. `extra` are thresholds the outcome itself crossed (a slow
    /// first token).
    pub(super) fn ejection(
        &self,
        name: &str,
        t: &Tracker,
        extra: &[String],
        totals: &Rate,
    ) -> ControlFlow<Option<Change>> {
        let now = self.now;
        let policy = &self.policy;
        let state = t.state();
        let mut rules = eject_rules(t, totals, policy, now).peekable();
        if rules.peek().is_none() {
            return ControlFlow::Continue(());
        }
        if !self.may_eject() && t.eject_refused() && state == HealthState::Degraded {
            return ControlFlow::Break(None);
        }
        let mut crossed = extra.to_vec();
        crossed.extend(thresholds(rules, t, policy));
        if !self.may_eject() {
            let newly_refused = !t.eject_refused();
            if state != HealthState::Degraded || newly_refused {
                return ControlFlow::Break(Some(self.refusal(name, crossed)));
            }
            return ControlFlow::Break(None);
        }
        let mut reason = format!(
            "ejected: {} (failure rate {:.0}% of {} calls, score {:.0})",
            crossed.join(", "),
            totals.failure_rate() * 100.0,
            totals.counted(),
            t.score()
        );
        if t.failure_outlier() {
            let own = t.recent_rate(now, policy);
            let (peers, n) = self.peer_failures(name, false);
            reason.push_str(&format!(
                "; last {} s: {} of {} calls failed, its {n} peers {} of {}",
                policy.window_ms / 3000,
                own.failed,
                own.counted(),
                peers.failed,
                peers.counted()
            ));
        }
        let change = Change::new(
            Entry::Eject(Some(dimension(t, totals, policy, now, !extra.is_empty()))),
            ReasonCode::Ejected,
            reason,
            crossed,
            t.failure_ids().to_vec(),
        );
        ControlFlow::Break(Some(change))
    }

    /// An endpoint kept serving through a suspected shared outage crosses no ejection rule any
    /// more (the pool has forgotten the outage's window for it): a degraded one with nothing
    /// else wrong is healthy again.
    pub(super) fn shared_outage_over(&self, name: &str) -> Option<Change> {
        let t = &self.endpoints[name];
        (t.state() == HealthState::Degraded && !degradable(t, &self.policy)).then(|| {
            Change::new(
                Entry::InRotation(InRotation::Healthy),
                ReasonCode::OutageOver,
                "kept serving through a suspected shared outage; the calls since pass, so it is judged on them"
                    .to_owned(),
                vec![format!("consecutive_successes>={}", t.consecutive_successes())],
                vec![],
            )
        })
    }

    /// The max-ejection rule said no: keep the endpoint serving, degraded (counted as refused),
    /// and let the pool suspect a shared dependency.
    pub(super) fn refusal(&self, name: &str, mut thresholds: Vec<String>) -> Change {
        let reason = format!(
            "would eject ({}) but {} of {} endpoints are already out (max {}%): suspected shared dependency, kept serving",
            thresholds.join(", "),
            self.count(HealthState::Unhealthy),
            self.total(),
            self.policy.max_ejection_pct
        );
        thresholds.push(format!("max_ejection_pct={}", self.policy.max_ejection_pct));
        let triggers = self.endpoints[name].failure_ids().to_vec();
        let mut change = Change::new(
            Entry::InRotation(InRotation::Degraded),
            ReasonCode::EjectionRefused,
            reason,
            thresholds,
            triggers,
        );
        change.refused = true;
        change
    }

    /// Envoy's rule: never eject more than max_ejection_pct of the pool, but always allow one.
    pub(super) fn may_eject(&self) -> bool {
        self.count(HealthState::Unhealthy) < self.max_ejected()
    }

    /// The most endpoints the max-ejection rule lets out at once (at least one).
    pub fn max_ejected(&self) -> u32 {
        let by_pct = (f64::from(self.total()) * self.policy.max_ejection_pct / 100.0).floor() as u32;
        by_pct.max(1)
    }
}
