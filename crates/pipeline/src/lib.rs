//! The record step of vitals, with no Kafka client and no database inside: a [`Partition`]
//! takes one record (offset, timestamp, key, payload), decodes and validates it, applies it to
//! its engine, and adds what follows to a [`BatchWrite`]: transitions and pool events with
//! their outbox events, endpoints seen for the first time, dead letters for what cannot be
//! read. The processor feeds it from Kafka and writes the batch to Postgres; a backtest or a
//! simulator feeds it from anywhere and gets the same rows.

pub use vitals_contracts::batch::{
    BatchWrite, Counted, OutboxRow, PartitionWrite, PolicyInForce, Rollup, Snapshot, Topics, MINUTE_US,
};

use rustc_hash::FxHashMap as HashMap;
use vitals_contracts::{decode_signal, validate_signal, Micros, Requests, Signal};
use vitals_engine::{Admission, Decision, Engine};

/// One input partition: its engine and where it stands in the log.
pub struct Partition {
    partition: i32,
    /// The ownership epoch under which this state was restored (fences older owners' writes).
    epoch: i64,
    engine: Engine,
    /// The next offset the engine expects; earlier records are stale duplicates.
    next_offset: Option<i64>,
    /// The first offset whose results are not in the database yet. Records before it are
    /// replayed into the engine only: their rows and events were committed by an earlier owner.
    committed: Option<i64>,
    since_snapshot: u64,
    /// Bytes of snapshot a record read may cost at most (0: no bound; see
    /// [`Partition::with_snapshot_budget`]), and the size of the last snapshot.
    snapshot_budget: u64,
    last_snapshot_bytes: u64,
    /// A record was applied since the last [`Partition::write`].
    unwritten: bool,
    decisions: Vec<Decision>,
    /// The first offset whose calls are not counted in the database: calls from here on are
    /// counted into `pending` (replayed ones too), calls before it never again.
    counted_from: i64,
    /// Calls counted since `counted_from`: pool → endpoint → (minute, calls), latest minute last.
    /// (Fx-hashed: this is two lookups on every call read.)
    pending: HashMap<String, HashMap<String, Vec<(Micros, Requests)>>>,
    /// Pools this partition's engine holds at most: a signal of another pool beyond them is
    /// dead-lettered (`too_many_pools`), so that a reporter naming new pools without end cannot
    /// grow the engine, its snapshots and its rows without end.
    max_pools: usize,
    /// On a topic stamped by its producers (CreateTime), how far ahead of the partition's time
    /// a record may be stamped; None: no bound (LogAppendTime, the broker's clock).
    max_ahead: Option<Micros>,
    /// Records in a row stamped beyond `max_ahead` (see [`AHEAD_AGREE`]).
    ahead_run: u32,
}

/// Records in a row, none in time between them, stamped beyond the bound: then the partition's
/// time has moved (every producer's clock agrees: the partition was quiet while every processor
/// was down, say), and the last of them is applied. A producer whose clock is ahead is
/// interleaved with others in time and never makes such a run.
pub const AHEAD_AGREE: u32 = 10;

impl Partition {
    /// `start_offset`: the first offset the engine has not applied (None: the beginning);
    /// `committed`: the first offset whose results are not in the database (None: nothing is).
    pub fn new(
        partition: i32,
        epoch: i64,
        engine: Engine,
        start_offset: Option<i64>,
        committed: Option<i64>,
    ) -> Partition {
        Partition {
            partition,
            epoch,
            engine,
            next_offset: start_offset,
            committed,
            since_snapshot: 0,
            snapshot_budget: 0,
            last_snapshot_bytes: 0,
            unwritten: false,
            decisions: Vec::new(),
            counted_from: 0,
            pending: HashMap::default(),
            max_pools: usize::MAX,
            max_ahead: None,
            ahead_run: 0,
        }
    }

