//! One reader of the changes topic per API instance, feeding every live stream: each event is
//! decoded once, duplicates (a relay's republish) are dropped once, and the result goes to a
//! bounded ring of recent events and to a broadcast channel. A client that resumes from a
//! position inside the ring is replayed from it; one further behind is served from Kafka by its
//! own consumer (`kafka.rs`). A client that falls behind the broadcast by more than its
//! capacity is dropped with a `lagged` event (it resumes with `Last-Event-ID`), so a slow client
//! never slows the others.

use super::fanout::{Fanout, RawClient};
use super::protocol::{self, encode_positions, Decoder, Filter, Item, Positions, RAW_HEAD};
use crate::metrics::Metrics;
use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::message::Message;
use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{broadcast, watch};
use tokio_util::sync::CancellationToken;

struct Inner {
    ring: VecDeque<Arc<Item>>,
    /// Positions before the oldest event of the ring: a client at or past them resumes from it.
    base: Positions,
    /// Positions after the newest record read.
    positions: Positions,
    decoder: Decoder,
    /// The live feed; None once the hub stops (every client's feed then ends).
    tx: Option<broadcast::Sender<Arc<Item>>>,
}

pub struct Hub {
    inner: Mutex<Inner>,
    /// The reader's consumer and topic, to ask for the topic's end (a new client starts there).
    reader: Mutex<Option<(Arc<StreamConsumer>, String)>>,
    /// The latest answer to "where does the topic end?", with when it was asked (shared by the
    /// clients that connect while it is asked: see `end_positions`).
    end: watch::Sender<Option<(tokio::time::Instant, Result<Positions, String>)>>,
    /// A query of the topic's end is under way.
    asking_end: std::sync::atomic::AtomicBool,
    ring_capacity: usize,
    /// Events one client may have waiting, its replay included.
    client_buffer: usize,
    started: watch::Sender<bool>,
    /// The streams written by the live-stream threads (`fanout.rs`).
    fanout: Fanout,
}

/// What a client starts from: the `ready` id, the events to replay, and the live feed.
pub struct Subscription {
    pub ready_id: String,
    /// The ring's events from where the client starts, as far as `cut` allows.
    pub replay: Vec<Arc<Item>>,
    /// Events the client wants beyond the replay it may hold (`--stream-client-buffer`): it
    /// ends with `lagged` after the replay, and resumes from there.
    pub cut: Option<u64>,
    pub rx: broadcast::Receiver<Arc<Item>>,
}

/// How much of `replay` a client that wants `filter` may hold: the number of events to replay
/// (wanted or not) so that at most `buffer` wanted ones are in it, and how many wanted ones are
/// left out (None: none).
pub fn cut(replay: &[Arc<Item>], filter: &Filter, buffer: usize) -> (usize, Option<u64>) {
    let mut wanted = 0usize;
    for (i, item) in replay.iter().enumerate() {
        if filter.wants(item) {
            if wanted == buffer {
                let missed = replay[i..].iter().filter(|it| filter.wants(it)).count();
                return (i, Some(missed as u64));
            }
            wanted += 1;
        }
    }
    (replay.len(), None)
}

