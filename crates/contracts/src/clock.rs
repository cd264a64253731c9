//! The wall clock in the unit every record carries (microseconds since the Unix epoch), read at
//! the edges — gateways, probers, the API's ingest, followers, the merge stage — to stamp what
//! they observe. The engine never reads it: its time is the log's (stream time).

use crate::Micros;
use std::time::{SystemTime, UNIX_EPOCH};

/// Now, in microseconds since the Unix epoch: 0 for a clock set before 1970, `Micros::MAX` past
/// what the type holds (never a wrapped, negative time).
pub fn now_us() -> Micros {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| Micros::try_from(d.as_micros()).unwrap_or(Micros::MAX))
}

#[cfg(test)]
mod tests {
    #[test]
    fn now_is_after_this_code_was_written_and_moves_forward() {
        let a = super::now_us();
        assert!(a > 1_764_800_000_000_000, "{a}"); // 2025-12-04
        assert!(super::now_us() >= a);
    }
}
