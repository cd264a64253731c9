//! Cooldown: an upstream that answers 429 is not failing, it is asking for less. A run of 429s
//! or a share of the recent calls starts a cooldown of the upstream's Retry-After (else the
//! policy's), with no isolation backoff; when its time is over the endpoint comes back through
//! slow start, which finds what the upstream takes.

use super::{Change, PoolState};
use crate::endpoint::{Dimension, Tracker};
use vitals_contracts::{HealthState, OutcomeClass, ReasonCode};

impl PoolState {
    /// A 429 for an endpoint in rotation (or recovering): a run of them (as long as the hard
    /// break's) or a share of at least `rate_limited_share` of the recent calls (at least
    /// `min_volume`) starts a cooldown. A cooldown takes an ejection slot; with none free the
    /// endpoint keeps serving, and nothing suspects an outage.
    pub(super) fn rate_limited(&self, name: &str) -> Option<Change> {
        let now = self.now;
        let policy = &self.policy;
        let t = &self.endpoints[name];
        if t.forced().is_some() {
            return None;
        }
        // Over the most recent third of the window, like the peer comparison: a storm that
        // began 5 s ago is a small share of a 30 s window.
        let limited = t.recent_totals(now, policy).get(OutcomeClass::RateLimited);
        let all = t.recent_rate(now, policy).counted() + limited;
        let by_run = i32::from(t.consecutive_rate_limited()) >= policy.hard_break_after;
        let by_share = all >= policy.min_volume as u64 && limited as f64 >= policy.rate_limited_share * all as f64;
        if !(by_run || by_share) || !self.may_eject() {
            return None;
        }
        let mut thresholds = Vec::new();
        if by_run {
            thresholds.push(format!("consecutive_429>={}", policy.hard_break_after));
        }
        if by_share {
            thresholds.push(format!("429_share>={}", policy.rate_limited_share));
        }
        let ms = self.cooldown_ms(t);
        let source = if t.retry_after_ms().is_some() {
            "the upstream's Retry-After"
        } else {
            "the policy's cooldown"
        };
        let mut change = Change::new(
            HealthState::Unhealthy,
            ReasonCode::Cooldown,
            format!(
                "rate limited: {limited} of the last {all} calls were 429s; cooling down for {:.1} s ({source}), no isolation backoff",
                ms as f64 / 1000.0
            ),
            thresholds,
            vec![],
        );
        change.out_for = Some(Dimension::RateLimit);
        Some(change)
    }

    /// The cooldown `t` gets: the upstream's latest Retry-After, else the policy's, bounded by
    /// the longest isolation.
    pub(super) fn cooldown_ms(&self, t: &Tracker) -> i64 {
        t.retry_after_ms()
            .map_or(self.policy.cooldown_ms, i64::from)
            .clamp(1, self.policy.isolation_max_ms.max(1))
    }

    /// A cooldown ends by its time, whatever the calls in flight say.
    pub(super) fn cooldown_over(&self, name: &str) -> Option<Change> {
        let now = self.now;
        let t = &self.endpoints[name];
        t.isolated_until().is_some_and(|u| u <= now).then(|| {
            Change::new(
                HealthState::Recovering,
                ReasonCode::CooldownOver,
                format!(
                    "cooldown over after {:.1} s; slow start over {} s finds what the upstream takes",
                    now.saturating_sub(t.since()) as f64 / 1e6,
                    self.policy.slow_start_ms / 1000
                ),
                vec!["cooldown_over".into()],
                vec![],
            )
        })
    }
}