impl Hub {
    /// `writers` threads write the streams handed over (0: one per core).
    pub fn new(ring_capacity: usize, client_buffer: usize, writers: usize) -> Arc<Hub> {
        Arc::new(Hub {
            inner: Mutex::new(Inner {
                ring: VecDeque::with_capacity(ring_capacity.min(100_000)),
                base: Positions::new(),
                positions: Positions::new(),
                decoder: Decoder::default(),
                tx: Some(broadcast::channel(client_buffer.max(1)).0),
            }),
            client_buffer: client_buffer.max(1),
            reader: Mutex::new(None),
            end: watch::channel(None).0,
            asking_end: std::sync::atomic::AtomicBool::new(false),
            ring_capacity: ring_capacity.max(1),
            started: watch::channel(false).0,
            fanout: Fanout::new(
                match writers {
                    0 => std::thread::available_parallelism().map_or(2, |n| n.get()),
                    n => n,
                },
                client_buffer,
            ),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Wait (up to `timeout`) until the hub reads the topic.
    pub async fn ready(&self, timeout: Duration) -> bool {
        let mut rx = self.started.subscribe();
        tokio::time::timeout(timeout, rx.wait_for(|s| *s))
            .await
            .is_ok_and(|r| r.is_ok())
    }

    /// Whether the hub has read past every offset of `resume` (then it is no resume from
    /// ahead of the topic, without asking the broker).
    pub fn has_read(&self, resume: &Positions) -> bool {
        !protocol::ahead(resume, &self.lock().positions)
    }

    /// Clients connected to the live feed.
    pub fn clients(&self) -> usize {
        self.lock().tx.as_ref().map_or(0, |tx| tx.receiver_count()) + self.fanout.clients()
    }

    /// Stop feeding: every client's feed ends after what it has been sent (the server's
    /// graceful shutdown waits for the streams to end).
    fn close(&self) {
        self.lock().tx = None;
        self.fanout.close();
    }

    /// The end of the topic now: where a client without `Last-Event-ID` starts (events the
    /// hub has yet to read, from before the client came, are not sent to it). The broker is
    /// asked once for every client that arrived before the question: when 10,000 dashboards
    /// connect at once, that is a few queries, not 10,000 (each a watermark query per partition).
    pub async fn end_positions(self: &Arc<Self>) -> anyhow::Result<Positions> {
        let arrived = tokio::time::Instant::now();
        let mut rx = self.end.subscribe();
        loop {
            if let Some((asked, answer)) = &*rx.borrow_and_update() {
                if *asked >= arrived {
                    return answer.clone().map_err(anyhow::Error::msg);
                }
            }
            if !self.asking_end.swap(true, std::sync::atomic::Ordering::AcqRel) {
                let hub = self.clone();
                let asked = tokio::time::Instant::now();
                // Its own task: the answer is shared even if this client goes away meanwhile.
                tokio::spawn(async move {
                    let answer = hub.ask_end().await.map_err(|e| e.to_string());
                    // Free before the answer is out: a client that arrived during this query
                    // and wakes to an answer older than itself must be able to ask again.
                    hub.asking_end.store(false, std::sync::atomic::Ordering::Release);
                    hub.end.send_replace(Some((asked, answer)));
                });
            }
            rx.changed().await?;
        }
    }

    /// Every partition's end, from the broker.
    async fn ask_end(&self) -> anyhow::Result<Positions> {
        let (consumer, topic) = self
            .reader
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
            .ok_or_else(|| anyhow::anyhow!("the changes topic is not read yet"))?;
        let partitions: Vec<i32> = self.lock().positions.keys().copied().collect();
        tokio::task::spawn_blocking(move || {
            let mut out = Positions::new();
            for p in partitions {
                out.insert(p, consumer.fetch_watermarks(&topic, p, Duration::from_secs(5))?.1);
            }
            Ok(out)
        })
        .await?
    }

    /// A client from `from` (its `Last-Event-ID`, or the end of the topic): the events of the ring
    /// at or after it, then the live feed. None if the ring does not reach back that far (serve
    /// it from Kafka).
    pub fn subscribe(&self, filter: &Filter) -> Option<Subscription> {
        let inner = self.lock();
        let mut replay = Self::replay(&inner, &filter.from)?;
        let (upto, cut) = cut(&replay, filter, self.client_buffer);
        replay.truncate(upto);
        Some(Subscription {
            ready_id: encode_positions(&filter.from),
            replay,
            cut,
            // After `close`, a feed that ends at once.
            rx: inner
                .tx
                .as_ref()
                .map_or_else(|| broadcast::channel(1).1, |tx| tx.subscribe()),
        })
    }

    /// The events of the ring at or after `from`; None if the ring does not reach back that far.
    fn replay(inner: &Inner, from: &Positions) -> Option<Vec<Arc<Item>>> {
        // Every partition the hub reads must be at or past the ring's start.
        let inside = inner
            .base
            .iter()
            .all(|(p, base)| from.get(p).copied().unwrap_or(0) >= *base);
        inside.then(|| {
            inner
                .ring
                .iter()
                .filter(|i| i.offset >= from.get(&i.partition).copied().unwrap_or(0))
                .cloned()
                .collect()
        })
    }

    /// Hand a stream to the live-stream writers: the response head, `ready`, `notice` (a
    /// `reset`), the events of the ring at or after where it starts (`filter.from`), then the
    /// live events. The client back if the ring does not reach back that far (serve it from
    /// Kafka).
    pub fn attach(&self, mut client: Box<RawClient>, notice: Option<axum::body::Bytes>) -> Result<(), Box<RawClient>> {
        let inner = self.lock();
        let Some(replay) = Self::replay(&inner, &client.filter.from) else {
            return Err(client);
        };
        client.last_id = encode_positions(&client.filter.from);
        let mut head = RAW_HEAD.to_vec();
        head.extend_from_slice(&protocol::ready(&client.last_id));
        if let Some(n) = notice {
            head.extend_from_slice(&n);
        }
        // The ring's own frames, not copies; at most a client buffer of them.
        let (upto, missed) = cut(&replay, &client.filter, self.client_buffer);
        let mut first = vec![axum::body::Bytes::from(head)];
        for item in &replay[..upto] {
            client.last_id.clone_from(&item.id);
            if client.filter.wants(item) {
                first.push(item.frame.clone());
            }
        }
        if let Some(missed) = missed {
            first.push(protocol::lagged(&client.last_id, missed));
        }
        // Under the lock, like `take`'s sends: the writer gets every later event after these.
        self.fanout.attach(client, first, missed.is_some());
        Ok(())
    }

    /// Take one record of the changes topic: the event clients get, if any.
    fn take(&self, partition: i32, offset: i64, payload: &[u8], metrics: &Metrics) {
        let mut inner = self.lock();
        let inner = &mut *inner;
        inner.positions.insert(partition, offset + 1);
        let Some(item) = inner
            .decoder
            .decode(partition, offset, payload, &inner.positions, None, metrics)
        else {
            return;
        };
        let item = Arc::new(item);
        if inner.ring.len() >= self.ring_capacity {
            if let Some(old) = inner.ring.pop_front() {
                inner.base.insert(old.partition, old.offset + 1);
            }
        }
        inner.ring.push_back(item.clone());
        // Sent under the lock, so a subscriber sees each event once: in its replay or its feed.
        self.fanout.send(&item);
        if let Some(tx) = &inner.tx {
            let _ = tx.send(item);
        }
    }

    /// Read the changes topic from its end until `cancel`, retrying while Kafka is away; then
    /// end every client's feed.
    pub async fn run(
        self: Arc<Hub>,
        kafka: vitals_runtime::args::KafkaArgs,
        topic: String,
        metrics: Arc<Metrics>,
        cancel: CancellationToken,
    ) {
        loop {
            match self.clone().read(&kafka, &topic, &metrics, &cancel).await {
                Ok(()) => break,
                Err(e) => {
                    tracing::warn!(error = %e, "live stream: cannot read the changes topic; retrying");
                    tokio::select! {
                        _ = cancel.cancelled() => break,
                        _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                    }
                }
            }
        }
        self.close();
    }

    async fn read(
        self: Arc<Hub>,
        kafka: &vitals_runtime::args::KafkaArgs,
        topic: &str,
        metrics: &Metrics,
        cancel: &CancellationToken,
    ) -> anyhow::Result<()> {
        let consumer: Arc<StreamConsumer> = Arc::new(
            vitals_runtime::kafka::consumer(
                kafka,
                "vitals-api-live",
                &[("isolation.level", "read_committed"), ("fetch.wait.max.ms", "20")],
            )
            .create()?,
        );
        let (consumer, start) = {
            let topic = topic.to_owned();
            let known = self.lock().positions.clone();
            tokio::task::spawn_blocking(move || {
                // After a reconnect, from where the hub was; the first time, from the end.
                let start = protocol::assign(&consumer, &topic, |p| known.get(&p).copied())?;
                anyhow::Ok((consumer, start))
            })
            .await??
        };
        {
            let mut inner = self.lock();
            for (p, o) in &start {
                inner.positions.entry(*p).or_insert(*o);
                inner.base.entry(*p).or_insert(*o);
            }
        }
        *self.reader.lock().unwrap_or_else(|p| p.into_inner()) = Some((consumer.clone(), topic.to_owned()));
        self.started.send_replace(true);
        tracing::info!(
            topic,
            partitions = start.len(),
            "live stream: reading the changes topic"
        );
        loop {
            let m = tokio::select! {
                _ = cancel.cancelled() => return Ok(()),
                m = consumer.recv() => m,
            };
            match m {
                Ok(m) => self.take(m.partition(), m.offset(), m.payload().unwrap_or_default(), metrics),
                Err(e) => {
                    tracing::warn!(error = %e, "live stream: consumer error");
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vitals_contracts::{encode, Evidence, HealthChanged, HealthState};

    fn change(seq: i64) -> Vec<u8> {
        encode(&HealthChanged {
            transition_id: format!("p/e/{seq}"),
            pool: "p".into(),
            endpoint: "e".into(),
            seq,
            from_state: HealthState::Healthy,
            to_state: HealthState::Degraded,
            weight: 0.25,
            ramp_ms: 0,
            retry_at: None,
            reason_code: "degraded".into(),
            reason: String::new(),
            evidence: Evidence::default(),
            policy_version: 0,
            trigger_ids: vec![],
            stream_time: seq,
            scope: None,
        })
        .unwrap()
    }

    #[test]
    fn the_ring_replays_a_resume_and_a_slow_receiver_lags() {
        let hub = Hub::new(3, 2, 1);
        let metrics = Metrics::default();
        hub.lock().base.insert(0, 0);
        let from = |p: Positions| Filter {
            from: p,
            pool: None,
            endpoint: None,
        };
        let mut slow = hub.subscribe(&from([(0, 0)].into())).unwrap();
        for seq in 1..=5 {
            hub.take(0, seq - 1, &change(seq), &metrics);
        }
        // A duplicate (republished) is dropped once, for everyone.
        hub.take(0, 5, &change(5), &metrics);
        assert_eq!(hub.lock().ring.len(), 3, "bounded");
        // Inside the ring: from offset 3 on.
        let at: Positions = [(0, 3)].into();
        let sub = hub.subscribe(&from(at)).unwrap();
        assert_eq!(sub.replay.iter().map(|i| i.offset).collect::<Vec<_>>(), [3, 4]);
        // Behind the ring (offset 1 was evicted): not from here.
        assert!(hub.subscribe(&from([(0, 1)].into())).is_none());
        // The slow receiver held 2 of 5: it lagged.
        assert!(matches!(
            slow.rx.try_recv(),
            Err(broadcast::error::TryRecvError::Lagged(3))
        ));
        assert_eq!(hub.lock().positions.get(&0), Some(&6));
    }

    #[test]
    fn a_replay_longer_than_the_client_buffer_is_cut_and_says_how_many_it_left_out() {
        // A ring of 10 and a client buffer of 4: a resume from the ring's start holds 4 events.
        let hub = Hub::new(10, 4, 1);
        let metrics = Metrics::default();
        hub.lock().base.insert(0, 0);
        for seq in 1..=10 {
            hub.take(0, seq - 1, &change(seq), &metrics);
        }
        let all = Filter {
            from: [(0, 0)].into(),
            pool: None,
            endpoint: None,
        };
        let sub = hub.subscribe(&all).unwrap();
        assert_eq!(sub.replay.iter().map(|i| i.offset).collect::<Vec<_>>(), [0, 1, 2, 3]);
        assert_eq!(sub.cut, Some(6));
        // One that wants another pool: nothing to hold, nothing cut.
        let other = Filter {
            pool: Some("other".into()),
            ..all
        };
        let (upto, missed) = cut(&hub.subscribe(&other).unwrap().replay, &other, 4);
        assert_eq!((upto, missed), (10, None));
    }
}
