//! The accept loop of both OTLP ports, with what `axum::serve` lacks:
//!
//! - **TLS** (rustls), optionally with client certificates from a CA of the operator's; ALPN
//!   offers `h2` (gRPC) and `http/1.1`.
//! - **A connection cap**: beyond `--max-connections` (fitted to the open-file limit) a new
//!   connection is closed at once, so that idle or slow clients cannot take every descriptor
//!   (1,100 idle connections made good exports time out with "Too many open files").
//! - **Read timeouts**: a connection must send its first bytes (or finish its TLS handshake)
//!   and each request's headers within `--header-read-timeout-ms` (an idle keep-alive
//!   connection is closed after as long); HTTP/2 connections are pinged and closed when the
//!   peer stops answering. A request's body has `--body-read-timeout-ms` (in [`crate::serve`]).
//!   1,000 slow-loris connections were held for 120 s without these.
//! - Graceful shutdown: on cancellation the loop stops accepting and every connection finishes
//!   its current request.

use anyhow::Context as _;
use axum::Router;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tower::Service as _;

#[derive(clap::Args, Debug, Clone)]
pub struct ListenArgs {
    /// TLS on both ports: the certificate chain (PEM). With --tls-key.
    #[arg(long, env = "VITALS_OTLP_TLS_CERT", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// The certificate's private key (PEM: PKCS#8, PKCS#1 or SEC1).
    #[arg(long, env = "VITALS_OTLP_TLS_KEY", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// Require client certificates signed by these CAs (PEM), as well as a token.
    #[arg(long, env = "VITALS_OTLP_TLS_CLIENT_CA", requires = "tls_cert")]
    pub tls_client_ca: Option<PathBuf>,
    /// Open connections at most, both ports together (0: fitted to the open-file limit, at
    /// most 10,000). Beyond, a new connection is closed at once.
    #[arg(long, env = "VITALS_OTLP_MAX_CONNECTIONS", default_value_t = 0)]
    pub max_connections: usize,
    /// Time a connection has to send its first bytes (or finish TLS) and each request's headers;
    /// an idle keep-alive connection is closed after as long.
    #[arg(long, env = "VITALS_OTLP_HEADER_READ_TIMEOUT_MS", default_value_t = 10_000)]
    pub header_read_timeout_ms: u64,
    /// Time a request's body has to arrive whole.
    #[arg(long, env = "VITALS_OTLP_BODY_READ_TIMEOUT_MS", default_value_t = 30_000)]
    pub body_read_timeout_ms: u64,
}

/// Descriptors kept for Kafka, the map, the tokens file and the rest.
const FILE_RESERVE: u64 = 128;

#[derive(Debug, Clone)]
pub struct Limits {
    /// Both ports draw from one cap (the descriptors are one table).
    pub connections: Arc<Semaphore>,
    pub header_read_timeout: Duration,
}

/// Connections closed at once over the cap, and those closed for sending nothing in time.
pub static REFUSED: AtomicU64 = AtomicU64::new(0);
pub static SILENT: AtomicU64 = AtomicU64::new(0);
pub static OPEN: AtomicU64 = AtomicU64::new(0);

impl ListenArgs {
    /// `--max-connections` within the open-file limit, or an error with the numbers.
    pub fn fit_connections(&self, open_files: u64) -> anyhow::Result<usize> {
        vitals_runtime::accept::fit_connections(
            self.max_connections,
            FILE_RESERVE,
            open_files,
            10_000,
            "the receiver (Kafka, its files)",
        )
    }

    pub fn limits(&self, max_connections: usize) -> Limits {
        Limits {
            connections: Arc::new(Semaphore::new(max_connections)),
            header_read_timeout: Duration::from_millis(self.header_read_timeout_ms.max(1)),
        }
    }

    /// The TLS acceptor, if TLS is configured; an error naming the file that is wrong.
    pub fn tls(&self) -> anyhow::Result<Option<TlsAcceptor>> {
        use rustls::pki_types::pem::PemObject as _;
        use rustls::pki_types::{CertificateDer, PrivateKeyDer};
        let (Some(cert), Some(key)) = (&self.tls_cert, &self.tls_key) else {
            return Ok(None);
        };
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
            .and_then(|i| i.collect::<Result<_, _>>())
            .map_err(|e| anyhow::anyhow!("--tls-cert {}: {e}", cert.display()))?;
        anyhow::ensure!(!chain.is_empty(), "--tls-cert {}: no certificate in it", cert.display());
        let key = PrivateKeyDer::from_pem_file(key).map_err(|e| anyhow::anyhow!("--tls-key {}: {e}", key.display()))?;
        let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .context("TLS versions")?;
        let builder = match &self.tls_client_ca {
            None => builder.with_no_client_auth(),
            Some(ca) => {
                let mut roots = rustls::RootCertStore::empty();
                for c in CertificateDer::pem_file_iter(ca)
                    .map_err(|e| anyhow::anyhow!("--tls-client-ca {}: {e}", ca.display()))?
                {
                    let c = c.map_err(|e| anyhow::anyhow!("--tls-client-ca {}: {e}", ca.display()))?;
                    roots
                        .add(c)
                        .map_err(|e| anyhow::anyhow!("--tls-client-ca {}: {e}", ca.display()))?;
                }
                let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                    .build()
                    .map_err(|e| anyhow::anyhow!("--tls-client-ca {}: {e}", ca.display()))?;
                builder.with_client_cert_verifier(verifier)
            }
        };
        let mut config = builder
            .with_single_cert(chain, key)
            .map_err(|e| anyhow::anyhow!("--tls-cert and --tls-key do not go together: {e}"))?;
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Ok(Some(TlsAcceptor::from(Arc::new(config))))
    }
}

