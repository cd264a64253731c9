//! `vitals-reporter`: what a Rust gateway links to report its calls to vitals.
//!
//! [`Reporter::report`] never blocks and never fails the caller's request: it puts the outcome
//! on a bounded queue and returns. A background thread encodes each outcome (Avro single-object
//! encoding, the contracts' `CallOutcome`) and hands it to an idempotent, batching, compressing
//! Kafka producer keyed by pool. When the queue is full, or the producer's own bounded queue is
//! (Kafka down), the outcome is dropped and counted: memory stays bounded whatever happens.
//! [`Reporter::flush`] at shutdown delivers what is queued. [`CallTimer`] measures a call for the
//! caller (start → first token → end) and classifies its outcome; [`Reporter::start_call`] also
//! watches the first token's deadline and reports a slow first token as a timeout the moment the
//! deadline passes, instead of when the call ends. Gateways that cannot reach Kafka report over
//! HTTP ingest instead ([`Config::http`]): batched, retried while the API is away, bounded.

mod http;
mod timer;

pub use timer::{CallResult, CallTimer};

use rdkafka::config::ClientConfig;
use rdkafka::error::KafkaError;
use rdkafka::producer::{BaseRecord, DeliveryResult, Producer, ProducerContext, ThreadedProducer};
use rdkafka::ClientContext;
use std::collections::BinaryHeap;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::mpsc::{self, Receiver, SyncSender, TryRecvError, TrySendError};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use vitals_contracts::clock::now_us;
use vitals_contracts::{encode_signal, keys, CallOutcome, OutcomeClass, Signal, Summarizer, SummaryConfig};
use vitals_runtime::produce;

/// How a reporter connects and how much it may hold.
#[derive(Debug, Clone)]
pub struct Config {
    /// Kafka bootstrap servers.
    pub brokers: String,
    /// Extra librdkafka settings (security, tuning); they win over the defaults.
    pub kafka_options: Vec<(String, String)>,
    /// The signals topic, or a merge stage's input (see `keyed_by_endpoint`).
    pub topic: String,
    /// Key records by endpoint (the endpoint key) instead of by pool: what a merge stage's
    /// input topic (`vitals.gateway-signals.v1`, read by `vitals-merger`) wants, so that one
    /// merger sees every gateway's calls to an endpoint. See [`Config::through_merger`].
    pub keyed_by_endpoint: bool,
    /// Outcomes waiting to be encoded; beyond, `report` drops and counts.
    pub queue_capacity: usize,
    /// Encoded outcomes the producer (or the HTTP sender) may hold while the transport is slow
    /// or down; beyond, dropped and counted.
    pub producer_queue_messages: u32,
    /// Report over HTTP ingest instead of Kafka.
    pub http: Option<HttpIngest>,
    /// Sum calls into summaries (`CallSummary`): successes per endpoint per interval, failures
    /// one by one up to a cap per interval (see `vitals_contracts::summary`). On by default
    /// (250 ms; fleet-bench: 223 calls a record at 10 M calls/s, detection within its targets);
    /// `None`: one record per call.
    pub summarize: Option<SummaryConfig>,
}

/// Summaries over `ms` milliseconds (the failure cap and the memory bound at their defaults);
/// 0: one record per call. What the services' `--summarize-ms` flags give.
pub fn summaries_every_ms(ms: u64) -> Option<SummaryConfig> {
    (ms > 0).then(|| SummaryConfig {
        interval_us: i64::try_from(ms.saturating_mul(1000)).unwrap_or(i64::MAX),
        ..SummaryConfig::default()
    })
}

/// The fallback transport: the API's `POST /v1/signals`.
#[derive(Debug, Clone)]
pub struct HttpIngest {
    /// The API's base URL, e.g. `http://vitals-api:8080`.
    pub url: String,
    /// A writer token.
    pub token: Option<String>,
    /// Reports per request (the API takes at most 1,000 by default).
    pub batch_items: usize,
    /// How long a report may wait for others to share its request.
    pub linger: Duration,
    /// Time one request may take.
    pub timeout: Duration,
}

impl Config {
    /// Report to Kafka at `brokers`.
    pub fn new(brokers: impl Into<String>) -> Config {
        Config {
            brokers: brokers.into(),
            kafka_options: Vec::new(),
            topic: vitals_contracts::topics::SIGNALS.to_owned(),
            keyed_by_endpoint: false,
            queue_capacity: 65_536,
            producer_queue_messages: 100_000,
            http: None,
            summarize: summaries_every_ms(250),
        }
    }

