//! Per-endpoint state: the window, the EWMA score, consecutive counters, isolation and the
//! conditions that the pool's rules turn into transitions.

use crate::window::{counts_as_failure, Rate, Totals, Window};
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
    PeerFailures,
    TtftOutlier,
    EjectionRefused,
    SuspectFailures,
    SuspectSilence,
}

/// What an ejection was for: the kind of evidence that can show the fault is gone.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Dimension {
    /// Failed calls or probes: any passing call or probe shows them gone.
    Errors,
    /// Slow first tokens: only an outcome with a first token (a call, a synthetic completion)
    /// shows them gone; a health-route probe readmits as a canary.
    Ttft,
    /// Heartbeats stopped: only a heartbeat shows the endpoint back.
    Heartbeat,
    /// A critical dependency is down: only a probe reporting it up shows it back.
    Dependency,
    /// Rate limited: a cooldown, over when its time is.
    RateLimit,
}

impl Dimension {
    pub fn as_str(self) -> &'static str {
        match self {
            Dimension::Errors => "errors",
            Dimension::Ttft => "ttft",
            Dimension::Heartbeat => "heartbeat",
            Dimension::Dependency => "dependency",
            Dimension::RateLimit => "rate_limit",
        }
    }
}

/// Where an outcome comes from: a real call or a probe of some kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    Call,
    Probe(vitals_contracts::ProbeKind),
}

