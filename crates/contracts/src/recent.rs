//! Ids seen lately, so that a report sent twice is taken once: each id remembered for a window of
//! time, at most `cap` of them (the oldest forgotten first: under a flood the window is shorter,
//! never the memory larger). An id is held as its 64-bit FNV-1a hash with the time it was seen.
//! The engine's pools keep one in stream time (and in their snapshots); the OTLP receiver one in
//! wall time, for span ids.

use crate::hash::fnv64;
use crate::Micros;
use std::collections::VecDeque;

#[derive(Debug, Clone, PartialEq)]
pub struct RecentIds {
    window: Micros,
    cap: usize,
    /// (seen at, hash of the id), oldest first.
    order: VecDeque<(Micros, u64)>,
    /// The same entries by hash.
    at: rustc_hash::FxHashMap<u64, Micros>,
}

impl RecentIds {
    /// Remember ids for `window`, at most `cap` of them (0: none, every id is new).
    pub fn new(window: Micros, cap: usize) -> RecentIds {
        RecentIds {
            window,
            cap,
            order: VecDeque::new(),
            at: Default::default(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.order.is_empty()
    }

    pub fn len(&self) -> usize {
        self.order.len()
    }

    /// Whether `id` was seen within the window before `now`.
    pub fn contains(&self, id: &str, now: Micros) -> bool {
        self.at
            .get(&fnv64(id.as_bytes()))
            .is_some_and(|at| now - *at < self.window)
    }

    /// Remember `id`, seen at `now`; false if it was seen within the window already. What fell
    /// out of the window or over the cap is forgotten first.
    pub fn first(&mut self, id: &str, now: Micros) -> bool {
        if self.cap == 0 {
            return true;
        }
        while let Some(&(at, h)) = self.order.front() {
            if now - at < self.window && self.order.len() < self.cap {
                break;
            }
            self.order.pop_front();
            self.at.remove(&h);
        }
        let h = fnv64(id.as_bytes());
        // One probe of the table for both the question and the insert.
        match self.at.entry(h) {
            std::collections::hash_map::Entry::Occupied(_) => false,
            std::collections::hash_map::Entry::Vacant(v) => {
                v.insert(now);
                self.order.push_back((now, h));
                true
            }
        }
    }

    /// The entries (seen at, hash), oldest first: what a snapshot keeps.
    pub fn entries(&self) -> impl Iterator<Item = (Micros, u64)> + '_ {
        self.order.iter().copied()
    }

    /// Add an entry read back from [`RecentIds::entries`] (a repeated hash is skipped).
    pub fn restore(&mut self, at: Micros, h: u64) {
        if self.at.insert(h, at).is_none() {
            self.order.push_back((at, h));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Micros = 1_000_000;

    #[test]
    fn an_id_is_first_once_within_the_window_and_the_cap() {
        let mut r = RecentIds::new(120 * S, 3);
        assert!(r.first("a", 0));
        assert!(!r.first("a", S));
        assert!(r.contains("a", S) && !r.contains("a", 120 * S));
        assert!(r.first("a", 120 * S), "out of the window: new again");
        for id in ["b", "c", "d"] {
            assert!(r.first(id, 120 * S));
        }
        assert_eq!(r.len(), 3, "never over the cap");
        assert!(r.first("a", 120 * S), "over the cap, the oldest is forgotten");
        let mut off = RecentIds::new(120 * S, 0);
        assert!(off.first("x", 0) && off.first("x", 0) && off.is_empty(), "off");
    }
}