    /// Report to a merge stage at `brokers`: the gateway-signals topic, keyed by endpoint.
    pub fn through_merger(brokers: impl Into<String>) -> Config {
        Config {
            topic: vitals_contracts::topics::GATEWAY_SIGNALS.to_owned(),
            keyed_by_endpoint: true,
            ..Config::new(brokers)
        }
    }

    /// Report over HTTP ingest to the API at `url`, with a writer `token`.
    pub fn http(url: impl Into<String>, token: Option<String>) -> Config {
        Config {
            http: Some(HttpIngest {
                url: url.into(),
                token,
                batch_items: 500,
                linger: Duration::from_millis(50),
                timeout: Duration::from_secs(10),
            }),
            ..Config::new("")
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("invalid reporter configuration: {0}")]
    Config(String),
    #[error("cannot create the Kafka producer: {0}")]
    Kafka(#[from] KafkaError),
    #[error("cannot create the HTTP client: {0}")]
    Http(String),
}

/// What happened to the outcomes reported so far.
#[derive(Debug, Default)]
pub struct Counters {
    /// Accepted by `report`.
    pub reported: AtomicU64,
    /// Dropped by `report`: the queue was full.
    pub dropped_queue_full: AtomicU64,
    /// Dropped after the queue: the producer's queue was full (Kafka slow or down).
    pub dropped_producer_full: AtomicU64,
    /// Dropped: not encodable (a value outside the contract).
    pub dropped_invalid: AtomicU64,
    /// Confirmed by the broker.
    pub delivered: AtomicU64,
    /// Failed after retries (Kafka unreachable for longer than the message timeout), or refused
    /// by the API for good (a bad token).
    pub delivery_failed: AtomicU64,
    /// Slow first tokens reported when their deadline passed.
    pub early_reports: AtomicU64,
    /// Final reports not sent because the call's slow first token was reported already.
    pub superseded: AtomicU64,
    /// HTTP ingest requests sent again (the API away, busy, or some items not confirmed).
    pub retries: AtomicU64,
    /// Summary records sent (each sums one or more calls).
    pub summaries: AtomicU64,
    /// Calls summed into summaries rather than sent one by one.
    pub summarized: AtomicU64,
    /// The last delivery error, for operators.
    last_error: Mutex<Option<String>>,
    /// Outcomes in the queue, not yet taken by the worker (may read -1 for an instant: the
    /// worker can take one before its sender counts it).
    queued: std::sync::atomic::AtomicI64,
}

/// A point-in-time copy of the counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Snapshot {
    pub reported: u64,
    pub dropped_queue_full: u64,
    pub dropped_producer_full: u64,
    pub dropped_invalid: u64,
    pub delivered: u64,
    pub delivery_failed: u64,
    pub early_reports: u64,
    pub superseded: u64,
    pub retries: u64,
    pub summaries: u64,
    pub summarized: u64,
}

impl Snapshot {
    /// The counters in the Prometheus text format (`vitals_reporter_*`), for a gateway's
    /// `/metrics`.
    pub fn prometheus(&self) -> String {
        let mut out = String::from(
            "# HELP vitals_reporter_reports_total Call reports by what became of them.\n# TYPE vitals_reporter_reports_total counter\n",
        );
        for (result, v) in [
            ("reported", self.reported),
            ("delivered", self.delivered),
            ("dropped_queue_full", self.dropped_queue_full),
            ("dropped_producer_full", self.dropped_producer_full),
            ("dropped_invalid", self.dropped_invalid),
            ("delivery_failed", self.delivery_failed),
            ("early", self.early_reports),
            ("superseded", self.superseded),
            ("summarized", self.summarized),
        ] {
            out.push_str(&format!("vitals_reporter_reports_total{{result=\"{result}\"}} {v}\n"));
        }
        out.push_str(&format!(
            "# HELP vitals_reporter_retries_total HTTP ingest requests sent again.\n# TYPE vitals_reporter_retries_total counter\nvitals_reporter_retries_total {}\n",
            self.retries
        ));
        out.push_str(&format!(
            "# HELP vitals_reporter_summaries_total Call summaries sent.\n# TYPE vitals_reporter_summaries_total counter\nvitals_reporter_summaries_total {}\n",
            self.summaries
        ));
        out
    }
}

impl Counters {
    fn error(&self, e: String) {
        *self.last_error.lock().unwrap_or_else(|p| p.into_inner()) = Some(e);
    }

