//! Record keys and identities that name an endpoint.
//!
//! | topic | key |
//! |---|---|
//! | `vitals.signals.v1` | the pool name, UTF-8 (ticks: none) |
//! | `vitals.health-changes.v1` | `HealthChanged`: the endpoint key; `PoolHealthChanged`: the pool name |
//! | `vitals.health-state.v1` (compacted) | the endpoint key |
//! | `vitals.signals.dlq.v1` | the key of the original record |
//! | `vitals.gateway-signals.v1` (a merge stage's input) | the endpoint key (a record about no endpoint: the pool name) |
//!
//! The **endpoint key** is `escape(pool) "/" escape(endpoint)`, where `escape` writes `%` as
//! `%25` and `/` as `%2F` and leaves every other character as it is. A pool `kc1/a` with an
//! endpoint `x` and a pool `kc1` with an endpoint `a/x` therefore get different keys
//! (`kc1%2Fa/x` and `kc1/a%2Fx`). Names without `/` or `%` — all names before this rule — keep
//! the key they always had (`pool/endpoint`), so old keys read the same. A transition's id is the
//! endpoint key, `/`, and its sequence number.

/// `pool/endpoint`, each part escaped.
pub fn endpoint_key(pool: &str, endpoint: &str) -> String {
    let mut s = String::with_capacity(pool.len() + endpoint.len() + 1);
    escape_into(pool, &mut s);
    s.push('/');
    escape_into(endpoint, &mut s);
    s
}

/// The id of an endpoint's transition number `seq`.
pub fn transition_id(pool: &str, endpoint: &str, seq: i64) -> String {
    format!("{}/{seq}", endpoint_key(pool, endpoint))
}

/// (pool, endpoint) of an endpoint key; `None` if it has no `/` or a bad escape.
pub fn parse_endpoint_key(key: &str) -> Option<(String, String)> {
    let (p, e) = key.split_once('/')?;
    Some((unescape(p)?, unescape(e)?))
}

/// `name` as one segment of an HTTP path: every byte but the unreserved characters (`A–Z a–z
/// 0–9 - . _ ~`) percent-encoded, so that a pool or endpoint named `openai/gpt-4o`, `50% off` or
/// with spaces or letters beyond ASCII stays one segment of the API's path (the API decodes it).
pub fn path_segment(name: &str) -> String {
    use std::fmt::Write as _;
    let mut out = String::with_capacity(name.len());
    for b in name.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(char::from(b));
        } else {
            let _ = write!(out, "%{b:02X}");
        }
    }
    out
}

/// A name with `%` and `/` escaped.
pub fn escape(name: &str) -> String {
    let mut s = String::with_capacity(name.len());
    escape_into(name, &mut s);
    s
}

fn escape_into(name: &str, out: &mut String) {
    for c in name.chars() {
        match c {
            '%' => out.push_str("%25"),
            '/' => out.push_str("%2F"),
            c => out.push(c),
        }
    }
}

fn unescape(s: &str) -> Option<String> {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(i) = rest.find('%') {
        out.push_str(&rest[..i]);
        match rest.get(i + 1..i + 3) {
            Some("25") => out.push('%'),
            Some("2F" | "2f") => out.push('/'),
            _ => return None,
        }
        rest = &rest[i + 3..];
    }
    out.push_str(rest);
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_slash_in_a_name_cannot_merge_two_endpoints() {
        assert_ne!(endpoint_key("kc1/a", "x"), endpoint_key("kc1", "a/x"));
        assert_ne!(transition_id("kc1/a", "x", 1), transition_id("kc1", "a/x", 1));
        assert_eq!(endpoint_key("kc1/a", "x"), "kc1%2Fa/x");
        assert_eq!(endpoint_key("kc1", "a/x"), "kc1/a%2Fx");
    }

    #[test]
    fn plain_names_keep_their_old_keys() {
        assert_eq!(endpoint_key("pool-1", "ep-2"), "pool-1/ep-2");
        assert_eq!(transition_id("pool-1", "ep-2", 7), "pool-1/ep-2/7");
    }

    #[test]
    fn keys_round_trip() {
        for (p, e) in [("a", "b"), ("kc1/a", "x"), ("kc1", "a/x"), ("50%", "%2F"), ("", "/")] {
            assert_eq!(parse_endpoint_key(&endpoint_key(p, e)), Some((p.into(), e.into())));
        }
        assert_eq!(parse_endpoint_key("no-slash"), None);
        assert_eq!(parse_endpoint_key("bad%zz/x"), None);
    }
}
