//! OTLP's two transports over one axum router (HTTP/1.1 and cleartext HTTP/2 on each listener):
//!
//! - OTLP/HTTP: `POST /v1/traces`, `application/x-protobuf` or `application/json`, optionally
//!   `Content-Encoding: gzip`. 200 with an `ExportTraceServiceResponse` (its partial success
//!   when spans were rejected), 400 malformed, 413 too large, 415 another content type or
//!   encoding, 429 with `Retry-After` while vitals is behind; error bodies are a
//!   `google.rpc.Status` in the request's encoding.
//! - OTLP/gRPC: the unary `TraceService/Export`, gzip message compression; `INVALID_ARGUMENT`,
//!   `RESOURCE_EXHAUSTED` (with a `RetryInfo` when sending again later will do), `UNIMPLEMENTED`
//!   for another compression.
//!
//! Every export carries a bearer token (`Authorization: Bearer …`; the OTel exporters'
//! `OTEL_EXPORTER_OTLP_HEADERS`) that may report: without one the answer is 401 /
//! `UNAUTHENTICATED`, with a reader's 403 / `PERMISSION_DENIED`, and nothing of the request is
//! read. A reporter over its budget is answered 429 / `RESOURCE_EXHAUSTED` with when to send
//! again. Without authentication (`--no-auth`) every request is `anonymous`.
//!
//! Plus `/healthz`, `/readyz` and `/metrics` (which needs a reader's token or better when
//! requests are authenticated).

use crate::receiver::{Answer, Outcome, Receiver, Transport};
use crate::rpc::{self, Code, Status};
use crate::trust::Caller;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use bytes::Bytes;
use http_body::Frame;
use opentelemetry_proto::tonic::collector::trace::v1::{ExportTracePartialSuccess, ExportTraceServiceResponse};
use prost::Message as _;
use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use vitals_runtime::tokens::{Denied, Need};
use vitals_spans::decode::{Format, Refused};

pub const GRPC_PATH: &str = "/opentelemetry.proto.collector.trace.v1.TraceService/Export";

pub fn router(r: Arc<Receiver>) -> Router {
    let metrics = r.clone();
    Router::new()
        .route("/v1/traces", post(http_export))
        .route(GRPC_PATH, post(grpc_export))
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(|| async { "ready" }))
        .route(
            "/metrics",
            get(move |headers: HeaderMap| {
                let answer = match metrics.caller(authorization(&headers), Need::Read) {
                    Ok(_) => metrics.prometheus().into_response(),
                    Err(d) => http_denied(Format::Json, d),
                };
                std::future::ready(answer)
            }),
        )
        .with_state(r)
}

/// `/metrics`, `/healthz` and `/readyz` alone, open to anyone who reaches them (`--metrics-addr`).
pub fn metrics_router(r: Arc<Receiver>) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(|| async { "ready" }))
        .route("/metrics", get(move || std::future::ready(r.prometheus())))
}

fn authorization(h: &HeaderMap) -> impl Iterator<Item = &[u8]> {
    h.get_all(header::AUTHORIZATION).iter().map(|v| v.as_bytes())
}

/// Who sent a request, or why they are refused (counted).
fn caller(r: &Receiver, t: Transport, h: &HeaderMap) -> Result<Caller, Denied> {
    r.caller(authorization(h), Need::Report).inspect_err(|d| {
        r.count(
            t,
            match d {
                Denied::Forbidden => Outcome::Forbidden,
                Denied::Unauthenticated => Outcome::Unauthenticated,
                Denied::Ambiguous => Outcome::Malformed,
            },
        )
    })
}

fn denied_status(d: Denied) -> (StatusCode, Status) {
    match d {
        Denied::Unauthenticated => (
            StatusCode::UNAUTHORIZED,
            Status::new(Code::Unauthenticated, "a bearer token that may report is needed"),
        ),
        Denied::Forbidden => (
            StatusCode::FORBIDDEN,
            Status::new(Code::PermissionDenied, "this token may not report"),
        ),
        Denied::Ambiguous => (
            StatusCode::BAD_REQUEST,
            Status::new(Code::InvalidArgument, "more than one Authorization header"),
        ),
    }
}