    pub fn snapshot(&self) -> Snapshot {
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        Snapshot {
            reported: g(&self.reported),
            dropped_queue_full: g(&self.dropped_queue_full),
            dropped_producer_full: g(&self.dropped_producer_full),
            dropped_invalid: g(&self.dropped_invalid),
            delivered: g(&self.delivered),
            delivery_failed: g(&self.delivery_failed),
            early_reports: g(&self.early_reports),
            superseded: g(&self.superseded),
            retries: g(&self.retries),
            summaries: g(&self.summaries),
            summarized: g(&self.summarized),
        }
    }
}

struct Deliveries(Arc<Counters>);

impl ClientContext for Deliveries {}

impl ProducerContext for Deliveries {
    type DeliveryOpaque = ();

    fn delivery(&self, result: &DeliveryResult<'_>, _: ()) {
        let c = match result {
            Ok(_) => &self.0.delivered,
            Err(_) => &self.0.delivery_failed,
        };
        c.fetch_add(1, Ordering::Relaxed);
    }
}

/// How long a record waits for room in a full producer queue before it is dropped.
const PRODUCER_FULL_WAIT: Duration = Duration::from_secs(1);

/// How long the worker sleeps when its queue is empty: [`IDLE_MIN`] at first, doubling while
/// nothing comes, up to [`IDLE_MAX`] (and never past the next first-token deadline). A busy
/// gateway's worker never sleeps long; an idle one wakes ~100 times a second instead of 1,000
/// (1.6 % of a core idle at 1 ms), and the first report after a quiet spell waits at most
/// 10 ms more — about twice the Kafka producer's own linger.
const IDLE_MIN: Duration = Duration::from_millis(1);
const IDLE_MAX: Duration = Duration::from_millis(10);

/// The sleep after `idle`, when the queue was empty again.
fn next_idle(idle: Duration) -> Duration {
    (idle * 2).min(IDLE_MAX)
}

/// Outcomes travel by value: the channel's slots are allocated once, so `report` allocates
/// nothing (a boxed outcome cost the caller a malloc, contended by the worker's frees).
#[allow(clippy::large_enum_variant)]
enum Msg {
    Outcome(CallOutcome),
    Watch(Box<Due>),
    Flush(Duration, SyncSender<bool>),
}

/// A watched first token: the report to send if it has not come by `at`.
struct Due {
    at: Instant,
    state: Arc<AtomicU8>,
    report: CallOutcome,
}

impl PartialEq for Due {
    fn eq(&self, o: &Due) -> bool {
        self.at == o.at
    }
}
impl Eq for Due {}
impl PartialOrd for Due {
    fn partial_cmp(&self, o: &Due) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Due {
    /// The earliest deadline first (a max-heap of reversed times).
    fn cmp(&self, o: &Due) -> std::cmp::Ordering {
        o.at.cmp(&self.at)
    }
}

/// Where encoded reports go: Kafka, or HTTP ingest.
trait Sink: Send {
    /// Take one record, a call or a summary (or drop it and count why).
    fn send(&mut self, o: Signal, counters: &Counters);
    /// Called on every turn of the worker: send what is due.
    fn tick(&mut self, _counters: &Counters) {}
    /// Deliver what is held, up to `timeout`; whether everything was.
    fn flush(&mut self, timeout: Duration, counters: &Counters) -> bool;
}

struct KafkaSink {
    producer: ThreadedProducer<Deliveries>,
    topic: String,
    keyed_by_endpoint: bool,
}

impl Sink for KafkaSink {
    fn send(&mut self, o: Signal, counters: &Counters) {
        let bytes = match encode_signal(&o) {
            Ok(b) => b,
            Err(_) => {
                counters.dropped_invalid.fetch_add(1, Ordering::Relaxed);
                return;
            }
        };
        let key = match (self.keyed_by_endpoint, o.pool(), o.endpoint()) {
            (true, Some(pool), Some(endpoint)) => std::borrow::Cow::Owned(keys::endpoint_key(pool, endpoint)),
            (_, pool, _) => std::borrow::Cow::Borrowed(pool.unwrap_or_default()),
        };
        let record = BaseRecord::to(&self.topic).key(key.as_bytes()).payload(&bytes);
        // The producer's queue is full when Kafka is slower than the reports: wait a while for
        // it to drain (the reporter's own queue takes the strain, and a source that can wait,
        // like a file, waits with it); drop only when Kafka is down or far behind, or refuses
        // the record as such.
        if let Err(e) = produce::queue_blocking(&self.producer, record, Some(PRODUCER_FULL_WAIT)) {
            let dropped = match e.failure {
                produce::Failure::Final => &counters.dropped_invalid,
                _ => &counters.dropped_producer_full,
            };
            dropped.fetch_add(1, Ordering::Relaxed);
            counters.error(format!("Kafka: {e}"));
        }
    }