    /// On a topic stamped by its producers: dead-letter a record stamped more than `bound`
    /// ahead of the partition's time (`stamped_ahead`), unless [`AHEAD_AGREE`] in a row are.
    pub fn with_max_ahead(mut self, bound: Option<Micros>) -> Partition {
        self.max_ahead = bound.filter(|b| *b > 0);
        self
    }

    /// Why a record stamped `at` is refused as stamped ahead, if it is. Replayed records are
    /// judged too, so that a replay rebuilds the same run.
    fn stamped_ahead(&mut self, at: Micros) -> Option<String> {
        let bound = self.max_ahead?;
        let now = self.engine.now();
        if now == 0 || at <= now.saturating_add(bound) {
            self.ahead_run = 0;
            return None;
        }
        self.ahead_run += 1;
        if self.ahead_run >= AHEAD_AGREE {
            self.ahead_run = 0;
            return None;
        }
        Some(format!(
            "stamped {} s ahead of its partition's time, more than --create-time-max-ahead-secs {} allows on a topic \
             stamped by its producers: the producer's clock is ahead (the partition's time moves on only when {AHEAD_AGREE} \
             records in a row are so stamped)",
            (at - now) / 1_000_000,
            bound / 1_000_000
        ))
    }

    /// Snapshots cost at most `bytes_per_record` bytes a record read (0: no bound): a snapshot
    /// waits, beyond the `every` records of [`Partition::write`], until as many records were read
    /// since the last one as its bytes over `bytes_per_record`. A partition of many pools is
    /// snapshotted less often (its replay after a crash is longer), one of a few as often as
    /// `every` says.
    pub fn with_snapshot_budget(mut self, bytes_per_record: u64) -> Partition {
        self.snapshot_budget = bytes_per_record;
        self
    }

    /// At most `n` pools in this partition (see [`Partition::step`]); the pools held already stay.
    pub fn with_max_pools(mut self, n: usize) -> Partition {
        self.max_pools = n.max(1);
        self
    }

    /// Count calls from `offset` on (the partition's counted offset in the database; the
    /// default, 0, counts every call read).
    pub fn counting_from(mut self, offset: i64) -> Partition {
        self.counted_from = offset.max(0);
        self
    }

    /// Calls are counted and not written yet, or records were read past the counted offset: a
    /// write with `flush_requests` has something to record.
    pub fn counting(&self) -> bool {
        !self.pending.is_empty() || self.next_offset.is_some_and(|n| n > self.counted_from)
    }

    /// Count a call, or a summary's calls, into the minute of stream time `at`.
    fn count(&mut self, at: Micros, signal: &Signal) {
        let (pool, endpoint, requests) = match signal {
            Signal::Call(c) => {
                let mut r = Requests::default();
                r.add(c.outcome, 1);
                (&c.pool, &c.endpoint, r)
            }
            Signal::Summary(s) => (&s.pool, &s.endpoint, Requests::of_counts(&s.calls)),
            _ => return,
        };
        let minute = at.div_euclid(MINUTE_US) * MINUTE_US;
        let endpoints = match self.pending.get_mut(pool.as_str()) {
            Some(e) => e,
            None => self.pending.entry(pool.clone()).or_default(),
        };
        let minutes = match endpoints.get_mut(endpoint.as_str()) {
            Some(m) => m,
            None => endpoints.entry(endpoint.clone()).or_default(),
        };
        match minutes.iter_mut().rev().find(|(m, _)| *m == minute) {
            Some((_, r)) => r.merge(&requests),
            None => minutes.push((minute, requests)),
        }
    }

    pub fn partition(&self) -> i32 {
        self.partition
    }

    pub fn epoch(&self) -> i64 {
        self.epoch
    }

    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    /// The next offset to read, if any record has been applied or restored.
    pub fn next_offset(&self) -> Option<i64> {
        self.next_offset
    }

