//! The live stream's protocol, written once for every way a stream is fed (the live-stream
//! writers, a kept-alive connection's feed, a client's own Kafka consumer): stream positions and
//! their text form (the events' ids), the frames (`ready`, the events, `lagged`, `reconnect`, the
//! keep-alive comment), what a client wants (`Filter`), the decoding of a record of the changes
//! topic into the event every client shares (with republished duplicates dropped), and the
//! assignment of the topic's partitions. It uses nothing else of the live stream, so a new event
//! kind or filter is one change here.

use crate::error::ApiError;
use crate::metrics::Metrics;
use axum::body::Bytes;
use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::topic_partition_list::{Offset, TopicPartitionList};
use std::collections::BTreeMap;
use std::time::Duration;
use vitals_contracts::seq::{Applied, SeqGate};
use vitals_contracts::{self as c, codec::SchemaKind, view};

/// Positions: partition → next offset.
pub type Positions = BTreeMap<i32, i64>;

/// Positions as an event id: `0:15,1:7,...`.
pub fn encode_positions(p: &Positions) -> String {
    p.iter().map(|(k, v)| format!("{k}:{v}")).collect::<Vec<_>>().join(",")
}

/// A `Last-Event-ID`, refused unless it is an id this stream could have sent.
pub fn parse_positions(s: &str) -> Result<Positions, ApiError> {
    let bad = || ApiError::invalid("Last-Event-ID", "not an event id of this stream");
    let mut out = Positions::new();
    for part in s.split(',').filter(|p| !p.is_empty()) {
        let (p, o) = part.split_once(':').ok_or_else(bad)?;
        let p: i32 = p.parse().map_err(|_| bad())?;
        let o: i64 = o.parse().map_err(|_| bad())?;
        if p < 0 || o < 0 {
            return Err(bad());
        }
        out.insert(p, o);
    }
    Ok(out)
}

/// Where a client resumes from its `Last-Event-ID` header: None when it sent none, or one with
/// no position in it (empty, `,`), which is no id this stream sends (read as a replay of every
/// partition from its start, it sent a client the whole topic).
pub fn resume_from(header: Option<&str>) -> Result<Option<Positions>, ApiError> {
    Ok(header.map(parse_positions).transpose()?.filter(|p| !p.is_empty()))
}

/// One event as every client sends it.
#[derive(Debug)]
pub struct Item {
    pub partition: i32,
    pub offset: i64,
    /// `health_changed` or `pool_changed`.
    pub kind: &'static str,
    pub pool: String,
    pub endpoint: Option<String>,
    /// The stream position after this event (its SSE id).
    pub id: String,
    /// The whole event as every client sends it, made once.
    pub frame: Bytes,
}

/// What a client wants of the feed.
pub struct Filter {
    /// Events before these offsets were seen already (a client ahead of this instance).
    pub from: Positions,
    pub pool: Option<String>,
    pub endpoint: Option<String>,
}

impl Filter {
    pub fn wants(&self, item: &Item) -> bool {
        item.offset >= self.from.get(&item.partition).copied().unwrap_or(0)
            && self.names(&item.pool, item.endpoint.as_deref())
    }

    /// Whether an event of `pool` (and `endpoint`, for an endpoint's) is one it wants.
    pub fn names(&self, pool: &str, endpoint: Option<&str>) -> bool {
        self.pool.as_deref().is_none_or(|p| p == pool) && self.endpoint.as_deref().is_none_or(|e| endpoint == Some(e))
    }
}

/// The headers of a live stream's answer, whichever path serves it (the server's adds them to
/// its response, the writers' head is made of them): an event stream, not cached, not sniffed.
pub const HEADERS: [(&str, &str); 3] = [
    ("content-type", "text/event-stream"),
    ("cache-control", "no-cache"),
    ("x-content-type-options", "nosniff"),
];

/// The response head of a stream written by the live-stream writers: [`HEADERS`], and the
/// body is the events until the connection closes.
pub static RAW_HEAD: std::sync::LazyLock<Vec<u8>> = std::sync::LazyLock::new(|| {
    let mut head = b"HTTP/1.1 200 OK\r\n".to_vec();
    for (name, value) in HEADERS {
        head.extend_from_slice(format!("{name}: {value}\r\n").as_bytes());
    }
    head.extend_from_slice(b"connection: close\r\n\r\n");
    head
});

/// A stream that has been silent this long gets a comment, so that proxies and clients do not
/// take it for dead.
pub const KEEP_ALIVE: Duration = Duration::from_secs(15);

/// The keep-alive comment.
pub const KEEP_ALIVE_COMMENT: &[u8] = b":\n\n";

/// One Server-Sent Event (`data` is one line of JSON).
fn frame(kind: &str, id: &str, data: &str) -> Bytes {
    Bytes::from(format!("event: {kind}\nid: {id}\ndata: {data}\n\n"))
}

/// The first event of every stream: where it starts.
pub fn ready(id: &str) -> Bytes {
    frame("ready", id, "{}")
}

/// The last event of a client that fell `missed` events behind; `id` resumes it.
pub fn lagged(id: &str, missed: u64) -> Bytes {
    frame(
        "lagged",
        id,
        &format!(
            r#"{{"reason":"this client fell {missed} events behind the live stream; resume with Last-Event-ID","missed":{missed}}}"#
        ),
    )
}

/// The last event of a stream that reached its lifetime; `id` resumes it.
pub fn reconnect(id: &str) -> Bytes {
    frame(
        "reconnect",
        id,
        r#"{"reason":"the stream reached its maximum lifetime; resume with Last-Event-ID"}"#,
    )
}

