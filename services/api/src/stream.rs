//! Live stream of health changes as Server-Sent Events, read from the changes topic.
//!
//! Each event's id is the stream position after it: the next offset of every partition,
//! `0:15,1:7,...`. A client that reconnects with `Last-Event-ID` continues exactly after the
//! last event it received, across API restarts and instances, with nothing lost or repeated.
//! Without it, the stream starts at the end of the topic; a first `ready` event carries the
//! starting position. Events republished by the outbox relay after a crash are dropped by
//! (endpoint, seq).
//!
//! One reader per API instance (`hub.rs`) feeds every client from a ring of recent events. A
//! connection whose first request is a stream the ring can serve is taken from the HTTP server
//! (`takeover`) and written to by the live-stream threads (`fanout.rs`: one write per delivery,
//! no task per client); a stream asked for later on a kept-alive connection is fed from a
//! broadcast by its connection's task (`HubFeed`). A client resuming from further back gets a
//! Kafka consumer of its own (at most `--max-kafka-streams`). A client that falls behind the
//! feed gets a `lagged` event whose id resumes it, and the stream ends.
//!
//! Limits: `--max-streams` in all, of which a quarter is kept for clients with a token;
//! `--max-streams-per-client` per token (or per IP address without one); and a lifetime, after
//! which the stream ends with a `reconnect` event whose id resumes it. A record on the changes
//! topic that cannot be decoded is skipped, logged and counted.

use crate::error::{ApiError, ErrorBody};
use crate::extract::ApiQuery;
use crate::hub::Item;
use crate::AppState;
use axum::body::Bytes;
use axum::extract::connect_info::ConnectInfo;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::IntoResponse;
use futures::{Stream, StreamExt};
use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::message::Message;
use rdkafka::topic_partition_list::{Offset, TopicPartitionList};
use serde::Deserialize;
use std::collections::{BTreeMap, HashMap};
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::sync::broadcast;
use tokio_util::sync::ReusableBoxFuture;
use utoipa::IntoParams;
use vitals_contracts::seq::{Applied, SeqGate};
use vitals_contracts::{self as c, codec::SchemaKind, view};

#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[allow(dead_code)] // documents the parameters
pub struct StreamParams {
    /// Only events of this pool.
    pool: Option<String>,
    /// Only events of this endpoint.
    endpoint: Option<String>,
}

/// Positions: partition → next offset.
pub(crate) type Positions = BTreeMap<i32, i64>;

pub(crate) fn encode_positions(p: &Positions) -> String {
    p.iter().map(|(k, v)| format!("{k}:{v}")).collect::<Vec<_>>().join(",")
}

