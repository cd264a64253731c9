//! Operator actions: overrides and policies, as records on the signals topic so that the
//! engine applies them in order and the audit log records them like every other transition.

use crate::auth::{Admin, Reader};
use crate::error::{ApiError, BadPath, Busy, ErrorBody, NeedsToken, NoToken, TooLarge};
use crate::extract::{ApiJson, ApiPath};
use crate::params::Name;
use crate::AppState;
use axum::extract::State;
use axum::http::StatusCode;
use axum::Json;
use chrono::Utc;
use rdkafka::producer::FutureRecord;
use serde::Deserialize;
use utoipa::ToSchema;
use vitals_contracts::view::{Accepted, PoolPolicy};
use vitals_contracts::{self as c, view};
use vitals_runtime::produce;

#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct OverrideRequest {
    pub action: view::Action,
    /// Why; recorded in the audit log with the token's name.
    pub reason: String,
}

/// An operator's record onto the signals topic, confirmed by the broker (keyed by pool, so
/// that the engine applies it in order with the pool's other records).
async fn produce(app: &AppState, signal: &c::Signal) -> Result<Accepted, ApiError> {
    let bytes = c::encode_signal(signal).map_err(|e| ApiError::Internal(e.into()))?;
    let pool = signal.pool().unwrap_or_default();
    let record = FutureRecord::to(&app.cfg.topics.signals_topic)
        .key(pool)
        .payload(&bytes);
    let failed = |e: produce::ProduceError| {
        tracing::warn!(error = %e, "operator record not produced");
        ApiError::Unavailable(e.advice().to_owned())
    };
    let delivery = produce::try_queue(&app.producer, record).map_err(failed)?;
    let (partition, offset) = produce::delivered(delivery).await.map_err(failed)?;
    Ok(Accepted {
        id: signal.id().to_owned(),
        partition,
        offset,
    })
}

#[utoipa::path(
    post, path = "/v1/pools/{pool}/endpoints/{endpoint}/override", tag = "operations",
    params(("pool" = String, Path, description = "Pool name"), ("endpoint" = String, Path, description = "Endpoint name")),
    request_body = OverrideRequest, security(("bearer" = [])),
    responses(
        (status = 202, description = "On the signals topic; the engine applies it in order", body = Accepted),
        (status = 400, description = "Invalid request", body = ErrorBody),
        (status = 403, description = "The token is not an admin", body = ErrorBody),
        NoToken, TooLarge,
        (status = 503, description = "Kafka unavailable, or busy", body = ErrorBody),
    )
)]
pub async fn override_endpoint(
    State(app): State<AppState>,
    Admin(who): Admin,
    ApiPath((Name(pool), Name(endpoint))): ApiPath<(Name, Name)>,
    ApiJson(req): ApiJson<OverrideRequest>,
) -> Result<(StatusCode, Json<Accepted>), ApiError> {
    let now = Utc::now().timestamp_micros();
    let signal = c::Signal::Override(c::OperatorOverride {
        override_id: format!("override-{now}-{}", who.name),
        pool,
        endpoint,
        action: req.action.into(),
        actor: who.name.clone(),
        reason: req.reason,
        issued_at: now,
    });
    c::validate_signal(&signal, Some(now)).map_err(|e| ApiError::invalid(e.field, e.message))?;
    tracing::info!(actor = %who.name, "operator override");
    Ok((StatusCode::ACCEPTED, Json(produce(&app, &signal).await?)))
}

#[utoipa::path(
    get, path = "/v1/pools/{pool}/policy", tag = "operations",
    description = "The policy the engine applies to the pool: the last policy change it applied (written in \
the same transaction), or the default (version 0) for a pool it has seen but never changed.",
    params(("pool" = String, Path, description = "Pool name")),
    responses(
        (status = 200, description = "The pool's policy", body = PoolPolicy),
        BadPath,
        (status = 404, description = "A pool the processor has not seen", body = ErrorBody),
        NeedsToken, Busy,
    )
)]
pub async fn get_policy(
    State(app): State<AppState>,
    _: Reader,
    ApiPath(Name(pool)): ApiPath<Name>,
) -> Result<Json<PoolPolicy>, ApiError> {
    let (version, policy) = vitals_store::read::pool_policy(&app.db, &pool)
        .await?
        .ok_or_else(|| ApiError::NotFound(format!("no pool {pool:?}")))?;
    Ok(Json(PoolPolicy { pool, version, policy }))
}

#[utoipa::path(
    put, path = "/v1/pools/{pool}/policy", tag = "operations",
    description = "Replaces the pool's whole policy: a field left out takes its documented default (not the \
pool's current value), and an unknown field is refused (400 naming it), so that a typo cannot silently \
revert a setting. Every value is range-checked.",
    params(("pool" = String, Path, description = "Pool name")),
    request_body = c::Policy, security(("bearer" = [])),
    responses(
        (status = 202, description = "On the signals topic; the engine applies it in order", body = Accepted),
        (status = 400, description = "Invalid policy (the field is named)", body = ErrorBody),
        (status = 403, description = "The token is not an admin", body = ErrorBody),
        NoToken, TooLarge,
        (status = 503, description = "Kafka unavailable, or busy", body = ErrorBody),
    )
)]
pub async fn put_policy(
    State(app): State<AppState>,
    Admin(who): Admin,
    ApiPath(Name(pool)): ApiPath<Name>,
    ApiJson(body): ApiJson<serde_json::Value>,
) -> Result<(StatusCode, Json<Accepted>), ApiError> {
    let policy = policy_from_json(body)?;
    let now = Utc::now().timestamp_micros();
    let signal = c::Signal::Policy(c::PolicyChange {
        change_id: format!("policy-{now}-{}", who.name),
        pool,
        actor: who.name.clone(),
        issued_at: now,
        policy,
    });
    c::validate_signal(&signal, Some(now)).map_err(|e| ApiError::invalid(e.field, e.message))?;
    tracing::info!(actor = %who.name, "policy change");
    Ok((StatusCode::ACCEPTED, Json(produce(&app, &signal).await?)))
}

/// A policy from a PUT body: an object whose every key is a policy field. `c::Policy` fills
/// omitted fields with defaults (PUT replaces the whole policy) and, being the Avro contract
/// type, cannot refuse unknown fields itself; a misspelt field must not pass silently.
fn policy_from_json(body: serde_json::Value) -> Result<c::Policy, ApiError> {
    let serde_json::Value::Object(fields) = &body else {
        return Err(ApiError::invalid("body", "a policy is a JSON object"));
    };
    let known = serde_json::to_value(c::Policy::default()).map_err(|e| ApiError::Internal(e.into()))?;
    if let Some(unknown) = fields.keys().find(|k| known.get(k.as_str()).is_none()) {
        return Err(ApiError::invalid(
            &format!("policy.{unknown}"),
            format!("{unknown:?} is not a policy field"),
        ));
    }
    serde_json::from_value(body).map_err(|e| ApiError::invalid("body", format!("not a valid policy: {e}")))
}