    fn flush(&mut self, timeout: Duration, _: &Counters) -> bool {
        self.producer.flush(timeout).is_ok()
    }
}

/// The reporter. Cheap to share (`Arc<Reporter>`); `report` takes `&self`.
pub struct Reporter {
    tx: SyncSender<Msg>,
    counters: Arc<Counters>,
    worker: Mutex<Option<JoinHandle<()>>>,
}

impl Reporter {
    pub fn new(cfg: Config) -> Result<Reporter, Error> {
        if cfg.queue_capacity == 0 || cfg.topic.is_empty() {
            return Err(Error::Config("topic must be set and queue_capacity above 0".into()));
        }
        if cfg.summarize.is_some_and(|s| s.interval_us <= 0 || s.max_open == 0) {
            return Err(Error::Config("summary interval_us and max_open must be above 0".into()));
        }
        let counters = Arc::new(Counters::default());
        let sink: Box<dyn Sink> = match &cfg.http {
            Some(h) => Box::new(http::HttpSink::new(h.clone(), cfg.producer_queue_messages as usize)?),
            None => {
                if cfg.brokers.is_empty() {
                    return Err(Error::Config("brokers must be set (or HTTP ingest chosen)".into()));
                }
                let mut c = ClientConfig::new();
                c.set("bootstrap.servers", &cfg.brokers)
                    .set("enable.idempotence", "true")
                    .set("acks", "all")
                    .set("linger.ms", "5")
                    .set("compression.type", "lz4")
                    .set("queue.buffering.max.messages", cfg.producer_queue_messages.to_string())
                    .set("message.timeout.ms", "30000");
                for (k, v) in &cfg.kafka_options {
                    c.set(k, v);
                }
                Box::new(KafkaSink {
                    producer: c.create_with_context(Deliveries(counters.clone()))?,
                    topic: cfg.topic.clone(),
                    keyed_by_endpoint: cfg.keyed_by_endpoint,
                })
            }
        };
        let (tx, rx) = mpsc::sync_channel(cfg.queue_capacity);
        let summarizer = cfg.summarize.map(|s| {
            // An instance id per reporter keeps its summary ids apart from every other's.
            let nanos = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos());
            let id = vitals_contracts::hash::Fnv64::new()
                .bytes(nanos.to_le_bytes().into_iter().chain(std::process::id().to_le_bytes()))
                .finish();
            Summarizer::new(s, &format!("{id:016x}"))
        });
        let worker = {
            let counters = counters.clone();
            let watch_capacity = cfg.queue_capacity;
            std::thread::Builder::new()
                .name("vitals-reporter".into())
                .spawn(move || work(rx, Out::new(sink, summarizer), counters, watch_capacity))
                .map_err(|e| Error::Config(format!("cannot start the reporter thread: {e}")))?
        };
        Ok(Reporter {
            tx,
            counters,
            worker: Mutex::new(Some(worker)),
        })
    }

    /// Queue an outcome. Never blocks; when the queue is full the outcome is dropped and
    /// counted.
    pub fn report(&self, outcome: CallOutcome) {
        match self.tx.try_send(Msg::Outcome(outcome)) {
            Ok(()) => {
                self.counters.queued.fetch_add(1, Ordering::Relaxed);
                self.counters.reported.fetch_add(1, Ordering::Relaxed)
            }
            Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => {
                self.counters.dropped_queue_full.fetch_add(1, Ordering::Relaxed)
            }
        };
    }

