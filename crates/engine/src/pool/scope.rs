//! Scoped health: whose fault a failure is (docs/decisions.md, "Scoped health").
//!
//! Each endpoint keeps a [`Book`] of who reported its calls: per scope (`gateway=g1`,
//! `location=eu`, `key=k1`; probes are not in it: a health route that answers while calls fail
//! says nothing of whose the failures are) the calls and failures of the last window, in two
//! half-window epochs. At most [`TRACKED`] scopes are kept exactly, those with the most failures;
//! the others are in the endpoint's total only, so the book does not grow with the fleet.
//!
//! **Attribution.** A scope's failures are its own when it holds at least [`SHARE`] of the
//! endpoint's failures, at least `hard_break_after` of them (3 or more), and the rest of the
//! endpoint's reporters (at least `min_volume` calls) fail significantly less: the upper Wilson
//! bound (z = [`Z`]) of the rest's failure rate is below the lower bound of the scope's. This is
//! tested over the window and over the scope's current run of failures against the rest's
//! calls since the run began (at a fault's start the window is still full of passing calls). A fault every
//! reporter sees spreads its failures as the traffic is spread, so no scope holds them.
//!
//! **Decisions.** A run of `consecutive_failures` in a scope whose failures are its own takes
//! the endpoint out for that scope only; so does a fleet rule that fires on failures that are
//! one scope's (the fleet change is not made). A scoped decision is published with its scope,
//! the endpoint's seq and a trial time; the scope's next call after it is its trial: a pass
//! ends the decision, a failure doubles the isolation. A fleet transition out of rotation ends
//! every scoped decision of the endpoint. A gateway out on most of the pool is a faulty
//! reporter: a pool event names it, and its calls are set aside for fleet decisions.

use super::{Change, PoolState};
use crate::endpoint::us;
use crate::Decision;
use serde::{Deserialize, Serialize};
use vitals_contracts::{HealthChanged, HealthState, Micros, Policy, ReasonCode};

/// Scopes per endpoint kept exactly.
pub(crate) const TRACKED: usize = 8;
/// The share of an endpoint's failures a scope must hold for them to be its own.
pub(crate) const SHARE: f64 = 0.8;
/// Width of the Wilson bounds that compare a scope with the rest.
pub(crate) const Z: f64 = 2.5;
/// A gateway out on at least this many endpoints, and half the pool, is a faulty reporter.
const FAULTY_MIN: usize = 2;

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Counts {
    pub calls: u32,
    pub failures: u32,
}

impl Counts {
    fn add(&mut self, calls: u64, failures: u64) {
        self.calls = self.calls.saturating_add(u32::try_from(calls).unwrap_or(u32::MAX));
        self.failures = self
            .failures
            .saturating_add(u32::try_from(failures).unwrap_or(u32::MAX));
    }

    fn plus(self, o: Counts) -> Counts {
        Counts {
            calls: self.calls.saturating_add(o.calls),
            failures: self.failures.saturating_add(o.failures),
        }
    }

    fn minus(self, o: Counts) -> Counts {
        Counts {
            calls: self.calls.saturating_sub(o.calls),
            failures: self.failures.saturating_sub(o.failures),
        }
    }

    fn bounds(self) -> (f64, f64) {
        super::peers::wilson(u64::from(self.failures), u64::from(self.calls), Z)
    }
}

/// One scope's calls to the endpoint.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Seen {
    scope: String,
    /// This epoch's and the last one's.
    counts: [Counts; 2],
    /// Failures in a row.
    run: u32,
    /// The book's calls and failures ([`Book::all`]) before the run began: the rest's since
    /// are what the run is compared with.
    #[serde(default)]
    run_base: (u64, u64),
    /// When its last scoped decision ended: its failures before are stale.
    back_at: Option<Micros>,
}

impl Seen {
    fn total(&self) -> Counts {
        self.counts[0].plus(self.counts[1])
    }
}

/// A scoped decision in force: the endpoint is out for `scope`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct Out {
    pub scope: String,
    pub retry_at: Micros,
    pub isolations: u32,
}

/// Who reported an endpoint's calls, and the scoped decisions in force for it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub(crate) struct Book {
    /// Calls and failures ever recorded (wrapping): where a scope's run began.
    #[serde(default)]
    all: (u64, u64),
    epoch: u32,
    total: [Counts; 2],
    seen: Vec<Seen>,
    pub out: Vec<Out>,
}