fn http_denied(format: Format, d: Denied) -> Response {
    let (code, status) = denied_status(d);
    let mut resp = http_error(format, code, status);
    if d == Denied::Unauthenticated {
        resp.headers_mut()
            .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
    }
    resp
}

fn http_limited(format: Format, over: crate::trust::Over) -> Response {
    let secs = over.retry_after.as_secs().max(1);
    let mut resp = http_error(
        format,
        StatusCode::TOO_MANY_REQUESTS,
        Status::new(Code::ResourceExhausted, over.message).retry_after(secs),
    );
    resp.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(secs));
    resp
}

fn header_str(h: &HeaderMap, name: header::HeaderName) -> &str {
    h.get(name).and_then(|v| v.to_str().ok()).unwrap_or("")
}

/// Why a body could not be read whole.
enum Unread {
    /// Longer than the limit.
    TooLarge,
    /// The client stopped sending before its end (it went away, or broke the stream).
    Broken,
    /// It did not arrive whole within the body timeout (a slow or stalled sender).
    Slow,
}

/// The body within the receiver's body timeout.
async fn body_in_time(r: &Receiver, b: Body, max: usize) -> Result<Bytes, Unread> {
    tokio::time::timeout(r.body_timeout, body(b, max))
        .await
        .unwrap_or(Err(Unread::Slow))
}

/// What is read and thrown away of a body over the limit before answering, at most: a client
/// still sending when the answer comes sees its connection reset (a broken pipe), which every
/// OTLP exporter takes as retryable and sends again, where a 413 / RESOURCE_EXHAUSTED tells it
/// not to. Beyond this the connection is closed as before.
const DRAIN_MAX: usize = 16 << 20;

/// The body, at most `max` bytes; one over it is read on (up to [`DRAIN_MAX`] more, discarded)
/// so that the client gets the answer.
async fn body(mut b: Body, max: usize) -> Result<Bytes, Unread> {
    use http_body_util::BodyExt as _;
    let mut held = bytes::BytesMut::new();
    let mut over: Option<usize> = None;
    while let Some(frame) = b.frame().await {
        let Ok(frame) = frame else {
            // The client went away: mid-body, or while an over-long body was being drained.
            return Err(if over.is_some() {
                Unread::TooLarge
            } else {
                Unread::Broken
            });
        };
        let Ok(data) = frame.into_data() else { continue };
        match &mut over {
            Some(drained) => {
                *drained += data.len();
                if *drained > DRAIN_MAX {
                    break;
                }
            }
            None if held.len() + data.len() > max => {
                over = Some(held.len() + data.len());
                held = bytes::BytesMut::new();
            }
            None => held.extend_from_slice(&data),
        }
    }
    match over {
        Some(_) => Err(Unread::TooLarge),
        None => Ok(held.freeze()),
    }
}

