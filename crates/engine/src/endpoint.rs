//! Per-endpoint state: the window, the EWMA score, consecutive counters, isolation and the
//! conditions that the pool's rules turn into transitions.

use crate::window::{Rate, Totals, Window};
use serde::{Deserialize, Serialize};
use vitals_contracts::{Evidence, HealthState, Micros, OutcomeClass, OverrideAction, Policy};

/// Number of recent TTFT samples kept for the percentiles in the evidence.
pub const TTFT_SAMPLES: usize = 16;
/// Most failing-signal ids kept as the trigger of a transition.
pub const MAX_TRIGGERS: usize = 5;
/// Latency samples an endpoint needs before it is compared with its peers.
pub const LATENCY_MIN_SAMPLES: u32 = 5;

/// A rule an endpoint crosses: an ejection, degradation or suspicion cause.
#[derive(Debug, Clone, Copy)]
enum Cause {
    HardBreak,
    ConsecutiveFailures,
    FailureRate,
    CriticalDown,
    HeartbeatSilence,
    Score,
    NoncriticalDown,
    LatencyOutlier,
    EjectionRefused,
    SuspectFailures,
    SuspectSilence,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Tracker {
    pub state: HealthState,
    pub since: Micros,
    pub seq: u64,
    pub window: Window,
    pub score: f64,
    /// When the score last rose above `recover_above`; the deadband's 30 s hold counts from here.
    pub above_since: Option<Micros>,
    pub consecutive_failures: u32,
    pub consecutive_successes: u32,
    pub consecutive_hard: u32,
    /// Ids of the current run of failures, newest last, at most [`MAX_TRIGGERS`].
    pub failure_ids: Vec<String>,
    /// How many isolations in a row (k of the 30 s × 2^k backoff).
    pub isolations: u32,
    pub last_isolated_at: Option<Micros>,
    pub isolated_until: Option<Micros>,
    /// The isolation has expired; the next outcome is the trial.
    pub trial_open: bool,
    pub ramp_until: Option<Micros>,
    ttft_us: [u32; TTFT_SAMPLES],
    ttft_len: u8,
    ttft_pos: u8,
    pub latency_ewma_ms: f64,
    pub latency_samples: u32,
    pub latency_outlier: bool,
    pub last_heartbeat: Option<Micros>,
    pub heartbeat_interval_ms: Option<i64>,
    /// Heartbeats have been silent past the suspect threshold.
    pub heartbeat_silent: bool,
    pub critical_down: Vec<String>,
    pub noncritical_down: Vec<String>,
    /// An automatic ejection was refused by the pool's max-ejection rule.
    pub eject_refused: bool,
    pub forced: Option<OverrideAction>,
}

impl Tracker {
    pub fn new(now: Micros, policy: &Policy) -> Tracker {
        Tracker {
            state: HealthState::Healthy,
            since: now,
            seq: 0,
            window: Window::new(buckets(policy)),
            score: 100.0,
            above_since: Some(now),
            consecutive_failures: 0,
            consecutive_successes: 0,
            consecutive_hard: 0,
            failure_ids: Vec::new(),
            isolations: 0,
            last_isolated_at: None,
            isolated_until: None,
            trial_open: false,
            ramp_until: None,
            ttft_us: [0; TTFT_SAMPLES],
            ttft_len: 0,
            ttft_pos: 0,
            latency_ewma_ms: 0.0,
            latency_samples: 0,
            latency_outlier: false,
            last_heartbeat: None,
            heartbeat_interval_ms: None,
            heartbeat_silent: false,
            critical_down: Vec::new(),
            noncritical_down: Vec::new(),
            eject_refused: false,
            forced: None,
        }
    }

    pub fn totals(&self, now: Micros, policy: &Policy) -> Totals {
        self.window.totals(now, us(policy.bucket_ms))
    }

    pub fn rate(&self, now: Micros, policy: &Policy) -> Rate {
        self.window.rate(now, us(policy.bucket_ms))
    }

