//! Bearer tokens with roles. Secrets are compared in constant time and never logged.

use crate::error::ApiError;
use crate::AppState;
use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use axum::http::HeaderMap;
use vitals_runtime::tokens::Denied;
pub use vitals_runtime::tokens::{Binding, Need, Role, Token, Tokens};

/// Who made a request.
#[derive(Debug, Clone)]
pub struct Principal {
    pub name: String,
    pub role: Role,
    /// What the token may report for (the API's ingest checks every item against it).
    pub binding: Binding,
}

/// The token's owner, if the request carries a known token that may do `need`. Two
/// `Authorization` headers are refused: which one counts would be a guess.
pub fn authorize(headers: &HeaderMap, tokens: &Tokens, need: Need) -> Result<Principal, ApiError> {
    let values = headers
        .get_all(axum::http::header::AUTHORIZATION)
        .iter()
        .map(|v| v.as_bytes());
    match tokens.authorize(values, need) {
        Ok(t) => Ok(Principal {
            name: t.name.clone(),
            role: t.role,
            binding: t.binding.clone(),
        }),
        Err(Denied::Ambiguous) => Err(ApiError::invalid("Authorization", "more than one Authorization header")),
        Err(Denied::Unauthenticated) => Err(ApiError::Unauthenticated),
        Err(Denied::Forbidden) => Err(ApiError::Forbidden),
    }
}

/// A request that may read: with `--read-requires-token` it carries a reader's token (or
/// better), else it is refused; without, anyone may read, and the principal is there when the
/// request carries a valid token (the live streams count their places per token).
pub struct Reader(pub Option<Principal>);

/// A request that carries a token that may report: a reporter's (bound to what it may speak
/// for), a writer's or an admin's.
pub struct Writer(pub Principal);

/// A request that carries an admin's token.
pub struct Admin(pub Principal);

impl Reader {
    /// The reader `headers` make, as the extractor judges it (for a request not served by a
    /// handler: the live-stream takeover).
    pub fn of(app: &AppState, headers: &HeaderMap) -> Result<Reader, ApiError> {
        let who = authorize(headers, &app.tokens.get(), Need::Read);
        if app.cfg.read_requires_token {
            who.map(|p| Reader(Some(p)))
        } else {
            Ok(Reader(who.ok()))
        }
    }
}

impl FromRequestParts<AppState> for Reader {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, app: &AppState) -> Result<Self, ApiError> {
        Reader::of(app, &parts.headers)
    }
}

impl FromRequestParts<AppState> for Writer {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, app: &AppState) -> Result<Self, ApiError> {
        authorize(&parts.headers, &app.tokens.get(), Need::Report).map(Writer)
    }
}

impl FromRequestParts<AppState> for Admin {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, app: &AppState) -> Result<Self, ApiError> {
        authorize(&parts.headers, &app.tokens.get(), Need::Act).map(Admin)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(v: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(axum::http::header::AUTHORIZATION, v.parse().unwrap());
        h
    }

    #[test]
    fn two_authorization_headers_are_refused_even_if_one_is_right() {
        let tokens = Tokens::new(vec![Token::new("ops", Role::Admin, "0123456789abcdef")]);
        let mut h = axum::http::HeaderMap::new();
        h.append("authorization", "Bearer 0123456789abcdef".parse().unwrap());
        assert!(authorize(&h, &tokens, Need::Act).is_ok());
        h.append("authorization", "Bearer wrong".parse().unwrap());
        let e = authorize(&h, &tokens, Need::Read).unwrap_err();
        assert!(e.to_string().contains("more than one Authorization header"), "{e}");
    }

    #[test]
    fn roles_allow_what_they_name_and_tokens_are_checked() {
        let tokens = Tokens::new(vec![
            Token::new("gw", Role::Writer, "writer-secret-0001"),
            Token::new("edge", Role::Reporter, "reporter-secret-01"),
            Token::new("ops", Role::Admin, "admin-secret-00001"),
        ]);
        assert!(matches!(
            authorize(&HeaderMap::new(), &tokens, Need::Read),
            Err(ApiError::Unauthenticated)
        ));
        assert!(matches!(
            authorize(&headers("Bearer nope"), &tokens, Need::Read),
            Err(ApiError::Unauthenticated)
        ));
        assert!(matches!(
            authorize(&headers("Bearer writer-secret-0001"), &tokens, Need::Act),
            Err(ApiError::Forbidden)
        ));
        assert!(matches!(
            authorize(&headers("Bearer reporter-secret-01"), &tokens, Need::Read),
            Err(ApiError::Forbidden)
        ));
        assert_eq!(
            authorize(&headers("Bearer reporter-secret-01"), &tokens, Need::Report)
                .unwrap()
                .name,
            "edge"
        );
        for scheme in ["bearer", "BEARER", "BeArEr"] {
            assert_eq!(
                authorize(&headers(&format!("{scheme} writer-secret-0001")), &tokens, Need::Report)
                    .unwrap()
                    .name,
                "gw",
                "the scheme {scheme} is case-insensitive"
            );
        }
        assert!(matches!(
            authorize(&headers("Basic writer-secret-0001"), &tokens, Need::Read),
            Err(ApiError::Unauthenticated)
        ));
        assert_eq!(
            authorize(&headers("Bearer admin-secret-00001"), &tokens, Need::Report)
                .unwrap()
                .name,
            "ops"
        );
    }
}
