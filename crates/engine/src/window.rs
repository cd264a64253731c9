//! A sliding window of time buckets with per-class counts.

use serde::{Deserialize, Serialize};
use vitals_contracts::{Micros, OutcomeClass};

const CLASSES: usize = OutcomeClass::ALL.len();

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
struct Bucket {
    /// The bucket's number: stream time / bucket length. A slot whose number is not the one the
    /// current time maps to holds stale counts and is reset before use.
    number: u32,
    counts: [u32; CLASSES],
}

/// A ring of `window / bucket` buckets. Memory is fixed: 40 bytes a bucket.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Window {
    buckets: Vec<Bucket>,
}

/// Counts by outcome class over the window.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Totals(pub [u64; CLASSES]);

impl Totals {
    pub fn get(&self, c: OutcomeClass) -> u64 {
        self.0[c.index()]
    }
    pub fn failures(&self) -> u64 {
        OutcomeClass::ALL
            .iter()
            .filter(|c| c.is_failure())
            .map(|c| self.get(*c))
            .sum()
    }
    /// Calls that count towards the failure rate: successes and failures, not 4xx or cancelled.
    pub fn counted(&self) -> u64 {
        self.get(OutcomeClass::Success) + self.failures()
    }
    pub fn failure_rate(&self) -> f64 {
        match self.counted() {
            0 => 0.0,
            n => self.failures() as f64 / n as f64,
        }
    }
}

fn number(now: Micros, bucket_us: i64) -> u32 {
    u32::try_from(now.max(0) / bucket_us).unwrap_or(u32::MAX)
}

impl Window {
    pub fn new(buckets: usize) -> Window {
        Window {
            buckets: vec![Bucket::default(); buckets.max(1)],
        }
    }

    pub fn len(&self) -> usize {
        self.buckets.len()
    }

    pub fn is_empty(&self) -> bool {
        self.buckets.is_empty()
    }

    pub fn record(&mut self, now: Micros, bucket_us: i64, class: OutcomeClass) {
        let n = number(now, bucket_us);
        let len = self.buckets.len();
        let slot = &mut self.buckets[n as usize % len];
        if slot.number != n {
            *slot = Bucket {
                number: n,
                counts: [0; CLASSES],
            };
        }
        slot.counts[class.index()] = slot.counts[class.index()].saturating_add(1);
    }

    /// Counts of the buckets that lie within the window ending at `now`.
    pub fn totals(&self, now: Micros, bucket_us: i64) -> Totals {
        let n = number(now, bucket_us);
        let oldest = n.saturating_sub(self.buckets.len() as u32 - 1);
        let mut t = [0u64; CLASSES];
        for b in self.buckets.iter().filter(|b| b.number >= oldest && b.number <= n) {
            for (acc, c) in t.iter_mut().zip(b.counts) {
                *acc += u64::from(c);
            }
        }
        Totals(t)
    }

    pub fn clear(&mut self) {
        self.buckets.iter_mut().for_each(|b| *b = Bucket::default());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const B: i64 = 3_000_000;

    #[test]
    fn counts_leave_the_window_after_its_length() {
        let mut w = Window::new(10);
        let t0 = 1_000 * B;
        for _ in 0..4 {
            w.record(t0, B, OutcomeClass::Timeout);
        }
        w.record(t0, B, OutcomeClass::Success);
        w.record(t0, B, OutcomeClass::ClientError);
        let t = w.totals(t0 + 9 * B, B);
        assert_eq!((t.failures(), t.counted(), t.get(OutcomeClass::ClientError)), (4, 5, 1));
        assert!((t.failure_rate() - 0.8).abs() < 1e-12);
        assert_eq!(w.totals(t0 + 10 * B, B).counted(), 0);
    }

    #[test]
    fn a_reused_slot_forgets_its_old_counts() {
        let mut w = Window::new(2);
        w.record(10 * B, B, OutcomeClass::ServerError);
        w.record(12 * B, B, OutcomeClass::Success);
        let t = w.totals(12 * B, B);
        assert_eq!((t.failures(), t.counted()), (0, 1));
    }
}