/// One scope's failures against the rest's: the evidence of a scoped decision.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Split {
    pub scope: Counts,
    pub rest: Counts,
}

impl Split {
    pub fn thresholds(&self, scope: &str) -> Vec<String> {
        vec![
            format!("{scope}:failed={}/{}", self.scope.failures, self.scope.calls),
            format!("rest:failed={}/{}", self.rest.failures, self.rest.calls),
            format!("share>={SHARE},wilson_z={Z}"),
        ]
    }
}

/// The fewest failures a scope's own are: as few as break an endpoint (the hard break), at
/// least 3.
fn min_failures(policy: &Policy) -> u32 {
    policy.hard_break_after.min(policy.consecutive_failures).max(3) as u32
}

fn epoch_us(policy: &Policy) -> i64 {
    us(policy.window_ms / 2).max(1)
}

/// The order among scopes equally to blame: the narrowest first.
fn rank(scope: &str) -> u8 {
    match scope.split_once('=').map(|(k, _)| k) {
        Some("gateway") => 0,
        Some("key") => 1,
        _ => 2,
    }
}

impl Book {
    /// Move to the epoch of `now`: an epoch later, the current becomes the last; more, both empty.
    fn roll(&mut self, now: Micros, policy: &Policy) {
        let e = u32::try_from(now.max(0) / epoch_us(policy)).unwrap_or(u32::MAX);
        if e == self.epoch {
            return;
        }
        let shift = |c: &mut [Counts; 2]| {
            *c = if e == self.epoch.wrapping_add(1) {
                [Counts::default(), c[0]]
            } else {
                [Counts::default(); 2]
            };
        };
        shift(&mut self.total);
        for s in &mut self.seen {
            shift(&mut s.counts);
        }
        self.epoch = e;
        let out = &self.out;
        self.seen
            .retain(|s| s.total().calls > 0 || out.iter().any(|o| o.scope == s.scope));
    }

    /// `calls` of the scopes `scopes`, `failures` of them failing, the last `trailing` in a row.
    pub fn record(
        &mut self,
        now: Micros,
        policy: &Policy,
        scopes: &[String],
        calls: u64,
        failures: u64,
        trailing: u64,
    ) {
        self.roll(now, policy);
        self.total[0].add(calls, failures);
        let before = self.all;
        self.all = (self.all.0.wrapping_add(calls), self.all.1.wrapping_add(failures));
        let successes = calls.saturating_sub(failures);
        for scope in scopes {
            let i = match self.seen.iter().position(|s| &s.scope == scope) {
                Some(i) => i,
                None => {
                    if self.seen.len() >= TRACKED {
                        // Keep the scopes with the most failures: one that has fewer than this
                        // call makes room (its calls stay in the total); a call that passed
                        // is in the total only.
                        let out = &self.out;
                        let weakest = self
                            .seen
                            .iter()
                            .enumerate()
                            .filter(|(_, s)| !out.iter().any(|o| o.scope == s.scope))
                            .min_by_key(|(_, s)| (s.total().failures, s.total().calls))
                            .map(|(i, s)| (i, s.total().failures));
                        match weakest {
                            Some((i, f)) if u64::from(f) < failures => {
                                self.seen.swap_remove(i);
                            }
                            _ => continue,
                        }
                    }
                    // One at a time: most endpoints hear from a few reporters.
                    self.seen.reserve_exact(1);
                    self.seen.push(Seen {
                        scope: scope.clone(),
                        counts: [Counts::default(); 2],
                        run: 0,
                        run_base: before,
                        back_at: None,
                    });
                    self.seen.len() - 1
                }
            };
            let s = &mut self.seen[i];
            s.counts[0].add(calls, failures);
            if successes > 0 || s.run == 0 {
                s.run_base = before;
            }
            s.run = if successes > 0 {
                u32::try_from(trailing).unwrap_or(u32::MAX)
            } else {
                s.run.saturating_add(u32::try_from(failures).unwrap_or(u32::MAX))
            };
        }
    }