fn parse_positions(s: &str) -> Result<Positions, ApiError> {
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

struct Live {
    consumer: StreamConsumer,
    positions: Positions,
    /// Its pool and endpoint (its positions are `positions`).
    filter: Filter,
    seqs: SeqGate,
    ready: bool,
    cancel: tokio_util::sync::CancellationToken,
    /// When the stream ends with a `reconnect` event.
    ends_at: tokio::time::Instant,
    ended: bool,
    metrics: std::sync::Arc<crate::metrics::Metrics>,
    _slot: StreamSlot,
    _kafka_slot: tokio::sync::OwnedSemaphorePermit,
}

/// A live stream's place: its permits and its count against its client, given back on drop.
struct StreamSlot {
    _all: tokio::sync::OwnedSemaphorePermit,
    _anonymous: Option<tokio::sync::OwnedSemaphorePermit>,
    client: String,
    clients: std::sync::Arc<std::sync::Mutex<HashMap<String, usize>>>,
}

impl Drop for StreamSlot {
    fn drop(&mut self) {
        let mut clients = self.clients.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = clients.get_mut(&self.client) {
            *n -= 1;
            if *n == 0 {
                clients.remove(&self.client);
            }
        }
    }
}

/// Take a stream slot for `client`, or say why not. Permits taken before a refusal are
/// given back as they drop.
fn take_slot(app: &AppState, client: String, anonymous: bool) -> Result<StreamSlot, ApiError> {
    let anonymous_permit = if anonymous {
        Some(app.anonymous_streams.clone().try_acquire_owned().map_err(|_| {
            ApiError::Unavailable("too many anonymous live streams; a token gets a reserved slot".into())
        })?)
    } else {
        None
    };
    let all = app
        .streams
        .clone()
        .try_acquire_owned()
        .map_err(|_| ApiError::Unavailable("too many live streams".into()))?;
    let mut clients = app.stream_clients.lock().unwrap_or_else(|p| p.into_inner());
    if clients.get(&client).copied().unwrap_or(0) >= app.cfg.max_streams_per_client {
        return Err(ApiError::TooMany(format!(
            "this client already holds {} live streams",
            app.cfg.max_streams_per_client
        )));
    }
    *clients.entry(client.clone()).or_insert(0) += 1;
    Ok(StreamSlot {
        _all: all,
        _anonymous: anonymous_permit,
        client,
        clients: app.stream_clients.clone(),
    })
}

impl Live {
    async fn next_event(&mut self) -> Option<Bytes> {
        if !self.ready {
            self.ready = true;
            return Some(frame("ready", &encode_positions(&self.positions), "{}"));
        }
        if self.ended {
            return None;
        }
        loop {
            let msg = tokio::select! {
                _ = self.cancel.cancelled() => return None,
                _ = tokio::time::sleep_until(self.ends_at) => {
                    self.ended = true;
                    return Some(
                        frame("reconnect", &encode_positions(&self.positions), RECONNECT),
                    );
                }
                m = self.consumer.recv() => m,
            };
            let m = match msg {
                Ok(m) => m,
                Err(e) => {
                    tracing::warn!(error = %e, "live stream: consumer error");
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    continue;
                }
            };
            self.positions.insert(m.partition(), m.offset() + 1);
            let payload = m.payload().unwrap_or_default();
            let (kind, data) = match c::codec::peek_kind(payload) {
                Ok(SchemaKind::HealthChanged) => {
                    let h = match c::decode::<c::HealthChanged>(payload) {
                        Ok(h) => h,
                        Err(e) => {
                            self.undecodable(m.partition(), m.offset(), &e);
                            continue;
                        }
                    };
                    if !self.filter.names(&h.pool, Some(&h.endpoint)) {
                        continue;
                    }
                    if self.seqs.admit(&h.pool, &h.endpoint, h.seq) == Applied::Duplicate {
                        continue; // a republished duplicate
                    }
                    match view::Transition::try_from(h) {
                        Ok(t) => ("health_changed", serde_json::to_string(&t)),
                        Err(e) => {
                            self.undecodable(m.partition(), m.offset(), &e);
                            continue;
                        }
                    }
                }
                Ok(SchemaKind::PoolHealthChanged) => {
                    let p = match c::decode::<c::PoolHealthChanged>(payload) {
                        Ok(p) => p,
                        Err(e) => {
                            self.undecodable(m.partition(), m.offset(), &e);
                            continue;
                        }
                    };
                    if !self.filter.names(&p.pool, None) {
                        continue;
                    }
                    let e = view::PoolEvent::from(p);
                    ("pool_changed", serde_json::to_string(&e))
                }
                _ => continue,
            };
            let Ok(data) = data else { continue };
            return Some(frame(kind, &encode_positions(&self.positions), &data));
        }
    }

    /// A record that cannot be decoded, or holds a value this build cannot show: skipped,
    /// logged and counted.
    fn undecodable(&self, partition: i32, offset: i64, e: &dyn std::fmt::Display) {
        self.metrics.stream_undecodable();
        tracing::warn!(partition, offset, error = %e, "live stream: skipping a record that cannot be decoded");
    }
}

/// A live stream admitted: its slot, where it starts and what it wants.
struct Opened {
    slot: StreamSlot,
    /// The client's `Last-Event-ID`.
    resume: Option<Positions>,
    /// What it wants, from where it starts (`filter.from`: after `resume`, or the end of the
    /// topic).
    filter: Filter,
    ends_at: tokio::time::Instant,
}

/// Authorize a stream request and take its slot; where it starts.
async fn open(
    app: &AppState,
    headers: &HeaderMap,
    peer: Option<std::net::SocketAddr>,
    q: &HashMap<String, String>,
) -> Result<Opened, ApiError> {
    app.authorize_read(headers)?;
    let principal = crate::auth::authorize(headers, &app.tokens, crate::auth::Role::Reader).ok();
    let (client, anonymous) = match principal {
        Some(p) => (format!("token:{}", p.name), false),
        None => (
            format!("ip:{}", peer.map_or("unknown".to_string(), |a| a.ip().to_string())),
            true,
        ),
    };
    let resume = headers
        .get("last-event-id")
        .map(|v| {
            v.to_str()
                .map_err(|_| ApiError::invalid("Last-Event-ID", "not text"))
                .and_then(parse_positions)
        })
        .transpose()?;
    let slot = take_slot(app, client, anonymous)?;
    let ends_at = tokio::time::Instant::now() + Duration::from_secs(app.cfg.stream_max_lifetime_secs);
    if !app.hub.ready(Duration::from_secs(5)).await {
        return Err(ApiError::Unavailable("the changes topic is unavailable".into()));
    }
    let from = match &resume {
        Some(r) => r.clone(),
        None => app.hub.end_positions().await.map_err(|e| {
            tracing::warn!(error = %e, "live stream: cannot read the end of the changes topic");
            ApiError::Unavailable("the changes topic is unavailable".into())
        })?,
    };
    Ok(Opened {
        slot,
        resume,
        filter: Filter {
            from,
            pool: q.get("pool").cloned(),
            endpoint: q.get("endpoint").cloned(),
        },
        ends_at,
    })
}

#[utoipa::path(
    get, path = "/v1/stream", tag = "stream", params(StreamParams,
        ("Last-Event-ID" = Option<String>, Header, description = "Resume after this event")),
    responses(
        (status = 200, description = "Server-Sent Events: `ready`, then `health_changed` (a transition, as in the history) and `pool_changed`; `reconnect` when the stream reaches its lifetime", content_type = "text/event-stream", body = String),
        (status = 400, description = "A Last-Event-ID that is not from this stream", body = ErrorBody),
        (status = 401, description = "A token is required", body = ErrorBody),
        (status = 429, description = "This client holds its maximum of live streams", body = ErrorBody),
        (status = 503, description = "Too many live streams, or Kafka unavailable", body = ErrorBody),
    )
)]
pub async fn stream(
    State(app): State<AppState>,
    headers: HeaderMap,
    peer: Option<axum::Extension<ConnectInfo<std::net::SocketAddr>>>,
    ApiQuery(q): ApiQuery<HashMap<String, String>>,
) -> Result<axum::response::Response, ApiError> {
    let peer = peer.map(|axum::Extension(ConnectInfo(a))| a);
    let Opened {
        slot,
        resume,
        filter,
        ends_at,
    } = open(&app, &headers, peer, &q).await?;
    if let Some(sub) = app.hub.subscribe(&filter.from) {
        let feed = HubFeed {
            last_id: sub.ready_id.clone(),
            replay: sub.replay.into(),
            rx: ReusableBoxFuture::new(recv(sub.rx)),
            filter,
            ready: Some(sub.ready_id),
            lifetime: Deadline::at(ends_at),
            ended: false,
            _slot: slot,
        };
        return Ok(sse_response(feed));
    }
    // Further back than the ring: a consumer of its own, from the client's positions.
    let kafka_slot = app
        .kafka_streams
        .clone()
        .try_acquire_owned()
        .map_err(|_| ApiError::Unavailable("too many live streams resuming from far back; retry later".into()))?;
    // Assigned by hand at the client's positions: the group id is only a label, nothing is
    // committed.
    let consumer: StreamConsumer = vitals_runtime::kafka::consumer(
        &app.cfg.kafka,
        "vitals-api-live",
        &[("isolation.level", "read_committed"), ("fetch.wait.max.ms", "50")],
    )
    .create()
    .map_err(|e| ApiError::Internal(e.into()))?;
    let topic = app.cfg.topics.changes_topic.clone();
    // Resolve the starting offset of every partition now, so the `ready` event is exact.
    let (consumer, positions) = tokio::task::spawn_blocking(move || -> Result<(StreamConsumer, Positions), String> {
        let timeout = Duration::from_secs(5);
        let parts = vitals_runtime::kafka::partitions(&consumer, &topic, timeout).map_err(|e| e.to_string())?;
        if parts.is_empty() {
            return Err(format!("topic {topic} has no partitions"));
        }
        let mut positions = Positions::new();
        let mut tpl = TopicPartitionList::new();
        for p in parts {
            let start = match resume.as_ref().and_then(|r| r.get(&p)) {
                Some(o) => *o,
                None if resume.is_some() => 0, // a partition added since: from its beginning
                None => {
                    consumer
                        .fetch_watermarks(&topic, p, timeout)
                        .map_err(|e| e.to_string())?
                        .1
                }
            };
            positions.insert(p, start);
            tpl.add_partition_offset(&topic, p, Offset::Offset(start))
                .map_err(|e| e.to_string())?;
        }
        consumer.assign(&tpl).map_err(|e| e.to_string())?;
        Ok((consumer, positions))
    })
    .await
    .map_err(|e| ApiError::Internal(e.into()))?
    .map_err(|e| {
        tracing::warn!(error = %e, "live stream: cannot read the changes topic");
        ApiError::Unavailable("the changes topic is unavailable".into())
    })?;
    let live = Live {
        consumer,
        positions,
        filter,
        seqs: SeqGate::default(),
        ready: false,
        cancel: app.cancel.clone(),
        ends_at,
        ended: false,
        metrics: app.metrics.clone(),
        _slot: slot,
        _kafka_slot: kafka_slot,
    };
    let events = futures::stream::unfold(live, |mut live| async move {
        let e = live.next_event().await?;
        Some((e, live))
    });
    Ok(sse_response(events.boxed()))
}