    /// Queue an outcome, waiting while the queue is full (for a source that can wait, like a
    /// file being read: back-pressure instead of loss). Returns at once if the reporter is gone.
    pub fn report_waiting(&self, outcome: CallOutcome) {
        match self.tx.send(Msg::Outcome(outcome)) {
            Ok(()) => {
                self.counters.queued.fetch_add(1, Ordering::Relaxed);
                self.counters.reported.fetch_add(1, Ordering::Relaxed)
            }
            Err(_) => self.counters.dropped_queue_full.fetch_add(1, Ordering::Relaxed),
        };
    }

    /// Queue an outcome if there is room; whether it was queued. Not counted as dropped when
    /// not: for a receiver that tells its own client what it could not take.
    pub fn try_report(&self, outcome: CallOutcome) -> bool {
        let queued = self.tx.try_send(Msg::Outcome(outcome)).is_ok();
        if queued {
            self.counters.queued.fetch_add(1, Ordering::Relaxed);
            self.counters.reported.fetch_add(1, Ordering::Relaxed);
        }
        queued
    }

    /// Outcomes waiting in the queue for the worker: how far the transport is behind (it waits
    /// for room in a full Kafka producer queue, so a slow broker fills this queue).
    pub fn queued(&self) -> u64 {
        self.counters.queued.load(Ordering::Relaxed).max(0) as u64
    }

    /// Start measuring a call whose first token is due within `ttft_deadline`. If none has come
    /// by then, a timeout (`attributes["vitals.early"] = "ttft_deadline"`, latency = the
    /// deadline) is reported at that moment, with `id`, and the call's own report is skipped
    /// when it ends ([`Reporter::finish`]). Never blocks; when the queue is full the call is
    /// measured without the early report.
    pub fn start_call(
        &self,
        pool: impl Into<String>,
        endpoint: impl Into<String>,
        gateway: &str,
        id: impl Into<String>,
        ttft_deadline: Duration,
    ) -> CallTimer {
        let mut t = CallTimer::start(pool, endpoint);
        let state = Arc::new(AtomicU8::new(timer::WAITING));
        let report = CallOutcome {
            event_id: id.into(),
            pool: t.pool.clone(),
            endpoint: t.endpoint.clone(),
            gateway: gateway.to_owned(),
            occurred_at: t.started_at_us,
            outcome: OutcomeClass::Timeout,
            http_status: None,
            latency_us: ttft_deadline.as_micros() as i64,
            ttft_us: None,
            tpot_us: None,
            attributes: [("vitals.early".to_owned(), "ttft_deadline".to_owned())].into(),
            model: None,
            retry_after_ms: None,
        };
        let due = Due {
            at: t.started() + ttft_deadline,
            state: state.clone(),
            report,
        };
        if self.tx.try_send(Msg::Watch(Box::new(due))).is_ok() {
            t.watch = Some(state);
        }
        t
    }

    /// Report a measured call as it ended, unless its slow first token was reported already.
    pub fn finish(
        &self,
        timer: CallTimer,
        gateway: &str,
        id: impl Into<String>,
        result: CallResult,
        retry_after_ms: Option<i64>,
    ) {
        if timer.settle() {
            self.report(timer.finish(gateway, id, result, retry_after_ms));
        } else {
            self.counters.superseded.fetch_add(1, Ordering::Relaxed);
        }
    }

    pub fn counters(&self) -> Snapshot {
        self.counters.snapshot()
    }

    /// The last delivery error (Kafka's or the API's), if any.
    pub fn last_error(&self) -> Option<String> {
        self.counters
            .last_error
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Wait (up to `timeout`) until everything reported so far is delivered or has failed.
    /// Returns whether the transport's queue emptied in time.
    pub fn flush(&self, timeout: Duration) -> bool {
        let (ack, done) = mpsc::sync_channel(1);
        if self.tx.send(Msg::Flush(timeout, ack)).is_err() {
            return false;
        }
        done.recv_timeout(timeout + Duration::from_secs(1)).unwrap_or(false)
    }

    /// Flush, then stop the background thread (after it has delivered what is queued).
    pub fn close(self, timeout: Duration) -> bool {
        let flushed = self.flush(timeout);
        let Reporter { tx, worker, .. } = self;
        drop(tx);
        if let Some(w) = worker.into_inner().ok().flatten() {
            let _ = w.join();
        }
        flushed
    }
}

/// Where the worker's reports go: through the summarizer when there is one, then the sink.
struct Out {
    sink: Box<dyn Sink>,
    summarizer: Option<Summarizer>,
    buf: Vec<Signal>,
}

impl Out {
    fn new(sink: Box<dyn Sink>, summarizer: Option<Summarizer>) -> Out {
        Out {
            sink,
            summarizer,
            buf: Vec::new(),
        }
    }

