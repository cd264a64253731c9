//! The reports a pool has applied lately, by id, so that a report sent twice — an exporter's
//! retry after a lost answer, an ingest batch sent again, a fallback that resends — is applied
//! once. A call's event id, a summary's id and a probe's id are remembered for [`WINDOW_US`] of
//! stream time, at most [`CAP`] of them per pool (the oldest forgotten first: under a flood of
//! reports the window is shorter, never the memory larger). An id is held as its 64-bit FNV-1a
//! hash with the stream time it was applied at: 16 bytes, so at most 64 KiB a pool, in memory
//! and in its snapshot (hex), which is how a restart remembers them.

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use vitals_contracts::recent::RecentIds;
use vitals_contracts::Micros;

/// How long an id is remembered, in stream time: longer than the OTLP exporters' retries
/// (a 10 s timeout, backing off up to a minute or so) and the reporter's HTTP fallback.
pub const WINDOW_US: Micros = 5 * 60 * 1_000_000;

/// Ids remembered per pool at most.
pub const CAP: usize = 4_096;

#[derive(Debug, Clone, PartialEq)]
pub struct Seen(RecentIds);

impl Default for Seen {
    fn default() -> Seen {
        Seen(RecentIds::new(WINDOW_US, CAP))
    }
}

impl Seen {
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether `id` was applied within the window before `now`.
    pub fn contains(&self, id: &str, now: Micros) -> bool {
        self.0.contains(id, now)
    }

    /// Remember `id`, applied at `now`; false if it was applied within the window already.
    pub fn first(&mut self, id: &str, now: Micros) -> bool {
        self.0.first(id, now)
    }
}

impl Serialize for Seen {
    /// Hex of 16 bytes an id (the time, then the hash; big-endian), oldest first: equal states
    /// give equal bytes.
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        const HEX: &[u8; 16] = b"0123456789abcdef";
        let mut out = String::with_capacity(self.0.len() * 32);
        for (at, h) in self.0.entries() {
            for b in at.to_be_bytes().into_iter().chain(h.to_be_bytes()) {
                out.push(HEX[usize::from(b >> 4)] as char);
                out.push(HEX[usize::from(b & 15)] as char);
            }
        }
        s.serialize_str(&out)
    }
}

impl<'de> Deserialize<'de> for Seen {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Seen, D::Error> {
        use serde::de::Error;
        let text = String::deserialize(d)?;
        if !text.len().is_multiple_of(32) || !text.is_ascii() {
            return Err(D::Error::custom("seen ids: not 32 hex digits an id"));
        }
        let mut seen = Seen::default();
        for chunk in text.as_bytes().chunks(32) {
            let word = |at: usize| {
                std::str::from_utf8(&chunk[at..at + 16])
                    .ok()
                    .and_then(|t| u64::from_str_radix(t, 16).ok())
                    .ok_or_else(|| D::Error::custom("seen ids: not hex"))
            };
            seen.0.restore(word(0)? as i64, word(16)?);
        }
        Ok(seen)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_id_is_remembered_for_the_window_within_the_cap_and_through_a_snapshot() {
        let mut s = Seen::default();
        s.first("a", 0);
        assert!(s.contains("a", 1));
        assert!(!s.contains("b", 1));
        assert!(s.contains("a", WINDOW_US - 1));
        assert!(!s.contains("a", WINDOW_US), "out of the window");
        s.first("b", WINDOW_US);
        assert_eq!(s.len(), 1, "a forgotten on the next insert");
        for i in 0..CAP + 10 {
            s.first(&format!("id-{i}"), WINDOW_US + 1);
        }
        assert_eq!(s.len(), CAP, "never over the cap");
        assert!(!s.contains("id-0", WINDOW_US + 1) && s.contains(&format!("id-{}", CAP + 9), WINDOW_US + 1));
        let json = serde_json::to_string(&s).unwrap();
        assert_eq!(json.len(), CAP * 32 + 2);
        let back: Seen = serde_json::from_str(&json).unwrap();
        assert_eq!(back, s);
        assert!(serde_json::from_str::<Seen>("\"abc\"").is_err());
        assert!(serde_json::from_str::<Seen>(&format!("\"{}\"", "g".repeat(32))).is_err());
    }
}
