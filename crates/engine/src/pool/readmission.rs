//! Readmission: what an outcome says about an endpoint that is out (or recovering) given what
//! it is out for, the router's trial call after an isolation, passing evidence after the
//! minimum isolation, probation, and the end of slow start.
//!
//! Probation is for an endpoint whose fault a probe cannot rule out: one that flaps (ejected
//! again soon after a readmission), one ejected for a share of failed calls (a probe that passes
//! 85 % of the time says little about 15 % of dropped calls), and one out for slow first tokens
//! that only a health probe has seen since (after the whole announced isolation). It is back in
//! rotation at the probation weight, held: its failures cost users little, and real calls stay
//! the evidence. A failure there is no transition; it only starts the count of passes again.
//! [`PROBATION_PASSES`] passes in a row end it (slow start follows); a run of failures as long as
//! two ejections' worth and a window without a pass take it out again, with the isolation grown
//! (or a run ten times as long: a busy endpoint that is down fails that many within a second).

use super::{Change, Outcome, PoolState, Source};
use crate::endpoint::{probation_weight, run_growth, us, Dimension, Tracker, PROBATION_PASSES, PROBATION_RAMP_MS};
use crate::endpoint::{Entry, InRotation};
use crate::window::counts_as_failure;
use vitals_contracts::{HealthState, Micros, OutcomeClass, Policy, ProbeKind, ReasonCode};

/// What a passing or failing outcome says about an endpoint while it is out (or recovering)
/// for `dim`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Verdict {
    /// It says nothing (a 4xx, a cancelled call, a 429).
    Neutral,
    /// The fault is still there.
    Fail,
    /// It passed, but cannot see the fault: readmit only on probation, once the isolation is
    /// over.
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
        (Dimension::Errors | Dimension::ErrorRate, Source::Probe(ProbeKind::Heartbeat)) => Verdict::Canary,
        (Dimension::Errors | Dimension::ErrorRate, _) => Verdict::Pass,
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

/// What an endpoint out (or recovering) for another dimension is out for once `class` fails
/// it: an endpoint back from slow first tokens (or silent heartbeats, a dependency) that fails
/// its calls is out for errors — readmitted as an ejection for errors from rotation would be,
/// not by a fast first token. None: what it was out for still holds.
fn failing_for(t: &Tracker, class: OutcomeClass) -> Option<Dimension> {
    let errors = matches!(t.out_for(), None | Some(Dimension::Errors | Dimension::ErrorRate));
    (counts_as_failure(class) && !errors).then_some(Dimension::Errors)
}