/// The last event of a client that fell `missed` events behind; `id` resumes it.
pub(crate) fn lagged(id: &str, missed: u64) -> Bytes {
    frame(
        "lagged",
        id,
        &format!(
            r#"{{"reason":"this client fell {missed} events behind the live stream; resume with Last-Event-ID","missed":{missed}}}"#
        ),
    )
}

pub(crate) const RECONNECT: &str = r#"{"reason":"the stream reached its maximum lifetime; resume with Last-Event-ID"}"#;

/// One Server-Sent Event (`data` is one line of JSON).
pub(crate) fn frame(kind: &str, id: &str, data: &str) -> Bytes {
    Bytes::from(format!("event: {kind}\nid: {id}\ndata: {data}\n\n"))
}

/// The events as a `text/event-stream` response, with a keep-alive comment.
fn sse_response<S>(events: S) -> axum::response::Response
where
    S: Stream<Item = Bytes> + Unpin + Send + 'static,
{
    let body = KeepAlive {
        events,
        timer: Deadline::after(KEEP_ALIVE),
        sent: false,
    };
    (
        [
            (axum::http::header::CONTENT_TYPE, "text/event-stream"),
            (axum::http::header::CACHE_CONTROL, "no-cache"),
        ],
        axum::body::Body::from_stream(body),
    )
        .into_response()
}

