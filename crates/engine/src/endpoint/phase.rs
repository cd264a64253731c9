//! Where an endpoint is in its cycle of ejection and readmission, each phase with its own data:
//! an isolation's trial and passes exist only while the endpoint is out, a probation's run and
//! growth only on probation, a ramp only in slow start, an operator's hold only while held. The
//! [`HealthState`] an endpoint publishes is a function of its phase ([`Phase::state`]), and no
//! phase can publish a state it does not mean (in rotation is never unhealthy).

use super::Dimension;
use vitals_contracts::{HealthState, Micros, OverrideAction};

#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Phase {
    /// In rotation by the rules: healthy, suspect or degraded.
    InRotation(InRotation),
    /// Out of rotation by a rule: an isolation, ended by passing evidence and the router's trial.
    Out(Isolation),
    /// Out of rotation for 429s: ended by its time alone.
    Cooldown(Cooldown),
    /// Readmitted at the slow-start weight, ramping to full.
    SlowStart(SlowStart),
    /// Readmitted on probation: held at the probation weight while real calls decide.
    Probation(Probation),
    /// Held by an operator (forced healthy or unhealthy, or maintenance): no rule moves it.
    Operator(Hold),
}

/// The states of an endpoint in rotation by the rules.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum InRotation {
    Healthy,
    Suspect,
    Degraded,
}

impl InRotation {
    /// The in-rotation state of `s` (None for a state out of rotation or recovering).
    pub fn of(s: HealthState) -> Option<InRotation> {
        match s {
            HealthState::Healthy => Some(InRotation::Healthy),
            HealthState::Suspect => Some(InRotation::Suspect),
            HealthState::Degraded => Some(InRotation::Degraded),
            _ => None,
        }
    }

    pub fn state(self) -> HealthState {
        match self {
            InRotation::Healthy => HealthState::Healthy,
            InRotation::Suspect => HealthState::Suspect,
            InRotation::Degraded => HealthState::Degraded,
        }
    }
}

/// What an operator holds an endpoint at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Hold {
    /// Forced healthy: in rotation at full weight whatever it does.
    Healthy,
    /// Forced unhealthy: out of rotation.
    Unhealthy,
    /// In maintenance: out of rotation.
    Maintenance,
}

impl Hold {
    pub fn state(self) -> HealthState {
        match self {
            Hold::Healthy => HealthState::Healthy,
            Hold::Unhealthy => HealthState::Unhealthy,
            Hold::Maintenance => HealthState::Maintenance,
        }
    }

    /// The override that holds it so.
    pub fn action(self) -> OverrideAction {
        match self {
            Hold::Healthy => OverrideAction::ForceHealthy,
            Hold::Unhealthy => OverrideAction::ForceUnhealthy,
            Hold::Maintenance => OverrideAction::MaintenanceOn,
        }
    }

    /// The hold an override asks for (None: it releases one).
    pub fn of(action: OverrideAction) -> Option<Hold> {
        match action {
            OverrideAction::ForceHealthy => Some(Hold::Healthy),
            OverrideAction::ForceUnhealthy => Some(Hold::Unhealthy),
            OverrideAction::MaintenanceOn => Some(Hold::Maintenance),
            OverrideAction::MaintenanceOff | OverrideAction::Clear => None,
        }
    }
}

/// A cooldown for 429s under way.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Cooldown {
    /// When it ends.
    pub until: Micros,
}

/// An ejection under way.
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
            Phase::InRotation(s) => s.state(),
            Phase::Operator(h) => h.state(),
            Phase::Out(_) | Phase::Cooldown(_) => HealthState::Unhealthy,
            Phase::SlowStart(_) | Phase::Probation(_) => HealthState::Recovering,
        }
    }

    /// What the current ejection is for (None in rotation and when held by an operator).
    pub fn out_for(&self) -> Option<Dimension> {
        match self {
            Phase::Out(i) => Some(i.out_for),
            Phase::Cooldown(_) => Some(Dimension::RateLimit),
            Phase::SlowStart(s) => s.after,
            Phase::Probation(p) => p.after,
            Phase::InRotation(_) | Phase::Operator(_) => None,
        }
    }
}
