//! One error type for every route, with one JSON body:
//! `{"error": {"code": "...", "message": "...", "field": "..."}}`. Internal details are logged,
//! never sent.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use utoipa::ToSchema;

#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error("{message}")]
    Invalid { field: Option<String>, message: String },
    #[error("not found: {0}")]
    NotFound(String),
    #[error("missing or invalid bearer token")]
    Unauthenticated,
    #[error("this token's role may not do this")]
    Forbidden,
    #[error("request body larger than {0} bytes")]
    TooLarge(usize),
    #[error("{0}")]
    Unavailable(String),
    /// The server is at a limit that frees up by itself (a route's concurrency, the database
    /// pool): retry shortly.
    #[error("{0}")]
    Busy(String),
    #[error("{0}")]
    TooMany(String),
    #[error("the request took too long")]
    Timeout,
    #[error("this route does not take this method")]
    MethodNotAllowed,
    #[error("internal error")]
    Internal(#[from] anyhow::Error),
}

impl ApiError {
    pub fn invalid(field: &str, message: impl Into<String>) -> ApiError {
        ApiError::Invalid {
            field: Some(field.to_owned()),
            message: message.into(),
        }
    }

    fn parts(&self) -> (StatusCode, &'static str) {
        match self {
            ApiError::Invalid { .. } => (StatusCode::BAD_REQUEST, "invalid_request"),
            ApiError::NotFound(_) => (StatusCode::NOT_FOUND, "not_found"),
            ApiError::Unauthenticated => (StatusCode::UNAUTHORIZED, "unauthenticated"),
            ApiError::Forbidden => (StatusCode::FORBIDDEN, "forbidden"),
            ApiError::TooLarge(_) => (StatusCode::PAYLOAD_TOO_LARGE, "payload_too_large"),
            ApiError::Unavailable(_) => (StatusCode::SERVICE_UNAVAILABLE, "unavailable"),
            ApiError::Busy(_) => (StatusCode::SERVICE_UNAVAILABLE, "busy"),
            ApiError::TooMany(_) => (StatusCode::TOO_MANY_REQUESTS, "too_many_requests"),
            ApiError::Timeout => (StatusCode::GATEWAY_TIMEOUT, "timeout"),
            ApiError::MethodNotAllowed => (StatusCode::METHOD_NOT_ALLOWED, "method_not_allowed"),
            ApiError::Internal(_) => (StatusCode::INTERNAL_SERVER_ERROR, "internal"),
        }
    }
}

impl From<sqlx::Error> for ApiError {
    fn from(e: sqlx::Error) -> ApiError {
        match e {
            sqlx::Error::PoolTimedOut => {
                tracing::warn!("database pool exhausted");
                ApiError::Busy("the server is busy; retry shortly".into())
            }
            sqlx::Error::Io(_) | sqlx::Error::PoolClosed => {
                tracing::warn!(error = %e, "database unavailable");
                ApiError::Unavailable("the database is unavailable".into())
            }
            e => ApiError::Internal(e.into()),
        }
    }
}

impl From<vitals_store::StoreError> for ApiError {
    fn from(e: vitals_store::StoreError) -> ApiError {
        match e {
            vitals_store::StoreError::Sql(e) => e.into(),
            e => ApiError::Internal(e.into()),
        }
    }
}

/// The answers routes share, declared once for the OpenAPI document (a route lists those it
/// gives besides its own).
///
/// A read without a token where reads need one.
#[derive(utoipa::IntoResponses)]
#[response(status = 401, description = "A token is required")]
pub struct NeedsToken(pub ErrorBody);

/// A route at its concurrency, or the database pool exhausted.
#[derive(utoipa::IntoResponses)]
#[response(status = 503, description = "Busy; retry after the Retry-After seconds")]
pub struct Busy(pub ErrorBody);

/// A write without a known token.
#[derive(utoipa::IntoResponses)]
#[response(status = 401, description = "Missing or unknown token")]
pub struct NoToken(pub ErrorBody);

/// A body over `--max-body-bytes`.
#[derive(utoipa::IntoResponses)]
#[response(status = 413, description = "Body too large")]
pub struct TooLarge(pub ErrorBody);

/// A route's query parameter refused (it is named).
#[derive(utoipa::IntoResponses)]
#[response(status = 400, description = "An invalid parameter")]
pub struct BadParameter(pub ErrorBody);

/// A route's path parameter refused (it is named).
#[derive(utoipa::IntoResponses)]
#[response(status = 400, description = "An invalid path parameter")]
pub struct BadPath(pub ErrorBody);

/// The error body of every failed request.
#[derive(Serialize, ToSchema)]
pub struct ErrorBody {
    pub error: ErrorDetail,
}

#[derive(Serialize, ToSchema)]
pub struct ErrorDetail {
    /// Machine-readable: invalid_request, not_found, unauthenticated, forbidden,
    /// payload_too_large, unavailable, busy, too_many_requests, timeout, method_not_allowed,
    /// internal.
    pub code: String,
    pub message: String,
    /// The offending field or parameter, when there is one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub field: Option<String>,
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let (status, code) = self.parts();
        if let ApiError::Internal(e) = &self {
            tracing::error!(error = %format!("{e:#}"), "internal error");
        }
        let field = match &self {
            ApiError::Invalid { field, .. } => field.clone(),
            _ => None,
        };
        let body = ErrorBody {
            error: ErrorDetail {
                code: code.into(),
                message: self.to_string(),
                field,
            },
        };
        let mut resp = (status, axum::Json(body)).into_response();
        match self {
            ApiError::Unauthenticated => {
                resp.headers_mut()
                    .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
            }
            ApiError::Unavailable(_) | ApiError::Busy(_) | ApiError::TooMany(_) => {
                resp.headers_mut()
                    .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
            }
            _ => {}
        }
        resp
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_exhausted_database_pool_is_busy_not_unavailable() {
        let resp = ApiError::from(sqlx::Error::PoolTimedOut).into_response();
        assert_eq!(resp.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(resp.headers()[header::RETRY_AFTER], "1");
        assert!(matches!(ApiError::from(sqlx::Error::PoolTimedOut), ApiError::Busy(_)));
        assert!(matches!(
            ApiError::from(sqlx::Error::PoolClosed),
            ApiError::Unavailable(_)
        ));
    }
}