/// Serve `app` on `listener` until `cancel` fires; then let open connections finish.
pub async fn serve(
    listener: TcpListener,
    app: Router,
    tls: Option<TlsAcceptor>,
    limits: Limits,
    cancel: CancellationToken,
) {
    let tracker = TaskTracker::new();
    let mut failing = vitals_runtime::accept::AcceptErrors::default();
    while let Some((stream, peer)) = failing.next(&listener, &cancel).await {
        let Ok(permit) = limits.connections.clone().try_acquire_owned() else {
            REFUSED.fetch_add(1, Ordering::Relaxed);
            drop(stream);
            continue;
        };
        let _ = stream.set_nodelay(true);
        let (app, cancel, tls, limits) = (app.clone(), cancel.clone(), tls.clone(), limits.clone());
        tracker.spawn(async move {
            let _permit = permit;
            OPEN.fetch_add(1, Ordering::Relaxed);
            let within = limits.header_read_timeout;
            match tls {
                None => {
                    // Nothing sent in time: closed before hyper waits on it.
                    let mut first = [0u8; 1];
                    match tokio::time::timeout(within, stream.peek(&mut first)).await {
                        Ok(Ok(n)) if n > 0 => connection(TokioIo::new(stream), app, &limits, cancel).await,
                        Ok(_) => {}
                        Err(_) => {
                            SILENT.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                }
                Some(acceptor) => match tokio::time::timeout(within, acceptor.accept(stream)).await {
                    Ok(Ok(s)) => connection(TokioIo::new(s), app, &limits, cancel).await,
                    Ok(Err(e)) => tracing::debug!(error = %e, %peer, "TLS handshake failed"),
                    Err(_) => {
                        SILENT.fetch_add(1, Ordering::Relaxed);
                    }
                },
            }
            OPEN.fetch_sub(1, Ordering::Relaxed);
        });
    }
    tracker.close();
    tracker.wait().await;
}

/// One connection, HTTP/1.1 or HTTP/2 (gRPC), until it ends or `cancel` fires.
async fn connection<I>(io: TokioIo<I>, app: Router, limits: &Limits, cancel: CancellationToken)
where
    I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let svc = hyper::service::service_fn(move |req: hyper::Request<Incoming>| app.clone().call(req));
    let mut builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout)
        .keep_alive(true);
    builder
        .http2()
        .timer(TokioTimer::new())
        .keep_alive_interval(Some(Duration::from_secs(30)))
        .keep_alive_timeout(Duration::from_secs(10))
        .max_concurrent_streams(256);
    let conn = builder.serve_connection(io, svc);
    tokio::pin!(conn);
    tokio::select! {
        r = conn.as_mut() => {
            if let Err(e) = r {
                tracing::debug!(error = %e, "connection ended with an error");
            }
        }
        _ = cancel.cancelled() => {
            conn.as_mut().graceful_shutdown();
            let _ = conn.await;
        }
    }
}

/// The loop's counters in the Prometheus text format.
pub fn prometheus() -> String {
    format!(
        "# HELP vitals_otlp_connections Open connections, both ports.\n# TYPE vitals_otlp_connections gauge\nvitals_otlp_connections {}\n\
         # HELP vitals_otlp_connections_closed_total Connections closed by the receiver: over the cap at once (refused), or for sending nothing within the header timeout (silent).\n# TYPE vitals_otlp_connections_closed_total counter\n\
         vitals_otlp_connections_closed_total{{reason=\"refused\"}} {}\nvitals_otlp_connections_closed_total{{reason=\"silent\"}} {}\n",
        OPEN.load(Ordering::Relaxed),
        REFUSED.load(Ordering::Relaxed),
        SILENT.load(Ordering::Relaxed),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Args {
        #[command(flatten)]
        listen: ListenArgs,
    }

    #[test]
    fn connections_fit_the_open_file_limit_or_are_refused_with_the_numbers() {
        let a = |extra: &[&str]| Args::parse_from([&["x"], extra].concat()).listen;
        assert_eq!(a(&[]).fit_connections(1_024).unwrap(), 896);
        assert_eq!(a(&[]).fit_connections(1 << 20).unwrap(), 10_000);
        assert_eq!(a(&["--max-connections", "500"]).fit_connections(1_024).unwrap(), 500);
        let e = a(&["--max-connections", "5000"])
            .fit_connections(1_024)
            .unwrap_err()
            .to_string();
        assert!(e.contains("at most 896"), "{e}");
        assert!(a(&[]).fit_connections(100).is_err());
        assert!(
            Args::try_parse_from(["x", "--tls-cert", "c.pem"]).is_err(),
            "a certificate needs its key"
        );
    }
}
