//! Filling a [`HealthView`] from Kafka: a cold start from the compacted state topic (read to its
//! end), then the changes topic followed from a little before the cold start began (so nothing
//! written meanwhile is missed; `seq` drops what the state already had). A gap in an endpoint's
//! `seq` means changes were missed: the state topic is read again (at most once per
//! `reread_after_gap`). Every record on the changes topic, the processor's ticks included, says
//! the processor is alive (the view's freshness).

use crate::{Applied, HealthView};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::{ClientConfig, Message, Offset, TopicPartitionList};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use vitals_contracts::clock::now_us;
use vitals_contracts::codec::peek_kind;
use vitals_contracts::{decode, EndpointState, HealthChanged, PoolHealthChanged, SchemaKind};

/// Where the topics are.
#[derive(Debug, Clone)]
pub struct Config {
    pub brokers: String,
    /// Extra librdkafka settings (security); they win over the defaults.
    pub kafka_options: Vec<(String, String)>,
    pub state_topic: String,
    pub changes_topic: String,
    /// Silence of the processor after which the view is stale (routes as last known).
    pub stale_after: Duration,
    /// Silence after which the view fails open (routes to every endpoint).
    pub open_after: Duration,
    /// The least time between two re-reads of the state topic after gaps.
    pub reread_after_gap: Duration,
    /// How long the start keeps retrying a broker that is not ready (still starting, its
    /// metadata not there yet, the topics not created yet) before it gives up.
    pub start_within: Duration,
    /// The scopes whose transitions the view applies besides the fleet's (its router's gateway
    /// id, location, credentials).
    pub identity: crate::Identity,
}

impl Config {
    pub fn new(brokers: impl Into<String>) -> Config {
        Config {
            brokers: brokers.into(),
            kafka_options: Vec::new(),
            state_topic: vitals_contracts::topics::HEALTH_STATE.to_owned(),
            changes_topic: vitals_contracts::topics::HEALTH_CHANGES.to_owned(),
            stale_after: Duration::from_secs(15),
            open_after: Duration::from_secs(60),
            reread_after_gap: Duration::from_secs(10),
            start_within: Duration::from_secs(120),
            identity: crate::Identity::fleet(),
        }
    }

    fn consumer(&self) -> Result<BaseConsumer, KafkaError> {
        let mut c = ClientConfig::new();
        c.set("bootstrap.servers", &self.brokers)
            .set("group.id", "vitals-healthview")
            .set("enable.auto.commit", "false")
            .set("isolation.level", "read_committed");
        for (k, v) in &self.kafka_options {
            c.set(k, v);
        }
        c.create()
    }
}

