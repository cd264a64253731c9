//! What one batch writes: decisions turned into audit rows and outbox rows, plus the offsets and
//! snapshots of the partitions it touched. The pure record step (`vitals-pipeline`) fills it and
//! the store writes it; it is here, with no engine inside, so that the store (and the read-only
//! API that links the store) never links the engine.

use crate::lateness::ClockChange;
use crate::{encode, keys, EndpointState, HealthChanged, Micros, Policy, PoolHealthChanged, Record, Requests};
use std::collections::{BTreeMap, HashMap};

/// One event to publish, with a key that makes a replayed insert a no-op.
#[derive(Debug, Clone)]
pub struct OutboxRow {
    pub dedup_key: String,
    pub topic: String,
    pub key: Option<Vec<u8>>,
    pub payload: Vec<u8>,
    pub headers: BTreeMap<String, String>,
    /// The input partition whose record caused it (not stored; lets a fenced partition's rows go).
    pub partition: i32,
}

#[derive(Debug, Clone)]
pub struct Snapshot {
    /// The offset the snapshot resumes from: the first record not applied to it.
    pub offset: i64,
    pub stream_time: i64,
    pub pools: Vec<(String, Vec<u8>)>,
}

#[derive(Debug, Clone)]
pub struct PartitionWrite {
    pub partition: i32,
    pub epoch: i64,
    pub next_offset: i64,
    pub snapshot: Option<Snapshot>,
    /// The calls counted since the last counts were written, when they are written with this
    /// batch (on the processor's timer, and always with a snapshot).
    pub requests: Option<Counted>,
}

/// The calls of one endpoint in one minute of stream time, by what they got.
#[derive(Debug, Clone, PartialEq)]
pub struct Rollup {
    pub pool: String,
    pub endpoint: String,
    /// The minute's start (µs, a multiple of [`MINUTE_US`]).
    pub minute: Micros,
    pub requests: Requests,
}

/// A minute in µs.
pub const MINUTE_US: Micros = 60_000_000;

/// What a partition counted from offset `from` up to `to` (exclusive): written in the batch's
/// transaction, which moves the partition's counted offset from `from` to `to` — so each
/// record's call is counted once, however often it is replayed.
#[derive(Debug, Clone, PartialEq)]
pub struct Counted {
    pub from: i64,
    pub to: i64,
    pub rollups: Vec<Rollup>,
}

#[derive(Debug, Default)]
pub struct BatchWrite {
    /// Policy changes the engine applied: each pool's policy in force from then on.
    pub policies: Vec<PolicyInForce>,
    /// Endpoints the engine saw for the first time, in their first state, with the input
    /// partition; they enter the state projection.
    pub discovered: Vec<(EndpointState, i32)>,
    pub transitions: Vec<(HealthChanged, i32, i64)>,
    pub pool_events: Vec<(PoolHealthChanged, i32, i64)>,
    pub outbox: Vec<OutboxRow>,
    pub partitions: Vec<PartitionWrite>,
    /// Records consumed (valid or not) in this batch.
    pub records: u64,
    pub dead_lettered: u64,
    /// Of those, signals of a new pool beyond the partition's cap (`too_many_pools`).
    pub pools_refused: u64,
    /// Of those, records stamped too far ahead of their partition's time (CreateTime topics).
    pub stamped_ahead: u64,
    /// Reports passed over as repeats of ones their pool applied lately (the same id).
    pub repeats: u64,
    /// Events that could not be encoded (a bug), dead-lettered as JSON instead.
    pub encode_failures: u64,
    /// Reports (calls) set aside as late by the engine's late rule.
    pub late: u64,
    /// Reporters' clocks a pool named off or back: (pool, change).
    pub clocks: Vec<(String, ClockChange)>,
}

/// The policy a pool is under from a policy change on, for the `pool_policies` table (the
/// API reads a pool's policy there, never from an engine snapshot).
#[derive(Debug, Clone)]
pub struct PolicyInForce {
    pub pool: String,
    pub policy: Policy,
    /// When the engine applied it.
    pub stream_time: Micros,
    /// The input partition (dropped with it when the partition is fenced or revoked).
    pub partition: i32,
}

