//! The HTTP/1.1 server loop, with the limits `axum::serve` does not have.
//!
//! - **Connection cap**: at most `max_connections` open at once. Beyond it a connection is
//!   answered `503` with `Retry-After` and closed, so that slow or idle clients cannot exhaust
//!   the process's file descriptors (and with them the database and Kafka sockets).
//! - **Header-read timeout**: a connection must deliver a request's headers within
//!   `header_read_timeout` of the moment the server starts waiting for them. This closes
//!   connections that send half a request, and keep-alive connections idle for that long.
//!   A response in progress (a live stream) is not bounded by it.
//! - Graceful shutdown: on cancellation the loop stops accepting and every connection finishes
//!   its current response.
//!
//! Each request carries the peer address as `ConnectInfo<SocketAddr>`.

use axum::extract::connect_info::ConnectInfo;
use axum::Router;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tower::Service;
use vitals_runtime::accept::AcceptErrors;

#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub max_connections: usize,
    pub header_read_timeout: Duration,
}

/// The whole answer to a connection over the cap, in the API's error format.
fn busy() -> Vec<u8> {
    let body = r#"{"error":{"code":"busy","message":"too many open connections; retry shortly"}}"#;
    format!(
        "HTTP/1.1 503 Service Unavailable\r\nRetry-After: 1\r\nContent-Type: application/json\r\n\
         Connection: close\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// The answer to a connection over the cap: `ok` to a liveness probe (`GET /healthz`), which
/// must not see a busy but healthy API as dead and restart it, and `busy` to anything else.
/// Only the request line is read (at most 1 KB, within the caller's timeout).
async fn over_cap(stream: &mut TcpStream) -> std::io::Result<()> {
    use tokio::io::AsyncReadExt;
    let mut head = Vec::with_capacity(64);
    let mut buf = [0u8; 256];
    while !head.contains(&b'\n') && head.len() < 1024 {
        let n = stream.read(&mut buf).await?;
        if n == 0 {
            break;
        }
        head.extend_from_slice(&buf[..n]);
    }
    let answer = if is_liveness_probe(&head) { alive() } else { busy() };
    stream.write_all(&answer).await
}

/// Whether a request starts `GET /healthz` (with or without a query).
fn is_liveness_probe(head: &[u8]) -> bool {
    let line = head.split(|b| *b == b'\n').next().unwrap_or_default();
    let mut parts = line.split(|b| *b == b' ');
    let (method, target) = (parts.next(), parts.next());
    method == Some(b"GET".as_slice()) && target.is_some_and(|t| t == b"/healthz" || t.starts_with(b"/healthz?"))
}

/// `/healthz`'s own answer, written without the app.
fn alive() -> Vec<u8> {
    b"HTTP/1.1 200 OK\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok"
        .to_vec()
}

/// Looks at a new connection first: `Ok` if it served it, or the connection back for `app`.
pub type Takeover =
    Arc<dyn Fn(TcpStream, SocketAddr) -> futures::future::BoxFuture<'static, Result<(), TcpStream>> + Send + Sync>;

/// Serve `app` on `listener` until `cancel` fires; then wait for open connections to finish.
/// Each connection is offered to `takeover` first (the live streams written by the hub's
/// threads).
pub async fn serve(
    listener: TcpListener,
    app: Router,
    limits: Limits,
    cancel: CancellationToken,
    takeover: Option<Takeover>,
) {
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    let tracker = TaskTracker::new();
    let mut failing = AcceptErrors::default();
    while let Some((mut stream, peer)) = failing.next(&listener, &cancel).await {
        let Ok(permit) = slots.clone().try_acquire_owned() else {
            tracker.spawn(async move {
                let _ = tokio::time::timeout(Duration::from_secs(1), over_cap(&mut stream)).await;
                let _ = stream.shutdown().await;
            });
            continue;
        };
        // A live stream's event is one small write that should leave at once, not wait for the
        // previous one's acknowledgement (Nagle); whole responses are written in one go anyway.
        let _ = stream.set_nodelay(true);
        let app = app.clone();
        let cancel = cancel.clone();
        let takeover = takeover.clone();
        tracker.spawn(async move {
            let _permit = permit;
            let stream = match takeover {
                Some(t) => match t(stream, peer).await {
                    Ok(()) => return,
                    Err(s) => s,
                },
                None => stream,
            };
            let svc = hyper::service::service_fn(move |mut req: hyper::Request<Incoming>| {
                req.extensions_mut().insert(ConnectInfo(peer));
                app.clone().call(req)
            });
            let conn = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(limits.header_read_timeout)
                .keep_alive(true)
                .serve_connection(TokioIo::new(stream), svc);
            tokio::pin!(conn);
            tokio::select! {
                r = conn.as_mut() => {
                    if let Err(e) = r {
                        tracing::debug!(error = %e, %peer, "connection ended with an error");
                    }
                }
                _ = cancel.cancelled() => {
                    conn.as_mut().graceful_shutdown();
                    let _ = conn.await;
                }
            }
        });
    }
    tracker.close();
    tracker.wait().await;
}

#[cfg(test)]
mod tests {
    use super::is_liveness_probe;

    #[test]
    fn only_a_get_of_healthz_is_a_liveness_probe() {
        assert!(is_liveness_probe(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"));
        assert!(is_liveness_probe(b"GET /healthz?x=1 HTTP/1.1\r\n"));
        assert!(!is_liveness_probe(b"GET /healthzz HTTP/1.1\r\n"));
        assert!(!is_liveness_probe(b"POST /healthz HTTP/1.1\r\n"));
        assert!(!is_liveness_probe(b"GET /v1/pools HTTP/1.1\r\n"));
        assert!(!is_liveness_probe(b""));
    }
}