    /// The record step. Returns false for a record before the partition's position (a stale
    /// fetch from before a seek), which changes nothing. `ts_ms` is the record's timestamp (the
    /// stream time); a record without one is applied at the current stream time. A record
    /// before the committed offset is replayed: the engine applies it, and nothing else follows
    /// (its rows, events and dead letter are in the database already).
    pub fn step(
        &mut self,
        offset: i64,
        ts_ms: Option<i64>,
        key: Option<&[u8]>,
        payload: Option<&[u8]>,
        topics: &Topics,
        out: &mut BatchWrite,
    ) -> bool {
        if self.next_offset.is_some_and(|n| offset < n) {
            return false;
        }
        self.next_offset = Some(offset + 1);
        self.since_snapshot += 1;
        self.unwritten = true;
        out.records += 1;
        let partition = self.partition;
        let replay = self.committed.is_some_and(|c| offset < c);
        let at: Micros = ts_ms.map_or(self.engine.now(), |ms| ms.saturating_mul(1000));
        let payload = payload.unwrap_or_default();
        if let Some(why) = self.stamped_ahead(at) {
            if !replay {
                out.stamped_ahead += 1;
                out.dead_letter(topics, partition, offset, key, payload, "stamped_ahead", &why);
            }
            return true;
        }
        let signal = match decode_signal(payload) {
            Ok(s) => s,
            Err(e) => {
                if !replay {
                    out.dead_letter(topics, partition, offset, key, payload, e.code(), &e.to_string());
                }
                return true;
            }
        };
        if let Err(e) = validate_signal(&signal, Some(at)) {
            if !replay {
                out.dead_letter(topics, partition, offset, key, payload, "invalid_value", &e.to_string());
            }
            return true;
        }
        // A report sent twice (a retried export, a batch sent again) is applied and counted
        // once: the engine remembers its pools' recent ids, in their snapshots too.
        let first_seen = match self.engine.admit(at, &signal) {
            Admission::Repeat => {
                if !replay {
                    out.repeats += 1;
                }
                return true;
            }
            Admission::Refused(why) => {
                if !replay {
                    out.dead_letter(topics, partition, offset, key, payload, "pool_full", &why);
                }
                return true;
            }
            Admission::Apply { new_pool, first_seen } => {
                if new_pool && self.engine.pool_count() >= self.max_pools {
                    if !replay {
                        let why = format!(
                            "this partition holds {} pools, the most it may (--max-pools-per-partition): pool {:?} is not added",
                            self.engine.pool_count(),
                            signal.pool().unwrap_or_default()
                        );
                        out.pools_refused += 1;
                        out.dead_letter(topics, partition, offset, key, payload, "too_many_pools", &why);
                    }
                    return true;
                }
                first_seen
            }
        };
        if offset >= self.counted_from {
            self.count(at, &signal);
        }
        let first = self.engine.apply_admitted(at, &signal, first_seen, &mut self.decisions);
        let notes = self.engine.take_notes();
        if replay {
            self.decisions.clear();
            return true;
        }
        if !notes.is_empty() {
            out.late += notes.late;
            out.clocks.extend(notes.clocks);
        }
        // The policy in force is data of its own (the API reads it, not a snapshot).
        if let Signal::Policy(p) = &signal {
            out.policies.push(PolicyInForce {
                pool: p.pool.clone(),
                policy: p.policy.clone(),
                stream_time: at,
                partition,
            });
        }
        if let Some(first) = first {
            out.discover(topics, first, partition);
        }
        for d in self.decisions.drain(..) {
            match d {
                Decision::Endpoint(h) => out.transition(topics, *h, partition, offset),
                Decision::Pool(p) => out.pool_event(topics, p, partition, offset),
            }
        }
        true
    }

