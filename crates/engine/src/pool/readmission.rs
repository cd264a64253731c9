//! Readmission: what an outcome says about an endpoint that is out (or recovering) given what
//! it is out for, the router's trial call after an isolation, passing evidence after the
//! minimum isolation, a canary readmission on evidence that cannot see the fault, and the end
//! of slow start.

use super::{Change, Outcome, PoolState, Source};
use crate::endpoint::{Dimension, Tracker};
use crate::window::counts_as_failure;
use vitals_contracts::{HealthState, OutcomeClass, Policy, ProbeKind, ReasonCode};

/// What a passing or failing outcome says about an endpoint while it is out (or recovering)
/// for `dim`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Verdict {
    /// It says nothing (a 4xx, a cancelled call, a 429).
    Neutral,
    /// The fault is still there.
    Fail,
    /// It passed, but cannot see the fault: readmit only as a canary that real calls decide.
    Canary,
    /// It passed and can see the fault.
    Pass,
}

fn verdict(t: &Tracker, dim: Dimension, o: &Outcome<'_>, class: OutcomeClass, policy: &Policy) -> Verdict {
    if class.is_neutral() || class == OutcomeClass::RateLimited {
        return Verdict::Neutral;
    }
    if counts_as_failure(class) {
        return Verdict::Fail;
    }
    let first_token_ok = o.ttft_us.map(|t| (t as f64) <= policy.ttft_max_ms * 1000.0);
    match (dim, o.source) {
        (Dimension::RateLimit, _) => Verdict::Neutral,
        (Dimension::Errors, Source::Probe(ProbeKind::Heartbeat)) => Verdict::Canary,
        (Dimension::Errors, _) => Verdict::Pass,
        (Dimension::Ttft, _) => match first_token_ok {
            Some(true) => Verdict::Pass,
            Some(false) => Verdict::Fail,
            None => Verdict::Canary,
        },
        // Only a heartbeat shows heartbeats back; a call or another probe says nothing about
        // them (readmitting on one only ejected the endpoint again, still silent).
        (Dimension::Heartbeat, Source::Probe(ProbeKind::Heartbeat)) => Verdict::Pass,
        (Dimension::Heartbeat, _) => Verdict::Neutral,
        // Only a probe that reports the dependency shows it back.
        (Dimension::Dependency, _) if !o.reports_dependencies => Verdict::Neutral,
        (Dimension::Dependency, _) if t.critical_down().is_empty() => Verdict::Pass,
        (Dimension::Dependency, _) => Verdict::Fail,
    }
}

impl PoolState {
    /// An outcome for an endpoint that is out of rotation or recovering: evidence that may
    /// readmit it, the router's trial call, or a failure during the slow-start ramp.
    pub(super) fn isolated_outcome(&mut self, o: &Outcome<'_>, class: OutcomeClass) -> Option<Change> {
        let t = &self.endpoints[o.endpoint];
        if t.forced().is_some() {
            return None;
        }
        // Fresh evidence only: a call that began before the endpoint was ejected or readmitted
        // says nothing about it now (a slow call begun during the fault ends after it).
        let since = match t.state() {
            HealthState::Recovering => t.readmitted_at(),
            _ => t.last_isolated_at(),
        };
        if since.is_some_and(|s| o.started(self.now) < s) {
            return None;
        }
        if t.state() == HealthState::Recovering && class == OutcomeClass::RateLimited {
            return self.rate_limited(o.endpoint);
        }
        let dim = t.out_for().unwrap_or(Dimension::Errors);
        let verdict = verdict(t, dim, o, class, &self.policy);
        match t.state() {
            HealthState::Unhealthy => self.while_out(o, class, dim, verdict),
            HealthState::Recovering if verdict == Verdict::Fail => {
                let what = if counts_as_failure(class) {
                    class.as_str().to_owned()
                } else {
                    format!("first token after {} ms", o.ttft_us.unwrap_or(0) / 1000)
                };
                let thresholds = vec!["failure_while_recovering".into()];
                if self.may_eject() {
                    return Some(Change::new(
                        HealthState::Unhealthy,
                        ReasonCode::FailedWhileRecovering,
                        format!("{what} while recovering; isolated again"),
                        thresholds,
                        vec![o.id.to_owned()],
                    ));
                }
                self.set_refused(o.endpoint, true);
                Some(self.refusal(o.endpoint, thresholds))
            }
            HealthState::Recovering => {
                if o.source == Source::Call && verdict == Verdict::Pass {
                    let needed = self.policy.consecutive_successes;
                    let t = self.endpoints.get_mut(o.endpoint).expect("known endpoint");
                    t.canary_call_passed(needed);
                }
                self.recovery_complete(o.endpoint)
            }
            _ => None,
        }
    }

