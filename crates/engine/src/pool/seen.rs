//! The reports a pool has applied lately, by id, so that a report sent twice — an exporter's
//! retry after a lost answer, an ingest batch sent again, a fallback that resends — is applied
//! once. A call's event id, a summary's id and a probe's id are remembered for [`WINDOW_US`] of
//! stream time, at most [`CAP`] of them per pool (the oldest forgotten first: under a flood of
//! reports the window is shorter, never the memory larger). An id is held as its 64-bit FNV-1a
//! hash with the stream time it was applied at: 16 bytes, so at most 64 KiB a pool in memory,
//! and about 11 bytes an id in its snapshot (packed), which is how a restart remembers them.

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

/// What a snapshot's ids begin with since they are packed ([`Seen`]'s `Serialize`); without it
/// they are the older hex, 32 digits an id, which is still read.
const PACKED: &str = "v2:";

impl Serialize for Seen {
    /// Packed, oldest first: for each id the time it was applied, as a zigzag varint of the
    /// difference from the id before (from 0 for the first), then its hash (8 bytes,
    /// little-endian); base64 of it all after [`PACKED`]. About 11 bytes an id, 15 characters
    /// (hex took 32, three fifths of a pool's snapshot). Equal states give equal bytes.
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use base64::Engine as _;
        let mut bytes = Vec::with_capacity(self.0.len() * 12);
        let mut last = 0i64;
        for (at, h) in self.0.entries() {
            let d = at.wrapping_sub(last);
            last = at;
            let mut z = ((d << 1) ^ (d >> 63)) as u64;
            while z >= 0x80 {
                bytes.push((z as u8) | 0x80);
                z >>= 7;
            }
            bytes.push(z as u8);
            bytes.extend_from_slice(&h.to_le_bytes());
        }
        let mut out = String::with_capacity(PACKED.len() + bytes.len().div_ceil(3) * 4);
        out.push_str(PACKED);
        base64::engine::general_purpose::STANDARD_NO_PAD.encode_string(&bytes, &mut out);
        s.serialize_str(&out)
    }
}

impl<'de> Deserialize<'de> for Seen {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Seen, D::Error> {
        use serde::de::Error;
        let text = std::borrow::Cow::<str>::deserialize(d)?;
        let mut seen = Seen::default();
        match text.strip_prefix(PACKED) {
            Some(packed) => unpack(packed, &mut seen),
            None => unhex(&text, &mut seen),
        }
        .map_err(D::Error::custom)?;
        Ok(seen)
    }
}

/// The packed form (see [`Seen`]'s `Serialize`).
fn unpack(packed: &str, seen: &mut Seen) -> Result<(), &'static str> {
    use base64::Engine as _;
    let bytes = base64::engine::general_purpose::STANDARD_NO_PAD
        .decode(packed)
        .map_err(|_| "seen ids: not base64")?;
    let (mut rest, mut last) = (bytes.as_slice(), 0i64);
    while !rest.is_empty() {
        let (mut z, mut shift) = (0u64, 0u32);
        loop {
            let (&b, tail) = rest.split_first().ok_or("seen ids: cut short")?;
            rest = tail;
            if shift > 63 {
                return Err("seen ids: a time too long");
            }
            z |= u64::from(b & 0x7f) << shift;
            shift += 7;
            if b < 0x80 {
                break;
            }
        }
        last = last.wrapping_add(((z >> 1) as i64) ^ -((z & 1) as i64));
        let (h, tail) = rest.split_at_checked(8).ok_or("seen ids: cut short")?;
        rest = tail;
        seen.0.restore(last, u64::from_le_bytes(h.try_into().expect("8 bytes")));
    }
    Ok(())
}

/// The older form: hex of 16 bytes an id (the time, then the hash; big-endian).
fn unhex(text: &str, seen: &mut Seen) -> Result<(), &'static str> {
    if !text.len().is_multiple_of(32) || !text.is_ascii() {
        return Err("seen ids: not 32 hex digits an id");
    }
    for chunk in text.as_bytes().chunks(32) {
        let word = |at: usize| {
            std::str::from_utf8(&chunk[at..at + 16])
                .ok()
                .and_then(|t| u64::from_str_radix(t, 16).ok())
                .ok_or("seen ids: not hex")
        };
        seen.0.restore(word(0)? as i64, word(16)?);
    }
    Ok(())
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
        assert!(json.len() < CAP * 16, "packed: {} bytes for {CAP} ids", json.len());
        let back: Seen = serde_json::from_str(&json).unwrap();
        assert_eq!(back, s);
        assert_eq!(serde_json::to_string(&back).unwrap(), json, "equal states, equal bytes");
        assert!(serde_json::from_str::<Seen>("\"abc\"").is_err());
        assert!(serde_json::from_str::<Seen>(&format!("\"{}\"", "g".repeat(32))).is_err());
        assert!(serde_json::from_str::<Seen>("\"v2:!!\"").is_err(), "not base64");
        let cut = &json[..json.len() - 4];
        assert!(serde_json::from_str::<Seen>(&format!("{cut}\"")).is_err(), "cut short");
    }

    /// A snapshot written before the ids were packed (hex, 32 digits an id) restores the same
    /// ids, and is written packed from then on; times before 0 and far apart round-trip.
    #[test]
    fn the_older_hex_form_is_still_read() {
        let mut s = Seen::default();
        for (i, at) in [-7i64, 5, 5, 1_000_000, i64::MAX / 2].into_iter().enumerate() {
            s.first(&format!("id-{i}"), at);
        }
        let hex: String =
            s.0.entries()
                .map(|(at, h)| format!("{:016x}{h:016x}", at as u64))
                .collect();
        let back: Seen = serde_json::from_str(&format!("\"{hex}\"")).unwrap();
        assert_eq!(back, s);
        let packed = serde_json::to_string(&back).unwrap();
        assert!(packed.starts_with("\"v2:"));
        assert_eq!(serde_json::from_str::<Seen>(&packed).unwrap(), s);
    }
}
