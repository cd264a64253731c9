//! Peer comparisons: an endpoint judged against the others of its pool. Its failure rate
//! significantly above theirs (Wilson bounds), its first tokens far slower than theirs, its
//! latency far above their median. Each sets a flag on the tracker that the ejection and
//! degradation rules read.

use super::PoolState;
use crate::endpoint::{latency_verdict, LATENCY_MIN_SAMPLES};
use crate::window::Rate;
use vitals_contracts::HealthState;

/// Wilson score interval of `k` successes in `n` trials at width `z`.
pub(super) fn wilson(k: u64, n: u64, z: f64) -> (f64, f64) {
    if n == 0 {
        return (0.0, 1.0);
    }
    let n = n as f64;
    let p = k as f64 / n;
    let z2 = z * z;
    let centre = (p + z2 / (2.0 * n)) / (1.0 + z2 / n);
    let half = z * (p * (1.0 - p) / n + z2 / (4.0 * n * n)).sqrt() / (1.0 + z2 / n);
    ((centre - half).max(0.0), (centre + half).min(1.0))
}

impl PoolState {
    /// The median latency EWMA of `name`'s peers that have enough samples (and, for the rule,
    /// are in rotation); None with fewer than `min_peers` of them.
    pub(super) fn peer_median(&mut self, name: &str, in_rotation_only: bool, min_peers: usize) -> Option<f64> {
        let mut peers = std::mem::take(&mut self.scratch.0);
        peers.clear();
        peers.extend(
            self.endpoints
                .iter()
                .filter(|(n, t)| {
                    // One on probation gets a trickle of calls: its latency is mostly its probes'.
                    n.as_str() != name
                        && t.latency_samples() >= LATENCY_MIN_SAMPLES
                        && !(in_rotation_only && t.out_or_on_probation())
                })
                .map(|(_, t)| t.latency_ewma_ms()),
        );
        let median = (!peers.is_empty() && peers.len() >= min_peers).then(|| {
            let mid = peers.len() / 2;
            *peers.select_nth_unstable_by(mid, f64::total_cmp).1
        });
        self.scratch.0 = peers;
        median
    }

    /// Whether the latency EWMA of `name` is far above its peers' median (with hysteresis), and
    /// the median it was judged against (None: too few peers).
    pub(super) fn latency_outlier(&mut self, name: &str) -> (bool, Option<f64>) {
        let min_peers = self.policy.latency_outlier_min_peers as usize;
        let seen = self.peer_median(name, true, min_peers);
        let t = &self.endpoints[name];
        // Too few peers to compare with: no outlier (a flag kept from before would outlive the
        // fault, and degrade the endpoint the moment it is back in rotation).
        let outlier =
            seen.is_some_and(|median| latency_verdict(t.latency_ewma_ms(), median, t.latency_outlier(), &self.policy));
        (outlier, seen)
    }

    /// The recent failures (see [`crate::Tracker::recent_rate`]; `longer`: over two thirds of
    /// the window) of the peers of `name` in rotation, pooled, with the number of peers.
    pub(super) fn peer_failures(&self, name: &str, longer: bool) -> (Rate, u32) {
        let mut peers = (Rate::default(), 0u32);
        for (n, p) in &self.endpoints {
            let routable = matches!(
                p.state(),
                HealthState::Healthy | HealthState::Suspect | HealthState::Degraded | HealthState::Recovering
            );
            if n.as_str() != name && routable && p.forced().is_none() {
                let r = if longer {
                    p.recent_rate_longer(self.now, &self.policy)
                } else {
                    p.recent_rate(self.now, &self.policy)
                };
                peers.0.ok += r.ok;
                peers.0.failed += r.failed;
                peers.1 += 1;
            }
        }
        peers
    }

    /// Whether the failure rate of `name` lies significantly above its peers': the lower Wilson
    /// bound of its recent rate above both the upper bound of the peers' pooled rate and the
    /// peers' rate plus `peer_failure_margin`. Only in a pool with at least two other endpoints
    /// in rotation; pools of one or two keep the absolute rules. Cheap checks on the endpoint's
    /// own counts come first, so a healthy endpoint never looks at its peers.
    ///
    /// Over the last third of the window, and over the last two thirds: 15 % of 5 calls a second
    /// is sometimes too few failures in 10 s to stand out at this confidence, and then twice the
    /// calls over 20 s are enough.
    pub(super) fn failure_outlier(&self, name: &str) -> bool {
        self.failure_outlier_over(name, false) || self.failure_outlier_over(name, true)
    }

    pub(super) fn failure_outlier_over(&self, name: &str, longer: bool) -> bool {
        let policy = &self.policy;
        let t = &self.endpoints[name];
        let own = if longer {
            t.recent_rate_longer(self.now, policy)
        } else {
            t.recent_rate(self.now, policy)
        };
        let margin = policy.peer_failure_margin;
        let z = policy.peer_failure_z;
        let low = wilson(own.failed, own.counted(), z).0;
        if own.failed < 3 || own.failure_rate() <= margin || low <= margin {
            return false;
        }
        let (peers, n) = self.peer_failures(name, longer);
        n >= 2 && low > wilson(peers.failed, peers.counted(), z).1 && low > peers.failure_rate() + margin
    }

    /// Whether the first tokens of `name` are far slower than its peers': its latest and its
    /// median (of the last 16) above `ttft_max_ms` and above `latency_outlier_factor` × the
    /// median of the peers' medians (at least two peers in rotation with enough samples).
    pub(super) fn ttft_outlier(&mut self, name: &str, latest_us: i64) -> bool {
        let policy = &self.policy;
        let max = policy.ttft_max_ms;
        let min = LATENCY_MIN_SAMPLES as usize;
        let t = &self.endpoints[name];
        let mut outlier = false;
        if let Some(own) = t
            .ttft_p(0.5, min)
            .filter(|p| latest_us as f64 > max * 1000.0 && *p > max)
        {
            let mut peers = std::mem::take(&mut self.scratch.0);
            peers.clear();
            peers.extend(
                self.endpoints
                    .iter()
                    .filter(|(n, p)| {
                        n.as_str() != name
                            && matches!(
                                p.state(),
                                HealthState::Healthy | HealthState::Suspect | HealthState::Degraded
                            )
                    })
                    .filter_map(|(_, p)| p.ttft_p(0.5, min)),
            );
            if peers.len() >= 2 {
                let mid = peers.len() / 2;
                let median = *peers.select_nth_unstable_by(mid, f64::total_cmp).1;
                outlier = own > policy.latency_outlier_factor * median;
            }
            self.scratch.0 = peers;
        }
        outlier
    }
}