    /// The split of `scope` against the rest, if its failures are its own (see the module's
    /// notes): over the window, or over its current run of failures (a fault that has just
    /// begun, the window still full of its passing calls from before).
    fn attributable(&self, s: &Seen, policy: &Policy) -> Option<Split> {
        let own = |mine: Counts, all: Counts| {
            let rest = all.minus(mine);
            let enough = mine.failures >= min_failures(policy)
                && f64::from(mine.failures) >= SHARE * f64::from(all.failures)
                && rest.calls >= policy.min_volume.max(1) as u32;
            (enough && rest.bounds().1 < mine.bounds().0).then_some(Split { scope: mine, rest })
        };
        let since = |n: u64, base: u64| u32::try_from(n.wrapping_sub(base)).unwrap_or(u32::MAX);
        let run = Counts {
            calls: s.run,
            failures: s.run,
        };
        let all_since_run = Counts {
            calls: since(self.all.0, s.run_base.0),
            failures: since(self.all.1, s.run_base.1),
        };
        own(s.total(), self.total[0].plus(self.total[1])).or_else(|| own(run, all_since_run))
    }

    /// The scope most to blame for the endpoint's failures, of those `which` allows.
    fn blame(&self, policy: &Policy, which: impl Fn(&Seen) -> bool) -> Option<(String, Split)> {
        self.seen
            .iter()
            .filter(|s| which(s))
            .filter_map(|s| self.attributable(s, policy).map(|split| (s, split)))
            .max_by(|(a, x), (b, y)| {
                x.scope
                    .bounds()
                    .0
                    .total_cmp(&y.scope.bounds().0)
                    .then(rank(&b.scope).cmp(&rank(&a.scope)))
                    .then(b.scope.cmp(&a.scope))
            })
            .map(|(s, split)| (s.scope.clone(), split))
    }

    /// Whether one scope holds most of the failures while the rest pass: attribution is
    /// pending (a suspicion waits for it).
    fn pending(&self, policy: &Policy) -> bool {
        let total = self.total[0].plus(self.total[1]);
        total.failures > 0
            && self.seen.iter().any(|s| {
                let mine = s.total();
                let rest = total.minus(mine);
                f64::from(mine.failures) >= SHARE * f64::from(total.failures)
                    && rest.calls >= policy.min_volume.max(1) as u32
                    && rest.bounds().1 < policy.failure_rate_threshold
            })
    }

    /// Whether one scope's run of failures holds the endpoint's failures since it began while
    /// the rest's calls since all passed, too few yet to compare: the fleet change waits for
    /// them (a fault every reporter sees fails the rest's calls too, and is not held).
    fn run_pending(&self) -> bool {
        self.seen.iter().filter(|s| s.run > 0).any(|s| {
            let calls = self.all.0.wrapping_sub(s.run_base.0);
            let failures = self.all.1.wrapping_sub(s.run_base.1);
            failures == u64::from(s.run) && calls > failures
        })
    }

    fn is_out(&self, scope: &str) -> bool {
        self.out.iter().any(|o| o.scope == scope)
    }

    fn seen(&self, scope: &str) -> Option<&Seen> {
        self.seen.iter().find(|s| s.scope == scope)
    }

    /// Bytes of this book in memory.
    pub fn bytes(&self) -> usize {
        std::mem::size_of::<Book>()
            + self.seen.capacity() * std::mem::size_of::<Seen>()
            + self.seen.iter().map(|s| s.scope.capacity()).sum::<usize>()
            + self.out.capacity() * std::mem::size_of::<Out>()
            + self.out.iter().map(|o| o.scope.capacity()).sum::<usize>()
    }
}

/// What a reported outcome was for its scopes.
pub(super) struct Reported<'a> {
    pub endpoint: &'a str,
    pub id: &'a str,
    pub scopes: &'a [String],
    pub calls: u64,
    pub failures: u64,
    pub trailing: u64,
}

impl Reported<'_> {
    /// It passed: its last outcome was a success.
    fn passed(&self) -> bool {
        self.calls > self.failures && self.trailing == 0
    }
}

/// The thresholds of the fleet rules that count failures (the ones attribution can explain).
fn counts_failures(thresholds: &[String]) -> bool {
    !thresholds.is_empty()
        && thresholds.iter().all(|t| {
            ["consecutive_", "failure_rate", "score<", "ejection_refused"]
                .iter()
                .any(|p| t.starts_with(p))
        })
}

impl PoolState {
    /// Whether `gateway`'s calls are set aside for fleet decisions (a faulty reporter).
    pub(super) fn set_aside(&self, scopes: &[String]) -> bool {
        !self.faulty.is_empty() && scopes.iter().any(|s| self.faulty.contains(s))
    }

