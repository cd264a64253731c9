//! Late evidence and reporters' clocks: one rule for every kind of report (a call, a summary, a
//! probe), whatever its outcome.
//!
//! A report's *lateness* is the stream time it arrives at less the time its calls ended by its
//! reporter's clock (a call's or a probe's start plus its latency, a summary's end), less the
//! reporter's measured clock offset. A report later than the pool's window is set aside whole:
//! its successes and its failures alike, counted, and named in the next decision about its
//! endpoint. A report in time is applied at its arrival, as always.
//!
//! A reporter's clock is measured in slots of [`SLOT_US`] of stream time: the least lateness of
//! its reports in a slot is how far its clock is off, since its fastest report took next to no
//! time to arrive. When [`SLOTS_TO_NAME`] slots in a row find it off by more than [`OFF_US`] and
//! agree within [`AGREE_US`], the reporter's clock is off: the pool names it in an event and
//! its reports are shifted by the measured offset from then on. Until then its reports are
//! judged as they are stamped, so a reporter whose clock is behind has its evidence set aside as
//! a whole, then applied as a whole, never half of it. A backlog draining is no clock: its least
//! lateness falls from slot to slot, and its old reports are late.
//!
//! In the engine the time a report arrives at is stream time, and all of it is a function of the
//! records, so a replay decides the same. The merge stage measures its gateways' clocks against
//! its own, to shift a skewed gateway's summaries before it merges them.

use crate::Micros;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// A slot of stream time in which a reporter's least lateness is taken.
pub const SLOT_US: Micros = 10_000_000;
/// A slot whose least lateness is further than this from 0 finds the reporter's clock off.
pub const OFF_US: Micros = 10_000_000;
/// Slots finding the clock off agree when their least latenesses are this close.
pub const AGREE_US: Micros = 5_000_000;
/// Slots in a row that must agree before a clock is named off (30 s of reports).
pub const SLOTS_TO_NAME: u8 = 3;
/// Reporters whose clocks a pool measures; one not measured is judged as stamped. When full, the
/// reporter heard from least lately gives way (gateways come and go with their pods).
pub const MAX_CLOCKS: usize = 256;

/// Who stamps a report: a gateway (calls and summaries) or a prober (probes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Gateway,
    Prober,
}

impl Kind {
    fn as_str(self) -> &'static str {
        match self {
            Kind::Gateway => "gateway",
            Kind::Prober => "prober",
        }
    }
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Clocks {
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    gateways: BTreeMap<String, Clock>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    probers: BTreeMap<String, Clock>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Clock {
    /// The slot of stream time `least` is for.
    slot: i64,
    /// The least lateness (as stamped) of the reporter's reports in `slot`.
    least: Micros,
    /// Finished slots in a row that found the clock off, agreeing; the last of their leasts.
    off_slots: u8,
    last_off: Micros,
    /// The offset its reports are shifted by: 0 while its clock is not known to be off.
    offset: Micros,
}

/// A reporter's clock (`gateway=g1`, `prober=p1`) named off (by `offset` µs: positive is
/// behind), or back in time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClockChange {
    Off { reporter: String, offset: Micros },
    Back { reporter: String },
}

impl ClockChange {
    /// One line a person can read, for the pool's event.
    pub fn reason(&self) -> String {
        match self {
            ClockChange::Off { reporter, offset } => format!(
                "reporter {reporter}'s clock is {} s {} stream time: its reports are shifted by its offset",
                offset.unsigned_abs() / 1_000_000,
                if *offset > 0 { "behind" } else { "ahead of" }
            ),
            ClockChange::Back { reporter } => {
                format!("reporter {reporter}'s clock is in time again: its reports are taken as stamped")
            }
        }
    }
}

impl Clocks {
    pub fn is_empty(&self) -> bool {
        self.gateways.is_empty() && self.probers.is_empty()
    }

    /// A report of `name` stamped `stamp` (when its calls ended, by its clock), arriving at
    /// stream time `now`: its lateness after the reporter's offset, and the reporter's clock
    /// named off or back when a slot it finished says so. A report that names no reporter is
    /// judged as stamped.
    pub fn judge(&mut self, kind: Kind, name: &str, stamp: Micros, now: Micros) -> (Micros, Option<ClockChange>) {
        let (lateness, offset, change) = self.judge_offset(kind, name, stamp, now);
        (lateness.saturating_sub(offset), change)
    }