/// A stream that has been silent this long gets a comment (`:`), so that proxies and clients
/// do not take it for dead.
const KEEP_ALIVE: Duration = Duration::from_secs(15);

/// A timer polled as a stream's deadline: between the moment it is registered and the moment
/// it is due, a poll is a clock read, not a poll of the timer (with 10,000 streams, polling
/// each one's timer after each event was a visible share of a delivery's cost).
struct Deadline {
    sleep: Pin<Box<tokio::time::Sleep>>,
    at: tokio::time::Instant,
    /// The task the timer wakes (registered by its last poll).
    waker: Option<std::task::Waker>,
}

impl Deadline {
    fn at(at: tokio::time::Instant) -> Deadline {
        Deadline {
            sleep: Box::pin(tokio::time::sleep_until(at)),
            at,
            waker: None,
        }
    }

    fn after(d: Duration) -> Deadline {
        Deadline::at(tokio::time::Instant::now() + d)
    }

    /// Whether it is due; if not, the task is woken when it is.
    fn poll_due(&mut self, cx: &mut Context<'_>) -> bool {
        let registered = self.waker.as_ref().is_some_and(|w| w.will_wake(cx.waker()));
        if registered && tokio::time::Instant::now() < self.at {
            return false;
        }
        self.waker = Some(cx.waker().clone());
        self.sleep.as_mut().poll(cx).is_ready()
    }

    fn reset(&mut self, at: tokio::time::Instant) {
        self.at = at;
        self.sleep.as_mut().reset(at);
        self.waker = None;
    }
}

