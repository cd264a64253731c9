//! The body of a stream served by the HTTP server: the events with a keep-alive comment, and
//! the hub's broadcast as a stream (`HubFeed`) for a stream asked for on a kept-alive connection,
//! which the live-stream writers cannot take over.

use super::hub::Subscription;
use super::protocol::{self, Filter, Item, KEEP_ALIVE, KEEP_ALIVE_COMMENT};
use super::slot::StreamSlot;
use axum::body::Bytes;
use axum::response::IntoResponse;
use futures::{Stream, StreamExt};
use std::collections::VecDeque;
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::sync::broadcast;
use tokio_util::sync::ReusableBoxFuture;

/// The events as a `text/event-stream` response, with a keep-alive comment.
pub fn sse_response<S>(events: S) -> axum::response::Response
where
    S: Stream<Item = Bytes> + Unpin + Send + 'static,
{
    let body = KeepAlive {
        events,
        timer: Deadline::after(KEEP_ALIVE),
        sent: false,
    };
    let mut response = axum::body::Body::from_stream(body).into_response();
    for (name, value) in super::protocol::HEADERS {
        response
            .headers_mut()
            .insert(name, axum::http::HeaderValue::from_static(value));
    }
    response
}

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
                return Poll::Ready(Some(Ok(Bytes::from_static(KEEP_ALIVE_COMMENT))));
            }
        }
        Poll::Pending
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
pub struct HubFeed {
    ready: Option<String>,
    /// Wanted events beyond the replay the client may hold: `lagged` after the replay.
    cut: Option<u64>,
    /// An event right after `ready` (a `reset`).
    notice: Option<Bytes>,
    replay: VecDeque<Arc<Item>>,
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
    /// `ready`, the replay, then the live feed of `sub`, as `filter` wants them, until `ends_at`.
    pub fn new(
        sub: Subscription,
        filter: Filter,
        ends_at: tokio::time::Instant,
        slot: StreamSlot,
        notice: Option<Bytes>,
    ) -> HubFeed {
        HubFeed {
            notice,
            cut: sub.cut,
            last_id: sub.ready_id.clone(),
            replay: sub.replay.into(),
            rx: ReusableBoxFuture::new(recv(sub.rx)),
            filter,
            ready: Some(sub.ready_id),
            lifetime: Deadline::at(ends_at),
            ended: false,
            _slot: slot,
        }
    }

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
            return Poll::Ready(Some(protocol::ready(&id)));
        }
        if let Some(n) = this.notice.take() {
            return Poll::Ready(Some(n));
        }
        if this.ended {
            return Poll::Ready(None);
        }
        while let Some(item) = this.replay.pop_front() {
            if let Some(e) = this.event(&item) {
                return Poll::Ready(Some(e));
            }
        }
        if let Some(missed) = this.cut.take() {
            this.ended = true;
            return Poll::Ready(Some(protocol::lagged(&this.last_id, missed)));
        }
        if this.lifetime.poll_due(cx) {
            this.ended = true;
            return Poll::Ready(Some(protocol::reconnect(&this.last_id)));
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
                    return Poll::Ready(Some(protocol::lagged(&this.last_id, missed)));
                }
                Err(broadcast::error::RecvError::Closed) => {
                    this.ended = true;
                    return Poll::Ready(None);
                }
            }
        }
    }
}