async fn http_export(State(r): State<Arc<Receiver>>, req: Request) -> Response {
    let (parts, b) = req.into_parts();
    let ctype = header_str(&parts.headers, header::CONTENT_TYPE);
    let format = match ctype.split(';').next().unwrap_or("").trim() {
        "application/x-protobuf" | "application/protobuf" => Format::Protobuf,
        "application/json" => Format::Json,
        other => {
            r.count(Transport::Http, Outcome::Unsupported);
            return (
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                format!("content type {other:?}: OTLP/HTTP takes application/x-protobuf or application/json"),
            )
                .into_response();
        }
    };
    let gzip = match header_str(&parts.headers, header::CONTENT_ENCODING).trim() {
        "" | "identity" => false,
        "gzip" => true,
        other => {
            r.count(Transport::Http, Outcome::Unsupported);
            return (
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                format!("content encoding {other:?}: OTLP/HTTP takes gzip or none"),
            )
                .into_response();
        }
    };
    let who = match caller(&r, Transport::Http, &parts.headers) {
        Ok(who) => who,
        Err(d) => return http_denied(format, d),
    };
    let max = r.limits().max_body;
    let raw = match body_in_time(&r, b, max).await {
        Ok(raw) => raw,
        Err(Unread::TooLarge) => {
            r.count(Transport::Http, Outcome::TooLarge);
            return http_error(
                format,
                StatusCode::PAYLOAD_TOO_LARGE,
                Status::new(Code::ResourceExhausted, format!("the body is over {max} bytes")),
            );
        }
        Err(Unread::Broken) => {
            r.count(Transport::Http, Outcome::Broken);
            return http_error(
                format,
                StatusCode::BAD_REQUEST,
                Status::new(Code::InvalidArgument, "the body ended before its end"),
            );
        }
        Err(Unread::Slow) => {
            r.count(Transport::Http, Outcome::Broken);
            return http_error(
                format,
                StatusCode::REQUEST_TIMEOUT,
                Status::new(Code::InvalidArgument, "the body did not arrive in time"),
            );
        }
    };
    match r.export(Transport::Http, format, raw, gzip, who).await {
        Answer::Accepted { rejected, message } => {
            let resp = response(rejected, message);
            let (ctype, body) = match format {
                Format::Protobuf => ("application/x-protobuf", resp.encode_to_vec()),
                Format::Json => (
                    "application/json",
                    serde_json::to_vec(&resp).unwrap_or_else(|_| b"{}".to_vec()),
                ),
            };
            ([(header::CONTENT_TYPE, ctype)], body).into_response()
        }
        Answer::Refused(e) => http_error(format, refused_status(&e), Status::new(refused_code(&e), e.message())),
        Answer::Busy => {
            let mut resp = http_error(
                format,
                StatusCode::TOO_MANY_REQUESTS,
                Status::new(Code::ResourceExhausted, "vitals is behind: send again later")
                    .retry_after(r.retry_after_secs),
            );
            resp.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(r.retry_after_secs));
            resp
        }
        Answer::Limited(over) => http_limited(format, over),
    }
}

fn refused_status(e: &Refused) -> StatusCode {
    match e {
        Refused::TooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
        Refused::Malformed(_) => StatusCode::BAD_REQUEST,
    }
}

fn refused_code(e: &Refused) -> Code {
    match e {
        Refused::TooLarge(_) => Code::ResourceExhausted,
        Refused::Malformed(_) => Code::InvalidArgument,
    }
}

fn http_error(format: Format, code: StatusCode, s: Status) -> Response {
    match format {
        Format::Protobuf => (
            code,
            [(header::CONTENT_TYPE, "application/x-protobuf")],
            s.encode_to_vec(),
        )
            .into_response(),
        Format::Json => (code, [(header::CONTENT_TYPE, "application/json")], s.json()).into_response(),
    }
}

fn response(rejected: u64, message: String) -> ExportTraceServiceResponse {
    ExportTraceServiceResponse {
        partial_success: (rejected > 0 || !message.is_empty()).then_some(ExportTracePartialSuccess {
            rejected_spans: rejected as i64,
            error_message: message,
        }),
    }
}