/// Events with a keep-alive comment after 15–30 s of silence. The timer is not reset per event
/// (with thousands of clients that is a timer-wheel update per delivery): when it fires, it is
/// re-armed, and the comment is sent only if no event went out since it last fired.
struct KeepAlive<S> {
    events: S,
    timer: Deadline,
    /// An event went out since the timer last fired.
    sent: bool,
}

impl<S: Stream<Item = Bytes> + Unpin> Stream for KeepAlive<S> {
    type Item = Result<Bytes, Infallible>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = &mut *self;
        match this.events.poll_next_unpin(cx) {
            Poll::Ready(Some(e)) => {
                this.sent = true;
                return Poll::Ready(Some(Ok(e)));
            }
            Poll::Ready(None) => return Poll::Ready(None),
            Poll::Pending => {}
        }
        while this.timer.poll_due(cx) {
            this.timer.reset(tokio::time::Instant::now() + KEEP_ALIVE);
            if !std::mem::take(&mut this.sent) {
                return Poll::Ready(Some(Ok(Bytes::from_static(b":\n\n"))));
            }
        }
        Poll::Pending
    }
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

type Feed = broadcast::Receiver<Arc<Item>>;

async fn recv(mut rx: Feed) -> (Result<Arc<Item>, broadcast::error::RecvError>, Feed) {
    let r = rx.recv().await;
    (r, rx)
}

/// A client fed by the hub: `ready`, the replay, then the live feed, until its lifetime ends,
/// it lags, or the hub stops (the API shuts down). Polled directly by the connection: a
/// delivery is one wake-up of the connection's task, with no timer or lock of its own.
struct HubFeed {
    ready: Option<String>,
    replay: std::collections::VecDeque<Arc<Item>>,
    /// The pending receive from the feed (its allocation reused from event to event).
    rx: ReusableBoxFuture<'static, (Result<Arc<Item>, broadcast::error::RecvError>, Feed)>,
    filter: Filter,
    /// The position after the last event this client was sent or skipped: its resume point.
    last_id: String,
    /// When the stream ends with a `reconnect` event.
    lifetime: Deadline,
    ended: bool,
    _slot: StreamSlot,
}

impl HubFeed {
    fn event(&mut self, item: &Item) -> Option<Bytes> {
        self.last_id.clone_from(&item.id);
        self.filter.wants(item).then(|| item.frame.clone())
    }
}

impl Stream for HubFeed {
    type Item = Bytes;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Bytes>> {
        let this = &mut *self;
        if let Some(id) = this.ready.take() {
            return Poll::Ready(Some(frame("ready", &id, "{}")));
        }
        if this.ended {
            return Poll::Ready(None);
        }
        while let Some(item) = this.replay.pop_front() {
            if let Some(e) = this.event(&item) {
                return Poll::Ready(Some(e));
            }
        }
        if this.lifetime.poll_due(cx) {
            this.ended = true;
            return Poll::Ready(Some(frame("reconnect", &this.last_id, RECONNECT)));
        }
        loop {
            let Poll::Ready((r, rx)) = this.rx.poll(cx) else {
                return Poll::Pending;
            };
            this.rx.set(recv(rx));
            match r {
                Ok(item) => {
                    if let Some(e) = this.event(&item) {
                        return Poll::Ready(Some(e));
                    }
                }
                Err(broadcast::error::RecvError::Lagged(missed)) => {
                    this.ended = true;
                    return Poll::Ready(Some(lagged(&this.last_id, missed)));
                }
                Err(broadcast::error::RecvError::Closed) => {
                    this.ended = true;
                    return Poll::Ready(None);
                }
            }
        }
    }
}

/// The response head of a live stream written by a shard (`fanout.rs`): the body is the events
/// until the connection closes.
const RAW_HEAD: &[u8] =
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\nconnection: close\r\n\r\n";

