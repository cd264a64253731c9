//! Where an endpoint is in its cycle of ejection and readmission, each phase with its own data:
//! an isolation's trial and passes exist only while the endpoint is out, a probation's run and
//! growth only on probation, a ramp only in slow start. The [`HealthState`] an endpoint
//! publishes is a function of its phase ([`Phase::state`]).

use super::Dimension;
use vitals_contracts::{HealthState, Micros};

#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Phase {
    /// In rotation: healthy, suspect or degraded (by the rules, or forced healthy).
    InRotation(HealthState),
    /// Out of rotation by a rule: an isolation, or a cooldown (out for [`Dimension::RateLimit`]).
    Out(Isolation),
    /// Readmitted at the slow-start weight, ramping to full.
    SlowStart(SlowStart),
    /// Readmitted on probation: held at the probation weight while real calls decide.
    Probation(Probation),
    /// Out by an operator: forced unhealthy, or maintenance.
    Operator(HealthState),
}

/// An ejection (or a cooldown) under way.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Isolation {
    /// What it is out for: the evidence that can show the fault gone.
    pub out_for: Dimension,
    /// When the router's trial call is due, or the cooldown ends.
    pub until: Micros,
    /// The isolation has expired: the next call is the router's trial.
    pub trial_open: bool,
    /// Passing outcomes in a row while out.
    pub passes: u16,
    /// Failed trial calls of this isolation: the jitter's attempt number.
    pub failed_trials: u16,
}

impl Isolation {
    pub fn new(out_for: Dimension, until: Micros, failed_trials: u16) -> Isolation {
        Isolation {
            out_for,
            until,
            trial_open: false,
            passes: 0,
            failed_trials,
        }
    }
}

/// Slow start after a readmission (or the end of a cooldown, or of a probation for first tokens).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct SlowStart {
    /// What the ejection it came back from was for (None after a cooldown or an operator).
    pub after: Option<Dimension>,
    /// When its weight reaches full.
    pub ramp_until: Micros,
}

/// A probation: readmitted on evidence that cannot see the fault, or after a flap or a
/// failure-rate ejection.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Probation {
    /// What the ejection it came back from was for.
    pub after: Option<Dimension>,
    /// Passing outcomes in a row (a failure starts the count again).
    pub passes: u16,
    /// When the first of those passes came (None without one, or read from a snapshot that
    /// did not keep it: that run is judged by its count alone).
    pub run_from: Option<Micros>,
    /// Times its weight grew and fell back: each makes the run the next growth needs twice
    /// as long.
    pub falls: u8,
    /// Growing to full weight over the ramp, reached at this time; None while held.
    pub growing_until: Option<Micros>,
}

impl Phase {
    /// The state the phase publishes.
    pub fn state(&self) -> HealthState {
        match self {
            Phase::InRotation(s) | Phase::Operator(s) => *s,
            Phase::Out(_) => HealthState::Unhealthy,
            Phase::SlowStart(_) | Phase::Probation(_) => HealthState::Recovering,
        }
    }

    /// What the current ejection is for (None in rotation and when out by an operator).
    pub fn out_for(&self) -> Option<Dimension> {
        match self {
            Phase::Out(i) => Some(i.out_for),
            Phase::SlowStart(s) => s.after,
            Phase::Probation(p) => p.after,
            Phase::InRotation(_) | Phase::Operator(_) => None,
        }
    }
}