    /// Record what `r`'s scopes reported, then their scoped decisions: a trial's verdict, or a
    /// run of failures that are the scope's own.
    pub(super) fn scoped(&mut self, r: &Reported<'_>, out: &mut Vec<Decision>) {
        if r.scopes.is_empty() || r.calls == 0 {
            return;
        }
        let (now, policy) = (self.now, &self.policy);
        let book = match self.books.get_mut(r.endpoint) {
            Some(b) => b,
            None => self.books.entry(r.endpoint.to_owned()).or_default(),
        };
        book.record(now, policy, r.scopes, r.calls, r.failures, r.trailing);
        // Most calls pass with nothing out for their scopes: no decision to take.
        if r.failures == 0 && book.out.is_empty() {
            return;
        }
        self.scoped_decisions(r, out);
    }

    /// A merged summary (vitals-merger): each reporter it lists is recorded under its scopes,
    /// the calls of everyone else under none (they are the rest of every comparison), and then
    /// the listed reporters' scoped decisions are taken as a call's would be.
    pub(super) fn scoped_merged(&mut self, s: &vitals_contracts::CallSummary, out: &mut Vec<Decision>) {
        let listed = s.reporters.as_deref().unwrap_or_default();
        let count = |n: i64| u64::try_from(n).unwrap_or(0);
        let failures = count(s.failures());
        let calls = failures + count(s.calls.success);
        let (now, policy) = (self.now, &self.policy);
        let book = match self.books.get_mut(s.endpoint.as_str()) {
            Some(b) => b,
            None => self.books.entry(s.endpoint.clone()).or_default(),
        };
        let (mut rest_calls, mut rest_failures) = (calls, failures);
        for r in listed.iter().filter(|r| r.calls > 0) {
            let (c, f) = (count(r.calls), count(r.failures));
            book.record(now, policy, &r.scopes, c, f, count(r.trailing_failures));
            rest_calls = rest_calls.saturating_sub(c);
            rest_failures = rest_failures.saturating_sub(f);
        }
        if rest_calls > 0 {
            book.record(now, policy, &[], rest_calls, rest_failures, 0);
        }
        for r in listed.iter().filter(|r| r.calls > 0) {
            let reported = Reported {
                endpoint: &s.endpoint,
                id: &s.summary_id,
                scopes: &r.scopes,
                calls: count(r.calls),
                failures: count(r.failures),
                trailing: count(r.trailing_failures),
            };
            self.scoped_decisions(&reported, out);
        }
    }

    /// The scoped decisions that what `r` reported (recorded) takes.
    fn scoped_decisions(&mut self, r: &Reported<'_>, out: &mut Vec<Decision>) {
        let now = self.now;
        let mut changed = false;
        for scope in r.scopes {
            let book = &self.books[r.endpoint];
            let Some(i) = book.out.iter().position(|o| &o.scope == scope) else {
                continue;
            };
            if now < book.out[i].retry_at {
                continue; // in flight when it went out, or before its trial
            }
            changed = true;
            if r.passed() {
                self.scope_back(r.endpoint, scope, r.id, out);
            } else {
                self.scope_trial_failed(r.endpoint, i, r.id, out);
            }
        }
        // A reporter already routed away by one of its scopes (its gateway out, say) is not
        // blamed again under another (its credential, its location): the same calls.
        let routed_away = r.scopes.iter().any(|s| self.books[r.endpoint].is_out(s));
        if r.failures > 0 && !changed && !routed_away {
            let run = self.policy.consecutive_failures.max(1) as u32;
            let book = &self.books[r.endpoint];
            let mine = |s: &Seen| r.scopes.contains(&s.scope) && s.run >= run && !book.is_out(&s.scope);
            if let Some((scope, split)) = book.blame(&self.policy, mine) {
                let reason = format!(
                    "{} of {scope}'s calls failed, {} in a row, while the rest's failed {} of {}: out for {scope} only",
                    split.scope.failures,
                    book.seen(&scope).map_or(0, |s| s.run),
                    split.rest.failures,
                    split.rest.calls
                );
                self.scope_out(r.endpoint, &scope, split, ReasonCode::Ejected, reason, r.id, out);
                changed = true;
            }
        }
        if changed {
            self.faulty_reporters(out);
        }
    }