/// Topic names the outbox rows are addressed to.
#[derive(Debug, Clone)]
pub struct Topics {
    pub signals: String,
    pub changes: String,
    pub state: String,
    pub dlq: String,
}

impl BatchWrite {
    pub fn is_empty(&self) -> bool {
        self.partitions.is_empty()
    }

    /// A transition the engine decided for the record at (partition, offset): its audit row,
    /// and its events on the changes topic and (a fleet transition) the state topic.
    pub fn transition(&mut self, topics: &Topics, h: HealthChanged, partition: i32, offset: i64) {
        let key = keys::endpoint_key(&h.pool, &h.endpoint).into_bytes();
        let (hc, es) = (format!("hc/{}", h.transition_id), format!("es/{}", h.transition_id));
        self.publish(topics, &h, &topics.changes, Some(key.clone()), hc, partition);
        // The state topic holds the fleet's state: a scoped transition is on the changes topic
        // and in the scoped-state projection only.
        if h.scope.is_none() {
            self.publish(
                topics,
                &EndpointState::from_change(&h),
                &topics.state,
                Some(key),
                es,
                partition,
            );
        }
        self.transitions.push((h, partition, offset));
    }

    /// A pool event the engine decided for the record at (partition, offset).
    pub fn pool_event(&mut self, topics: &Topics, p: PoolHealthChanged, partition: i32, offset: i64) {
        let dedup_key = format!("pe/{}/{}", keys::escape(&p.pool), p.seq);
        self.publish(
            topics,
            &p,
            &topics.changes,
            Some(p.pool.clone().into_bytes()),
            dedup_key,
            partition,
        );
        self.pool_events.push((p, partition, offset));
    }

    /// An endpoint seen for the first time: into the state projection, and onto the compacted
    /// state topic so that a router bootstrapping from it learns every member of a pool.
    pub fn discover(&mut self, topics: &Topics, state: EndpointState, partition: i32) {
        let key = keys::endpoint_key(&state.pool, &state.endpoint);
        let dedup_key = format!("es0/{key}");
        self.publish(
            topics,
            &state,
            &topics.state,
            Some(key.into_bytes()),
            dedup_key,
            partition,
        );
        self.discovered.push((state, partition));
    }

    /// An event for the outbox, encoded, with its type in the `vitals-type` header. An event that
    /// cannot be encoded is a bug, and its audit row commits anyway (the line goes on): it goes
    /// to the dead-letter topic as JSON with the error, where it is seen and can be replayed by
    /// hand, and is counted (`encode_failures`, which the processor logs and exports); never
    /// dropped silently.
    fn publish<T: Record>(
        &mut self,
        topics: &Topics,
        value: &T,
        topic: &str,
        key: Option<Vec<u8>>,
        dedup_key: String,
        partition: i32,
    ) {
        let kind = format!("{:?}", T::KIND);
        match encode(value) {
            Ok(payload) => self.outbox.push(OutboxRow {
                dedup_key,
                topic: topic.to_owned(),
                key,
                payload,
                headers: BTreeMap::from([("vitals-type".to_string(), kind)]),
                partition,
            }),
            Err(e) => {
                self.encode_failures += 1;
                let payload = serde_json::to_vec(value)
                    .unwrap_or_else(|j| format!("{{\"unencodable\":{:?}}}", j.to_string()).into_bytes());
                self.outbox.push(OutboxRow {
                    dedup_key: format!("dlq/{dedup_key}"),
                    topic: topics.dlq.clone(),
                    key,
                    payload,
                    headers: BTreeMap::from([
                        ("vitals-type".to_string(), kind),
                        ("vitals-intended-topic".to_string(), topic.to_owned()),
                        ("vitals-error-code".to_string(), "encode_failed".to_string()),
                        ("vitals-error".to_string(), e.to_string().chars().take(1000).collect()),
                        ("content-type".to_string(), "application/json".to_string()),
                    ]),
                    partition,
                });
            }
        }
    }

