//! The route `GET /v1/stream`: authorization, the stream's slot (its limits), where it starts,
//! and which part feeds it: the live-stream writers (a connection taken over before the server
//! reads it), the hub's broadcast (a stream asked for on a kept-alive connection) or a Kafka
//! consumer of its own (a resume from further back than the ring).

use super::fanout::RawClient;
use super::feed::{sse_response, HubFeed};
use super::kafka;
use super::protocol::{self, encode_positions, Filter, Positions};
use super::slot::{take_slot, StreamSlot};
use crate::auth::Reader;
use crate::error::{ApiError, ErrorBody, NeedsToken};
use crate::params::Name;
use crate::AppState;
use axum::extract::connect_info::ConnectInfo;
use axum::extract::{RawQuery, State};
use axum::http::HeaderMap;
use serde::Deserialize;
use std::sync::Arc;
use std::time::Duration;
use utoipa::IntoParams;

#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct StreamParams {
    /// Only events of this pool.
    #[param(inline)]
    pool: Option<Name>,
    /// Only events of this endpoint.
    #[param(inline)]
    endpoint: Option<Name>,
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
    /// A `reset` event to send after `ready`: the client's `Last-Event-ID` was ahead of the
    /// topic, and the stream starts at its end instead.
    notice: Option<axum::body::Bytes>,
}

/// Admit a stream request from its headers and raw query: authorize it, read its parameters,
/// take its slot and find where it starts. Both paths to the route (the handler and the
/// takeover) call this and nothing else before serving, so they cannot refuse or admit
/// differently; a refusal is an [`ApiError`], which the server answers either way.
async fn admit(
    app: &AppState,
    headers: &HeaderMap,
    query: &str,
    peer: Option<std::net::SocketAddr>,
) -> Result<Opened, ApiError> {
    let reader = Reader::of(app, headers)?;
    let params = crate::extract::query::<StreamParams>(query)?;
    open(app, reader, headers, peer, params).await
}

/// Take the slot of an authorized stream request; where it starts.
async fn open(
    app: &AppState,
    Reader(principal): Reader,
    headers: &HeaderMap,
    peer: Option<std::net::SocketAddr>,
    q: StreamParams,
) -> Result<Opened, ApiError> {
    let (client, anonymous) = match principal {
        Some(p) => (format!("token:{}", p.name), false),
        None => (
            format!("ip:{}", peer.map_or("unknown".to_string(), |a| a.ip().to_string())),
            true,
        ),
    };
    let resume = headers
        .get("last-event-id")
        .map(|v| v.to_str().map_err(|_| ApiError::invalid("Last-Event-ID", "not text")))
        .transpose()?;
    let resume = protocol::resume_from(resume.map(str::trim))?;
    let slot = take_slot(app, &client, anonymous)?;
    let ends_at = tokio::time::Instant::now() + Duration::from_secs(app.cfg.stream_max_lifetime_secs);
    if !app.hub.ready(Duration::from_secs(5)).await {
        return Err(ApiError::Unavailable("the changes topic is unavailable".into()));
    }
    let end = || async {
        app.hub.end_positions().await.map_err(|e| {
            tracing::warn!(error = %e, "live stream: cannot read the end of the changes topic");
            ApiError::Unavailable("the changes topic is unavailable".into())
        })
    };
    // A resume from ahead of the topic (recreated since) would wait for offsets that never come:
    // start it at the end, and say so.
    let (from, resume, notice) = match resume {
        Some(r) if !app.hub.has_read(&r) => {
            let end = end().await?;
            if protocol::ahead(&r, &end) {
                let notice = protocol::reset(&encode_positions(&end), &encode_positions(&r));
                (end, None, Some(notice))
            } else {
                (r.clone(), Some(r), None)
            }
        }
        Some(r) => (r.clone(), Some(r), None),
        None => (end().await?, None, None),
    };
    Ok(Opened {
        slot,
        resume,
        filter: Filter {
            from,
            pool: q.pool.map(|n| n.0),
            endpoint: q.endpoint.map(|n| n.0),
        },
        ends_at,
        notice,
    })
}

#[utoipa::path(
    get, path = "/v1/stream", tag = "stream", params(StreamParams,
        ("Last-Event-ID" = Option<String>, Header, description = "Resume after this event")),
    responses(
        (status = 200, description = "Server-Sent Events: `ready`, then `health_changed` (a transition, as in the history) and `pool_changed`; `lagged` when the client fell behind and `reconnect` when the stream reaches its lifetime (both end it; their id resumes it); `reset` right after `ready` when Last-Event-ID was ahead of the topic (the stream starts at its end: reload what you hold)", content_type = "text/event-stream", body = String),
        (status = 400, description = "A Last-Event-ID that is not from this stream", body = ErrorBody),
        NeedsToken,
        (status = 429, description = "This client holds its maximum of live streams", body = ErrorBody),
        (status = 503, description = "Too many live streams (anonymous clients get three quarters of them), too many resuming from far back, or Kafka unavailable", body = ErrorBody),
    )
)]
pub async fn stream(
    State(app): State<AppState>,
    headers: HeaderMap,
    peer: Option<axum::Extension<ConnectInfo<std::net::SocketAddr>>>,
    RawQuery(query): RawQuery,
) -> Result<axum::response::Response, ApiError> {
    let peer = peer.map(|axum::Extension(ConnectInfo(a))| a);
    let Opened {
        slot,
        resume,
        filter,
        ends_at,
        notice,
    } = admit(&app, &headers, query.as_deref().unwrap_or(""), peer).await?;
    if let Some(sub) = app.hub.subscribe(&filter) {
        return Ok(sse_response(HubFeed::new(sub, filter, ends_at, slot, notice)));
    }
    // Further back than the ring: a consumer of its own, from the client's positions.
    let events = kafka::events(&app, resume, filter, ends_at, slot).await?;
    Ok(sse_response(events))
}

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
    // The handler's own admission: a refusal is answered by the server, with the reason.
    let Ok(opened) = admit(&app, &headers, &query, Some(peer)).await else {
        return Err(sock);
    };
    // The socket is shared with a writer thread, which writes without waiting (`try_write`):
    // its readiness to write is known before it is handed over.
    if sock.writable().await.is_err() {
        return Ok(());
    }
    let sock = Arc::new(sock);
    let gone = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (ended_tx, mut ended) = tokio::sync::oneshot::channel();
    let client = Box::new(RawClient {
        sock: sock.clone(),
        filter: opened.filter,
        last_id: String::new(),
        ends_at: opened.ends_at.into_std(),
        gone: gone.clone(),
        ended: ended_tx,
    });
    if let Err(client) = app.hub.attach(client, opened.notice) {
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

/// The headers and raw query of a complete request head; None if it is not one this path takes
/// (incomplete, not HTTP/1.x, a method or path other than `GET /v1/stream`, a header that is
/// not one).
fn parse_head(buf: &[u8]) -> Option<(HeaderMap, String)> {
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
    Some((headers, uri.query().unwrap_or("").to_owned()))
}