    fn report(&mut self, o: CallOutcome, counters: &Counters) {
        match &mut self.summarizer {
            None => self.sink.send(Signal::Call(o), counters),
            Some(s) => {
                s.add(o, now_us(), &mut self.buf);
                self.drain(counters);
            }
        }
    }

    /// Send what the summarizer let out: summaries (counted with the calls they sum) and calls.
    fn drain(&mut self, counters: &Counters) {
        for sig in self.buf.drain(..) {
            if let Signal::Summary(x) = &sig {
                counters.summaries.fetch_add(1, Ordering::Relaxed);
                counters
                    .summarized
                    .fetch_add(x.calls.total().max(0) as u64, Ordering::Relaxed);
            }
            self.sink.send(sig, counters);
        }
    }

    /// Summaries whose interval has ended go out; then the sink's own turn.
    fn tick(&mut self, counters: &Counters) {
        if let Some(s) = &mut self.summarizer {
            s.flush_due(now_us(), &mut self.buf);
            self.drain(counters);
        }
        self.sink.tick(counters);
    }

    /// Every open summary goes out, then the sink delivers what it holds.
    fn flush(&mut self, timeout: Duration, counters: &Counters) -> bool {
        if let Some(s) = &mut self.summarizer {
            s.flush_all(&mut self.buf);
            self.drain(counters);
        }
        self.sink.flush(timeout, counters)
    }
}

fn work(rx: Receiver<Msg>, mut out: Out, counters: Arc<Counters>, watch_capacity: usize) {
    let mut due: BinaryHeap<Due> = BinaryHeap::new();
    let mut idle = IDLE_MIN;
    loop {
        // Slow first tokens whose deadline passed are reported now, once.
        let now = Instant::now();
        while due.peek().is_some_and(|d| d.at <= now) {
            let d = due.pop().expect("peeked");
            if d.state
                .compare_exchange(timer::WAITING, timer::EARLY, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
            {
                counters.early_reports.fetch_add(1, Ordering::Relaxed);
                counters.reported.fetch_add(1, Ordering::Relaxed);
                out.report(d.report, &counters);
            }
        }
        out.tick(&counters);
        // The worker never parks on the channel: a parked receiver makes every `report` wake it
        // (a futex call of several µs on the caller's path). It sleeps when the queue is empty
        // instead, longer the longer it stays empty (IDLE_MIN to IDLE_MAX).
        let msg = match rx.try_recv() {
            Ok(m) => {
                idle = IDLE_MIN;
                m
            }
            Err(TryRecvError::Empty) => {
                let until_due = due.peek().map(|d| d.at.saturating_duration_since(Instant::now()));
                std::thread::sleep(until_due.map_or(idle, |u| u.min(idle)));
                idle = next_idle(idle);
                continue;
            }
            Err(TryRecvError::Disconnected) => break,
        };
        match msg {
            Msg::Outcome(o) => {
                counters.queued.fetch_sub(1, Ordering::Relaxed);
                out.report(o, &counters)
            }
            Msg::Watch(d) => {
                // Bounded: calls that ended leave their entries behind until the deadline; clear
                // them when full, and watch no more if still full (the calls report at their end).
                if due.len() >= watch_capacity {
                    due.retain(|d| d.state.load(Ordering::Acquire) == timer::WAITING);
                }
                if due.len() < watch_capacity {
                    due.push(*d);
                } else {
                    d.state.store(timer::DONE, Ordering::Release);
                }
            }
            Msg::Flush(timeout, ack) => {
                let ok = out.flush(timeout, &counters);
                let _ = ack.try_send(ok);
            }
        }
    }
    out.flush(Duration::from_secs(5), &counters);
}

#[cfg(test)]
mod idle_tests {
    use super::*;

    #[test]
    fn an_idle_worker_sleeps_longer_the_longer_it_is_idle_up_to_the_bound() {
        let mut idle = IDLE_MIN;
        let mut seen = vec![idle];
        for _ in 0..6 {
            idle = next_idle(idle);
            seen.push(idle);
        }
        let ms: Vec<u128> = seen.iter().map(Duration::as_millis).collect();
        assert_eq!(ms, [1, 2, 4, 8, 10, 10, 10]);
    }
}