    /// A record that cannot be decoded or validated: to the dead-letter topic with its origin and
    /// the error in headers, through the outbox so that it commits with the offset.
    #[allow(clippy::too_many_arguments)]
    pub fn dead_letter(
        &mut self,
        topics: &Topics,
        partition: i32,
        offset: i64,
        key: Option<&[u8]>,
        payload: &[u8],
        code: &str,
        error: &str,
    ) {
        self.dead_lettered += 1;
        let headers = BTreeMap::from([
            ("vitals-origin-topic".to_string(), topics.signals.clone()),
            ("vitals-origin-partition".to_string(), partition.to_string()),
            ("vitals-origin-offset".to_string(), offset.to_string()),
            ("vitals-error-code".to_string(), code.to_string()),
            ("vitals-error".to_string(), error.chars().take(1000).collect()),
        ]);
        self.outbox.push(OutboxRow {
            dedup_key: format!("dlq/{}/{}/{}", topics.signals, partition, offset),
            topic: topics.dlq.clone(),
            key: key.map(<[u8]>::to_vec),
            payload: payload.to_vec(),
            headers,
            partition,
        });
    }

    /// The last fleet transition of each endpoint in the batch, for the state projection.
    pub fn latest_states(&self) -> Vec<&HealthChanged> {
        let mut latest: HashMap<(&str, &str), &HealthChanged> = HashMap::new();
        for (h, _, _) in self.transitions.iter().filter(|(h, _, _)| h.scope.is_none()) {
            let e = latest.entry((&h.pool, &h.endpoint)).or_insert(h);
            if e.seq < h.seq {
                *e = h;
            }
        }
        let mut v: Vec<&HealthChanged> = latest.into_values().collect();
        v.sort_by(|a, b| (&a.pool, &a.endpoint).cmp(&(&b.pool, &b.endpoint)));
        v
    }

    /// Leave out a partition that another processor now owns.
    pub fn drop_partition(&mut self, partition: i32) {
        self.policies.retain(|p| p.partition != partition);
        self.transitions.retain(|(_, p, _)| *p != partition);
        self.pool_events.retain(|(_, p, _)| *p != partition);
        self.outbox.retain(|o| o.partition != partition);
        self.discovered.retain(|(_, p)| *p != partition);
        self.partitions.retain(|p| p.partition != partition);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::SchemaKind;

    /// An event whose value does not fit its schema: apache-avro refuses to encode it.
    #[derive(serde::Serialize, serde::Deserialize)]
    struct Unencodable {
        nothing_like_a_health_change: i64,
    }

    impl Record for Unencodable {
        const KIND: SchemaKind = SchemaKind::HealthChanged;
    }

    #[test]
    fn an_event_that_cannot_be_encoded_goes_to_the_dead_letter_topic_as_json_and_is_counted() {
        let topics = Topics {
            signals: "s".into(),
            changes: "c".into(),
            state: "st".into(),
            dlq: "d".into(),
        };
        let mut b = BatchWrite::default();
        let value = Unencodable {
            nothing_like_a_health_change: 7,
        };
        b.publish(&topics, &value, "c", Some(b"k".to_vec()), "hc/x".into(), 3);
        assert_eq!(b.encode_failures, 1);
        assert_eq!(b.outbox.len(), 1, "not dropped");
        let row = &b.outbox[0];
        assert_eq!(
            (row.topic.as_str(), row.dedup_key.as_str(), row.partition),
            ("d", "dlq/hc/x", 3)
        );
        assert_eq!(row.headers["vitals-error-code"], "encode_failed");
        assert_eq!(row.headers["vitals-intended-topic"], "c");
        assert_eq!(row.headers["vitals-type"], "HealthChanged");
        assert_eq!(row.payload, br#"{"nothing_like_a_health_change":7}"#);
    }
}
