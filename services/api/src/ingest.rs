//! Ingest for gateways that do not speak Kafka: a JSON batch of call outcomes and probe results,
//! validated per item with the processor's rules, produced to the signals topic keyed by pool,
//! and acknowledged only when the broker confirms.

use crate::auth::Role;
use crate::error::{ApiError, ErrorBody};
use crate::AppState;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderValue};
use axum::response::{IntoResponse, Response};
use axum::Json;
use chrono::{DateTime, Utc};
use rdkafka::producer::FutureRecord;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use utoipa::ToSchema;
use vitals_contracts as c;

#[derive(Deserialize, ToSchema, Clone, Copy)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    Success,
    Timeout,
    ConnectError,
    ConnectionDropped,
    RateLimited,
    ServerError,
    ClientError,
    InvalidResponse,
    Cancelled,
}

impl From<Outcome> for c::OutcomeClass {
    fn from(o: Outcome) -> c::OutcomeClass {
        match o {
            Outcome::Success => c::OutcomeClass::Success,
            Outcome::Timeout => c::OutcomeClass::Timeout,
            Outcome::ConnectError => c::OutcomeClass::ConnectError,
            Outcome::ConnectionDropped => c::OutcomeClass::ConnectionDropped,
            Outcome::RateLimited => c::OutcomeClass::RateLimited,
            Outcome::ServerError => c::OutcomeClass::ServerError,
            Outcome::ClientError => c::OutcomeClass::ClientError,
            Outcome::InvalidResponse => c::OutcomeClass::InvalidResponse,
            Outcome::Cancelled => c::OutcomeClass::Cancelled,
        }
    }
}

#[derive(Deserialize, ToSchema, Clone, Copy)]
#[serde(rename_all = "snake_case")]
pub enum ProbeKind {
    Http,
    Tcp,
    SyntheticCompletion,
    Heartbeat,
}

#[derive(Deserialize, ToSchema, Clone, Copy)]
#[serde(rename_all = "snake_case")]
pub enum DependencyStatus {
    Up,
    Degraded,
    Down,
}

#[derive(Deserialize, ToSchema)]
pub struct Dependency {
    pub name: String,
    pub critical: bool,
    pub status: DependencyStatus,
}

/// One call through a gateway.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CallItem {
    /// Unique id of the event; generated when absent.
    pub event_id: Option<String>,
    pub pool: String,
    pub endpoint: String,
    pub gateway: String,
    /// When the call happened (RFC 3339); now when absent.
    pub occurred_at: Option<DateTime<Utc>>,
    pub outcome: Outcome,
    pub http_status: Option<i32>,
    pub latency_us: i64,
    pub ttft_us: Option<i64>,
    pub tpot_us: Option<i64>,
    #[serde(default)]
    pub attributes: BTreeMap<String, String>,
    pub model: Option<String>,
}

/// One active probe.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ProbeItem {
    pub probe_id: Option<String>,
    pub pool: String,
    pub endpoint: String,
    pub prober: String,
    pub occurred_at: Option<DateTime<Utc>>,
    pub kind: ProbeKind,
    pub outcome: Outcome,
    pub latency_us: i64,
    pub ttft_us: Option<i64>,
    pub http_status: Option<i32>,
    pub interval_ms: Option<i64>,
    #[serde(default)]
    pub dependencies: Vec<Dependency>,
    #[serde(default)]
    pub detail: String,
}

#[derive(Deserialize, ToSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum IngestItem {
    Call(CallItem),
    Probe(ProbeItem),
}

/// The request body. Items are checked one by one: a bad item is reported, the rest go on.
#[derive(Deserialize, ToSchema)]
#[allow(dead_code)] // documents the body; it is parsed item by item
pub struct IngestRequest {
    pub items: Vec<IngestItem>,
}

#[derive(Serialize, ToSchema, PartialEq, Debug, Clone, Copy)]
#[serde(rename_all = "snake_case")]
pub enum ItemStatus {
    /// On the signals topic, confirmed by the broker.
    Accepted,
    /// Invalid: fix it; sending it again as is will fail again.
    Rejected,
    /// Valid but not confirmed by the broker: send it again.
    Failed,
}