    /// An outcome while the endpoint is out. Every one is evidence: after the minimum isolation
    /// the first passing one that can see what the endpoint is out for readmits it (two in a row
    /// for a flapping endpoint); one that cannot see it readmits it as a canary. A call after
    /// the isolation is the router's trial. A failure says the fault is still there and starts
    /// the count again; only a failed trial call is a transition (it carries the next trial's time).
    fn while_out(&mut self, o: &Outcome<'_>, class: OutcomeClass, dim: Dimension, verdict: Verdict) -> Option<Change> {
        let now = self.now;
        let policy = &self.policy;
        let t = self.endpoints.get_mut(o.endpoint).expect("known endpoint");
        if dim == Dimension::RateLimit {
            // A cooldown ends by its time, whatever the calls in flight say.
            return None;
        }
        let trial = o.source == Source::Call && t.trial_open();
        let what = match o.source {
            Source::Call => "a call".to_owned(),
            Source::Probe(k) => format!("a {} probe", k.as_str()),
        };
        match verdict {
            Verdict::Neutral => None,
            Verdict::Fail => {
                t.failed_while_out();
                trial.then(|| {
                    Change::new(
                        HealthState::Unhealthy,
                        ReasonCode::TrialFailed,
                        format!("trial after isolation failed ({})", class.as_str()),
                        vec!["trial_failed".into()],
                        vec![o.id.to_owned()],
                    )
                })
            }
            Verdict::Pass | Verdict::Canary => {
                let passes = t.passed_while_out();
                let canary = verdict == Verdict::Canary;
                let ramp = format!("slow start over {} s", policy.slow_start_ms / 1000);
                let mut change = if trial {
                    Change::new(
                        HealthState::Recovering,
                        ReasonCode::TrialSucceeded,
                        format!("trial after isolation succeeded; {ramp}"),
                        vec!["trial_succeeded".into()],
                        vec![o.id.to_owned()],
                    )
                } else if t.readmittable(now, policy) && passes >= t.passes_needed() {
                    let out_s = now.saturating_sub(t.last_isolated_at().unwrap_or(now)) / 1_000_000;
                    let reason = if canary {
                        format!(
                            "{what} passed after {out_s} s out but cannot see {}: readmitted as a canary at weight {}; real calls decide",
                            dim.as_str(),
                            policy.slow_start_weight
                        )
                    } else {
                        format!(
                            "{what} passed after {out_s} s out (ejected for {}); readmitted, {ramp}",
                            dim.as_str()
                        )
                    };
                    Change::new(
                        HealthState::Recovering,
                        ReasonCode::Readmitted,
                        reason,
                        vec![
                            format!("passing_evidence>={passes}"),
                            format!("out>={}ms", policy.readmit_min_ms),
                        ],
                        vec![o.id.to_owned()],
                    )
                } else {
                    return None;
                };
                change.canary = canary;
                Some(change)
            }
        }
    }

    /// Slow start is over when its ramp has run, the latest outcomes passed and no canary is
    /// still waiting for real calls.
    pub(super) fn recovery_complete(&self, name: &str) -> Option<Change> {
        let t = &self.endpoints[name];
        let m = self.policy.consecutive_successes as u32;
        let ramped = t.ramp_until().is_none_or(|r| r <= self.now);
        (t.consecutive_successes() >= m && !t.canary() && ramped).then(|| {
            Change::new(
                HealthState::Healthy,
                ReasonCode::Recovered,
                format!(
                    "{} consecutive successes and slow start complete",
                    t.consecutive_successes()
                ),
                vec![format!("consecutive_successes>={m}")],
                vec![],
            )
        })
    }
}
