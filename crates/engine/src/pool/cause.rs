//! The rules an endpoint crosses, and the thresholds the audit log records for them.

use crate::endpoint::Tracker;
use vitals_contracts::Policy;

/// A rule an endpoint crosses: an ejection, degradation or suspicion cause.
#[derive(Debug, Clone, Copy)]
pub(super) enum Cause {
    /// Hard failures in a row, at least this many (the policy's, or longer at high traffic).
    HardBreak(u32),
    /// Failures in a row, at least this many.
    ConsecutiveFailures(u32),
    FailureRate,
    CriticalDown,
    HeartbeatSilence,
    Score,
    NoncriticalDown,
    LatencyOutlier,
    PeerFailures,
    TtftOutlier,
    EjectionRefused,
    SuspectFailures,
    SuspectSilence,
}

/// The causes among `rules` whose condition holds, in order. The rules are checked at every
/// timer of the pool; their thresholds are only spelled out when the state changes (building
/// them for an endpoint that stays put was most of the engine's time once timers fired often).
pub(super) fn crossed<const N: usize>(rules: [(bool, Cause); N]) -> impl Iterator<Item = Cause> {
    rules.into_iter().filter_map(|(holds, cause)| holds.then_some(cause))
}

/// Causes spelled out as the thresholds the audit log records.
pub(super) fn thresholds(causes: impl Iterator<Item = Cause>, t: &Tracker, policy: &Policy) -> Vec<String> {
    causes.map(|c| c.threshold(t, policy)).collect()
}

impl Cause {
    /// The crossed rule as the threshold the audit log records.
    fn threshold(self, t: &Tracker, policy: &Policy) -> String {
        match self {
            Cause::HardBreak(n) => format!("consecutive_5xx_or_timeouts>={n}"),
            Cause::ConsecutiveFailures(n) => format!("consecutive_failures>={n}"),
            Cause::FailureRate => format!("failure_rate>{}", policy.failure_rate_threshold),
            Cause::CriticalDown => format!("critical_dependency_down:{}", t.critical_down().join(",")),
            Cause::HeartbeatSilence => format!("heartbeat_silence>={}x_interval", policy.heartbeat_unhealthy_intervals),
            Cause::Score => format!("score<{}", policy.degrade_below),
            Cause::NoncriticalDown => format!("noncritical_dependency_down:{}", t.noncritical_down().join(",")),
            Cause::LatencyOutlier => format!("latency>{}x_pool_median", policy.latency_outlier_factor),
            Cause::PeerFailures => format!(
                "failure_rate>peers+{}(wilson_z={})",
                policy.peer_failure_margin, policy.peer_failure_z
            ),
            Cause::TtftOutlier => format!(
                "ttft>{}ms(p50,>{}x_pool_median)",
                policy.ttft_max_ms, policy.latency_outlier_factor
            ),
            Cause::EjectionRefused => "ejection_refused:max_ejection".to_owned(),
            Cause::SuspectFailures => format!("consecutive_failures>={}", policy.suspect_after_failures),
            Cause::SuspectSilence => format!("heartbeat_silence>={}x_interval", policy.heartbeat_suspect_intervals),
        }
    }
}
