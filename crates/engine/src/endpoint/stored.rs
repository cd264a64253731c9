//! The stored form of a [`Tracker`], apart from the type the engine works with: a refactor of
//! the tracker changes this module's conversions, never the bytes in a snapshot.
//!
//! Version 1 is the form every snapshot so far was written in: the endpoint's phase as flags
//! (`isolated_until`, `trial_open`, `canary`, `probation_growing`, …). It is frozen: a field
//! may be added with a default, none renamed or dropped, so that a snapshot restores in a later
//! build and a build restores the snapshots of the one before (a rollback). A format that must
//! change a field gets its own struct beside this one and a `format` field, and
//! `Tracker`'s `Deserialize` reads either.
//!
//! Reading version 1, a combination of flags that the phases cannot hold (a ramp left over from
//! slow start on a degraded endpoint, a trial count left over from an isolation, a cooldown's
//! trial, an operator's hold on a state it does not hold) is dropped — no rule read it outside
//! its phase — and counted: the restored tracker is marked ([`Tracker::restored_lossy`]), and
//! the engine says how many were ([`crate::Engine::lossy_restores`]).

use super::phase::{Cooldown, Hold, InRotation, Isolation, Phase, Probation, SlowStart};
use super::{Dimension, Share, Tracker, TTFT_SAMPLES};
use crate::window::Window;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::borrow::Cow;
use vitals_contracts::{HealthState, Micros, OverrideAction};

/// Version 1 of the stored tracker. Field order is the bytes' order: keep it.
#[derive(Serialize, Deserialize, PartialEq)]
struct StoredV1<'a> {
    state: HealthState,
    since: Micros,
    seq: u64,
    window: Cow<'a, Window>,
    score: f64,
    above_since: Option<Micros>,
    consecutive_failures: u32,
    consecutive_successes: u32,
    consecutive_hard: u32,
    failure_ids: Cow<'a, [String]>,
    isolations: u32,
    last_isolated_at: Option<Micros>,
    isolated_until: Option<Micros>,
    trial_open: bool,
    ramp_until: Option<Micros>,
    ttft_us: [u32; TTFT_SAMPLES],
    ttft_len: u8,
    ttft_pos: u8,
    latency_ewma_ms: f64,
    latency_samples: u32,
    latency_outlier: bool,
    last_heartbeat: Option<Micros>,
    heartbeat_interval_ms: Option<i64>,
    heartbeat_silent: bool,
    critical_down: Cow<'a, [String]>,
    noncritical_down: Cow<'a, [String]>,
    eject_refused: bool,
    forced: Option<OverrideAction>,
    #[serde(default)]
    out_for: Option<Dimension>,
    #[serde(default)]
    passes_while_out: u16,
    #[serde(default)]
    failed_trials: u16,
    #[serde(default)]
    consecutive_rate_limited: u16,
    /// On probation (named `canary` before probation held).
    #[serde(default)]
    canary: bool,
    /// Passing outcomes in a row on probation.
    #[serde(default)]
    canary_calls: u16,
    #[serde(default)]
    probation_growing: bool,
    #[serde(default)]
    probation_falls: u8,
    #[serde(default)]
    cooldowns: u16,
    #[serde(default)]
    cooled_at: Option<Micros>,
    #[serde(default)]
    limited_bits: u16,
    #[serde(default)]
    retry_after_ms: Option<u32>,
    #[serde(default)]
    readmitted_at: Option<Micros>,
    #[serde(default)]
    failure_outlier: bool,
    #[serde(default)]
    ttft_outlier: bool,
    #[serde(default)]
    traffic_when_out: u64,
    #[serde(default)]
    born: Micros,
    #[serde(default)]
    latency_clear_since: Option<Micros>,
    #[serde(default)]
    latency_median_seen: f64,
    /// When the run of passes on probation began (written only while one runs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    probation_run_from: Option<Micros>,
}