    /// Record an outcome: window, counters, score. `class` is the effective class (a success
    /// slower than `slow_call_ms` to its first token arrives here as a timeout).
    /// Returns the window's counts after recording.
    pub fn record(
        &mut self,
        now: Micros,
        policy: &Policy,
        class: OutcomeClass,
        ttft_us: Option<i64>,
        id: &str,
    ) -> Rate {
        self.window.record(now, us(policy.bucket_ms), class);
        let rate = self.rate(now, policy);
        if class.is_neutral() {
            return rate;
        }
        let failed = class.is_failure();
        if failed {
            self.consecutive_failures += 1;
            self.consecutive_successes = 0;
            self.consecutive_hard = if class.is_hard() { self.consecutive_hard + 1 } else { 0 };
            if self.failure_ids.len() == MAX_TRIGGERS {
                self.failure_ids.remove(0);
            }
            self.failure_ids.push(id.to_owned());
        } else {
            self.consecutive_successes += 1;
            self.consecutive_failures = 0;
            self.consecutive_hard = 0;
            self.failure_ids.clear();
        }
        if let Some(t) = ttft_us {
            self.ttft_us[self.ttft_pos as usize] = u32::try_from(t).unwrap_or(u32::MAX);
            self.ttft_pos = ((self.ttft_pos as usize + 1) % TTFT_SAMPLES) as u8;
            self.ttft_len = (self.ttft_len + 1).min(TTFT_SAMPLES as u8);
        }
        // Seed 001: TTFT score and success rate, 0.6 / 0.4, smoothed with beta.
        let ttft_score = match (failed, ttft_us) {
            (true, _) => 0.0,
            (false, None) => 100.0,
            (false, Some(t)) => {
                let ms = t as f64 / 1000.0;
                let s = 100.0 - (ms - policy.ttft_baseline_ms) / (policy.ttft_max_ms - policy.ttft_baseline_ms) * 100.0;
                s.clamp(0.0, 100.0)
            }
        };
        let success_rate = (1.0 - rate.failure_rate()) * 100.0;
        let sample = 0.6 * ttft_score + 0.4 * success_rate;
        self.score = policy.ewma_beta * self.score + (1.0 - policy.ewma_beta) * sample;
        if self.consecutive_hard >= policy.hard_break_after as u32 {
            self.score = 0.0;
        }
        self.above_since = if self.score > policy.recover_above {
            self.above_since.or(Some(now))
        } else {
            None
        };
        rate
    }

    pub fn record_latency(&mut self, latency_us: i64, policy: &Policy) {
        let ms = latency_us as f64 / 1000.0;
        self.latency_ewma_ms = if self.latency_samples == 0 {
            ms
        } else {
            policy.ewma_beta * self.latency_ewma_ms + (1.0 - policy.ewma_beta) * ms
        };
        self.latency_samples = self.latency_samples.saturating_add(1);
    }

    fn ttft_percentile(&self, q: f64) -> Option<f64> {
        if self.ttft_len == 0 {
            return None;
        }
        let mut v: Vec<u32> = self.ttft_us[..self.ttft_len as usize].to_vec();
        v.sort_unstable();
        let idx = ((v.len() as f64 - 1.0) * q).round() as usize;
        Some(f64::from(v[idx]) / 1000.0)
    }

    /// The ejection rules this endpoint crosses, not yet spelled out (the rules are checked at
    /// every timer of the pool; thresholds are only written when the state changes).
    fn eject_rules(&self, totals: &Rate, policy: &Policy, now: Micros) -> impl Iterator<Item = Cause> {
        let silent = self.heartbeat_silence(now).is_some_and(|silence| {
            silence >= us(self.heartbeat_interval(policy)).saturating_mul(policy.heartbeat_unhealthy_intervals.into())
        });
        [
            (
                self.consecutive_hard >= policy.hard_break_after as u32,
                Cause::HardBreak,
            ),
            (
                self.consecutive_failures >= policy.consecutive_failures as u32,
                Cause::ConsecutiveFailures,
            ),
            (
                totals.counted() >= policy.min_volume as u64 && totals.failure_rate() > policy.failure_rate_threshold,
                Cause::FailureRate,
            ),
            (!self.critical_down.is_empty(), Cause::CriticalDown),
            (silent, Cause::HeartbeatSilence),
        ]
        .into_iter()
        .filter_map(|(crossed, cause)| crossed.then_some(cause))
    }