#[derive(Serialize, ToSchema)]
pub struct ItemResult {
    pub index: usize,
    pub status: ItemStatus,
    /// The event or probe id (generated ids are returned here).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub partition: Option<i32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub offset: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub field: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

#[derive(Serialize, ToSchema)]
pub struct IngestResponse {
    pub accepted: usize,
    pub rejected: usize,
    pub failed: usize,
    pub results: Vec<ItemResult>,
}

fn now_us() -> i64 {
    Utc::now().timestamp_micros()
}

fn to_signal(item: IngestItem, index: usize, request_id: i64) -> c::Signal {
    let gen = |prefix: &str| format!("{prefix}-{request_id}-{index}");
    match item {
        IngestItem::Call(i) => c::Signal::Call(c::CallOutcome {
            event_id: i.event_id.unwrap_or_else(|| gen("api")),
            pool: i.pool,
            endpoint: i.endpoint,
            gateway: i.gateway,
            occurred_at: i.occurred_at.map_or_else(now_us, |t| t.timestamp_micros()),
            outcome: i.outcome.into(),
            http_status: i.http_status,
            latency_us: i.latency_us,
            ttft_us: i.ttft_us,
            tpot_us: i.tpot_us,
            attributes: i.attributes,
            model: i.model,
        }),
        IngestItem::Probe(p) => c::Signal::Probe(c::ProbeResult {
            probe_id: p.probe_id.unwrap_or_else(|| gen("api-probe")),
            pool: p.pool,
            endpoint: p.endpoint,
            prober: p.prober,
            occurred_at: p.occurred_at.map_or_else(now_us, |t| t.timestamp_micros()),
            kind: match p.kind {
                ProbeKind::Http => c::ProbeKind::Http,
                ProbeKind::Tcp => c::ProbeKind::Tcp,
                ProbeKind::SyntheticCompletion => c::ProbeKind::SyntheticCompletion,
                ProbeKind::Heartbeat => c::ProbeKind::Heartbeat,
            },
            outcome: p.outcome.into(),
            latency_us: p.latency_us,
            ttft_us: p.ttft_us,
            http_status: p.http_status,
            interval_ms: p.interval_ms,
            dependencies: p
                .dependencies
                .into_iter()
                .map(|d| c::DependencyReport {
                    name: d.name,
                    critical: d.critical,
                    status: match d.status {
                        DependencyStatus::Up => c::DependencyStatus::Up,
                        DependencyStatus::Degraded => c::DependencyStatus::Degraded,
                        DependencyStatus::Down => c::DependencyStatus::Down,
                    },
                })
                .collect(),
            detail: p.detail,
        }),
    }
}

fn rejected(index: usize, field: Option<String>, error: String) -> ItemResult {
    ItemResult {
        index,
        status: ItemStatus::Rejected,
        id: None,
        partition: None,
        offset: None,
        field,
        error: Some(error),
    }
}

#[utoipa::path(
    post, path = "/v1/signals", tag = "ingest", request_body = IngestRequest,
    security(("bearer" = [])),
    responses(
        (status = 200, description = "Per item: accepted, rejected (invalid) or failed (retry)", body = IngestResponse),
        (status = 400, description = "The body is not JSON or has no items array", body = ErrorBody),
        (status = 401, description = "Missing or unknown token", body = ErrorBody),
        (status = 403, description = "The token is not a writer", body = ErrorBody),
        (status = 413, description = "Body too large", body = ErrorBody),
        (status = 503, description = "Producer queue full; retry after the Retry-After seconds", body = ErrorBody),
    )
)]
pub async fn ingest(
    State(app): State<AppState>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    app.authorize(&headers, Role::Writer)?;
    let value: serde_json::Value = crate::extract::json_body(body, app.cfg.max_body_bytes)?;
    let items = value
        .get("items")
        .and_then(|v| v.as_array())
        .ok_or_else(|| ApiError::invalid("items", "the body must be an object with an items array"))?;
    if items.len() > app.cfg.max_batch_items {
        return Err(ApiError::invalid(
            "items",
            format!("at most {} items per batch", app.cfg.max_batch_items),
        ));
    }
    // Room for the whole batch, or nothing is queued: 503 and the client retries later.
    if app.producer_in_flight() + items.len() > app.cfg.producer_queue {
        return Err(ApiError::Unavailable("the producer queue is full".into()));
    }
    let request_id = now_us();
    let reference = now_us();
    let mut results: Vec<ItemResult> = Vec::with_capacity(items.len());
    let mut pending = Vec::new();
    for (index, raw) in items.iter().enumerate() {
        let item: IngestItem = match serde_json::from_value(raw.clone()) {
            Ok(i) => i,
            Err(e) => {
                results.push(rejected(index, None, e.to_string()));
                continue;
            }
        };
        let signal = to_signal(item, index, request_id);
        if let Err(e) = c::validate_signal(&signal, Some(reference)) {
            results.push(rejected(index, Some(e.field.to_owned()), e.message));
            continue;
        }
        let bytes = match c::encode_signal(&signal) {
            Ok(b) if b.len() > MAX_RECORD_BYTES => {
                results.push(rejected(
                    index,
                    Some("item".into()),
                    format!("encodes to {} bytes; at most {MAX_RECORD_BYTES}", b.len()),
                ));
                continue;
            }
            Ok(b) => b,
            Err(e) => {
                results.push(rejected(index, None, e.to_string()));
                continue;
            }
        };
        let pool = signal.pool().unwrap_or_default().to_owned();
        let id = signal.id().to_owned();
        let record = FutureRecord::to(&app.cfg.signals_topic).key(&pool).payload(&bytes);
        match app.producer.send_result(record) {
            Ok(delivery) => {
                pending.push((results.len(), delivery));
                results.push(ItemResult {
                    index,
                    status: ItemStatus::Accepted,
                    id: Some(id),
                    partition: None,
                    offset: None,
                    field: None,
                    error: None,
                });
            }
            Err((e, _)) => {
                // librdkafka's text stays in the log; the client learns what to do about it.
                tracing::warn!(error = %e, "ingest: record not queued");
                let (status, error) = kafka_failure(&e);
                results.push(ItemResult {
                    index,
                    status,
                    id: Some(id),
                    partition: None,
                    offset: None,
                    field: None,
                    error: Some(format!("not queued: {error}")),
                })
            }
        }
    }
    for (slot, delivery) in pending {
        let r = &mut results[slot];
        match delivery.await {
            Ok(Ok(d)) => {
                r.partition = Some(d.partition);
                r.offset = Some(d.offset);
            }
            Ok(Err((e, _))) => {
                tracing::warn!(error = %e, "ingest: the broker did not confirm a record");
                let (status, error) = kafka_failure(&e);
                r.status = status;
                r.error = Some(format!("the broker did not confirm: {error}"));
            }
            Err(_) => {
                r.status = ItemStatus::Failed;
                r.error = Some("the producer was shut down".into());
            }
        }
    }
    let count = |s: ItemStatus| results.iter().filter(|r| r.status == s).count();
    let response = IngestResponse {
        accepted: count(ItemStatus::Accepted),
        rejected: count(ItemStatus::Rejected),
        failed: count(ItemStatus::Failed),
        results,
    };
    app.metrics.ingested(response.accepted as u64);
    let failed = response.failed > 0;
    let mut resp = Json(response).into_response();
    if failed {
        resp.headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    }
    Ok(resp)
}

/// Largest encoded record ingest produces; validation keeps real records far below it, and it is
/// far below the broker's default `message.max.bytes` (1 MB).
pub const MAX_RECORD_BYTES: usize = 256 * 1024;

/// How a Kafka error reads to a client: `rejected` when retrying cannot help (the record is too
/// large or otherwise refused as such), `failed` (retry) otherwise. The message is ours, not
/// librdkafka's.
pub(crate) fn kafka_failure(e: &rdkafka::error::KafkaError) -> (ItemStatus, &'static str) {
    use rdkafka::types::RDKafkaErrorCode as K;
    match e.rdkafka_error_code() {
        Some(K::MessageSizeTooLarge | K::InvalidMessageSize | K::InvalidMessage | K::InvalidRecord) => {
            (ItemStatus::Rejected, "the broker refuses this record; do not retry it")
        }
        Some(K::QueueFull) => (ItemStatus::Failed, "the producer queue is full; retry"),
        Some(K::MessageTimedOut) => (ItemStatus::Failed, "Kafka did not answer in time; retry"),
        _ => (ItemStatus::Failed, "Kafka is unavailable; retry"),
    }
}
