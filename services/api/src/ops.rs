//! Operator actions: overrides and policies, as records on the signals topic so that the
//! engine applies them in order and the audit log records them like every other transition.

use crate::auth::Role;
use crate::error::{ApiError, ErrorBody};
use crate::extract::ApiPath;
use crate::AppState;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::Json;
use chrono::Utc;
use rdkafka::producer::FutureRecord;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use vitals_contracts as c;

#[derive(Deserialize, ToSchema, Clone, Copy)]
#[serde(rename_all = "snake_case")]
pub enum Action {
    ForceHealthy,
    ForceUnhealthy,
    MaintenanceOn,
    MaintenanceOff,
    Clear,
}

#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct OverrideRequest {
    pub action: Action,
    /// Why; recorded in the audit log with the token's name.
    pub reason: String,
}

#[derive(Serialize, ToSchema)]
pub struct Accepted {
    /// Id of the record on the signals topic (the trigger id of the resulting transition).
    pub id: String,
    pub partition: i32,
    pub offset: i64,
}

async fn produce(app: &AppState, signal: &c::Signal) -> Result<Accepted, ApiError> {
    let bytes = c::encode_signal(signal).map_err(|e| ApiError::Internal(e.into()))?;
    let pool = signal.pool().unwrap_or_default();
    let record = FutureRecord::to(&app.cfg.signals_topic).key(pool).payload(&bytes);
    let delivery = app
        .producer
        .send_result(record)
        .map_err(|(e, _)| ApiError::Unavailable(format!("cannot queue the record: {e}")))?;
    match delivery.await {
        Ok(Ok(d)) => Ok(Accepted {
            id: signal.id().to_owned(),
            partition: d.partition,
            offset: d.offset,
        }),
        Ok(Err((e, _))) => Err(ApiError::Unavailable(format!("the broker did not confirm: {e}"))),
        Err(_) => Err(ApiError::Unavailable("the producer was shut down".into())),
    }
}

#[utoipa::path(
    post, path = "/v1/pools/{pool}/endpoints/{endpoint}/override", tag = "operations",
    params(("pool" = String, Path, description = "Pool name"), ("endpoint" = String, Path, description = "Endpoint name")),
    request_body = OverrideRequest, security(("bearer" = [])),
    responses(
        (status = 202, description = "On the signals topic; the engine applies it in order", body = Accepted),
        (status = 400, description = "Invalid request", body = ErrorBody),
        (status = 401, description = "Missing or unknown token", body = ErrorBody),
        (status = 403, description = "The token is not an admin", body = ErrorBody),
        (status = 413, description = "Body too large", body = ErrorBody),
        (status = 503, description = "Kafka unavailable", body = ErrorBody),
    )
)]
pub async fn override_endpoint(
    State(app): State<AppState>,
    headers: HeaderMap,
    ApiPath((pool, endpoint)): ApiPath<(String, String)>,
    body: Result<Bytes, BytesRejection>,
) -> Result<(StatusCode, Json<Accepted>), ApiError> {
    let who = app.authorize(&headers, Role::Admin)?;
    let req: OverrideRequest = crate::extract::json_body(body, app.cfg.max_body_bytes)?;
    let now = Utc::now().timestamp_micros();
    let signal = c::Signal::Override(c::OperatorOverride {
        override_id: format!("override-{now}-{}", who.name),
        pool,
        endpoint,
        action: match req.action {
            Action::ForceHealthy => c::OverrideAction::ForceHealthy,
            Action::ForceUnhealthy => c::OverrideAction::ForceUnhealthy,
            Action::MaintenanceOn => c::OverrideAction::MaintenanceOn,
            Action::MaintenanceOff => c::OverrideAction::MaintenanceOff,
            Action::Clear => c::OverrideAction::Clear,
        },
        actor: who.name.clone(),
        reason: req.reason,
        issued_at: now,
    });
    c::validate_signal(&signal, Some(now)).map_err(|e| ApiError::invalid(e.field, e.message))?;
    tracing::info!(actor = %who.name, "operator override");
    Ok((StatusCode::ACCEPTED, Json(produce(&app, &signal).await?)))
}

#[utoipa::path(
    put, path = "/v1/pools/{pool}/policy", tag = "operations",
    params(("pool" = String, Path, description = "Pool name")),
    request_body = c::Policy, security(("bearer" = [])),
    responses(
        (status = 202, description = "On the signals topic; the engine applies it in order", body = Accepted),
        (status = 400, description = "Invalid policy (the field is named)", body = ErrorBody),
        (status = 401, description = "Missing or unknown token", body = ErrorBody),
        (status = 403, description = "The token is not an admin", body = ErrorBody),
        (status = 413, description = "Body too large", body = ErrorBody),
        (status = 503, description = "Kafka unavailable", body = ErrorBody),
    )
)]
pub async fn put_policy(
    State(app): State<AppState>,
    headers: HeaderMap,
    ApiPath(pool): ApiPath<String>,
    body: Result<Bytes, BytesRejection>,
) -> Result<(StatusCode, Json<Accepted>), ApiError> {
    let who = app.authorize(&headers, Role::Admin)?;
    let policy: c::Policy = crate::extract::json_body(body, app.cfg.max_body_bytes)?;
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