    /// As [`Clocks::judge`], with the lateness as stamped and the offset apart (one look-up where
    /// a merger would make two: the judgement, then [`Clocks::offset`]).
    pub fn judge_offset(
        &mut self,
        kind: Kind,
        name: &str,
        stamp: Micros,
        now: Micros,
    ) -> (Micros, Micros, Option<ClockChange>) {
        let lateness = now.saturating_sub(stamp);
        if name.is_empty() {
            return (lateness, 0, None);
        }
        let slot = now.div_euclid(SLOT_US);
        let reporters = match kind {
            Kind::Gateway => &mut self.gateways,
            Kind::Prober => &mut self.probers,
        };
        if let Some(c) = reporters.get_mut(name) {
            let mut change = None;
            if slot > c.slot {
                change = c.finish_slot().map(|off| match off {
                    Some(offset) => ClockChange::Off {
                        reporter: crate::scope::name(kind.as_str(), name),
                        offset,
                    },
                    None => ClockChange::Back {
                        reporter: crate::scope::name(kind.as_str(), name),
                    },
                });
                c.slot = slot;
                c.least = lateness;
            } else {
                c.least = c.least.min(lateness);
            }
            return (lateness, c.offset, change);
        }
        if reporters.len() >= MAX_CLOCKS {
            let Some(oldest) = reporters
                .iter()
                .min_by_key(|(_, c)| c.slot)
                .filter(|(_, c)| c.slot < slot)
                .map(|(r, _)| r.clone())
            else {
                return (lateness, 0, None);
            };
            reporters.remove(&oldest);
        }
        reporters.insert(
            name.to_owned(),
            Clock {
                slot,
                least: lateness,
                off_slots: 0,
                last_off: 0,
                offset: 0,
            },
        );
        (lateness, 0, None)
    }

    /// The offset `name`'s reports are shifted by (0: its clock is not known to be off).
    pub fn offset(&self, kind: Kind, name: &str) -> Micros {
        let reporters = match kind {
            Kind::Gateway => &self.gateways,
            Kind::Prober => &self.probers,
        };
        reporters.get(name).map_or(0, |c| c.offset)
    }

    /// The reporters whose clocks are named off (`gateway=g1`), with their offsets.
    pub fn off(&self) -> impl Iterator<Item = (String, Micros)> + '_ {
        let named = |kind: Kind| {
            move |(r, c): (&String, &Clock)| (c.offset != 0).then(|| (crate::scope::name(kind.as_str(), r), c.offset))
        };
        self.gateways
            .iter()
            .filter_map(named(Kind::Gateway))
            .chain(self.probers.iter().filter_map(named(Kind::Prober)))
    }
}

impl Clock {
    /// The slot is over: Some(Some(offset)) when it names the clock off (anew or by another
    /// offset), Some(None) when it finds a clock named off in time again.
    fn finish_slot(&mut self) -> Option<Option<Micros>> {
        let m = self.least;
        if m.saturating_abs() <= OFF_US {
            self.off_slots = 0;
            if self.offset != 0 {
                self.offset = 0;
                return Some(None);
            }
            return None;
        }
        let agrees = self.off_slots > 0 && m.abs_diff(self.last_off) <= AGREE_US as u64;
        self.off_slots = if agrees { self.off_slots.saturating_add(1) } else { 1 };
        self.last_off = m;
        if self.off_slots < SLOTS_TO_NAME {
            return None;
        }
        let known = self.offset != 0 && m.abs_diff(self.offset) <= AGREE_US as u64;
        self.offset = m;
        (!known).then_some(Some(m))
    }
}

/// Reports of an endpoint set aside as late: those of the current window-long slot of stream
/// time and of the one before (a decision names them: up to two windows' worth).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Late {
    slot: i64,
    now: u64,
    before: u64,
}

impl Late {
    pub fn add(&mut self, now: Micros, window: Micros, n: u64) {
        let slot = now.div_euclid(window.max(1));
        self.roll(slot);
        self.now += n;
    }

    /// Late reports in this slot and the one before, as of stream time `now`.
    pub fn count(&self, now: Micros, window: Micros) -> u64 {
        let slot = now.div_euclid(window.max(1));
        match slot - self.slot {
            0 => self.now + self.before,
            1 => self.now,
            _ => 0,
        }
    }

