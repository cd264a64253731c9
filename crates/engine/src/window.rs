//! A sliding window of time buckets with per-class counts.

use serde::{Deserialize, Serialize};
use vitals_contracts::{Micros, OutcomeClass};

const CLASSES: usize = OutcomeClass::ALL.len();

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
struct Bucket {
    /// The bucket's number: stream time / bucket length. A slot whose number is not the one the
    /// current time maps to holds stale counts and is reset before use.
    number: u32,
    /// Exact counts of successes and failures: the failure rate comes from these.
    ok: u32,
    failed: u32,
    /// Per-class counts for the evidence, saturating at 65,535 a bucket (21,845 calls a second
    /// of one class to one endpoint); 16 bits keep a bucket at 32 bytes.
    counts: [u16; CLASSES],
}

/// A ring of `window / bucket` buckets. Memory is fixed: 32 bytes a bucket.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Window {
    buckets: Vec<Bucket>,
}

/// Successes and failures over the window: what the rules need on every signal.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Rate {
    pub ok: u64,
    pub failed: u64,
}

impl Rate {
    /// Calls that count towards the failure rate: successes and failures, not 4xx, 429s or
    /// cancelled calls.
    pub fn counted(&self) -> u64 {
        self.ok + self.failed
    }
    pub fn failure_rate(&self) -> f64 {
        match self.counted() {
            0 => 0.0,
            n => self.failed as f64 / n as f64,
        }
    }
}

/// Counts by outcome class over the window, for the evidence.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Totals(pub [u64; CLASSES]);

impl Totals {
    pub fn get(&self, c: OutcomeClass) -> u64 {
        self.0[c.index()]
    }
}

/// Whether an outcome counts against the endpoint's failure rate (the contracts' rule,
/// [`OutcomeClass::counts_as_failure`]).
pub fn counts_as_failure(class: OutcomeClass) -> bool {
    class.counts_as_failure()
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

    pub fn record(&mut self, now: Micros, bucket_us: i64, class: OutcomeClass) {
        self.record_n(now, bucket_us, class, 1);
    }

    /// Record `calls` outcomes of one class at once (a call summary's).
    pub fn record_n(&mut self, now: Micros, bucket_us: i64, class: OutcomeClass, calls: u64) {
        let add = u32::try_from(calls).unwrap_or(u32::MAX);
        let n = number(now, bucket_us);
        let len = self.buckets.len();
        let slot = &mut self.buckets[n as usize % len];
        if slot.number != n {
            *slot = Bucket {
                number: n,
                ..Bucket::default()
            };
        }
        let add16 = u16::try_from(add).unwrap_or(u16::MAX);
        slot.counts[class.index()] = slot.counts[class.index()].saturating_add(add16);
        if counts_as_failure(class) {
            slot.failed = slot.failed.saturating_add(add);
        } else if class == OutcomeClass::Success {
            slot.ok = slot.ok.saturating_add(add);
        }
    }

    fn live(&self, now: Micros, bucket_us: i64) -> impl Iterator<Item = &Bucket> {
        let n = number(now, bucket_us);
        let oldest = n.saturating_sub(self.buckets.len() as u32 - 1);
        self.buckets.iter().filter(move |b| b.number >= oldest && b.number <= n)
    }

    /// Successes and failures of the buckets within the window ending at `now`.
    pub fn rate(&self, now: Micros, bucket_us: i64) -> Rate {
        self.live(now, bucket_us).fold(Rate::default(), |r, b| Rate {
            ok: r.ok + u64::from(b.ok),
            failed: r.failed + u64::from(b.failed),
        })
    }

    /// How many buckets the calls in the window span, from the oldest bucket with one to the
    /// one `now` falls in (0 without calls): a rate divides by this, not by the whole window,
    /// while the window is still filling.
    pub fn span_buckets(&self, now: Micros, bucket_us: i64) -> u32 {
        let n = number(now, bucket_us);
        self.live(now, bucket_us)
            .filter(|b| b.ok > 0 || b.failed > 0)
            .map(|b| n - b.number + 1)
            .max()
            .unwrap_or(0)
    }

    /// Successes and failures of the last `n` buckets up to `now` (a shorter, fresher window).
    pub fn rate_last(&self, now: Micros, bucket_us: i64, n: u32) -> Rate {
        let newest = number(now, bucket_us);
        let oldest = newest.saturating_sub(n.max(1) - 1);
        self.live(now, bucket_us)
            .filter(|b| b.number >= oldest)
            .fold(Rate::default(), |r, b| Rate {
                ok: r.ok + u64::from(b.ok),
                failed: r.failed + u64::from(b.failed),
            })
    }

    /// Per-class counts of the buckets within the window ending at `now`.
    pub fn totals(&self, now: Micros, bucket_us: i64) -> Totals {
        self.totals_last(now, bucket_us, self.buckets.len() as u32)
    }

    /// Per-class counts of the last `n` buckets up to `now`.
    pub fn totals_last(&self, now: Micros, bucket_us: i64, n: u32) -> Totals {
        let oldest = number(now, bucket_us).saturating_sub(n.max(1) - 1);
        let mut t = [0u64; CLASSES];
        for b in self.live(now, bucket_us).filter(|b| b.number >= oldest) {
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
        assert_eq!(
            (
                t.get(OutcomeClass::Timeout),
                t.get(OutcomeClass::Success),
                t.get(OutcomeClass::ClientError)
            ),
            (4, 1, 1)
        );
        let r = w.rate(t0 + 9 * B, B);
        assert_eq!((r.failed, r.counted()), (4, 5));
        assert!((r.failure_rate() - 0.8).abs() < 1e-12);
        assert_eq!(w.totals(t0 + 10 * B, B), Totals::default());
        assert_eq!(w.rate(t0 + 10 * B, B), Rate::default());
    }

    #[test]
    fn a_reused_slot_forgets_its_old_counts() {
        let mut w = Window::new(2);
        w.record(10 * B, B, OutcomeClass::ServerError);
        w.record(12 * B, B, OutcomeClass::Success);
        let t = w.rate(12 * B, B);
        assert_eq!((t.failed, t.counted()), (0, 1));
    }
}
