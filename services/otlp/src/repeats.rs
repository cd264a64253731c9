//! Spans this receiver reported lately, by id, so that an export sent again — every OTLP
//! exporter retries on a timeout, a 429 or a 503, so an export whose answer was lost arrives
//! twice — is reported once. Remembered for [`WINDOW`], at most `cap` of them (the oldest
//! forgotten first: under a flood the window is shorter, never the memory larger; 16 bytes an
//! id, 4 MiB at the default 262,144). Only this receiver's: a retry that reaches another replica
//! is caught by the processor for calls sent one by one (failures), whose event ids it
//! remembers per pool, and not for successes summed into a summary.

use std::collections::VecDeque;
use std::time::{Duration, Instant};
use vitals_contracts::hash::fnv64;

/// How long a span id is remembered: past the exporters' 10 s timeout and their backed-off
/// retries.
pub const WINDOW: Duration = Duration::from_secs(120);

pub struct Recent {
    cap: usize,
    order: VecDeque<(Instant, u64)>,
    set: rustc_hash::FxHashSet<u64>,
}

impl Recent {
    pub fn new(cap: usize) -> Recent {
        Recent {
            cap,
            order: VecDeque::new(),
            set: Default::default(),
        }
    }

    /// Remember `id` at `now`; false if it was reported within the window already.
    pub fn first(&mut self, id: &str, now: Instant) -> bool {
        if self.cap == 0 {
            return true;
        }
        while let Some(&(at, h)) = self.order.front() {
            if now.saturating_duration_since(at) < WINDOW && self.order.len() < self.cap {
                break;
            }
            self.order.pop_front();
            self.set.remove(&h);
        }
        let h = fnv64(id.as_bytes());
        if !self.set.insert(h) {
            return false;
        }
        self.order.push_back((now, h));
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_span_id_is_first_once_within_the_window_and_the_cap() {
        let mut r = Recent::new(3);
        let t0 = Instant::now();
        assert!(r.first("a", t0));
        assert!(!r.first("a", t0 + Duration::from_secs(1)));
        assert!(r.first("a", t0 + WINDOW), "out of the window: reported again");
        for id in ["b", "c", "d"] {
            assert!(r.first(id, t0 + WINDOW));
        }
        assert!(r.first("a", t0 + WINDOW), "over the cap, the oldest is forgotten");
        assert!(Recent::new(0).first("x", t0) && Recent::new(0).first("x", t0), "off");
    }
}