    /// Whether a fleet change of `name` is not made because the failures it is for are one
    /// scope's: the scope is taken out instead (if it is not already), or, for a suspicion, its
    /// attribution is still pending.
    pub(super) fn scope_gate(&mut self, name: &str, change: &Change, out: &mut Vec<Decision>) -> bool {
        let t = &self.endpoints[name];
        let in_rotation = matches!(
            t.state(),
            HealthState::Healthy | HealthState::Suspect | HealthState::Degraded
        );
        let automatic = matches!(
            change.code,
            ReasonCode::Ejected | ReasonCode::Degraded | ReasonCode::Suspect | ReasonCode::EjectionRefused
        );
        if !in_rotation || !automatic || t.forced().is_some() || !counts_failures(&change.thresholds) {
            return false;
        }
        let Some(book) = self.books.get(name) else {
            return false;
        };
        let window = us(self.policy.window_ms);
        let now = self.now;
        let Some((scope, split)) = book.blame(&self.policy, |_| true) else {
            return book.run_pending() || (change.to() == HealthState::Suspect && book.pending(&self.policy));
        };
        let recent = book
            .seen(&scope)
            .and_then(|s| s.back_at)
            .is_some_and(|b| now.saturating_sub(b) < window);
        if !book.is_out(&scope) && !recent {
            let reason = format!(
                "{} ({}) on {} of {scope}'s calls failing, while the rest's failed {} of {}: out for {scope} only",
                change.code.as_str(),
                change.thresholds.join(", "),
                split.scope.failures,
                split.rest.failures,
                split.rest.calls
            );
            let id = change.triggers.first().cloned().unwrap_or_default();
            self.scope_out(name, &scope, split, ReasonCode::Ejected, reason, &id, out);
            self.faulty_reporters(out);
        }
        true
    }

    /// A fleet transition out of rotation ends every scoped decision of `name`.
    pub(super) fn scopes_superseded(&mut self, name: &str, to: HealthState, out: &mut Vec<Decision>) {
        if !vitals_contracts::scope::ends_scoped(to) {
            return;
        }
        if let Some(book) = self.books.get_mut(name).filter(|b| !b.out.is_empty()) {
            book.out.clear();
            self.faulty_reporters(out);
        }
    }

    fn scoped_isolation(&self, isolations: u32) -> i64 {
        let base = self.policy.isolation_base_ms.max(1);
        let ms = base.saturating_mul(1i64 << isolations.saturating_sub(1).min(20));
        ms.min(self.policy.isolation_max_ms.max(base))
    }

    #[allow(clippy::too_many_arguments)]
    fn scope_out(
        &mut self,
        name: &str,
        scope: &str,
        split: Split,
        code: ReasonCode,
        reason: String,
        id: &str,
        out: &mut Vec<Decision>,
    ) {
        let retry_at = self.now.saturating_add(us(self.scoped_isolation(1)));
        let book = self.books.get_mut(name).expect("a book for a scope seen");
        book.out.push(Out {
            scope: scope.to_owned(),
            retry_at,
            isolations: 1,
        });
        let from = self.endpoints[name].state();
        let reason = format!(
            "{reason}; a call from {scope} is its trial in {} s",
            self.scoped_isolation(1) / 1000
        );
        self.publish_scoped(
            name,
            scope,
            (from, HealthState::Unhealthy),
            code,
            reason,
            Some(retry_at),
            split.thresholds(scope),
            id,
            out,
        );
    }

    fn scope_trial_failed(&mut self, name: &str, i: usize, id: &str, out: &mut Vec<Decision>) {
        let isolations = self.books[name].out[i].isolations.saturating_add(1);
        let ms = self.scoped_isolation(isolations);
        let retry_at = self.now.saturating_add(us(ms));
        let book = self.books.get_mut(name).expect("known book");
        let o = &mut book.out[i];
        o.isolations = isolations;
        o.retry_at = retry_at;
        let scope = o.scope.clone();
        let split = book.seen(&scope).map(|s| s.total()).unwrap_or_default();
        let reason = format!(
            "{scope}'s trial failed: out for {scope}, its next trial in {} s",
            ms / 1000
        );
        let thresholds = vec![format!("{scope}:failed={}/{}", split.failures, split.calls)];
        self.publish_scoped(
            name,
            &scope,
            (HealthState::Unhealthy, HealthState::Unhealthy),
            ReasonCode::TrialFailed,
            reason,
            Some(retry_at),
            thresholds,
            id,
            out,
        );
    }