async fn grpc_export(State(r): State<Arc<Receiver>>, req: Request) -> Response {
    let (parts, b) = req.into_parts();
    let ctype = header_str(&parts.headers, header::CONTENT_TYPE);
    if !ctype.starts_with("application/grpc") {
        r.count(Transport::Grpc, Outcome::Unsupported);
        return (StatusCode::UNSUPPORTED_MEDIA_TYPE, "gRPC takes application/grpc").into_response();
    }
    let encoding = parts
        .headers
        .get("grpc-encoding")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("identity")
        .to_owned();
    let who = match caller(&r, Transport::Grpc, &parts.headers) {
        Ok(who) => who,
        Err(d) => return grpc_status(denied_status(d).1),
    };
    let max = r.limits().max_body;
    let raw = match body_in_time(&r, b, max + 5).await {
        Ok(raw) => raw,
        Err(Unread::TooLarge) => {
            r.count(Transport::Grpc, Outcome::TooLarge);
            return grpc_status(Status::new(
                Code::ResourceExhausted,
                format!("the message is over {max} bytes"),
            ));
        }
        Err(Unread::Broken) => {
            r.count(Transport::Grpc, Outcome::Broken);
            return grpc_status(Status::new(Code::InvalidArgument, "the message ended before its end"));
        }
        Err(Unread::Slow) => {
            r.count(Transport::Grpc, Outcome::Broken);
            return grpc_status(Status::new(Code::InvalidArgument, "the message did not arrive in time"));
        }
    };
    // One length-prefixed message: a compressed flag and a 4-byte big-endian length.
    let message = match raw.get(..5) {
        Some(h) if raw.len() - 5 == u32::from_be_bytes([h[1], h[2], h[3], h[4]]) as usize => raw.slice(5..),
        _ => {
            r.count(Transport::Grpc, Outcome::Malformed);
            return grpc_status(Status::new(
                Code::InvalidArgument,
                "not one length-prefixed gRPC message",
            ));
        }
    };
    let gzip = match (raw[0], encoding.as_str()) {
        (0, _) => false,
        (1, "gzip") => true,
        (_, other) => {
            r.count(Transport::Grpc, Outcome::Unsupported);
            return grpc_status(Status::new(
                Code::Unimplemented,
                format!("message compression {other:?}: this receiver takes gzip or none"),
            ));
        }
    };
    match r.export(Transport::Grpc, Format::Protobuf, message, gzip, who).await {
        Answer::Accepted { rejected, message } => {
            let m = response(rejected, message).encode_to_vec();
            let mut framed = Vec::with_capacity(m.len() + 5);
            framed.push(0);
            framed.extend_from_slice(&(m.len() as u32).to_be_bytes());
            framed.extend_from_slice(&m);
            let mut trailers = HeaderMap::new();
            trailers.insert("grpc-status", HeaderValue::from_static("0"));
            Response::builder()
                .header(header::CONTENT_TYPE, "application/grpc")
                .body(Body::new(Unary {
                    data: Some(Bytes::from(framed)),
                    trailers: Some(trailers),
                }))
                .unwrap_or_else(|_| StatusCode::INTERNAL_SERVER_ERROR.into_response())
        }
        Answer::Refused(e) => grpc_status(Status::new(refused_code(&e), e.message())),
        Answer::Busy => grpc_status(
            Status::new(Code::ResourceExhausted, "vitals is behind: send again later").retry_after(r.retry_after_secs),
        ),
        Answer::Limited(over) => {
            let secs = over.retry_after.as_secs().max(1);
            grpc_status(Status::new(Code::ResourceExhausted, over.message).retry_after(secs))
        }
    }
}

/// A trailers-only gRPC answer: the status in the headers, no message.
fn grpc_status(s: Status) -> Response {
    let mut resp = Response::new(Body::empty());
    let h = resp.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
    h.insert("grpc-status", HeaderValue::from(s.code));
    if let Ok(v) = HeaderValue::from_str(&rpc::grpc_message(&s.message)) {
        h.insert("grpc-message", v);
    }
    if !s.details.is_empty() {
        if let Ok(v) = HeaderValue::from_str(&s.details_bin()) {
            h.insert("grpc-status-details-bin", v);
        }
    }
    resp
}

/// A unary gRPC answer's body: the message, then the trailers.
struct Unary {
    data: Option<Bytes>,
    trailers: Option<HeaderMap>,
}

impl http_body::Body for Unary {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(mut self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        if let Some(d) = self.data.take() {
            return Poll::Ready(Some(Ok(Frame::data(d))));
        }
        Poll::Ready(self.trailers.take().map(|t| Ok(Frame::trailers(t))))
    }
}