/// The passes in a row that end a probation of `t`: slow first tokens are not a matter of
/// chance, a few fast ones in a row show them gone; a share of failed calls is, and each
/// probation that ended in another ejection makes the next one ask for [`PROBATION_PASSES`] more.
fn probation_passes(t: &Tracker, policy: &Policy) -> u16 {
    match t.out_for() {
        Some(Dimension::Ttft) => policy.consecutive_successes.max(1) as u16,
        _ => PROBATION_PASSES.saturating_mul(t.isolations().clamp(1, 3) as u16),
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
        if o.stale(t, self.now) {
            return None;
        }
        if t.state() == HealthState::Recovering && class == OutcomeClass::RateLimited {
            return self.rate_limited(o.endpoint);
        }
        let dim = t.out_for().unwrap_or(Dimension::Errors);
        let verdict = verdict(t, dim, o, class, &self.policy);
        let run = self.tally(o.endpoint, verdict);
        let t = &self.endpoints[o.endpoint];
        match t.state() {
            HealthState::Unhealthy => self.while_out(o, class, dim, verdict, run),
            HealthState::Recovering if t.probation() => self.on_probation(o, class, verdict, run),
            HealthState::Recovering if verdict == Verdict::Fail && !self.fails_slow_start(o.endpoint, class) => None,
            HealthState::Recovering if verdict == Verdict::Fail => {
                let what = if counts_as_failure(class) {
                    class.as_str().to_owned()
                } else {
                    format!("first token after {} ms", o.ttft_us.unwrap_or(0) / 1000)
                };
                let dim = failing_for(t, class);
                self.eject_again(o, format!("{what} while recovering; isolated again"), dim)
            }
            HealthState::Recovering => self.recovery_complete(o.endpoint),
            _ => None,
        }
    }

    /// Count the verdict in the run of its phase, before the rules read it: passing evidence
    /// in a row while out (a cooldown counts none: its time ends it), or passing outcomes in a
    /// row on probation (evidence that cannot see the fault counts for neither). Returns the run.
    fn tally(&mut self, name: &str, verdict: Verdict) -> u16 {
        let down_after = self.policy.hard_break_after.max(1) as u32;
        let t = self.endpoints.get_mut(name).expect("known endpoint");
        let passed = match verdict {
            Verdict::Neutral => return 0,
            Verdict::Canary if t.probation() => return 0,
            _ if t.cooling() => return 0,
            Verdict::Fail => false,
            Verdict::Pass | Verdict::Canary => true,
        };
        t.tally(self.now, passed, down_after)
    }

    /// Whether a failure in slow start takes the endpoint out again: one does at the traffic
    /// where three in a row are evidence (up to ~11 calls a second, the policy's hard break).
    /// Busier, noise of 1 % fails a call in slow start every few seconds, so it takes the hard
    /// break's run at its traffic (`ejection::runs_to_eject`: 4 from ~12 calls a second, 5 from
    /// ~1,157; its traffic the more of its window's and what the window held when it left
    /// rotation, as the window starts empty in slow start), or failures since the readmission
    /// that stand out from its peers' as the peer rule asks (a share of failed calls back). A
    /// first token too slow for an endpoint out for slow first tokens is no matter of chance: one
    /// takes it out.
    fn fails_slow_start(&self, name: &str, class: OutcomeClass) -> bool {
        if !counts_as_failure(class) {
            return true;
        }
        let t = &self.endpoints[name];
        let traffic = t.calls_a_day(self.now, &self.policy).max(t.traffic_when_out());
        let more = run_growth(traffic);
        let run = if more == 0 {
            1
        } else {
            self.policy.hard_break_after.max(1) as u32 + more
        };
        t.consecutive_failures() >= run || self.failure_outlier_over(name, false)
    }

    /// A failure of an endpoint back in rotation takes it out again (its isolation grows: it
    /// flaps), or, with no ejection slot free, keeps it serving, degraded.
    /// `dim`: what it is out for now, if not what it was out for before.
    fn eject_again(&self, o: &Outcome<'_>, reason: String, dim: Option<Dimension>) -> Option<Change> {
        let thresholds = vec!["failure_while_recovering".into()];
        if self.may_eject() {
            let change = Change::new(
                Entry::Eject(dim),
                ReasonCode::FailedWhileRecovering,
                reason,
                thresholds,
                vec![o.id.to_owned()],
            );
            return Some(change);
        }
        Some(self.refusal(o.endpoint, thresholds))
    }

    /// An outcome of an endpoint on probation. Held at the probation weight, a run of passes
    /// makes its weight grow to full over the ramp ([`PROBATION_RAMP_MS`]), and a failure only
    /// starts the count again; growing, a failure holds it at the probation weight again and
    /// the next growth needs twice the run. Passes end it at full weight once it grew; a
    /// probation for first tokens, whose few fast ones end it, through slow start. A
    /// run of failures as long as two ejections' worth takes it out again once its window holds
    /// no pass, or at once when ten times as long.
    /// `passes`: the run of passes, this outcome counted.
    fn on_probation(&self, o: &Outcome<'_>, class: OutcomeClass, verdict: Verdict, passes: u16) -> Option<Change> {
        match verdict {
            Verdict::Neutral | Verdict::Canary => None,
            Verdict::Fail => self.probation_failed(o, class),
            Verdict::Pass => self.probation_passed(o, passes),
        }
    }

    /// A failure on probation: out again after a run of them, or, growing, held again.
    fn probation_failed(&self, o: &Outcome<'_>, class: OutcomeClass) -> Option<Change> {
        let down_after = 2 * self.policy.consecutive_failures.max(1) as u32;
        let now = self.now;
        let t = &self.endpoints[o.endpoint];
        let w = probation_weight(&self.policy, t.out_for());
        // And no pass in the whole window: a run of failures as long as an isolation
        // lasts is one phase of an intermittent fault (down 10 s, up 10 s), whose
        // every phase it would follow out and back at a prober's fast cadence. A run
        // ten times as long is more than that cadence brings in a window: a busy
        // endpoint that is down (its calls at the probation weight, or gateways that
        // do not follow weights) is out again within a second, not a window.
        let run = t.consecutive_failures();
        let window_failed = t.rate(now, &self.policy).ok == 0;
        if counts_as_failure(class) && run >= down_after && (window_failed || run >= 10 * down_after) {
            let (needed, window) = if window_failed {
                (
                    down_after,
                    format!(" and no pass in {} s", self.policy.window_ms / 1000),
                )
            } else {
                (10 * down_after, String::new())
            };
            let reason = format!(
                "{needed} failures in a row on probation ({}){window}; isolated again",
                class.as_str()
            );
            return self.eject_again(o, reason, failing_for(t, class));
        }
        // Growing, it falls back on a failure as slow start would eject on one: at
        // once up to ~11 calls a second, busier on a run as long as its traffic's
        // noise makes rare or failures that stand out from its peers' (1 % noise at
        // thousands of calls a second fails one every few milliseconds).
        let falls = t.probation_growing() && self.fails_slow_start(o.endpoint, class);
        falls.then(|| {
            let grown = t.ramp_until().map_or(1.0, |until| {
                let left = until.saturating_sub(now) as f64 / us(PROBATION_RAMP_MS) as f64;
                1.0 - (1.0 - w) * left.clamp(0.0, 1.0)
            });
            Change::new(
                Entry::Probation { growing: false },
                ReasonCode::ProbationHeld,
                format!(
                    "{} at weight {grown:.2} while its weight grew on probation; held at {w} again until {}",
                    class.as_str(),
                    t.grow_needs_after_a_fall()
                ),
                vec!["failure_while_growing".into()],
                vec![o.id.to_owned()],
            )
        })
    }

    /// A pass on probation: its weight grows after a run of them, and a longer run (once grown)
    /// ends probation.
    fn probation_passed(&self, o: &Outcome<'_>, passes: u16) -> Option<Change> {
        let now = self.now;
        let t = &self.endpoints[o.endpoint];
        let w = probation_weight(&self.policy, t.out_for());
        // Slow first tokens are not a matter of chance: a few fast ones in a row show
        // them gone. A share of failed calls is: it takes a long run of passes.
        let needed = probation_passes(t, &self.policy);
        let grown = t.ramp_until().is_none_or(|r| r <= now);
        if t.probation_growing() {
            return (passes >= needed && grown).then(|| {
                Change::new(
                    Entry::InRotation(InRotation::Healthy),
                    ReasonCode::Recovered,
                    format!("probation over: {passes} passing outcomes in a row and its weight grown to full"),
                    vec![format!("probation_passes>={needed}")],
                    vec![o.id.to_owned()],
                )
            });
        }
        // Slow first tokens end it through slow start; a share of failed calls only
        // through a growth that held (however long the run that ends it).
        if passes >= needed && t.out_for() == Some(Dimension::Ttft) {
            return Some(Change::new(
                Entry::Recovering { probation: false },
                ReasonCode::ProbationOver,
                format!(
                    "probation over: {passes} passing outcomes in a row; slow start over {} s",
                    self.policy.slow_start_ms / 1000
                ),
                vec![format!("probation_passes>={needed}")],
                vec![o.id.to_owned()],
            ));
        }
        t.probation_grows(now).map(|(threshold, span)| {
            let over = if span >= us(1_000) {
                format!(" over {:.0} s", span as f64 / 1e6)
            } else {
                String::new()
            };
            Change::new(
                Entry::Probation { growing: true },
                ReasonCode::ProbationGrowing,
                format!(
                    "{passes} passing outcomes in a row on probation{over}; its weight grows from {w} to full over {} s while they go on passing, and {needed} end probation",
                    PROBATION_RAMP_MS / 1000
                ),
                vec![threshold],
                vec![o.id.to_owned()],
            )
        })
    }

    /// An outcome while the endpoint is out. Every one is evidence: after the minimum isolation
    /// the first passing one that can see what the endpoint is out for readmits it (two in a row
    /// for a flapping endpoint); one that cannot see it readmits it as a canary. A call after
    /// the isolation is the router's trial. A failure says the fault is still there and starts
    /// the count again; only a failed trial call is a transition (it carries the next trial's time).
    /// `passes`: the passing evidence in a row, this outcome counted.
    fn while_out(
        &self,
        o: &Outcome<'_>,
        class: OutcomeClass,
        dim: Dimension,
        verdict: Verdict,
        passes: u16,
    ) -> Option<Change> {
        let now = self.now;
        let policy = &self.policy;
        let t = &self.endpoints[o.endpoint];
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
            Verdict::Fail => trial.then(|| {
                Change::new(
                    Entry::TrialFailed(self.trial_key(o.endpoint)),
                    ReasonCode::TrialFailed,
                    format!("trial after isolation failed ({})", class.as_str()),
                    vec!["trial_failed".into()],
                    vec![o.id.to_owned()],
                )
            }),
            Verdict::Pass | Verdict::Canary => {
                let canary = verdict == Verdict::Canary;
                let isolation_over = t.isolated_until().is_none_or(|u| u <= now);
                // A flap, a failure-rate ejection, or evidence that cannot see the fault: on
                // probation.
                let probation = canary || dim == Dimension::ErrorRate || t.isolations() >= 2;
                let w = probation_weight(policy, Some(dim));
                let back = if probation {
                    let needed = if dim == Dimension::Ttft {
                        format!("{} calls in a row have fast first tokens", policy.consecutive_successes)
                    } else {
                        format!("{} outcomes in a row pass", probation_passes(t, policy))
                    };
                    format!("on probation at weight {w} until {needed}; real calls decide")
                } else {
                    format!("slow start over {} s", policy.slow_start_ms / 1000)
                };
                let (code, reason, thresholds) = if trial {
                    let reason = format!("trial after isolation succeeded; {back}");
                    (ReasonCode::TrialSucceeded, reason, vec!["trial_succeeded".into()])
                } else if t.readmittable(now, policy) && passes >= t.passes_needed() && (!canary || isolation_over) {
                    let out_s = now.saturating_sub(t.last_isolated_at().unwrap_or(now)) / 1_000_000;
                    let reason = if canary {
                        format!(
                            "{what} passed after {out_s} s out but cannot see {}: readmitted {back}",
                            dim.as_str()
                        )
                    } else {
                        format!(
                            "{what} passed after {out_s} s out (ejected for {}); readmitted, {back}",
                            dim.as_str()
                        )
                    };
                    let thresholds = vec![
                        format!("passing_evidence>={passes}"),
                        format!("out>={}ms", policy.readmit_min_ms),
                    ];
                    let code = if probation {
                        ReasonCode::Probation
                    } else {
                        ReasonCode::Readmitted
                    };
                    (code, reason, thresholds)
                } else {
                    return None;
                };
                Some(Change::new(
                    Entry::Recovering { probation },
                    code,
                    reason,
                    thresholds,
                    vec![o.id.to_owned()],
                ))
            }
        }
    }

    /// What the reason of an isolation until `retry_at` announces: when and on what evidence the
    /// endpoint can come back, as the rules of this module will apply them.
    pub(super) fn what_readmits(&self, name: &str, retry_at: Micros) -> String {
        let t = &self.endpoints[name];
        let policy = &self.policy;
        let secs = |us: Micros| (us.max(0) as f64 / 1e6).round() as i64;
        let iso = secs(retry_at.saturating_sub(self.now));
        let min = policy.readmit_min_ms / 1000;
        let w = probation_weight(policy, t.out_for());
        if t.cooling() {
            return format!("back at slow start in {iso} s");
        }
        // The subject and its verb agree: "a passing probe or call readmits", "two ... readmit".
        let passes = if t.passes_needed() > 1 {
            "two passing probes or calls readmit"
        } else {
            "a passing probe or call readmits"
        };
        let probation = t.isolations() >= 2;
        let on = |p: bool| {
            if p {
                format!(", on probation at weight {w}")
            } else {
                String::new()
            }
        };
        let evidence = match t.out_for().unwrap_or(Dimension::Errors) {
            Dimension::Errors => format!("{passes} it after {min} s{}", on(probation)),
            Dimension::ErrorRate => format!("{passes} it after {min} s{}", on(true)),
            Dimension::Ttft => format!(
                "a call or completion probe with a fast first token readmits it after {min} s{}; a health probe only after {iso} s, on probation at weight {w}",
                on(probation)
            ),
            Dimension::Heartbeat => format!("heartbeats readmit it after {min} s{}", on(probation)),
            Dimension::Dependency => {
                format!("a probe reporting its dependencies up readmits it after {min} s{}", on(probation))
            }
            Dimension::RateLimit => format!("back at slow start in {iso} s"),
        };
        format!("out: {evidence}; the router's trial is due in {iso} s")
    }

    /// Slow start is over when its ramp has run and the latest outcomes passed (never on
    /// probation).
    pub(super) fn recovery_complete(&self, name: &str) -> Option<Change> {
        let t = &self.endpoints[name];
        let m = self.policy.consecutive_successes as u32;
        let ramped = t.ramp_until().is_none_or(|r| r <= self.now);
        (t.consecutive_successes() >= m && !t.probation() && ramped).then(|| {
            Change::new(
                Entry::InRotation(InRotation::Healthy),
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