/// A view being kept current by a background thread.
pub struct Follower {
    pub view: Arc<HealthView>,
    /// How long the cold start took.
    pub cold_start: Duration,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Drop for Follower {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The topic's partitions. The services share `vitals_runtime::kafka::partitions`; this
/// library, embedded in gateways, does not take the runtime's dependencies (clap, axum).
/// A topic without partitions is one the broker does not know (yet): an error, so that the
/// start retries instead of following nothing.
fn partitions(c: &BaseConsumer, topic: &str) -> Result<Vec<i32>, KafkaError> {
    let md = c.fetch_metadata(Some(topic), Duration::from_secs(10))?;
    let ps: Vec<i32> = md
        .topics()
        .iter()
        .filter(|t| t.name() == topic)
        .flat_map(|t| t.partitions().iter().map(|p| p.id()))
        .collect();
    if ps.is_empty() {
        return Err(KafkaError::MetadataFetch(RDKafkaErrorCode::UnknownTopicOrPartition));
    }
    Ok(ps)
}

/// What the follower applied, as it happens (for a caller that logs or reacts to changes).
#[derive(Debug, Clone, Copy)]
pub enum Event<'a> {
    /// An endpoint's transition, new to the view (duplicates are not reported).
    Change(&'a HealthChanged, Applied),
    /// A pool decision, new to the view.
    Pool(&'a PoolHealthChanged),
}

/// Apply one record; whether it revealed a gap.
fn apply(view: &HealthView, payload: &[u8], listener: &dyn Fn(Event<'_>)) -> bool {
    match peek_kind(payload) {
        Ok(SchemaKind::HealthChanged) => {
            if let Ok(h) = decode::<HealthChanged>(payload) {
                let applied = view.apply_change(&h);
                if applied != Applied::Duplicate {
                    listener(Event::Change(&h, applied));
                }
                return applied == Applied::Gap;
            }
        }
        Ok(SchemaKind::PoolHealthChanged) => {
            if let Ok(p) = decode::<PoolHealthChanged>(payload) {
                if view.apply_pool(&p) {
                    listener(Event::Pool(&p));
                }
            }
        }
        Ok(SchemaKind::EndpointState) => {
            if let Ok(s) = decode::<EndpointState>(payload) {
                view.apply_state(&s);
            }
        }
        _ => {}
    }
    false
}

/// Every partition of the state topic, from its beginning to its high watermark, into `view`.
fn load_state(cfg: &Config, view: &HealthView) -> Result<(), KafkaError> {
    let state = cfg.consumer()?;
    let mut ends = std::collections::HashMap::new();
    let mut tpl = TopicPartitionList::new();
    for p in partitions(&state, &cfg.state_topic)? {
        let (low, high) = state.fetch_watermarks(&cfg.state_topic, p, Duration::from_secs(10))?;
        if high > low {
            ends.insert(p, high);
            tpl.add_partition_offset(&cfg.state_topic, p, Offset::Beginning)?;
        }
    }
    if ends.is_empty() {
        return Ok(());
    }
    state.assign(&tpl)?;
    while !ends.is_empty() {
        match state.poll(Duration::from_millis(500)) {
            Some(Ok(m)) => {
                if let Some(p) = m.payload() {
                    apply(view, p, &|_| {});
                }
                if m.offset() + 1 >= ends.get(&m.partition()).copied().unwrap_or(0) {
                    ends.remove(&m.partition());
                }
            }
            Some(Err(e)) => return Err(e),
            None => {}
        }
    }
    Ok(())
}

/// The cold start: every partition of the state topic from its beginning to its high
/// watermark into `view`; then a consumer of the changes from `since_ms` on.
fn start(cfg: &Config, view: &HealthView, since_ms: i64) -> Result<BaseConsumer, KafkaError> {
    load_state(cfg, view)?;
    let changes = cfg.consumer()?;
    let mut tpl = TopicPartitionList::new();
    for p in partitions(&changes, &cfg.changes_topic)? {
        tpl.add_partition_offset(&cfg.changes_topic, p, Offset::Offset(since_ms))?;
    }
    let tpl = changes.offsets_for_times(tpl, Duration::from_secs(10))?;
    let mut from = TopicPartitionList::new();
    for e in tpl.elements() {
        let offset = match e.offset() {
            Offset::Offset(o) => Offset::Offset(o),
            _ => Offset::End,
        };
        from.add_partition_offset(e.topic(), e.partition(), offset)?;
    }
    changes.assign(&from)?;
    Ok(changes)
}

/// Load the state topic to its end, then follow the changes topic in the background.
pub fn follow(cfg: Config) -> Result<Follower, KafkaError> {
    follow_with(cfg, |_| {})
}

/// [`follow`], calling `listener` (on the follower's thread) for every change it applies after
/// the cold start.
pub fn follow_with(cfg: Config, listener: impl Fn(Event<'_>) + Send + 'static) -> Result<Follower, KafkaError> {
    let started = Instant::now();
    let since_ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
        - 60_000;
    let view = Arc::new(HealthView::with_staleness(cfg.stale_after, cfg.open_after).identified(cfg.identity.clone()));
    // A broker that is starting answers metadata requests with errors for a while (a router
    // started beside it exited on "Meta data fetch error"): retry with a backoff, up to
    // `start_within`.
    let mut backoff = Duration::from_millis(100);
    let changes = loop {
        match start(&cfg, &view, since_ms) {
            Ok(c) => break c,
            Err(e) if started.elapsed() + backoff < cfg.start_within => {
                eprintln!("vitals-healthview: the broker is not ready ({e}); retrying in {backoff:?}");
                std::thread::sleep(backoff);
                backoff = (backoff * 2).min(Duration::from_secs(5));
            }
            Err(e) => return Err(e),
        }
    };
    view.heard(now_us());
    let cold_start = started.elapsed();
    let stop = Arc::new(AtomicBool::new(false));
    let thread = {
        let (view, stop) = (view.clone(), stop.clone());
        std::thread::Builder::new()
            .name("vitals-healthview".into())
            .spawn(move || {
                let mut gap = false;
                let mut reread = Instant::now();
                while !stop.load(Ordering::Relaxed) {
                    if let Some(Ok(m)) = changes.poll(Duration::from_millis(100)) {
                        view.heard(now_us());
                        if let Some(p) = m.payload() {
                            gap |= apply(&view, p, &listener);
                        }
                    }
                    // Changes were missed: the state topic has the latest of every endpoint.
                    if gap && reread.elapsed() >= cfg.reread_after_gap {
                        if load_state(&cfg, &view).is_ok() {
                            view.counters.rereads.fetch_add(1, Ordering::Relaxed);
                            gap = false;
                        }
                        reread = Instant::now();
                    }
                }
            })
            .map_err(|e| KafkaError::ClientCreation(e.to_string()))?
    };
    Ok(Follower {
        view,
        cold_start,
        stop,
        thread: Some(thread),
    })
}