impl<'a> From<&'a Tracker> for StoredV1<'a> {
    fn from(t: &'a Tracker) -> StoredV1<'a> {
        let (isolation, slow_start, probation) = match &t.phase {
            Phase::Out(i) => (Some(i), None, None),
            Phase::SlowStart(s) => (None, Some(s), None),
            Phase::Probation(p) => (None, None, Some(p)),
            Phase::InRotation(_) | Phase::Operator(_) | Phase::Cooldown(_) => (None, None, None),
        };
        let cooldown = match &t.phase {
            Phase::Cooldown(c) => Some(c),
            _ => None,
        };
        StoredV1 {
            state: t.phase.state(),
            since: t.since,
            seq: t.seq,
            window: Cow::Borrowed(&t.window),
            score: t.score,
            above_since: t.above_since,
            consecutive_failures: t.runs.failures,
            consecutive_successes: t.runs.successes,
            consecutive_hard: t.runs.hard,
            failure_ids: Cow::Borrowed(&t.runs.failure_ids),
            isolations: t.history.isolations,
            last_isolated_at: t.history.last_isolated_at,
            isolated_until: isolation.map(|i| i.until).or(cooldown.map(|c| c.until)),
            trial_open: isolation.is_some_and(|i| i.trial_open),
            ramp_until: slow_start
                .map(|s| s.ramp_until)
                .or(probation.and_then(|p| p.growing_until)),
            ttft_us: t.ttft.us,
            ttft_len: t.ttft.len,
            ttft_pos: t.ttft.pos,
            latency_ewma_ms: t.latency.ewma_ms,
            latency_samples: t.latency.samples,
            latency_outlier: t.latency.outlier,
            last_heartbeat: t.heartbeats.last,
            heartbeat_interval_ms: t.heartbeats.interval_ms,
            heartbeat_silent: t.heartbeats.silent,
            critical_down: Cow::Borrowed(&t.dependencies.critical_down),
            noncritical_down: Cow::Borrowed(&t.dependencies.noncritical_down),
            eject_refused: t.eject_refused,
            forced: t.forced(),
            out_for: t.phase.out_for(),
            passes_while_out: isolation.map_or(0, |i| i.passes),
            failed_trials: isolation.map_or(0, |i| i.failed_trials),
            consecutive_rate_limited: t.limits.consecutive,
            canary: probation.is_some(),
            canary_calls: probation.map_or(0, |p| p.passes),
            probation_growing: probation.is_some_and(|p| p.growing_until.is_some()),
            probation_falls: probation.map_or(0, |p| p.falls),
            cooldowns: t.limits.cooldowns,
            cooled_at: t.limits.cooled_at,
            limited_bits: t.limits.limited_bits,
            retry_after_ms: t.limits.retry_after_ms,
            readmitted_at: t.history.readmitted_at,
            failure_outlier: t.failure_outlier,
            ttft_outlier: t.ttft_outlier,
            traffic_when_out: t.history.traffic_when_out,
            born: t.born,
            latency_clear_since: t.latency.clear_since,
            latency_median_seen: t.latency.median_seen,
            probation_run_from: probation.and_then(|p| p.run_from),
        }
    }
}

