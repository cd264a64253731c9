//! Degradation: an endpoint that still serves but should take less traffic (a low score, a
//! non-critical dependency down, latency far above its peers', an ejection the max-ejection
//! rule refused), and its way back: the score held above `recover_above` for `recover_hold_ms`.

use super::cause::{crossed, thresholds, Cause};
use super::{Change, PoolState};
use crate::endpoint::{us, Tracker};
use crate::endpoint::{Entry, InRotation};
use std::ops::ControlFlow;
use vitals_contracts::{HealthState, Policy, ReasonCode};

fn degrade_rules(t: &Tracker, policy: &Policy) -> impl Iterator<Item = Cause> {
    crossed([
        (t.score() < policy.degrade_below, Cause::Score),
        (!t.noncritical_down().is_empty(), Cause::NoncriticalDown),
        (t.latency_outlier(), Cause::LatencyOutlier),
        (t.eject_refused(), Cause::EjectionRefused),
    ])
}

/// Whether any degradation rule holds for `t`.
pub(super) fn degradable(t: &Tracker, policy: &Policy) -> bool {
    degrade_rules(t, policy).next().is_some()
}

impl PoolState {
    /// The degradation rules for an endpoint in rotation: breaks with a degradation when one
    /// holds for an endpoint not yet degraded, and with nothing while one still holds for a
    /// degraded endpoint.
    pub(super) fn degradation(&self, t: &Tracker, extra: &[String]) -> ControlFlow<Option<Change>> {
        let policy = &self.policy;
        let mut rules = degrade_rules(t, policy).peekable();
        if rules.peek().is_none() {
            return ControlFlow::Continue(());
        }
        if t.state() == HealthState::Degraded {
            return ControlFlow::Break(None);
        }
        let mut crossed = extra.to_vec();
        crossed.extend(thresholds(rules, t, policy));
        let reason = format!(
            "degraded: {} (score {:.0}, weight {})",
            crossed.join(", "),
            t.score(),
            policy.degraded_weight
        );
        ControlFlow::Break(Some(Change::new(
            Entry::InRotation(InRotation::Degraded),
            ReasonCode::Degraded,
            reason,
            crossed,
            t.failure_ids().to_vec(),
        )))
    }

    /// A degraded endpoint that nothing degrades or makes suspect any more is healthy once its
    /// score has held above `recover_above` for `recover_hold_ms` (a deadband, not a flicker).
    pub(super) fn degradation_over(&self, t: &Tracker, suspicious: bool) -> Option<Change> {
        let policy = &self.policy;
        let held = t
            .above_since()
            .is_some_and(|s| self.now.saturating_sub(s) >= us(policy.recover_hold_ms));
        // Latency far above the peers' must have stayed gone as long as the score must hold
        // (it cleared and came back within tens of ms, 1,521 times in 90 s).
        let latency_gone = t.latency_held_clear(self.now, policy);
        (t.state() == HealthState::Degraded && !suspicious && held && latency_gone).then(|| {
            Change::new(
                Entry::InRotation(InRotation::Healthy),
                ReasonCode::Recovered,
                format!(
                    "score {:.0} held above {} for {} s",
                    t.score(),
                    policy.recover_above,
                    policy.recover_hold_ms / 1000
                ),
                vec![format!(
                    "score>{}_for_{}ms",
                    policy.recover_above, policy.recover_hold_ms
                )],
                vec![],
            )
        })
    }
}