    fn degrade_rules(&self, policy: &Policy) -> impl Iterator<Item = Cause> {
        [
            (self.score < policy.degrade_below, Cause::Score),
            (!self.noncritical_down.is_empty(), Cause::NoncriticalDown),
            (self.latency_outlier, Cause::LatencyOutlier),
            (self.eject_refused, Cause::EjectionRefused),
        ]
        .into_iter()
        .filter_map(|(crossed, cause)| crossed.then_some(cause))
    }

    fn suspect_rules(&self, policy: &Policy) -> impl Iterator<Item = Cause> {
        [
            (
                self.consecutive_failures >= policy.suspect_after_failures as u32,
                Cause::SuspectFailures,
            ),
            (self.heartbeat_silent, Cause::SuspectSilence),
        ]
        .into_iter()
        .filter_map(|(crossed, cause)| crossed.then_some(cause))
    }

    /// Whether [`Tracker::eject_causes`] is not empty, without spelling the causes out.
    pub fn ejectable(&self, totals: &Rate, policy: &Policy, now: Micros) -> bool {
        self.eject_rules(totals, policy, now).next().is_some()
    }

    /// Whether [`Tracker::degrade_causes`] is not empty.
    pub fn degradable(&self, policy: &Policy) -> bool {
        self.degrade_rules(policy).next().is_some()
    }

    /// Whether [`Tracker::suspect_causes`] is not empty.
    pub fn suspicious(&self, policy: &Policy) -> bool {
        self.suspect_rules(policy).next().is_some()
    }

    /// Reasons for an automatic ejection, as thresholds crossed. Empty when there is none.
    pub fn eject_causes(&self, totals: &Rate, policy: &Policy, now: Micros) -> Vec<String> {
        self.eject_rules(totals, policy, now)
            .map(|c| self.threshold(c, policy))
            .collect()
    }

    /// Reasons for degraded, as thresholds crossed.
    pub fn degrade_causes(&self, policy: &Policy) -> Vec<String> {
        self.degrade_rules(policy).map(|c| self.threshold(c, policy)).collect()
    }

    pub fn suspect_causes(&self, policy: &Policy) -> Vec<String> {
        self.suspect_rules(policy).map(|c| self.threshold(c, policy)).collect()
    }

    /// A crossed rule as the threshold the audit log records.
    fn threshold(&self, cause: Cause, policy: &Policy) -> String {
        match cause {
            Cause::HardBreak => format!("consecutive_5xx_or_timeouts>={}", policy.hard_break_after),
            Cause::ConsecutiveFailures => format!("consecutive_failures>={}", policy.consecutive_failures),
            Cause::FailureRate => format!("failure_rate>{}", policy.failure_rate_threshold),
            Cause::CriticalDown => format!("critical_dependency_down:{}", self.critical_down.join(",")),
            Cause::HeartbeatSilence => format!("heartbeat_silence>={}x_interval", policy.heartbeat_unhealthy_intervals),
            Cause::Score => format!("score<{}", policy.degrade_below),
            Cause::NoncriticalDown => format!("noncritical_dependency_down:{}", self.noncritical_down.join(",")),
            Cause::LatencyOutlier => format!("latency>{}x_pool_median", policy.latency_outlier_factor),
            Cause::EjectionRefused => "ejection_refused:max_ejection".to_owned(),
            Cause::SuspectFailures => format!("consecutive_failures>={}", policy.suspect_after_failures),
            Cause::SuspectSilence => format!("heartbeat_silence>={}x_interval", policy.heartbeat_suspect_intervals),
        }
    }

    pub fn heartbeat_interval(&self, policy: &Policy) -> i64 {
        self.heartbeat_interval_ms.unwrap_or(policy.heartbeat_interval_ms)
    }

    pub fn heartbeat_silence(&self, now: Micros) -> Option<i64> {
        self.last_heartbeat.map(|t| now.saturating_sub(t))
    }

