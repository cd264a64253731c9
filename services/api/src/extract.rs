//! Path and query extractors whose rejections are the API's JSON errors, not axum's plain text.

use crate::error::ApiError;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{FromRequestParts, Path, Query};
use axum::http::request::Parts;
use serde::de::DeserializeOwned;

pub struct ApiPath<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned + Send> FromRequestParts<S> for ApiPath<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        let raw = Path::<Vec<(String, String)>>::from_request_parts(parts, state)
            .await
            .map_err(|e| ApiError::invalid("path", e.body_text()))?;
        for (name, value) in &raw.0 {
            no_control(name, value)?;
        }
        Path::<T>::from_request_parts(parts, state)
            .await
            .map(|Path(t)| ApiPath(t))
            .map_err(|e| ApiError::invalid("path", e.body_text()))
    }
}

pub struct ApiQuery<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned + Send> FromRequestParts<S> for ApiQuery<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        let raw = Query::<Vec<(String, String)>>::from_request_parts(parts, state)
            .await
            .map_err(|e| ApiError::invalid("query", e.body_text()))?;
        for (name, value) in &raw.0 {
            no_control(name, name)?;
            no_control(name, value)?;
        }
        Query::<T>::from_request_parts(parts, state)
            .await
            .map(|Query(t)| ApiQuery(t))
            .map_err(|e| ApiError::invalid("query", e.body_text()))
    }
}

/// A path segment or query parameter with a control character (NUL, newline, …) or a
/// bidirectional control (U+202E, …) is refused like an ingested name with one: no name in
/// vitals contains them.
pub fn no_control(field: &str, value: &str) -> Result<(), ApiError> {
    use vitals_contracts::validate::is_hidden_control;
    if value.chars().any(is_hidden_control) {
        let field = if field.chars().any(is_hidden_control) {
            "query"
        } else {
            field
        };
        return Err(ApiError::invalid(field, "contains control characters"));
    }
    Ok(())
}

/// An integer `limit` query parameter within 1..=max, or `default` when absent.
pub fn limit_param(q: &std::collections::HashMap<String, String>, default: i64, max: i64) -> Result<i64, ApiError> {
    int_param(q, "limit", default, 1, max)
}

/// An integer query parameter within `min..=max`, or its default; 400 naming it otherwise.
pub fn int_param(
    q: &std::collections::HashMap<String, String>,
    name: &'static str,
    default: i64,
    min: i64,
    max: i64,
) -> Result<i64, ApiError> {
    match q.get(name) {
        Some(v) => v
            .parse::<i64>()
            .ok()
            .filter(|l| (min..=max).contains(l))
            .ok_or_else(|| ApiError::invalid(name, format!("must be an integer from {min} to {max}"))),
        None => Ok(default),
    }
}

/// A JSON request body, with 413 for one over the limit and 400 naming the problem otherwise.
pub fn json_body<T: DeserializeOwned>(body: Result<Bytes, BytesRejection>, limit: usize) -> Result<T, ApiError> {
    let body = body.map_err(|r| {
        if r.status() == axum::http::StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::TooLarge(limit)
        } else {
            ApiError::invalid("body", "cannot read the request body")
        }
    })?;
    serde_json::from_slice(&body).map_err(|e| ApiError::invalid("body", format!("not valid JSON for this route: {e}")))
}

/// A page cursor: the position of a page's last item, as URL-safe base64 of its JSON.
pub fn encode_cursor<T: serde::Serialize>(position: &T) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(serde_json::to_vec(position).unwrap_or_default())
}

/// A cursor back to its position; 400 naming `cursor` for anything a page did not hand out.
pub fn decode_cursor<T: DeserializeOwned>(s: &str) -> Result<T, ApiError> {
    use base64::Engine as _;
    let bad = || ApiError::invalid("cursor", "not a cursor from a previous page");
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(s)
        .map_err(|_| bad())?;
    serde_json::from_slice(&bytes).map_err(|_| bad())
}
