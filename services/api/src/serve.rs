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
    loop {
        let accepted = tokio::select! {
            _ = cancel.cancelled() => break,
            a = listener.accept() => a,
        };
        let (mut stream, peer) = match accepted {
            Ok(a) => a,
            Err(e) => {
                // EMFILE and the like: back off instead of spinning on the error.
                tracing::warn!(error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let Ok(permit) = slots.clone().try_acquire_owned() else {
            tracker.spawn(async move {
                let _ = tokio::time::timeout(Duration::from_secs(1), stream.write_all(&busy())).await;
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