impl StoredV1<'_> {
    /// The phase the flags describe. A time a phase needs and the flags lack (never written so)
    /// is the time the endpoint entered its state: the isolation or ramp is over.
    fn phase(&self) -> Phase {
        if let Some(hold) = self.forced.and_then(Hold::of) {
            return Phase::Operator(hold);
        }
        match self.state {
            HealthState::Healthy => Phase::InRotation(InRotation::Healthy),
            HealthState::Suspect => Phase::InRotation(InRotation::Suspect),
            HealthState::Degraded => Phase::InRotation(InRotation::Degraded),
            HealthState::Maintenance => Phase::Operator(Hold::Maintenance),
            HealthState::Unhealthy if self.out_for == Some(Dimension::RateLimit) => Phase::Cooldown(Cooldown {
                until: self.isolated_until.unwrap_or(self.since),
            }),
            HealthState::Unhealthy => Phase::Out(Isolation {
                out_for: self.out_for.unwrap_or(Dimension::Errors),
                until: self.isolated_until.unwrap_or(self.since),
                trial_open: self.trial_open,
                passes: self.passes_while_out,
                failed_trials: self.failed_trials,
            }),
            HealthState::Recovering if self.canary => Phase::Probation(Probation {
                after: self.out_for,
                passes: self.canary_calls,
                run_from: self.probation_run_from,
                falls: self.probation_falls,
                growing_until: self.probation_growing.then(|| self.ramp_until.unwrap_or(self.since)),
            }),
            HealthState::Recovering => Phase::SlowStart(SlowStart {
                after: self.out_for,
                ramp_until: self.ramp_until.unwrap_or(self.since),
            }),
        }
    }

    /// The fields that say the phase: a tracker restored from these flags writes the same
    /// ones back unless the phases could not hold them.
    #[allow(clippy::type_complexity)]
    fn phase_flags(
        &self,
    ) -> (
        HealthState,
        Option<OverrideAction>,
        Option<Dimension>,
        (Option<Micros>, bool, u16, u16),
        Option<Micros>,
        (bool, u16, bool, u8, Option<Micros>),
    ) {
        (
            self.state,
            self.forced,
            self.out_for,
            (
                self.isolated_until,
                self.trial_open,
                self.passes_while_out,
                self.failed_trials,
            ),
            self.ramp_until,
            (
                self.canary,
                self.canary_calls,
                self.probation_growing,
                self.probation_falls,
                self.probation_run_from,
            ),
        )
    }
}

impl From<StoredV1<'_>> for Tracker {
    fn from(s: StoredV1<'_>) -> Tracker {
        let read = s.phase_flags();
        let mut t = Tracker {
            phase: s.phase(),
            since: s.since,
            seq: s.seq,
            window: s.window.into_owned(),
            score: s.score,
            above_since: s.above_since,
            eject_refused: s.eject_refused,
            failure_outlier: s.failure_outlier,
            ttft_outlier: s.ttft_outlier,
            born: s.born,
            runs: super::Runs {
                failures: s.consecutive_failures,
                successes: s.consecutive_successes,
                hard: s.consecutive_hard,
                failure_ids: s.failure_ids.into_owned(),
            },
            history: super::History {
                isolations: s.isolations,
                last_isolated_at: s.last_isolated_at,
                readmitted_at: s.readmitted_at,
                traffic_when_out: s.traffic_when_out,
            },
            heartbeats: super::Heartbeats {
                last: s.last_heartbeat,
                interval_ms: s.heartbeat_interval_ms,
                silent: s.heartbeat_silent,
            },
            latency: super::Latency {
                ewma_ms: s.latency_ewma_ms,
                samples: s.latency_samples,
                outlier: s.latency_outlier,
                clear_since: s.latency_clear_since,
                median_seen: s.latency_median_seen,
            },
            ttft: super::FirstTokens {
                us: s.ttft_us,
                len: s.ttft_len,
                pos: s.ttft_pos,
            },
            limits: super::RateLimits {
                consecutive: s.consecutive_rate_limited,
                cooldowns: s.cooldowns,
                cooled_at: s.cooled_at,
                limited_bits: s.limited_bits,
                retry_after_ms: s.retry_after_ms,
            },
            dependencies: super::Dependencies {
                critical_down: s.critical_down.into_owned(),
                noncritical_down: s.noncritical_down.into_owned(),
            },
            share: Share::default(),
            restored_lossy: false,
        };
        // A time the flags lacked is filled in (the time it entered its state), not lost:
        // only what the phases cannot hold is.
        let mut written = StoredV1::from(&t).phase_flags();
        if read.3 .0.is_none() {
            written.3 .0 = None;
        }
        if read.4.is_none() {
            written.4 = None;
        }
        t.restored_lossy = written != read;
        t
    }
}

impl Serialize for Tracker {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        StoredV1::from(self).serialize(s)
    }
}

impl<'de> Deserialize<'de> for Tracker {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Tracker, D::Error> {
        StoredV1::deserialize(d).map(Tracker::from)
    }
}

/// Two trackers are equal when they would store the same: the state a snapshot keeps, and
/// nothing of the working memory beside it (the latest sample share, a lossy restore's mark).
impl PartialEq for Tracker {
    fn eq(&self, other: &Tracker) -> bool {
        StoredV1::from(self) == StoredV1::from(other)
    }
}
