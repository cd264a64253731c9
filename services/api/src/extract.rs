//! Path, query and JSON body extractors whose rejections are the API's JSON errors, naming
//! the parameter or field, never axum's plain text.
//!
//! Path and query values are read by one small deserializer ([`Text`]) whose error type is the
//! API's own ([`ParamError`]): a missing or repeated parameter comes back as the field serde
//! names, never found by reading serde's message text.

use crate::error::ApiError;
use crate::AppState;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{FromRequest, FromRequestParts, Path, Request};
use axum::http::request::Parts;
use serde::de::value::{MapDeserializer, SeqDeserializer};
use serde::de::{DeserializeOwned, Deserializer, IntoDeserializer, Visitor};

/// What reading a path or query value failed with.
#[derive(Debug)]
pub enum ParamError {
    /// A required parameter is not there.
    Missing(&'static str),
    /// A parameter is given more than once.
    Duplicate(&'static str),
    /// A value its type refused, with what it must be.
    Message(String),
}

impl std::fmt::Display for ParamError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ParamError::Missing(field) => write!(f, "{field} is required"),
            ParamError::Duplicate(field) => write!(f, "{field} is given more than once"),
            ParamError::Message(m) => f.write_str(m),
        }
    }
}

impl std::error::Error for ParamError {}

impl serde::de::Error for ParamError {
    fn custom<T: std::fmt::Display>(msg: T) -> Self {
        ParamError::Message(msg.to_string())
    }
    fn missing_field(field: &'static str) -> Self {
        ParamError::Missing(field)
    }
    fn duplicate_field(field: &'static str) -> Self {
        ParamError::Duplicate(field)
    }
}

/// One path or query value: text, which each parameter type parses itself (see
/// [`crate::params`]); present for an `Option`.
pub struct Text(pub String);

impl<'de> Deserializer<'de> for Text {
    type Error = ParamError;

    fn deserialize_any<V: Visitor<'de>>(self, v: V) -> Result<V::Value, ParamError> {
        v.visit_string(self.0)
    }
    fn deserialize_option<V: Visitor<'de>>(self, v: V) -> Result<V::Value, ParamError> {
        v.visit_some(self)
    }
    fn deserialize_ignored_any<V: Visitor<'de>>(self, v: V) -> Result<V::Value, ParamError> {
        v.visit_unit()
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf unit
        unit_struct newtype_struct seq tuple tuple_struct map struct enum identifier
    }
}

impl<'de> IntoDeserializer<'de, ParamError> for Text {
    type Deserializer = Text;
    fn into_deserializer(self) -> Text {
        self
    }
}

/// A field and its problem as the API's 400.
fn refused(field: &str, e: ParamError) -> ApiError {
    match e {
        ParamError::Missing(f) => ApiError::invalid(f, "is required"),
        ParamError::Duplicate(f) => ApiError::invalid(f, "is given more than once"),
        ParamError::Message(m) => ApiError::invalid(field, m),
    }
}

/// A route's path parameters (pool and endpoint names are [`crate::params::Name`]): 400 naming
/// the parameter that failed, with what it must be.
pub struct ApiPath<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned + Send> FromRequestParts<S> for ApiPath<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        let Path(raw) = Path::<Vec<(String, String)>>::from_request_parts(parts, state)
            .await
            .map_err(|e| ApiError::invalid("path", e.body_text()))?;
        path(raw).map(ApiPath)
    }
}

/// Path parameters (name, value) into `T`: one value into `T` itself, several into a tuple.
pub fn path<T: DeserializeOwned>(raw: Vec<(String, String)>) -> Result<T, ApiError> {
    for (name, value) in &raw {
        no_control(name, value)?;
    }
    let names: Vec<String> = raw.iter().map(|(n, _)| n.clone()).collect();
    let result = match <[_; 1]>::try_from(raw) {
        Ok([(_, one)]) => serde_path_to_error::deserialize(Text(one)),
        Err(raw) => serde_path_to_error::deserialize(SeqDeserializer::new(raw.into_iter().map(|(_, v)| Text(v)))),
    };
    result.map_err(|e| {
        let at = match e.path().iter().next() {
            Some(serde_path_to_error::Segment::Seq { index }) => Some(*index),
            _ => None,
        };
        let field = match (names.len(), at) {
            (1, _) => names[0].clone(),
            (_, Some(i)) if i < names.len() => names[i].clone(),
            _ => "path".to_owned(),
        };
        refused(&field, e.into_inner())
    })
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
    let mut pairs = Vec::new();
    for (name, value) in form_urlencoded::parse(raw.as_bytes()) {
        no_control(&name, &name)?;
        no_control(&name, &value)?;
        pairs.push((name.into_owned(), Text(value.into_owned())));
    }
    serde_path_to_error::deserialize(MapDeserializer::new(pairs.into_iter())).map_err(|e| {
        let field = match e.path().to_string() {
            p if p == "." || p.is_empty() => "query".to_owned(),
            p => p,
        };
        refused(&field, e.into_inner())
    })
}

/// A JSON request body: 413 for one over the limit (`--max-body-bytes`), 400 naming the
/// problem otherwise.
pub struct ApiJson<T>(pub T);

impl<T: DeserializeOwned> FromRequest<AppState> for ApiJson<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &AppState) -> Result<Self, ApiError> {
        let body = Bytes::from_request(req, state).await;
        json_body(body, state.cfg.max_body_bytes).map(ApiJson)
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

/// A JSON request body, with 413 for one over the limit and 400 naming the problem otherwise.
fn json_body<T: DeserializeOwned>(body: Result<Bytes, BytesRejection>, limit: usize) -> Result<T, ApiError> {
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

    fn path_field<T: DeserializeOwned + std::fmt::Debug>(raw: &[(&str, &str)]) -> (String, String) {
        let raw = raw.iter().map(|(n, v)| (n.to_string(), v.to_string())).collect();
        match path::<T>(raw) {
            Err(ApiError::Invalid {
                field: Some(f),
                message,
            }) => (f, message),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_refused_path_names_its_parameter_and_what_it_must_be() {
        let one: Name = path(vec![("pool".into(), "a/b".into())]).unwrap();
        assert_eq!(one.as_str(), "a/b");
        let (p, e): (Name, Name) = path(vec![("pool".into(), "p".into()), ("endpoint".into(), "e".into())]).unwrap();
        assert_eq!((p.as_str(), e.as_str()), ("p", "e"));
        let long = "x".repeat(257);
        let (f, m) = path_field::<Name>(&[("pool", &long)]);
        assert_eq!(f, "pool");
        assert!(m.contains("1 to 256 bytes"), "{m}");
        assert_eq!(
            path_field::<(Name, Name)>(&[("pool", "p"), ("endpoint", &long)]).0,
            "endpoint"
        );
        assert_eq!(
            path_field::<(Name, Name)>(&[("pool", &long), ("endpoint", "e")]).0,
            "pool"
        );
        assert_eq!(
            path_field::<(Name, Name)>(&[("pool", "p"), ("endpoint", "a\u{202e}b")]).0,
            "endpoint"
        );
    }
}