    fn scope_back(&mut self, name: &str, scope: &str, id: &str, out: &mut Vec<Decision>) {
        let now = self.now;
        let book = self.books.get_mut(name).expect("known book");
        book.out.retain(|o| o.scope != scope);
        if let Some(s) = book.seen.iter_mut().find(|s| s.scope == scope) {
            s.back_at = Some(now);
            s.run = 0;
        }
        let to = self.endpoints[name].state();
        let reason = format!("{scope}'s trial passed: back in rotation for {scope}");
        self.publish_scoped(
            name,
            scope,
            (HealthState::Unhealthy, to),
            ReasonCode::TrialSucceeded,
            reason,
            None,
            vec![],
            id,
            out,
        );
    }

    #[allow(clippy::too_many_arguments)]
    fn publish_scoped(
        &mut self,
        name: &str,
        scope: &str,
        (from, to): (HealthState, HealthState),
        code: ReasonCode,
        reason: String,
        retry_at: Option<Micros>,
        thresholds: Vec<String>,
        id: &str,
        out: &mut Vec<Decision>,
    ) {
        let now = self.now;
        let weight = if to == HealthState::Unhealthy {
            0.0
        } else {
            self.weight(&self.endpoints[name]).0
        };
        let t = self.endpoints.get_mut(name).expect("known endpoint");
        let seq = t.next_seq() as i64;
        let evidence = self.endpoints[name].evidence(now, &self.policy, thresholds, None);
        out.push(Decision::Endpoint(Box::new(HealthChanged {
            transition_id: vitals_contracts::keys::transition_id(&self.pool, name, seq),
            weight,
            ramp_ms: 0,
            retry_at,
            reason_code: code.as_str().to_owned(),
            reason,
            evidence,
            policy_version: self.policy.version,
            trigger_ids: if id.is_empty() { vec![] } else { vec![id.to_owned()] },
            scope: Some(scope.to_owned()),
            ..HealthChanged::new(self.pool.clone(), name, seq, from, to, now)
        })));
    }

    /// Gateways out on most of the pool: when the set changes, a pool event says so.
    fn faulty_reporters(&mut self, out: &mut Vec<Decision>) {
        let total = self.endpoints.len();
        let mut counts: Vec<(&str, usize)> = Vec::new();
        for book in self.books.values() {
            for o in book.out.iter().filter(|o| o.scope.starts_with("gateway=")) {
                match counts.iter_mut().find(|(s, _)| *s == o.scope) {
                    Some((_, n)) => *n += 1,
                    None => counts.push((&o.scope, 1)),
                }
            }
        }
        let mut faulty: Vec<(String, usize)> = counts
            .into_iter()
            .filter(|(_, n)| *n >= FAULTY_MIN && n * 2 >= total)
            .map(|(s, n)| (s.to_owned(), n))
            .collect();
        faulty.sort_unstable();
        let names: Vec<String> = faulty.iter().map(|(s, _)| s.clone()).collect();
        if names == self.faulty {
            return;
        }
        let reason = if faulty.is_empty() {
            format!("faulty reporter over: {}", self.faulty.join(", "))
        } else {
            let each: Vec<String> = faulty
                .iter()
                .map(|(s, n)| format!("{s} fails to {n} of {total} endpoints"))
                .collect();
            format!(
                "faulty reporter: {} while the others' calls pass; its calls are set aside for fleet decisions",
                each.join(", ")
            )
        };
        self.faulty = names;
        self.pool_rules(out, Some(reason));
    }

    /// The scoped decisions in force for `endpoint`: (scope, trial time).
    pub fn scoped_out(&self, endpoint: &str) -> Vec<(String, Micros)> {
        self.books
            .get(endpoint)
            .map(|b| b.out.iter().map(|o| (o.scope.clone(), o.retry_at)).collect())
            .unwrap_or_default()
    }

    /// Reporters whose calls are set aside for fleet decisions.
    pub fn faulty(&self) -> &[String] {
        &self.faulty
    }

    /// Bytes of every endpoint's scope book.
    pub fn books_bytes(&self) -> usize {
        self.books
            .values()
            .map(|b| b.bytes() + std::mem::size_of::<Box<Book>>())
            .sum()
    }

    /// Bytes of the endpoint's scope book (the attribution's memory).
    pub fn book_bytes(&self, endpoint: &str) -> usize {
        self.books.get(endpoint).map_or(0, |b| b.bytes())
    }
}
