//! Live stream of health changes as Server-Sent Events, read from the changes topic.
//!
//! Each event's id is the stream position after it: the next offset of every partition,
//! `0:15,1:7,...`. A client that reconnects with `Last-Event-ID` continues exactly after the
//! last event it received, across API restarts and instances, with nothing lost or repeated.
//! Without it, the stream starts at the end of the topic; a first `ready` event carries the
//! starting position. Events republished by the outbox relay after a crash are dropped by
//! (endpoint, seq).
//!
//! One reader per API instance (`hub.rs`) feeds every client from a ring of recent events and a
//! broadcast; a client resuming from further back gets a Kafka consumer of its own (at most
//! `--max-kafka-streams`). A client that falls behind the feed gets a `lagged` event whose id
//! resumes it, and the stream ends.
//!
//! Limits: `--max-streams` in all, of which a quarter is kept for clients with a token;
//! `--max-streams-per-client` per token (or per IP address without one); and a lifetime, after
//! which the stream ends with a `reconnect` event whose id resumes it. A record on the changes
//! topic that cannot be decoded is skipped, logged and counted.

use crate::error::{ApiError, ErrorBody};
use crate::extract::ApiQuery;
use crate::AppState;
use axum::body::Bytes;
use axum::extract::connect_info::ConnectInfo;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::IntoResponse;
use futures::StreamExt;
use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::message::Message;
use rdkafka::topic_partition_list::{Offset, TopicPartitionList};
use serde::Deserialize;
use std::collections::{BTreeMap, HashMap};
use std::convert::Infallible;
use std::time::Duration;
use utoipa::IntoParams;
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
    pool: Option<String>,
    endpoint: Option<String>,
    last_seq: HashMap<(String, String), i64>,
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
                    if !self.wanted(&h.pool, Some(&h.endpoint)) {
                        continue;
                    }
                    let key = (h.pool.clone(), h.endpoint.clone());
                    if self.last_seq.get(&key).is_some_and(|s| *s >= h.seq) {
                        continue; // a republished duplicate
                    }
                    self.last_seq.insert(key, h.seq);
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
                    if !self.wanted(&p.pool, None) {
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

    fn wanted(&self, pool: &str, endpoint: Option<&str>) -> bool {
        self.pool.as_deref().is_none_or(|p| p == pool) && self.endpoint.as_deref().is_none_or(|e| endpoint == Some(e))
    }
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
    app.authorize_read(&headers)?;
    let principal = crate::auth::authorize(&headers, &app.tokens, crate::auth::Role::Reader).ok();
    let (client, anonymous) = match principal {
        Some(p) => (format!("token:{}", p.name), false),
        None => (
            format!(
                "ip:{}",
                peer.map_or("unknown".to_string(), |axum::Extension(ConnectInfo(a))| a
                    .ip()
                    .to_string())
            ),
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
    let slot = take_slot(&app, client, anonymous)?;
    let (pool, endpoint) = (q.get("pool").cloned(), q.get("endpoint").cloned());
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
    if let Some(sub) = app.hub.subscribe(&from) {
        let client = HubClient {
            last_id: sub.ready_id.clone(),
            replay: sub.replay.into(),
            sub_rx: sub.rx,
            from: sub.from,
            ready: Some(sub.ready_id),
            pool,
            endpoint,
            cancel: app.cancel.clone(),
            ends_at,
            ended: false,
            _slot: slot,
        };
        let events = futures::stream::unfold(client, |mut c| async move {
            let e = c.next_event().await?;
            Some((e, c))
        });
        return Ok(sse_response(events.boxed()));
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
        let meta = consumer
            .fetch_metadata(Some(&topic), timeout)
            .map_err(|e| e.to_string())?;
        let parts: Vec<i32> = meta
            .topics()
            .first()
            .map(|t| t.partitions().iter().map(|p| p.id()).collect())
            .unwrap_or_default();
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
        pool,
        endpoint,
        last_seq: HashMap::new(),
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

const RECONNECT: &str = r#"{"reason":"the stream reached its maximum lifetime; resume with Last-Event-ID"}"#;

/// One Server-Sent Event (`data` is one line of JSON).
pub(crate) fn frame(kind: &str, id: &str, data: &str) -> Bytes {
    Bytes::from(format!("event: {kind}\nid: {id}\ndata: {data}\n\n"))
}

/// The events as a `text/event-stream` response, with a keep-alive comment after 15 s of
/// silence (the frames are made once per event and shared by every client).
fn sse_response(events: futures::stream::BoxStream<'static, Bytes>) -> axum::response::Response {
    const EVERY: Duration = Duration::from_secs(15);
    let tick = tokio::time::interval_at(tokio::time::Instant::now() + EVERY, EVERY);
    let body = futures::stream::unfold((events, tick), |(mut events, mut tick)| async move {
        tokio::select! {
            e = events.next() => {
                tick.reset();
                e.map(|b| (Ok::<_, Infallible>(b), (events, tick)))
            }
            _ = tick.tick() => Some((Ok(Bytes::from_static(b":\n\n")), (events, tick))),
        }
    });
    (
        [
            (axum::http::header::CONTENT_TYPE, "text/event-stream"),
            (axum::http::header::CACHE_CONTROL, "no-cache"),
        ],
        axum::body::Body::from_stream(body),
    )
        .into_response()
}

/// A client fed by the hub: `ready`, the replay, then the live feed.
struct HubClient {
    ready: Option<String>,
    replay: std::collections::VecDeque<std::sync::Arc<crate::hub::Item>>,
    sub_rx: tokio::sync::broadcast::Receiver<std::sync::Arc<crate::hub::Item>>,
    from: Positions,
    /// The position after the last event this client was sent or skipped: its resume point.
    last_id: String,
    pool: Option<String>,
    endpoint: Option<String>,
    cancel: tokio_util::sync::CancellationToken,
    ends_at: tokio::time::Instant,
    ended: bool,
    _slot: StreamSlot,
}

impl HubClient {
    fn event(&mut self, item: &crate::hub::Item) -> Option<Bytes> {
        self.last_id.clone_from(&item.id);
        if item.offset < self.from.get(&item.partition).copied().unwrap_or(0) {
            return None; // already seen by this client (it was ahead of this instance)
        }
        let wanted = self.pool.as_deref().is_none_or(|p| p == item.pool)
            && self
                .endpoint
                .as_deref()
                .is_none_or(|e| item.endpoint.as_deref() == Some(e));
        wanted.then(|| item.frame.clone())
    }

    async fn next_event(&mut self) -> Option<Bytes> {
        if let Some(id) = self.ready.take() {
            return Some(frame("ready", &id, "{}"));
        }
        if self.ended {
            return None;
        }
        while let Some(item) = self.replay.pop_front() {
            if let Some(e) = self.event(&item) {
                return Some(e);
            }
        }
        loop {
            let item = tokio::select! {
                _ = self.cancel.cancelled() => return None,
                _ = tokio::time::sleep_until(self.ends_at) => {
                    self.ended = true;
                    return Some(
                        frame("reconnect", &self.last_id, RECONNECT),
                    );
                }
                r = self.sub_rx.recv() => r,
            };
            match item {
                Ok(item) => {
                    if let Some(e) = self.event(&item) {
                        return Some(e);
                    }
                }
                Err(tokio::sync::broadcast::error::RecvError::Lagged(missed)) => {
                    self.ended = true;
                    return Some(frame(
                        "lagged",
                        &self.last_id,
                        &format!(
                            r#"{{"reason":"this client fell {missed} events behind the live stream; resume with Last-Event-ID","missed":{missed}}}"#
                        ),
                    ));
                }
                Err(tokio::sync::broadcast::error::RecvError::Closed) => return None,
            }
        }
    }
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