/// The event after `ready` of a client whose `Last-Event-ID` (`requested`) is ahead of the
/// topic (it was recreated, or the id is from another cluster): the stream starts at the topic's
/// end instead, and the client must reload what it holds; `id` resumes it from here.
pub fn reset(id: &str, requested: &str) -> Bytes {
    let data = serde_json::json!({
        "reason": "Last-Event-ID is ahead of the changes topic (was it recreated?): the stream starts at its end; reload the state you hold",
        "requested": requested,
    });
    frame("reset", id, &data.to_string())
}

/// Whether `resume` names an offset the topic whose end is `end` cannot have yet (or a
/// partition it does not have).
pub fn ahead(resume: &Positions, end: &Positions) -> bool {
    resume.iter().any(|(p, o)| end.get(p).is_none_or(|e| o > e))
}

/// Turns records of the changes topic into events: the one place that knows the record kinds.
/// A transition republished by the outbox relay after a crash is dropped by (endpoint, seq).
#[derive(Default)]
pub struct Decoder {
    seqs: SeqGate,
}

impl Decoder {
    /// The event of one record, `positions` being the stream's positions after it (the event's
    /// id). None for a record no client gets: another kind (a tick), a duplicate, one `only`
    /// does not name, or one that cannot be decoded (skipped, logged and counted).
    pub fn decode(
        &mut self,
        partition: i32,
        offset: i64,
        payload: &[u8],
        positions: &Positions,
        only: Option<&Filter>,
        metrics: &Metrics,
    ) -> Option<Item> {
        let undecodable = |e: &dyn std::fmt::Display| {
            metrics.stream_undecodable();
            tracing::warn!(partition, offset, error = %e, "live stream: skipping a record that cannot be decoded");
        };
        let named = |pool: &str, endpoint: Option<&str>| only.is_none_or(|f| f.names(pool, endpoint));
        let (kind, data, pool, endpoint) = match c::codec::peek_kind(payload) {
            Ok(SchemaKind::HealthChanged) => {
                let h = c::decode::<c::HealthChanged>(payload)
                    .map_err(|e| undecodable(&e))
                    .ok()?;
                if !named(&h.pool, Some(&h.endpoint))
                    || self.seqs.admit(&h.pool, &h.endpoint, h.seq) == Applied::Duplicate
                {
                    return None;
                }
                let (pool, endpoint) = (h.pool.clone(), h.endpoint.clone());
                let t = view::Transition::try_from(h).map_err(|e| undecodable(&e)).ok()?;
                ("health_changed", serde_json::to_string(&t), pool, Some(endpoint))
            }
            Ok(SchemaKind::PoolHealthChanged) => {
                let p = c::decode::<c::PoolHealthChanged>(payload)
                    .map_err(|e| undecodable(&e))
                    .ok()?;
                if !named(&p.pool, None) {
                    return None;
                }
                let pool = p.pool.clone();
                (
                    "pool_changed",
                    serde_json::to_string(&view::PoolEvent::from(p)),
                    pool,
                    None,
                )
            }
            _ => return None, // ticks and other kinds move the position only
        };
        let data = data.ok()?;
        let id = encode_positions(positions);
        Some(Item {
            partition,
            offset,
            kind,
            frame: frame(kind, &id, &data),
            pool,
            endpoint,
            id,
        })
    }
}

/// Assign every partition of `topic` to `consumer`, each at `start(partition)` or, where that
/// is None, at the partition's end; the positions it starts from. Blocking (broker queries).
pub fn assign(consumer: &StreamConsumer, topic: &str, start: impl Fn(i32) -> Option<i64>) -> anyhow::Result<Positions> {
    let timeout = Duration::from_secs(5);
    let parts = vitals_runtime::kafka::partitions(consumer, topic, timeout)?;
    anyhow::ensure!(!parts.is_empty(), "topic {topic} has no partitions");
    let mut positions = Positions::new();
    let mut tpl = TopicPartitionList::new();
    for p in parts {
        let o = match start(p) {
            Some(o) => o,
            None => consumer.fetch_watermarks(topic, p, timeout)?.1,
        };
        positions.insert(p, o);
        tpl.add_partition_offset(topic, p, Offset::Offset(o))?;
    }
    consumer.assign(&tpl)?;
    Ok(positions)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_id_past_the_end_or_of_a_missing_partition_is_ahead() {
        let end: Positions = [(0, 10), (1, 5)].into();
        assert!(!ahead(&[(0, 10), (1, 0)].into(), &end));
        assert!(ahead(&[(0, 11)].into(), &end));
        assert!(ahead(&[(0, 1), (7, 0)].into(), &end));
    }

    #[test]
    fn positions_round_trip_and_garbage_is_refused() {
        let p: Positions = [(0, 15), (1, 0), (7, 123_456)].into_iter().collect();
        assert_eq!(parse_positions(&encode_positions(&p)).unwrap(), p);
        for bad in ["x", "0:", ":5", "0:-1", "-1:3", "0:1,zz"] {
            assert!(parse_positions(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn an_empty_last_event_id_is_no_resume_not_a_replay_from_the_start() {
        for empty in ["", ",", ",,", " "] {
            assert_eq!(resume_from(Some(empty.trim())).unwrap(), None, "{empty:?}");
        }
        assert_eq!(resume_from(None).unwrap(), None);
        assert_eq!(resume_from(Some("0:4")).unwrap(), Some([(0, 4)].into()));
        assert!(resume_from(Some("0:x")).is_err());
    }
}
