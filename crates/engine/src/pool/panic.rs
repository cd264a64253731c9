//! The pool's own rules: panic mode (too few endpoints can serve, so route over all of them) and
//! correlated-outage suspicion (the max-ejection rule refused an ejection). A pool event is
//! published when either flips, or when a policy change says so.

use super::PoolState;
use vitals_contracts::HealthState;

/// What the pool's rules decided: panic mode and correlated-outage suspicion as they are now,
/// and why the pool event that publishes them is due.
pub(super) struct PoolChange {
    pub panic: bool,
    pub correlated: bool,
    pub healthy_fraction: f64,
    pub reason: String,
}

impl PoolState {
    /// Endpoints that can serve: healthy, suspect, recovering (slow start or probation), degraded
    /// at a weight above 0 unless only the max-ejection rule keeps it in (it fails), and cooling
    /// down after 429s (not an outage: the upstream asked for less). Envoy counts hosts in slow
    /// start as healthy for its panic threshold, for the same reason.
    fn available(&self) -> u32 {
        let degraded = if self.policy.degraded_weight > 0.0 {
            self.count(HealthState::Degraded).saturating_sub(self.refused)
        } else {
            0
        };
        self.count(HealthState::Healthy)
            + self.count(HealthState::Suspect)
            + self.count(HealthState::Recovering)
            + degraded
            + self.cooling
    }

    /// Panic mode and correlated-outage suspicion: a change when either flips, or when
    /// `force_reason` says so (policy changes).
    pub(super) fn pool_change(&self, force_reason: Option<String>) -> Option<PoolChange> {
        let total = self.total();
        let available = self.available();
        let fraction = if total == 0 {
            1.0
        } else {
            f64::from(available) / f64::from(total)
        };
        let panic = total > 0 && fraction * 100.0 < self.policy.panic_threshold_pct;
        let correlated = self.refused > 0;
        if panic == self.panic && correlated == self.correlated_outage && force_reason.is_none() {
            return None;
        }
        let mut reasons = Vec::new();
        if let Some(r) = force_reason {
            reasons.push(r);
        }
        if correlated != self.correlated_outage {
            reasons.push(if correlated {
                format!(
                    "correlated outage suspected: ejection refused for {} endpoint(s) at max-ejection {}%",
                    self.refused, self.policy.max_ejection_pct
                )
            } else {
                "correlated outage over".to_owned()
            });
        }
        if panic != self.panic {
            reasons.push(if panic {
                format!(
                    "panic mode: {available} of {total} endpoints can serve ({:.0}%), below {}%; route over all endpoints",
                    fraction * 100.0,
                    self.policy.panic_threshold_pct
                )
            } else {
                format!(
                    "panic mode over: {available} of {total} endpoints can serve ({:.0}%)",
                    fraction * 100.0
                )
            });
        }
        Some(PoolChange {
            panic,
            correlated,
            healthy_fraction: fraction,
            reason: reasons.join("; "),
        })
    }
}