/// Take a connection whose first request is `GET /v1/stream` that the hub can serve, and hand
/// it to the live-stream writers (`fanout.rs`); everything else, including every refusal and a
/// resume from further back than the ring, is given back (`Err`) untouched for the HTTP server
/// to answer. The request is only peeked at until the stream is taken.
///
/// The task stays with the connection: it holds the stream's slot, reads (and drops) whatever
/// the client sends until it goes away, and closes the socket when the stream ends.
pub async fn takeover(
    app: AppState,
    sock: tokio::net::TcpStream,
    peer: std::net::SocketAddr,
    head_timeout: Duration,
) -> Result<(), tokio::net::TcpStream> {
    let start = std::time::Instant::now();
    let mut buf = vec![0u8; 8192];
    let n = match tokio::time::timeout(head_timeout, sock.peek(&mut buf)).await {
        Ok(Ok(n)) => n,
        Ok(Err(_)) => return Ok(()), // the connection failed
        Err(_) => return Ok(()),     // no request within the header timeout: closed
    };
    if !buf[..n].starts_with(b"GET /v1/stream") {
        return Err(sock);
    }
    let Some((headers, query)) = parse_head(&buf[..n]) else {
        return Err(sock);
    };
    let Ok(opened) = open(&app, &headers, Some(peer), &query).await else {
        return Err(sock); // answered by the server, with the reason
    };
    // The socket is shared with a writer thread, which writes without waiting (`try_write`):
    // its readiness to write is known before it is handed over.
    if sock.writable().await.is_err() {
        return Ok(());
    }
    let sock = Arc::new(sock);
    let gone = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (ended_tx, mut ended) = tokio::sync::oneshot::channel();
    let client = Box::new(crate::fanout::RawClient {
        sock: sock.clone(),
        filter: opened.filter,
        last_id: String::new(),
        ends_at: opened.ends_at.into_std(),
        gone: gone.clone(),
        ended: ended_tx,
    });
    if let Err(client) = app.hub.attach(RAW_HEAD, client) {
        drop((client, opened.slot));
        // Further back than the ring: served from Kafka by the server.
        return Arc::try_unwrap(sock).map_or(Ok(()), Err);
    }
    app.metrics
        .observe("/v1/stream", "GET", 200, start.elapsed().as_secs_f64());
    let _slot = opened.slot;
    // Until the client goes away or the stream ends here.
    let mut scratch = [0u8; 1024];
    let closed_here = loop {
        tokio::select! {
            _ = &mut ended => break true,
            r = sock.readable() => {
                if r.is_err() {
                    break false;
                }
                match sock.try_read(&mut scratch) {
                    Ok(0) => break false,
                    Ok(_) => {} // the request, or one after it: not answered
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                    Err(_) => break false,
                }
            }
        }
    };
    gone.store(true, std::sync::atomic::Ordering::Relaxed);
    // The writer let go of the socket before saying the stream ended: end it cleanly.
    if closed_here {
        if let Ok(mut sock) = Arc::try_unwrap(sock) {
            let _ = tokio::io::AsyncWriteExt::shutdown(&mut sock).await;
        }
    }
    Ok(())
}

/// The headers and query of a complete request head; None if it is not one this path takes
/// (incomplete, not HTTP/1.x, a path other than `/v1/stream`, a query or header the API's
/// extractors would refuse).
fn parse_head(buf: &[u8]) -> Option<(HeaderMap, HashMap<String, String>)> {
    let mut slots = [httparse::EMPTY_HEADER; 64];
    let mut req = httparse::Request::new(&mut slots);
    if !matches!(req.parse(buf), Ok(httparse::Status::Complete(_))) || req.method != Some("GET") {
        return None;
    }
    let uri: axum::http::Uri = req.path?.parse().ok()?;
    if uri.path() != "/v1/stream" {
        return None;
    }
    let mut headers = HeaderMap::new();
    for h in req.headers.iter() {
        headers.append(
            axum::http::HeaderName::from_bytes(h.name.as_bytes()).ok()?,
            axum::http::HeaderValue::from_bytes(h.value).ok()?,
        );
    }
    let pairs: Vec<(String, String)> = serde_urlencoded::from_str(uri.query().unwrap_or("")).ok()?;
    if pairs
        .iter()
        .any(|(k, v)| crate::extract::no_control(k, k).is_err() || crate::extract::no_control(k, v).is_err())
    {
        return None;
    }
    Some((headers, pairs.into_iter().collect()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn positions_round_trip_and_garbage_is_refused() {
        let p: Positions = [(0, 15), (1, 0), (7, 123_456)].into_iter().collect();
        assert_eq!(parse_positions(&encode_positions(&p)).unwrap(), p);
        for bad in ["x", "0:", ":5", "0:-1", "-1:3", "0:1,zz"] {
            assert!(parse_positions(bad).is_err(), "{bad}");
        }
    }
}
