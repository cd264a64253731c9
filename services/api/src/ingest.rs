//! Ingest for gateways that do not speak Kafka: a JSON batch of call outcomes and probe results,
//! validated per item with the processor's rules, produced to the signals topic keyed by pool,
//! and acknowledged only when the broker confirms.

use crate::auth::{Principal, Writer};
use crate::error::{ApiError, ErrorBody, NoToken, TooLarge};
use crate::extract::ApiJson;
use crate::AppState;
use axum::extract::State;
use axum::http::{header, HeaderValue};
use axum::response::{IntoResponse, Response};
use axum::Json;
use rdkafka::producer::FutureRecord;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use vitals_contracts::clock::now_us;
use vitals_contracts::{self as c, view};
use vitals_runtime::produce;
use vitals_runtime::tokens::NotBound;

/// The request body. Items are checked one by one: a bad item is reported, the rest go on.
#[derive(Deserialize, ToSchema)]
#[allow(dead_code)] // documents the body; it is parsed item by item
pub struct IngestRequest {
    pub items: Vec<view::SignalItem>,
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

/// Whether the token may report `signal`: its gateway (a probe's prober) and pool within the
/// token's binding.
fn bound(who: &Principal, signal: &c::Signal) -> Result<(), NotBound> {
    let (field, reporter) = match signal {
        c::Signal::Call(x) => ("gateway", x.gateway.as_str()),
        c::Signal::Summary(x) => ("gateway", x.gateway.as_str()),
        c::Signal::Probe(x) => ("prober", x.prober.as_str()),
        _ => return Ok(()),
    };
    who.binding
        .check(&who.name, field, reporter, signal.pool().unwrap_or_default())
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
        (status = 403, description = "The token may not report (a reader's)", body = ErrorBody),
        NoToken, TooLarge,
        (status = 503, description = "Producer queue full; retry after the Retry-After seconds", body = ErrorBody),
    )
)]
pub async fn ingest(
    State(app): State<AppState>,
    Writer(who): Writer,
    ApiJson(value): ApiJson<serde_json::Value>,
) -> Result<Response, ApiError> {
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
        let item: view::SignalItem = match serde_json::from_value(raw.clone()) {
            Ok(i) => i,
            Err(e) => {
                results.push(rejected(index, None, e.to_string()));
                continue;
            }
        };
        let signal = item.into_signal(|prefix| format!("{prefix}-{request_id}-{index}"), now_us());
        if let Err(e) = c::validate_signal(&signal, Some(reference)) {
            results.push(rejected(index, Some(e.field.to_owned()), e.message));
            continue;
        }
        if let Err(e) = bound(&who, &signal) {
            app.metrics.refused_unbound(&who.name);
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
        let record = FutureRecord::to(&app.cfg.topics.signals_topic)
            .key(&pool)
            .payload(&bytes);
        match produce::try_queue(&app.producer, record) {
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
            Err(e) => {
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
        match produce::delivered(delivery).await {
            Ok((partition, offset)) => {
                r.partition = Some(partition);
                r.offset = Some(offset);
            }
            Err(e) => {
                tracing::warn!(error = %e, "ingest: the broker did not confirm a record");
                let (status, error) = kafka_failure(&e);
                r.status = status;
                r.error = Some(format!("the broker did not confirm: {error}"));
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

/// How a produce error reads to a client: `rejected` when retrying cannot help (the record is
/// refused as such), `failed` (retry) otherwise; the message is ours, not librdkafka's.
fn kafka_failure(e: &produce::ProduceError) -> (ItemStatus, &'static str) {
    let status = if e.is_retriable() {
        ItemStatus::Failed
    } else {
        ItemStatus::Rejected
    };
    (status, e.advice())
}