    /// What the batch records for this partition: its next offset, a snapshot when `force` or
    /// when `every` records have been applied since the last one (and as many as the snapshot
    /// budget asks, [`Partition::with_snapshot_budget`]), and the calls counted since
    /// the last counts when `flush_requests` or with a snapshot (a snapshot's offset is never
    /// past the counted offset, so a restart replays every call not yet counted). None when there
    /// is nothing to record.
    pub fn write(&mut self, every: u64, force: bool, flush_requests: bool) -> Option<PartitionWrite> {
        let counting = flush_requests && self.counting();
        let next = self.next_offset.filter(|_| self.unwritten || force || counting)?;
        self.unwritten = false;
        let every = match self.snapshot_budget {
            0 => every,
            b => every.max(self.last_snapshot_bytes / b),
        };
        let snapshot = (force || self.since_snapshot >= every).then(|| {
            self.since_snapshot = 0;
            let s = self.engine.partition_snapshot();
            self.last_snapshot_bytes = s.pools.iter().map(|(_, b)| b.len() as u64).sum();
            Snapshot {
                offset: next,
                stream_time: s.stream_time,
                pools: s.pools,
            }
        });
        let requests = (counting || (snapshot.is_some() && self.counting())).then(|| {
            let from = std::mem::replace(&mut self.counted_from, next);
            let mut rollups = Vec::new();
            for (pool, endpoints) in self.pending.drain() {
                for (endpoint, minutes) in endpoints {
                    rollups.extend(minutes.into_iter().map(|(minute, requests)| Rollup {
                        pool: pool.clone(),
                        endpoint: endpoint.clone(),
                        minute,
                        requests,
                    }));
                }
            }
            rollups.sort_by(|a, b| (&a.pool, &a.endpoint, a.minute).cmp(&(&b.pool, &b.endpoint, b.minute)));
            Counted {
                from,
                to: next,
                rollups,
            }
        });
        Some(PartitionWrite {
            partition: self.partition,
            epoch: self.epoch,
            next_offset: next,
            snapshot,
            requests,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vitals_contracts::{encode_signal, CallOutcome, OutcomeClass, Policy};

    fn topics() -> Topics {
        Topics {
            signals: "s".into(),
            changes: "c".into(),
            state: "st".into(),
            dlq: "d".into(),
        }
    }

    fn call(ep: &str, i: u64, outcome: OutcomeClass) -> Vec<u8> {
        encode_signal(&Signal::Call(CallOutcome {
            event_id: format!("e{i}"),
            pool: "p".into(),
            endpoint: ep.into(),
            gateway: "g".into(),
            occurred_at: 1_700_000_000_000_000,
            outcome,
            http_status: None,
            latency_us: 1_000,
            ttft_us: None,
            tpot_us: None,
            attributes: Default::default(),
            model: None,
            retry_after_ms: None,
        }))
        .unwrap()
    }

    /// On a topic stamped by its producers, one tick stamped 55 minutes ahead froze its
    /// partition's clock for 55 minutes. Bounded, it is dead-lettered (`stamped_ahead`) and the
    /// partition's time stays; calls in time go on; ten records in a row stamped ahead move the
    /// time (the partition was quiet); a replay of the same records decides the same.
    #[test]
    fn a_record_stamped_far_ahead_is_dead_lettered_unless_every_record_agrees() {
        let t = topics();
        let t0: i64 = 1_700_000_000_000;
        let tick = |ms: i64| {
            encode_signal(&Signal::Tick(vitals_contracts::Tick {
                ticker: "x".into(),
                emitted_at: ms * 1000,
            }))
            .unwrap()
        };
        let mut records: Vec<(i64, Vec<u8>)> = vec![(t0, call("a", 1, OutcomeClass::Success))];
        records.push((t0 + 55 * 60_000, tick(t0 + 55 * 60_000)));
        for i in 0..5 {
            records.push((t0 + 1_000 * (i + 1), call("a", 10 + i as u64, OutcomeClass::Success)));
        }
        let quiet = t0 + 3_600_000;
        for i in 0..12 {
            records.push((quiet + i * 1_000, tick(quiet + i * 1_000)));
        }
        let run = |from_replay: bool| {
            let committed = from_replay.then_some(records.len() as i64);
            let mut p =
                Partition::new(0, 1, Engine::new(Policy::default()), None, committed).with_max_ahead(Some(300_000_000));
            let mut out = BatchWrite::default();
            let mut times = Vec::new();
            for (offset, (ts, bytes)) in records.iter().enumerate() {
                p.step(offset as i64, Some(*ts), None, Some(bytes), &t, &mut out);
                times.push(p.engine().now());
            }
            (out, times)
        };
        let (out, times) = run(false);
        let dlq: Vec<&OutboxRow> = out.outbox.iter().filter(|r| r.topic == "d").collect();
        assert_eq!(out.stamped_ahead, 1 + 9);
        assert_eq!(dlq.len(), 10);
        assert_eq!(dlq[0].headers["vitals-error-code"], "stamped_ahead");
        assert_eq!(dlq[0].headers["vitals-origin-offset"], "1");
        assert!(
            dlq[0].headers["vitals-error"].contains("stamped 3300 s ahead"),
            "{:?}",
            dlq[0].headers
        );
        // The far tick left the time alone: the calls after it moved it a second at a time.
        assert_eq!(times[1], t0 * 1000);
        assert_eq!(times[6], (t0 + 5_000) * 1000);
        // The quiet hour: nine ticks refused, the tenth in a row moves the time, the rest follow.
        assert_eq!(times[6 + 9], (t0 + 5_000) * 1000);
        assert_eq!(times[6 + 10], (quiet + 9_000) * 1000);
        assert_eq!(*times.last().unwrap(), (quiet + 11_000) * 1000);
        // Unbounded (LogAppendTime), the far tick moves the time at once.
        let mut free = Partition::new(0, 1, Engine::new(Policy::default()), None, None);
        let mut o = BatchWrite::default();
        free.step(0, Some(records[0].0), None, Some(&records[0].1), &t, &mut o);
        free.step(1, Some(records[1].0), None, Some(&records[1].1), &t, &mut o);
        assert_eq!(free.engine().now(), (t0 + 55 * 60_000) * 1000);
        // A replay rebuilds the same times and dead-letters nothing again.
        let (replayed, again) = run(true);
        assert_eq!(again, times);
        assert_eq!(replayed.stamped_ahead, 0);
    }

    /// Beyond the partition's pools, a signal naming a new pool goes to the dead-letter topic
    /// with the reason (`too_many_pools`) and is counted; the pools held go on; a replay of the
    /// same records refuses the same one again, without a second dead letter.
    #[test]
    fn a_new_pool_beyond_the_partitions_cap_is_dead_lettered_with_the_reason() {
        let t = topics();
        let ts = Some(1_700_000_000_000);
        let in_pool = |pool: &str, i: u64| {
            encode_signal(&Signal::Call(CallOutcome::new(
                format!("e{i}"),
                pool,
                "a",
                "g",
                1_700_000_000_000_000,
                OutcomeClass::Success,
            )))
            .unwrap()
        };
        let records: Vec<Vec<u8>> = ["p1", "p2", "p3", "p1", "p2"]
            .iter()
            .enumerate()
            .map(|(i, p)| in_pool(p, i as u64))
            .collect();
        let mut p = Partition::new(0, 1, Engine::new(Policy::default()), None, None).with_max_pools(2);
        let mut out = BatchWrite::default();
        for (i, r) in records.iter().enumerate() {
            p.step(i as i64, ts, Some(b"k"), Some(r), &t, &mut out);
        }
        assert_eq!((out.dead_lettered, out.pools_refused), (1, 1));
        assert_eq!(p.engine().pool_count(), 2);
        let dlq: Vec<&OutboxRow> = out.outbox.iter().filter(|r| r.topic == "d").collect();
        assert_eq!(dlq[0].headers["vitals-error-code"], "too_many_pools");
        assert_eq!(dlq[0].headers["vitals-origin-offset"], "2");
        assert!(
            dlq[0].headers["vitals-error"].contains("holds 2 pools"),
            "{:?}",
            dlq[0].headers
        );
        // A new owner replays what the first committed: the same refusal, no second letter.
        let mut again = Partition::new(0, 2, Engine::new(Policy::default()), None, Some(5)).with_max_pools(2);
        let mut replayed = BatchWrite::default();
        for (i, r) in records.iter().enumerate() {
            again.step(i as i64, ts, Some(b"k"), Some(r), &t, &mut replayed);
        }
        assert_eq!((replayed.dead_lettered, again.engine().pool_count()), (0, 2));
    }

    /// Beyond the pool's `max_endpoints`, a signal naming a new endpoint goes to the dead-letter
    /// topic with the reason, and the pool's endpoints are unchanged; a replay does it again.
    #[test]
    fn a_new_endpoint_beyond_the_pools_cap_is_dead_lettered_with_the_reason() {
        let engine = Engine::new(Policy {
            max_endpoints: 2,
            ..Policy::default()
        });
        let mut p = Partition::new(0, 1, engine, None, None);
        let mut out = BatchWrite::default();
        let t = topics();
        let ts = Some(1_700_000_000_000);
        for (i, ep) in ["a", "b", "c", "a"].iter().enumerate() {
            p.step(
                i as i64,
                ts,
                Some(b"p"),
                Some(&call(ep, i as u64, OutcomeClass::Success)),
                &t,
                &mut out,
            );
        }
        assert_eq!(out.dead_lettered, 1);
        assert_eq!(out.discovered.len(), 2);
        let dlq: Vec<&OutboxRow> = out.outbox.iter().filter(|r| r.topic == "d").collect();
        assert_eq!(dlq.len(), 1);
        assert_eq!(dlq[0].headers["vitals-error-code"], "pool_full");
        assert_eq!(dlq[0].headers["vitals-origin-offset"], "2");
        assert!(
            dlq[0].headers["vitals-error"].contains("max_endpoints 2"),
            "{:?}",
            dlq[0].headers
        );
        assert_eq!(p.engine().pool("p").unwrap().total(), 2);
    }

    #[test]
    fn a_record_step_gives_first_seen_decisions_and_dead_letters_without_io() {
        let mut p = Partition::new(3, 1, Engine::new(Policy::default()), None, None);
        let mut out = BatchWrite::default();
        let t = topics();
        let ts = Some(1_700_000_000_000);
        assert!(p.step(
            0,
            ts,
            Some(b"p"),
            Some(&call("a", 0, OutcomeClass::Success)),
            &t,
            &mut out
        ));
        assert_eq!(out.discovered.len(), 1, "a first-seen endpoint");
        assert_eq!(out.discovered[0].0.endpoint, "a");
        for i in 1..=3 {
            p.step(
                i,
                ts,
                Some(b"p"),
                Some(&call("a", i as u64, OutcomeClass::ServerError)),
                &t,
                &mut out,
            );
        }
        assert_eq!(out.discovered.len(), 1, "seen once");
        assert!(!out.transitions.is_empty(), "three 5xx in a row break hard");
        assert!(p.step(4, ts, None, Some(b"garbage"), &t, &mut out));
        assert_eq!(out.dead_lettered, 1);
        assert!(
            !p.step(2, ts, None, Some(b"stale"), &t, &mut out),
            "before the position: skipped"
        );
        assert_eq!(out.records, 5);
        let w = p.write(1_000, false, false).unwrap();
        assert_eq!((w.partition, w.next_offset), (3, 5));
        assert!(w.snapshot.is_none());
        assert!(
            p.write(1_000, false, false).is_none(),
            "nothing new since the last write"
        );
        let w = p.write(1_000, true, false).unwrap();
        let s = w.snapshot.unwrap();
        let restored = Engine::from_snapshot(
            Policy::default(),
            s.stream_time,
            s.pools.iter().map(|(_, b)| b.as_slice()),
        )
        .unwrap();
        assert_eq!(&restored, p.engine());
    }

    /// With a snapshot budget, a snapshot waits until its predecessor's bytes over the budget
    /// were read since, then comes as `every` says; without one, `every` alone decides.
    #[test]
    fn a_snapshot_budget_spaces_snapshots_by_their_size() {
        let t = topics();
        let ts = Some(1_700_000_000_000);
        let mut bounded = Partition::new(0, 1, Engine::new(Policy::default()), None, None).with_snapshot_budget(16);
        let mut plain = Partition::new(0, 1, Engine::new(Policy::default()), None, None);
        // (record, bytes of the snapshot taken after it)
        let (mut taken, mut taken_plain) = (Vec::new(), 0);
        for i in 0..3_000i64 {
            let record = call(["a", "b", "c"][i as usize % 3], i as u64, OutcomeClass::Success);
            for p in [&mut bounded, &mut plain] {
                p.step(i, ts, Some(b"p"), Some(&record), &t, &mut BatchWrite::default());
            }
            if let Some(s) = bounded.write(10, false, false).and_then(|w| w.snapshot) {
                taken.push((i, s.pools.iter().map(|(_, b)| b.len() as i64).sum::<i64>()));
            }
            taken_plain += i64::from(plain.write(10, false, false).and_then(|w| w.snapshot).is_some());
        }
        assert_eq!(taken_plain, 300, "every 10 records without a budget");
        assert_eq!(taken[0].0, 9, "the first after `every` records");
        assert!(taken.len() >= 3 && taken[0].1 > 1_000, "{taken:?}");
        for w in taken.windows(2) {
            let ((at, bytes), (next, _)) = (w[0], w[1]);
            assert_eq!(
                next - at,
                (bytes / 16).max(10),
                "spaced by the last one's bytes over 16: {taken:?}"
            );
        }
    }

    #[test]
    fn a_replay_below_the_committed_offset_rebuilds_the_engine_and_emits_only_what_is_new() {
        let t = topics();
        let ts = Some(1_700_000_000_000);
        let records: Vec<Vec<u8>> = (0..12)
            .map(|i| match i {
                5 => b"garbage".to_vec(),
                i if i % 4 == 3 => call("b", i, OutcomeClass::Success),
                i if i < 8 => call("a", i, OutcomeClass::Success),
                i => call("a", i, OutcomeClass::ServerError),
            })
            .collect();
        let run = |committed: Option<i64>| {
            let mut p = Partition::new(0, 1, Engine::new(Policy::default()), None, committed);
            let mut out = BatchWrite::default();
            for (o, r) in records.iter().enumerate() {
                p.step(o as i64, ts, None, Some(r), &t, &mut out);
            }
            (p, out)
        };
        let (first, all) = run(None);
        let (replayed, tail) = run(Some(7));
        assert_eq!(replayed.engine(), first.engine(), "the replay rebuilt the same state");
        assert_eq!(tail.records, 12);
        assert!(tail.discovered.is_empty(), "both endpoints were seen before offset 7");
        assert_eq!(tail.dead_lettered, 0, "offset 5 was dead-lettered by the earlier owner");
        let after = |b: &BatchWrite| {
            b.transitions
                .iter()
                .filter(|(_, _, o)| *o >= 7)
                .map(|(h, _, o)| (h.transition_id.clone(), *o))
                .collect::<Vec<_>>()
        };
        assert!(!after(&all).is_empty(), "the scenario has transitions after offset 7");
        assert_eq!(after(&tail), after(&all));
        assert_eq!(
            tail.transitions.len(),
            after(&all).len(),
            "nothing from before offset 7"
        );
        let outbox_keys = |b: &BatchWrite| b.outbox.iter().map(|o| o.dedup_key.clone()).collect::<Vec<_>>();
        let new_keys: Vec<String> = outbox_keys(&all)
            .into_iter()
            .filter(|k| tail.transitions.iter().any(|(h, _, _)| k.ends_with(&h.transition_id)))
            .collect();
        assert_eq!(outbox_keys(&tail), new_keys);
    }

    /// A processor that stops at any point, after writing its counts and snapshots at any
    /// points before, and a successor that resumes from the last snapshot with the counted
    /// offset: every call of the log is counted once, by minute, whatever the points.
    #[test]
    fn calls_are_counted_once_across_any_restart() {
        let t = topics();
        let classes = [
            OutcomeClass::Success,
            OutcomeClass::ServerError,
            OutcomeClass::RateLimited,
            OutcomeClass::ClientError,
            OutcomeClass::Success,
        ];
        let n = 14i64;
        // Four records a minute apart in stream time, one of them garbage (not counted).
        let records: Vec<(Option<i64>, Vec<u8>)> = (0..n)
            .map(|i| {
                let ts = Some(1_700_000_000_000 + i * 20_000);
                let body = if i == 6 {
                    b"garbage".to_vec()
                } else {
                    call(if i % 3 == 0 { "b" } else { "a" }, i as u64, classes[i as usize % 5])
                };
                (ts, body)
            })
            .collect();
        let sum = |rollups: &[Rollup]| {
            let mut by: std::collections::BTreeMap<(String, Micros), Requests> = Default::default();
            for r in rollups {
                by.entry((r.endpoint.clone(), r.minute)).or_default().merge(&r.requests);
            }
            by
        };
        let mut whole = Partition::new(0, 1, Engine::new(Policy::default()), None, None);
        let mut out = BatchWrite::default();
        for (o, (ts, r)) in records.iter().enumerate() {
            whole.step(o as i64, *ts, Some(b"p"), Some(r), &t, &mut out);
        }
        let all = whole.write(1_000, false, true).unwrap().requests.unwrap();
        assert_eq!((all.from, all.to), (0, n));
        let expected = sum(&all.rollups);
        assert_eq!(expected.values().map(Requests::total).sum::<i64>(), n - 1);
        assert!(expected.len() >= 4, "two endpoints over several minutes: {expected:?}");
        for snap_at in 1..n {
            for flush_at in snap_at..n {
                for stop_at in flush_at..=n {
                    let mut written: Vec<Rollup> = Vec::new();
                    let mut first = Partition::new(0, 1, Engine::new(Policy::default()), None, None);
                    let (mut snapshot, mut counted) = (None, 0);
                    let mut out = BatchWrite::default();
                    for o in 0..stop_at {
                        let (ts, r) = &records[o as usize];
                        first.step(o, *ts, Some(b"p"), Some(r), &t, &mut out);
                        let (force, flush) = (o + 1 == snap_at, o + 1 == flush_at);
                        if let Some(w) = (force || flush).then(|| first.write(1_000, force, flush)).flatten() {
                            if let Some(c) = w.requests {
                                assert_eq!(c.from, counted, "counts follow on");
                                counted = c.to;
                                written.extend(c.rollups);
                            }
                            if let Some(s) = w.snapshot {
                                snapshot = Some(s);
                            }
                        }
                    }
                    // The first stops here: what it counted and did not write is lost.
                    let s = snapshot.expect("a snapshot was written");
                    assert!(s.offset <= counted, "a snapshot is never past the counted offset");
                    let engine = Engine::from_snapshot(
                        Policy::default(),
                        s.stream_time,
                        s.pools.iter().map(|(_, b)| b.as_slice()),
                    )
                    .unwrap();
                    let mut next = Partition::new(0, 2, engine, Some(s.offset), Some(counted)).counting_from(counted);
                    for o in s.offset..n {
                        let (ts, r) = &records[o as usize];
                        next.step(o, *ts, Some(b"p"), Some(r), &t, &mut out);
                    }
                    if let Some(c) = next.write(1_000, false, true).and_then(|w| w.requests) {
                        assert_eq!((c.from, c.to), (counted, n));
                        written.extend(c.rollups);
                    }
                    assert_eq!(
                        sum(&written),
                        expected,
                        "snapshot at {snap_at}, counts at {flush_at}, stopped at {stop_at}"
                    );
                }
            }
        }
    }
}