    fn roll(&mut self, slot: i64) {
        match slot - self.slot {
            0 => {}
            1 => {
                self.before = self.now;
                self.now = 0;
            }
            _ => {
                self.before = 0;
                self.now = 0;
            }
        }
        self.slot = slot;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Micros = 1_000_000;
    const T0: Micros = 1_700_000_000 * S;

    /// Reports every second for `secs` seconds from `from`, stamped `behind` before their arrival.
    fn feed(c: &mut Clocks, from: Micros, secs: i64, behind: Micros) -> (Vec<Micros>, Vec<ClockChange>) {
        let mut late = Vec::new();
        let mut changes = Vec::new();
        for k in 0..secs {
            let now = from + k * S;
            let (l, ch) = c.judge(Kind::Gateway, "g", now - behind, now);
            late.push(l);
            changes.extend(ch);
        }
        (late, changes)
    }

    #[test]
    fn a_clock_behind_is_named_after_three_slots_and_its_reports_shifted() {
        let mut c = Clocks::default();
        let (late, changes) = feed(&mut c, T0, 60, 90 * S);
        // As stamped for the first three slots; the first report after them names the clock,
        // and it and the rest are shifted.
        assert!(late[..30].iter().all(|l| *l == 90 * S), "{late:?}");
        assert!(late[30..].iter().all(|l| *l == 0), "{late:?}");
        assert_eq!(
            changes,
            vec![ClockChange::Off {
                reporter: "gateway=g".into(),
                offset: 90 * S
            }]
        );
        assert_eq!(c.off().collect::<Vec<_>>(), vec![("gateway=g".to_owned(), 90 * S)]);
        // Its clock put right: the next slot finds it in time, and reports are as stamped.
        let (late, changes) = feed(&mut c, T0 + 60 * S, 20, 0);
        assert_eq!(
            changes,
            vec![ClockChange::Back {
                reporter: "gateway=g".into()
            }]
        );
        assert_eq!(*late.last().unwrap(), 0);
        assert_eq!(c.off().count(), 0);
    }

    #[test]
    fn a_clock_ahead_is_named_too() {
        let mut c = Clocks::default();
        let (_, changes) = feed(&mut c, T0, 45, -30 * S);
        assert_eq!(
            changes,
            vec![ClockChange::Off {
                reporter: "gateway=g".into(),
                offset: -30 * S
            }]
        );
        assert!(
            changes[0].reason().contains("30 s ahead of stream time"),
            "{}",
            changes[0].reason()
        );
    }

    /// A backlog of 90 s drained over 30 s: its least lateness falls slot by slot, so no clock is
    /// named and the old reports stay late.
    #[test]
    fn a_draining_backlog_is_late_not_a_clock() {
        let mut c = Clocks::default();
        let mut changes = Vec::new();
        let mut late = Vec::new();
        for k in 0..60 {
            let now = T0 + k * S;
            // Stamps catch up three seconds a second until they are in time.
            let stamp = (T0 - 90 * S + 3 * k * S).min(now);
            let (l, ch) = c.judge(Kind::Gateway, "g", stamp, now);
            late.push(l);
            changes.extend(ch);
        }
        assert!(changes.is_empty(), "{changes:?}");
        assert_eq!(late[0], 90 * S);
        assert_eq!(*late.last().unwrap(), 0);
    }

    /// A clock that jitters within the agreement still counts as one offset; a single slow
    /// slot among fast ones names nothing.
    #[test]
    fn one_slow_slot_names_nothing() {
        let mut c = Clocks::default();
        let (_, a) = feed(&mut c, T0, 10, 0);
        let (_, b) = feed(&mut c, T0 + 10 * S, 10, 40 * S);
        let (_, d) = feed(&mut c, T0 + 20 * S, 30, 0);
        assert!(a.is_empty() && b.is_empty() && d.is_empty());
    }

    #[test]
    fn the_reporter_heard_from_least_lately_gives_way_when_full() {
        let mut c = Clocks::default();
        for i in 0..MAX_CLOCKS as i64 {
            c.judge(Kind::Gateway, &format!("g{i}"), T0 + i * S, T0 + i * SLOT_US);
        }
        let now = T0 + MAX_CLOCKS as i64 * SLOT_US;
        c.judge(Kind::Gateway, "new", now, now);
        assert_eq!(c.gateways.len(), MAX_CLOCKS);
        assert!(!c.gateways.contains_key("g0") && c.gateways.contains_key("new"));
    }

    #[test]
    fn late_counts_cover_this_window_and_the_last() {
        let mut l = Late::default();
        let w = 30 * S;
        l.add(T0, w, 3);
        l.add(T0 + w, w, 2);
        assert_eq!(l.count(T0 + w, w), 5);
        assert_eq!(l.count(T0 + 2 * w, w), 2);
        assert_eq!(l.count(T0 + 3 * w, w), 0);
    }
}
