//! Suspicion: a healthy endpoint whose failures are no longer isolated, or whose heartbeats
//! have gone quiet, is suspect (still at full weight; the ejection rules decide); a suspect one
//! is cleared by `consecutive_successes` in a row.

use super::cause::{crossed, thresholds, Cause};
use super::{Change, PoolState};
use crate::endpoint::Tracker;
use crate::endpoint::{Entry, InRotation};
use crate::window::Rate;
use vitals_contracts::{HealthState, Policy, ReasonCode};

/// Failures make an endpoint suspect only when they are not isolated: a run of them and a
/// window failure rate of at least half the ejection threshold (a few failures in a row among
/// many successes used to flicker healthy → suspect → healthy and fill the audit log).
fn suspect_rules(t: &Tracker, totals: &Rate, policy: &Policy) -> impl Iterator<Item = Cause> {
    crossed([
        (
            t.consecutive_failures() >= policy.suspect_after_failures as u32
                && totals.failure_rate() >= policy.failure_rate_threshold / 2.0,
            Cause::SuspectFailures,
        ),
        (t.heartbeat_silent(), Cause::SuspectSilence),
    ])
}

impl PoolState {
    /// Whether any suspicion rule holds for `name`.
    pub(super) fn suspicious(&self, t: &Tracker, totals: &Rate) -> bool {
        suspect_rules(t, totals, &self.policy).next().is_some()
    }

    /// Healthy → suspect when a rule holds; suspect → healthy when none does and the latest
    /// outcomes passed.
    pub(super) fn suspicion(&self, t: &Tracker, totals: &Rate, suspicious: bool) -> Option<Change> {
        let policy = &self.policy;
        match t.state() {
            HealthState::Healthy if suspicious => {
                let suspect = thresholds(suspect_rules(t, totals, policy), t, policy);
                Some(Change::new(
                    Entry::InRotation(InRotation::Suspect),
                    ReasonCode::Suspect,
                    format!("suspect: {}", suspect.join(", ")),
                    suspect,
                    t.failure_ids().to_vec(),
                ))
            }
            HealthState::Suspect if !suspicious && t.consecutive_successes() >= policy.consecutive_successes as u32 => {
                Some(Change::new(
                    Entry::InRotation(InRotation::Healthy),
                    ReasonCode::Cleared,
                    format!("{} consecutive successes", t.consecutive_successes()),
                    vec![format!("consecutive_successes>={}", policy.consecutive_successes)],
                    vec![],
                ))
            }
            _ => None,
        }
    }
}
