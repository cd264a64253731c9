//! Bearer tokens with roles. Secrets are compared in constant time and never logged.

use crate::error::ApiError;
use crate::AppState;
use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use axum::http::HeaderMap;
use subtle::ConstantTimeEq;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Role {
    Reader,
    Writer,
    Admin,
}

impl Role {
    pub fn parse(s: &str) -> Option<Role> {
        match s {
            "reader" => Some(Role::Reader),
            "writer" => Some(Role::Writer),
            "admin" => Some(Role::Admin),
            _ => None,
        }
    }
}

#[derive(Clone)]
pub struct Token {
    pub name: String,
    pub role: Role,
    pub secret: Vec<u8>,
}

/// Who made a request.
#[derive(Debug, Clone)]
pub struct Principal {
    pub name: String,
    pub role: Role,
}

/// The credentials of a `Bearer` authorization; the scheme is case-insensitive (RFC 9110 §11.1).
fn bearer(value: &str) -> Option<&str> {
    let (scheme, token) = value.trim_start().split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
}

/// The token's owner, if the request carries a known token with at least `need`. Two
/// `Authorization` headers are refused: which one counts would be a guess.
pub fn authorize(headers: &HeaderMap, tokens: &[Token], need: Role) -> Result<Principal, ApiError> {
    let mut all = headers.get_all(axum::http::header::AUTHORIZATION).iter();
    let first = all.next();
    if all.next().is_some() {
        return Err(ApiError::invalid("Authorization", "more than one Authorization header"));
    }
    let presented = first
        .and_then(|v| v.to_str().ok())
        .and_then(bearer)
        .ok_or(ApiError::Unauthenticated)?
        .as_bytes();
    // Compare against every token so that timing says nothing about which one matched.
    let mut found: Option<&Token> = None;
    for t in tokens {
        if bool::from(t.secret.as_slice().ct_eq(presented)) {
            found = Some(t);
        }
    }
    let t = found.ok_or(ApiError::Unauthenticated)?;
    if t.role < need {
        return Err(ApiError::Forbidden);
    }
    Ok(Principal {
        name: t.name.clone(),
        role: t.role,
    })
}

/// A request that may read: with `--read-requires-token` it carries a reader's token (or
/// better), else it is refused; without, anyone may read, and the principal is there when the
/// request carries a valid token (the live streams count their places per token).
pub struct Reader(pub Option<Principal>);

/// A request that carries a writer's token (or better).
pub struct Writer(pub Principal);

/// A request that carries an admin's token.
pub struct Admin(pub Principal);

impl Reader {
    /// The reader `headers` make, as the extractor judges it (for a request not served by a
    /// handler: the live-stream takeover).
    pub fn of(app: &AppState, headers: &HeaderMap) -> Result<Reader, ApiError> {
        let who = authorize(headers, &app.tokens, Role::Reader);
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
        authorize(&parts.headers, &app.tokens, Role::Writer).map(Writer)
    }
}

impl FromRequestParts<AppState> for Admin {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, app: &AppState) -> Result<Self, ApiError> {
        authorize(&parts.headers, &app.tokens, Role::Admin).map(Admin)
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn two_authorization_headers_are_refused_even_if_one_is_right() {
        let tokens = [super::Token {
            name: "ops".into(),
            role: super::Role::Admin,
            secret: b"0123456789abcdef".to_vec(),
        }];
        let mut h = axum::http::HeaderMap::new();
        h.append("authorization", "Bearer 0123456789abcdef".parse().unwrap());
        assert!(super::authorize(&h, &tokens, super::Role::Admin).is_ok());
        h.append("authorization", "Bearer wrong".parse().unwrap());
        let e = super::authorize(&h, &tokens, super::Role::Reader).unwrap_err();
        assert!(e.to_string().contains("more than one Authorization header"), "{e}");
    }

    use super::*;

    fn headers(v: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(axum::http::header::AUTHORIZATION, v.parse().unwrap());
        h
    }

    #[test]
    fn roles_are_ordered_and_tokens_checked() {
        let tokens = vec![
            Token {
                name: "gw".into(),
                role: Role::Writer,
                secret: b"writer-secret-0001".to_vec(),
            },
            Token {
                name: "ops".into(),
                role: Role::Admin,
                secret: b"admin-secret-00001".to_vec(),
            },
        ];
        assert!(matches!(
            authorize(&HeaderMap::new(), &tokens, Role::Reader),
            Err(ApiError::Unauthenticated)
        ));
        assert!(matches!(
            authorize(&headers("Bearer nope"), &tokens, Role::Reader),
            Err(ApiError::Unauthenticated)
        ));
        assert!(matches!(
            authorize(&headers("Bearer writer-secret-0001"), &tokens, Role::Admin),
            Err(ApiError::Forbidden)
        ));
        assert_eq!(
            authorize(&headers("Bearer writer-secret-0001"), &tokens, Role::Writer)
                .unwrap()
                .name,
            "gw"
        );
        for scheme in ["bearer", "BEARER", "BeArEr"] {
            assert_eq!(
                authorize(&headers(&format!("{scheme} writer-secret-0001")), &tokens, Role::Writer)
                    .unwrap()
                    .name,
                "gw",
                "the scheme {scheme} is case-insensitive"
            );
        }
        assert!(matches!(
            authorize(&headers("Basic writer-secret-0001"), &tokens, Role::Reader),
            Err(ApiError::Unauthenticated)
        ));
        assert_eq!(
            authorize(&headers("Bearer admin-secret-00001"), &tokens, Role::Writer)
                .unwrap()
                .name,
            "ops"
        );
    }
}
