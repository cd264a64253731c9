//! The admin API: every endpoint's behaviour, read and replaced live.

use crate::behaviour::*;
use crate::endpoint::*;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use bytes::Bytes;
use serde::Serialize;
use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use tokio::time::Instant;

pub(crate) type Endpoints = Arc<BTreeMap<String, Arc<Endpoint>>>;

#[derive(Serialize)]
pub(crate) struct EndpointView {
    name: String,
    address: String,
    requests: u64,
    behaviour: Behaviour,
}

pub(crate) fn view(ep: &Endpoint) -> EndpointView {
    EndpointView {
        name: ep.name.clone(),
        address: format!("127.0.0.1:{}", ep.port),
        requests: ep.requests.load(Ordering::Relaxed),
        behaviour: ep.behaviour.borrow().0.clone(),
    }
}

pub(crate) async fn admin_list(State(eps): State<Endpoints>) -> Json<Vec<EndpointView>> {
    Json(eps.values().map(|e| view(e)).collect())
}

pub(crate) async fn admin_get(State(eps): State<Endpoints>, Path(name): Path<String>) -> Response {
    match eps.get(&name) {
        Some(e) => Json(view(e)).into_response(),
        None => admin_error(StatusCode::NOT_FOUND, None, format!("no endpoint {name:?}")),
    }
}

pub(crate) async fn admin_put(State(eps): State<Endpoints>, Path(name): Path<String>, body: Bytes) -> Response {
    let Some(ep) = eps.get(&name) else {
        return admin_error(StatusCode::NOT_FOUND, None, format!("no endpoint {name:?}"));
    };
    let b: Behaviour = match serde_json::from_slice(&body) {
        Ok(b) => b,
        Err(e) => return admin_error(StatusCode::BAD_REQUEST, None, format!("behaviour: {e}")),
    };
    if let Err(e) = b.validate() {
        return admin_error(StatusCode::BAD_REQUEST, Some(e.field), e.message);
    }
    ep.behaviour.send_replace((b, Instant::now()));
    tracing::info!(endpoint = %name, "behaviour replaced");
    Json(view(ep)).into_response()
}

pub(crate) fn admin_error(status: StatusCode, field: Option<&str>, message: String) -> Response {
    (status, Json(serde_json::json!({"error": message, "field": field}))).into_response()
}