/// What an outcome says about an endpoint that is out, given what it is out for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// It says nothing (a 4xx, a cancelled call, a 429).
    Neutral,
    /// The fault is still there.
    Fail,
    /// It passed, but cannot see the fault: readmit only as a canary that real calls decide.
    Canary,
    /// It passed and can see the fault.
    Pass,
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
    /// Isolations in a row, each ejected soon after a readmission (k + 1 of the 30 s × 2^k
    /// backoff); 1 for a first ejection.
    pub isolations: u32,
    /// When the current (or last) ejection began: the minimum isolation counts from here.
    pub last_isolated_at: Option<Micros>,
    /// When the router's trial call is due (`retry_at`), or a cooldown ends.
    pub isolated_until: Option<Micros>,
    /// The isolation has expired: the next call is the router's trial.
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
    /// What the current ejection is for (None while in rotation).
    #[serde(default)]
    pub out_for: Option<Dimension>,
    /// Passing outcomes in a row while out.
    #[serde(default)]
    pub passes_while_out: u16,
    /// Failed trial calls of the current isolation: the jitter's attempt number.
    #[serde(default)]
    pub failed_trials: u16,
    /// 429s in a row.
    #[serde(default)]
    pub consecutive_rate_limited: u16,
    /// Readmitted on evidence that cannot see the fault: real calls decide.
    #[serde(default)]
    pub canary: bool,
    /// Real calls that passed since a canary readmission.
    #[serde(default)]
    pub canary_calls: u16,
    /// The latest Retry-After the upstream sent with a 429, in ms.
    #[serde(default)]
    pub retry_after_ms: Option<u32>,
    /// When the endpoint was last readmitted: an ejection soon after is a flap.
    #[serde(default)]
    pub readmitted_at: Option<Micros>,
    /// Failure rate significantly above the peers' (Wilson bounds; set by the pool).
    #[serde(default)]
    pub failure_outlier: bool,
    /// First tokens far slower than the peers' (set by the pool).
    #[serde(default)]
    pub ttft_outlier: bool,
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
            out_for: None,
            passes_while_out: 0,
            failed_trials: 0,
            consecutive_rate_limited: 0,
            canary: false,
            canary_calls: 0,
            retry_after_ms: None,
            readmitted_at: None,
            failure_outlier: false,
            ttft_outlier: false,
        }
    }

    pub fn totals(&self, now: Micros, policy: &Policy) -> Totals {
        self.window.totals(now, us(policy.bucket_ms))
    }

    pub fn rate(&self, now: Micros, policy: &Policy) -> Rate {
        self.window.rate(now, us(policy.bucket_ms))
    }

    /// Successes and failures over the most recent third of the window: a fault 10 s old is a
    /// tenth of a 30 s window still full of the calls before it.
    pub fn recent_rate(&self, now: Micros, policy: &Policy) -> Rate {
        self.window.rate_last(now, us(policy.bucket_ms), recent_buckets(policy))
    }

    /// Per-class counts over the most recent third of the window.
    pub fn recent_totals(&self, now: Micros, policy: &Policy) -> Totals {
        self.window
            .totals_last(now, us(policy.bucket_ms), recent_buckets(policy))
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
        if class == OutcomeClass::RateLimited {
            // Not a failure of the endpoint: its own rule (the cooldown) answers it.
            self.consecutive_rate_limited = self.consecutive_rate_limited.saturating_add(1);
            return rate;
        }
        self.consecutive_rate_limited = 0;
        let failed = counts_as_failure(class);
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
    ///
    /// Fresh evidence only: the rules that look back over the window (failure rate, the peer
    /// comparison) never eject an endpoint whose latest outcome succeeded.
    fn eject_rules(&self, totals: &Rate, policy: &Policy, now: Micros) -> impl Iterator<Item = Cause> {
        let silent = self.heartbeat_silence(now).is_some_and(|silence| {
            silence >= us(self.heartbeat_interval(policy)).saturating_mul(policy.heartbeat_unhealthy_intervals.into())
        });
        let fresh = self.consecutive_successes == 0;
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
                fresh
                    && totals.counted() >= policy.min_volume as u64
                    && totals.failure_rate() > policy.failure_rate_threshold,
                Cause::FailureRate,
            ),
            (fresh && self.failure_outlier, Cause::PeerFailures),
            (self.ttft_outlier, Cause::TtftOutlier),
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

    /// Failures make an endpoint suspect only when they are not isolated: a run of them and a
    /// window failure rate of at least half the ejection threshold (a few failures in a row among
    /// many successes used to flicker healthy → suspect → healthy and fill the audit log).
    fn suspect_rules(&self, totals: &Rate, policy: &Policy) -> impl Iterator<Item = Cause> {
        [
            (
                self.consecutive_failures >= policy.suspect_after_failures as u32
                    && totals.failure_rate() >= policy.failure_rate_threshold / 2.0,
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
    pub fn suspicious(&self, totals: &Rate, policy: &Policy) -> bool {
        self.suspect_rules(totals, policy).next().is_some()
    }

    /// What an ejection on these rules is for. `slow` says the outcome that crossed them was a
    /// 200 whose first token came too late.
    pub fn eject_dimension(&self, totals: &Rate, policy: &Policy, now: Micros, slow: bool) -> Dimension {
        let mut dims = self.eject_rules(totals, policy, now).map(|c| match c {
            Cause::TtftOutlier => Dimension::Ttft,
            Cause::CriticalDown => Dimension::Dependency,
            Cause::HeartbeatSilence => Dimension::Heartbeat,
            _ if slow => Dimension::Ttft,
            _ => Dimension::Errors,
        });
        let first = dims.next().unwrap_or(Dimension::Errors);
        // Slow first tokens and errors together: only a first token shows both gone.
        dims.fold(first, |a, b| if b == Dimension::Ttft { b } else { a })
    }

    /// What a passing or failing outcome says about this endpoint while it is out (or
    /// recovering) for `dim`.
    pub fn verdict(
        &self,
        dim: Dimension,
        source: Source,
        class: OutcomeClass,
        ttft_us: Option<i64>,
        probe_reports_dependencies: bool,
        policy: &Policy,
    ) -> Verdict {
        use vitals_contracts::ProbeKind;
        if class.is_neutral() || class == OutcomeClass::RateLimited {
            return Verdict::Neutral;
        }
        if counts_as_failure(class) {
            return Verdict::Fail;
        }
        let first_token_ok = ttft_us.map(|t| (t as f64) <= policy.ttft_max_ms * 1000.0);
        match (dim, source) {
            (Dimension::RateLimit, _) => Verdict::Neutral,
            (Dimension::Errors, Source::Probe(ProbeKind::Heartbeat)) => Verdict::Canary,
            (Dimension::Errors, _) => Verdict::Pass,
            (Dimension::Ttft, _) => match first_token_ok {
                Some(true) => Verdict::Pass,
                Some(false) => Verdict::Fail,
                None => Verdict::Canary,
            },
            // Only a heartbeat shows heartbeats back; a call or another probe says nothing
            // about them (readmitting on one only ejected the endpoint again, still silent).
            (Dimension::Heartbeat, Source::Probe(ProbeKind::Heartbeat)) => Verdict::Pass,
            (Dimension::Heartbeat, _) => Verdict::Neutral,
            // Only a probe that reports the dependency shows it back.
            (Dimension::Dependency, _) if !probe_reports_dependencies => Verdict::Neutral,
            (Dimension::Dependency, _) if self.critical_down.is_empty() => Verdict::Pass,
            (Dimension::Dependency, _) => Verdict::Fail,
        }
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

    pub fn suspect_causes(&self, totals: &Rate, policy: &Policy) -> Vec<String> {
        self.suspect_rules(totals, policy)
            .map(|c| self.threshold(c, policy))
            .collect()
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

    pub fn heartbeat_interval(&self, policy: &Policy) -> i64 {
        self.heartbeat_interval_ms.unwrap_or(policy.heartbeat_interval_ms)
    }

    pub fn heartbeat_silence(&self, now: Micros) -> Option<i64> {
        self.last_heartbeat.map(|t| now.saturating_sub(t))
    }

    /// The isolation for a new ejection: base × 2^k, capped. k grows only for a flapping
    /// endpoint, one ejected again within `isolation_reset_ms` of its last readmission; a first
    /// ejection (or one after a quiet period) starts again at the base.
    pub fn next_isolation(&mut self, now: Micros, policy: &Policy) -> i64 {
        let flapping = self
            .readmitted_at
            .is_some_and(|t| now.saturating_sub(t) <= us(policy.isolation_reset_ms));
        if !flapping {
            self.isolations = 0;
        }
        self.isolations = self.isolations.saturating_add(1);
        self.last_isolated_at = Some(now);
        self.failed_trials = 0;
        self.isolation(policy)
    }

    /// The current isolation's length: base × 2^(isolations − 1), capped.
    pub fn isolation(&self, policy: &Policy) -> i64 {
        let k = self.isolations.saturating_sub(1).min(30);
        policy
            .isolation_base_ms
            .saturating_mul(1i64 << k)
            .min(policy.isolation_max_ms)
    }

    /// Whether this is a flapping endpoint (ejected again soon after a readmission): it then
    /// needs two passing probes in a row to come back, not one.
    pub fn passes_needed(&self) -> u16 {
        if self.isolations >= 2 {
            2
        } else {
            1
        }
    }

    /// Whether the minimum isolation has passed, after which passing evidence readmits.
    pub fn readmittable(&self, now: Micros, policy: &Policy) -> bool {
        self.last_isolated_at
            .is_none_or(|t| now.saturating_sub(t) >= us(policy.readmit_min_ms))
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
        self.consecutive_rate_limited = 0;
        self.failure_ids.clear();
        self.failure_outlier = false;
        self.ttft_outlier = false;
    }

    /// Kept serving through a suspected shared outage: judged on what happens from now on, not
    /// on the outage's window (its latest successes still count).
    pub fn forget_outage(&mut self, now: Micros) {
        let successes = self.consecutive_successes;
        self.reset_for_recovery(now);
        self.consecutive_successes = successes;
    }

    /// The `q` percentile of the recent first tokens, in ms, once there are at least `min`.
    pub fn ttft_p(&self, q: f64, min: usize) -> Option<f64> {
        if (self.ttft_len as usize) < min {
            return None;
        }
        self.ttft_percentile(q)
    }
}

pub fn buckets(policy: &Policy) -> usize {
    (policy.window_ms / policy.bucket_ms).max(1) as usize
}

/// The buckets of the most recent third of the window.
fn recent_buckets(policy: &Policy) -> u32 {
    (buckets(policy) as u32).div_ceil(3)
}

/// Milliseconds to microseconds, saturating: a policy or probe value can never wrap stream time
/// (validation bounds them far below this, but the engine must not rely on its callers).
pub(crate) fn us(ms: i64) -> i64 {
    ms.saturating_mul(1000)
}
