//! Path and query extractors whose rejections are the API's JSON errors, not axum's plain text.

use crate::error::ApiError;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{FromRequestParts, Path};
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

/// A route's query parameters, parsed into its parameter struct (see [`crate::params`]): 400
/// naming the parameter that failed, with what it must be; unknown parameters are ignored.
pub struct ApiQuery<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned + Send> FromRequestParts<S> for ApiQuery<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, ApiError> {
        query(parts.uri.query().unwrap_or("")).map(ApiQuery)
    }
}

/// `raw` (a URI's query) into `T`, refusing control characters anywhere.
pub fn query<T: DeserializeOwned>(raw: &str) -> Result<T, ApiError> {
    for (name, value) in form_urlencoded::parse(raw.as_bytes()) {
        no_control(&name, &name)?;
        no_control(&name, &value)?;
    }
    let de = serde_urlencoded::Deserializer::new(form_urlencoded::parse(raw.as_bytes()));
    serde_path_to_error::deserialize(de).map_err(|e| {
        let message = e.inner().to_string();
        // A struct-level error names its field in the message: a required parameter missing, or
        // one given twice.
        let quoted = |prefix: &str| {
            message
                .strip_prefix(prefix)
                .and_then(|rest| rest.split('`').next())
                .map(str::to_owned)
        };
        if let Some(field) = quoted("missing field `") {
            return ApiError::invalid(&field, "is required");
        }
        if let Some(field) = quoted("duplicate field `") {
            return ApiError::invalid(&field, "is given more than once");
        }
        match e.path().to_string() {
            p if p == "." || p.is_empty() => ApiError::invalid("query", message),
            p => ApiError::invalid(&p, message),
        }
    })
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::params::{Int, Name};

    #[derive(serde::Deserialize, Debug)]
    struct Q {
        pool: Name,
        limit: Option<Int<1, 500>>,
    }

    fn field(raw: &str) -> (String, String) {
        match query::<Q>(raw) {
            Err(ApiError::Invalid {
                field: Some(f),
                message,
            }) => (f, message),
            other => panic!("{raw}: {other:?}"),
        }
    }

    #[test]
    fn a_refused_query_names_its_parameter_and_what_it_must_be() {
        let q = query::<Q>("pool=a&limit=7&unknown=x").unwrap();
        assert_eq!((q.pool.as_str(), q.limit), ("a", Some(Int(7))));
        assert_eq!(field("pool=a&limit=0").0, "limit");
        assert!(field("pool=a&limit=0").1.contains("from 1 to 500"));
        assert_eq!(field("limit=3"), ("pool".into(), "is required".into()));
        assert_eq!(
            field("pool=a&pool=b"),
            ("pool".into(), "is given more than once".into())
        );
        assert_eq!(field("pool=a%00b").0, "pool");
        assert_eq!(field("pool=a&x%0A=1").0, "query");
        assert_eq!(field("pool=").0, "pool");
    }
}
