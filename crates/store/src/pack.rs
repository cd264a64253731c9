//! A pack: the events one batch publishes, in order, framed in one outbox row (migration 0017).
//! One row per event cost Postgres a heap tuple, an index entry, a WAL record, a delete and a
//! vacuum for each; a pack pays them once for up to [`MAX_EVENTS`] events.
//!
//! The frame is private to this crate (the writer packs, the relay's query unpacks): per event,
//! its dedup key, topic, key, payload, then its headers as a count and name/value pairs. Each
//! byte string is a little-endian u32 length and the bytes; an absent key is the length
//! `u32::MAX`. Lengths are fixed-width rather than varints: simpler to check, and the column is
//! lz4-compressed, which takes the zero bytes back.

use std::collections::BTreeMap;
use vitals_contracts::batch::OutboxRow;

/// Events in one pack at most: a batch of many dead letters becomes several packs, so that a
/// relay round (which takes whole packs) stays near its size.
pub const MAX_EVENTS: usize = 500;
/// Bytes in one pack at most (a pack may pass it by its last event).
pub const MAX_BYTES: usize = 1 << 20;

const NO_KEY: u32 = u32::MAX;

/// One event as the relay publishes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    /// The event's identity, for logs and operators (`endpoint/seq` and the like).
    pub dedup_key: String,
    pub topic: String,
    pub key: Option<Vec<u8>>,
    pub payload: Vec<u8>,
    pub headers: BTreeMap<String, String>,
}

/// The rows in order, as packs of at most [`MAX_EVENTS`] events and about [`MAX_BYTES`]: each
/// pack with its number of events.
pub fn pack(rows: &[OutboxRow]) -> Vec<(i32, Vec<u8>)> {
    let mut packs = Vec::new();
    let mut current: Vec<u8> = Vec::new();
    let mut events = 0;
    for row in rows {
        if events == MAX_EVENTS || (events > 0 && current.len() >= MAX_BYTES) {
            packs.push((events as i32, std::mem::take(&mut current)));
            events = 0;
        }
        put(&mut current, row.dedup_key.as_bytes());
        put(&mut current, row.topic.as_bytes());
        match &row.key {
            Some(k) => put(&mut current, k),
            None => current.extend_from_slice(&NO_KEY.to_le_bytes()),
        }
        put(&mut current, &row.payload);
        current.extend_from_slice(&(row.headers.len() as u32).to_le_bytes());
        for (name, value) in &row.headers {
            put(&mut current, name.as_bytes());
            put(&mut current, value.as_bytes());
        }
        events += 1;
    }
    if events > 0 {
        packs.push((events as i32, current));
    }
    packs
}

fn put(out: &mut Vec<u8>, bytes: &[u8]) {
    out.extend_from_slice(&(bytes.len() as u32).to_le_bytes());
    out.extend_from_slice(bytes);
}

/// The events of a pack, in order; `expected` is the row's count of them. An error says what
/// is wrong where (a pack this build did not write, or a damaged one).
pub fn unpack(bytes: &[u8], expected: i32) -> Result<Vec<Event>, String> {
    let mut r = Reader { bytes, at: 0 };
    let mut events = Vec::with_capacity(expected.max(0) as usize);
    while r.at < bytes.len() {
        let dedup_key = r.text("dedup key")?;
        let topic = r.text("topic")?;
        let key = match r.length("key")? {
            NO_KEY => None,
            n => Some(r.take(n, "key")?.to_vec()),
        };
        let n = r.length("payload")?;
        let payload = r.take(n, "payload")?.to_vec();
        let count = r.length("header count")?;
        let mut headers = BTreeMap::new();
        for _ in 0..count {
            let name = r.text("header name")?;
            let value = r.text("header value")?;
            headers.insert(name, value);
        }
        events.push(Event {
            dedup_key,
            topic,
            key,
            payload,
            headers,
        });
    }
    if events.len() != expected as usize {
        return Err(format!("pack holds {} events, its row says {expected}", events.len()));
    }
    Ok(events)
}

struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn length(&mut self, what: &str) -> Result<u32, String> {
        let four = self.take(4, what)?;
        Ok(u32::from_le_bytes([four[0], four[1], four[2], four[3]]))
    }

    fn take(&mut self, n: u32, what: &str) -> Result<&'a [u8], String> {
        let end = self
            .at
            .checked_add(n as usize)
            .filter(|e| *e <= self.bytes.len())
            .ok_or_else(|| {
                format!(
                    "pack ends inside an event's {what} (byte {} of {}, {n} more wanted)",
                    self.at,
                    self.bytes.len()
                )
            })?;
        let out = &self.bytes[self.at..end];
        self.at = end;
        Ok(out)
    }

    fn text(&mut self, what: &str) -> Result<String, String> {
        let n = self.length(what)?;
        let at = self.at;
        let bytes = self.take(n, what)?;
        String::from_utf8(bytes.to_vec()).map_err(|_| format!("an event's {what} at byte {at} is not UTF-8"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn row(i: usize, payload: usize) -> OutboxRow {
        OutboxRow {
            dedup_key: format!("pool/ep-{i}/{i}"),
            topic: if i.is_multiple_of(2) { "changes" } else { "state" }.into(),
            key: (!i.is_multiple_of(3)).then(|| format!("pool/ep-{i}").into_bytes()),
            payload: vec![i as u8; payload],
            headers: BTreeMap::from([("seq".to_string(), i.to_string())]),
            partition: 0,
        }
    }

    fn event(r: &OutboxRow) -> Event {
        Event {
            dedup_key: r.dedup_key.clone(),
            topic: r.topic.clone(),
            key: r.key.clone(),
            payload: r.payload.clone(),
            headers: r.headers.clone(),
        }
    }

    fn arb_row() -> impl Strategy<Value = OutboxRow> {
        (
            ".{0,12}",
            "[a-z.]{1,12}",
            proptest::option::of(proptest::collection::vec(any::<u8>(), 0..16)),
            proptest::collection::vec(any::<u8>(), 0..64),
            proptest::collection::btree_map(".{0,6}", ".{0,6}", 0..4),
        )
            .prop_map(|(dedup_key, topic, key, payload, headers)| OutboxRow {
                dedup_key,
                topic,
                key,
                payload,
                headers,
                partition: 0,
            })
    }

    proptest! {
        /// Whatever the events, the packs give them back in order, each pack within its bounds.
        #[test]
        fn packs_give_back_every_event_in_order(rows in proptest::collection::vec(arb_row(), 0..1200)) {
            let packs = pack(&rows);
            let mut back = Vec::new();
            for (events, bytes) in &packs {
                prop_assert!(*events >= 1 && *events as usize <= MAX_EVENTS);
                back.extend(unpack(bytes, *events).map_err(TestCaseError::fail)?);
            }
            prop_assert_eq!(back, rows.iter().map(event).collect::<Vec<_>>());
            prop_assert_eq!(packs.len(), rows.len().div_ceil(MAX_EVENTS));
        }

        /// A pack cut short, or with bytes added, is refused with a reason, never read as events.
        #[test]
        fn a_damaged_pack_is_refused(rows in proptest::collection::vec(arb_row(), 1..20), cut in 1usize..64) {
            let (events, bytes) = pack(&rows).remove(0);
            let short = &bytes[..bytes.len().saturating_sub(cut)];
            prop_assert!(unpack(short, events).is_err());
            let mut long = bytes.clone();
            long.push(0);
            prop_assert!(unpack(&long, events).is_err());
        }
    }

    #[test]
    fn a_pack_closes_at_its_byte_bound() {
        let rows: Vec<OutboxRow> = (0..5).map(|i| row(i, MAX_BYTES / 2)).collect();
        let packs = pack(&rows);
        assert_eq!(packs.iter().map(|(n, _)| *n).collect::<Vec<_>>(), vec![2, 2, 1]);
        assert!(pack(&[]).is_empty());
    }

    #[test]
    fn a_count_that_disagrees_with_the_pack_is_named() {
        let (_, bytes) = pack(&[row(1, 3), row(2, 3)]).remove(0);
        assert_eq!(unpack(&bytes, 3).unwrap_err(), "pack holds 2 events, its row says 3");
    }
}
