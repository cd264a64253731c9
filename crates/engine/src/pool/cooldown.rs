//! Cooldown: an upstream that answers 429 is not failing, it is asking for less. A run of 429s
//! or a share of the recent calls starts a cooldown of the upstream's Retry-After (else the
//! policy's); when its time is over the endpoint comes back through slow start, which finds what
//! the upstream takes. A Retry-After is taken as said, every time: the upstream knows when its
//! limit lifts. Without one, a cooldown begun soon after the last (the upstream still cannot
//! take the load) is twice as long, so that a limit that persists costs a few 429s per
//! doubling, not a few every cycle.

use super::{Change, PoolState};
use crate::endpoint::Entry;
use crate::endpoint::Tracker;
use vitals_contracts::{HealthState, ReasonCode};

impl PoolState {
    /// A 429 for an endpoint in rotation (or recovering): a run of them (as long as the hard
    /// break's), or at least that many among the recent calls making a share of at least
    /// `rate_limited_share`, starts a cooldown. A cooldown takes an ejection slot; with none
    /// free the endpoint keeps serving, and nothing suspects an outage.
    pub(super) fn rate_limited(&self, name: &str) -> Option<Change> {
        let policy = &self.policy;
        let t = &self.endpoints[name];
        if t.forced().is_some() {
            return None;
        }
        // Over the latest outcomes, not a window of time: a storm that began 2 s ago is a small
        // share of even the last 10 s. `run` 429s among the fewest outcomes in which they make
        // `rate_limited_share` of them (12 at 3 and 25 %, at most 16). Busy, the run grows as
        // the hard break's does (`noise_run`): 0.5 % of 429s among a healthy endpoint's calls
        // make 3 among 12 every few seconds at 5,000 calls a second, 5 among 16 every few hours.
        let more = if u32::from(t.consecutive_rate_limited()).max(t.recent_429s(16))
            >= policy.hard_break_after.max(1) as u32
        {
            t.run_growth(self.now, policy)
        } else {
            0
        };
        let run = policy.hard_break_after.max(1) as u32 + more;
        let all = ((f64::from(run) / policy.rate_limited_share.max(0.01)).ceil() as u32).clamp(run, 16);
        let limited = t.recent_429s(all);
        let by_run = u32::from(t.consecutive_rate_limited()) >= run;
        let by_share = limited >= run;
        // Back from a cooldown, a 429 with a Retry-After is the upstream saying its limit holds
        // and when it lifts: one is enough (each more costs a user a failed call).
        let announced = t.state() == HealthState::Recovering
            && t.retry_after_ms().is_some()
            && t.cooled_within(self.now, policy.isolation_reset_ms)
            && t.consecutive_rate_limited() >= 1;
        if !(by_run || by_share || announced) || !self.may_eject() {
            return None;
        }
        let mut thresholds = Vec::new();
        if announced && !(by_run || by_share) {
            thresholds.push("429_with_retry_after_after_cooldown".to_owned());
        }
        if by_run {
            thresholds.push(format!("consecutive_429>={run}"));
        }
        if by_share {
            thresholds.push(format!("429_share>={}", policy.rate_limited_share));
        }
        let ms = self.cooldown_ms(t);
        let cap = policy.isolation_max_ms.max(1);
        let base = match t.retry_after_ms() {
            Some(ra) if i64::from(ra) > cap => format!(
                "the upstream's Retry-After of {:.0} s, capped at {:.0} s",
                f64::from(ra) / 1000.0,
                cap as f64 / 1000.0
            ),
            Some(_) => "the upstream's Retry-After".to_owned(),
            None => "the policy's cooldown".to_owned(),
        };
        let base_ms = self.cooldown_base_ms(t);
        let source = if ms > base_ms {
            format!("{base}, doubled: it rate-limits again soon after its last cooldown")
        } else {
            base.to_owned()
        };
        let change = Change::new(
            Entry::Cooldown(ms),
            ReasonCode::Cooldown,
            if by_run || by_share {
                format!(
                    "rate limited: {limited} of the last {all} calls were 429s; cooling down for {:.1} s ({source}), then slow start",
                    ms as f64 / 1000.0
                )
            } else {
                format!(
                    "rate limited again after its cooldown: a 429 says the limit lifts in {:.1} s; cooling down until then ({source}), then slow start",
                    ms as f64 / 1000.0
                )
            },
            thresholds,
            vec![],
        );
        Some(change)
    }

    /// The cooldown `t` gets now: the upstream's latest Retry-After, as it says (the upstream
    /// knows when its limit lifts: a cooldown longer than that only idles capacity), else the
    /// policy's, doubled for each cooldown in a row; bounded by the longest isolation.
    pub(super) fn cooldown_ms(&self, t: &Tracker) -> i64 {
        let base = self.cooldown_base_ms(t);
        if t.retry_after_ms().is_some() {
            base
        } else {
            t.cooldown_for(base, self.now, &self.policy)
        }
    }

    fn cooldown_base_ms(&self, t: &Tracker) -> i64 {
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
                Entry::Recovering { probation: false },
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