    /// The isolation for the next ejection: base × 2^k, capped; k resets after a quiet period.
    pub fn next_isolation(&mut self, now: Micros, policy: &Policy) -> i64 {
        if self
            .last_isolated_at
            .is_some_and(|t| now.saturating_sub(t) > us(policy.isolation_reset_ms))
        {
            self.isolations = 0;
        }
        let k = self.isolations.min(30);
        self.isolations += 1;
        self.last_isolated_at = Some(now);
        policy
            .isolation_base_ms
            .saturating_mul(1i64 << k)
            .min(policy.isolation_max_ms)
    }

    /// The earliest stream time at which a timer of this endpoint may change its state.
    pub fn deadline(&self, policy: &Policy) -> Option<Micros> {
        let mut d: Option<Micros> = None;
        let mut consider = |t: Micros| d = Some(d.map_or(t, |x: Micros| x.min(t)));
        if self.forced.is_some() {
            return None;
        }
        match self.state {
            HealthState::Unhealthy if !self.trial_open => {
                if let Some(t) = self.isolated_until {
                    consider(t);
                }
            }
            HealthState::Recovering => {
                if let Some(t) = self.ramp_until {
                    consider(t);
                }
            }
            HealthState::Degraded => {
                if let Some(t) = self.above_since {
                    consider(t.saturating_add(us(policy.recover_hold_ms)));
                }
            }
            _ => {}
        }
        if let (Some(last), HealthState::Healthy | HealthState::Suspect | HealthState::Degraded) =
            (self.last_heartbeat, self.state)
        {
            let iv = us(self.heartbeat_interval(policy));
            let n = if self.heartbeat_silent {
                policy.heartbeat_unhealthy_intervals
            } else {
                policy.heartbeat_suspect_intervals
            };
            consider(last.saturating_add(iv.saturating_mul(n.into())));
        }
        d
    }

    pub fn evidence(
        &self,
        now: Micros,
        policy: &Policy,
        thresholds: Vec<String>,
        pool_median: Option<f64>,
    ) -> Evidence {
        let t = self.totals(now, policy);
        let rate = self.rate(now, policy);
        let n = |c: OutcomeClass| t.get(c) as i64;
        Evidence {
            window_ms: policy.window_ms,
            success: n(OutcomeClass::Success),
            timeout: n(OutcomeClass::Timeout),
            connect_error: n(OutcomeClass::ConnectError),
            connection_dropped: n(OutcomeClass::ConnectionDropped),
            rate_limited: n(OutcomeClass::RateLimited),
            server_error: n(OutcomeClass::ServerError),
            client_error: n(OutcomeClass::ClientError),
            invalid_response: n(OutcomeClass::InvalidResponse),
            cancelled: n(OutcomeClass::Cancelled),
            failure_rate: rate.failure_rate(),
            score: self.score,
            ttft_p50_ms: self.ttft_percentile(0.5),
            ttft_p99_ms: self.ttft_percentile(0.99),
            latency_ewma_ms: (self.latency_samples > 0).then_some(self.latency_ewma_ms),
            pool_latency_median_ms: pool_median,
            consecutive_failures: self.consecutive_failures as i32,
            consecutive_successes: self.consecutive_successes as i32,
            consecutive_hard_failures: self.consecutive_hard as i32,
            isolations: self.isolations as i32,
            thresholds,
        }
    }

    /// A fresh start after an isolation's trial succeeded: the old window and score were the
    /// evidence of the outage and are already in the audit log.
    pub fn reset_for_recovery(&mut self, now: Micros) {
        self.window.clear();
        self.score = 100.0;
        self.above_since = Some(now);
        self.consecutive_failures = 0;
        self.consecutive_hard = 0;
        self.failure_ids.clear();
    }
}

pub fn buckets(policy: &Policy) -> usize {
    (policy.window_ms / policy.bucket_ms).max(1) as usize
}

/// Milliseconds to microseconds, saturating: a policy or probe value can never wrap stream time
/// (validation bounds them far below this, but the engine must not rely on its callers).
pub(crate) fn us(ms: i64) -> i64 {
    ms.saturating_mul(1000)
}
