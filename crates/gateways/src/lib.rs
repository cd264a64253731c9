//! `vitals-gateways`: what vitals' bridges to HAProxy and nginx share.
//!
//! - [`syslog`]: the message inside an RFC 3164 or RFC 5424 datagram (or a bare line).
//! - [`haproxy`]: vitals' documented HAProxy `log-format` (`deploy/haproxy/`), parsed into
//!   [`Attempt`]s, its termination state telling a refused connection, a timeout and a server
//!   abort apart.
//! - [`nginx`]: vitals' nginx JSON `log_format` (`deploy/nginx/`): one attempt per upstream tried.
//! - [`map`]: backend → pool and server → endpoint, a small TOML table with defaults.
//! - [`runtime`]: HAProxy's Runtime API (`show servers state`, `set server`) and the plan that
//!   brings its servers to vitals' decisions.
//!
//! Everything here is pure (no clock, no I/O) except [`runtime::Client`], so the bridges' rules
//! are tested without the programs, and with them in `tests/system`.

pub mod haproxy;
pub mod map;
pub mod nginx;
pub mod runtime;
pub mod syslog;

use vitals_contracts::OutcomeClass;

/// One attempt on one upstream server, as a gateway logged it.
#[derive(Debug, Clone, PartialEq)]
pub struct Attempt<'a> {
    /// HAProxy's backend, or nginx's upstream group (`$proxy_host`).
    pub backend: &'a str,
    /// HAProxy's server name, or the address nginx tried.
    pub server: &'a str,
    /// A stable id: the gateway's request id, or a hash of the line (the same line read twice
    /// gives the same id).
    pub id: String,
    /// When the request started (µs since the epoch).
    pub started_us: i64,
    pub outcome: OutcomeClass,
    pub status: Option<i32>,
    /// Time the server took (connect + response, µs).
    pub latency_us: i64,
    pub retry_after_ms: Option<i64>,
    /// What the gateway said about the end, e.g. HAProxy's termination state `SC--`.
    pub detail: Option<&'a str>,
}

/// What one access-log line held (either format).
#[derive(Debug, Clone, PartialEq)]
pub struct Line<'a> {
    pub attempts: Vec<Attempt<'a>>,
    /// Why the line gave no attempt.
    pub skipped: Option<Skip>,
    /// Attempts on a server the line does not name (a redispatched request's first tries).
    pub unattributed: u32,
}

impl Line<'_> {
    pub(crate) fn skipped(s: Skip) -> Self {
        Line {
            attempts: Vec::new(),
            skipped: Some(s),
            unattributed: 0,
        }
    }
}

/// Why a line gave no attempt although it was read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Skip {
    /// No server was chosen (HAProxy's `<NOSRV>`, nginx without an upstream): nothing to blame.
    NoServer,
    /// The client went away before a server was involved.
    ClientAborted,
    /// The gateway answered itself (denied, redirect, stats, its own limits or queue).
    GatewayAnswered,
    /// A message of the gateway's own in the same log (a server going down, a reload), not an
    /// access-log line: syslog-framed with a tag, but not in vitals' formats.
    OtherMessage,
    /// Its backend is not vitals' (`skip = true` in the map).
    BackendSkipped,
}

impl Skip {
    pub fn as_str(self) -> &'static str {
        match self {
            Skip::NoServer => "no_server",
            Skip::ClientAborted => "client_aborted",
            Skip::GatewayAnswered => "gateway_answered",
            Skip::OtherMessage => "other_message",
            Skip::BackendSkipped => "backend_skipped",
        }
    }
}

/// Why a line could not be read. Counted by reason; never stops a bridge.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, thiserror::Error)]
pub enum Bad {
    #[error("not a vitals access-log line (neither the HAProxy `vitals1` format nor nginx JSON)")]
    UnknownFormat,
    #[error("too few fields")]
    Truncated,
    #[error("bad field {0}")]
    Field(&'static str),
    #[error("not UTF-8")]
    NotUtf8,
    #[error("longer than the line limit")]
    Oversized,
}

impl Bad {
    pub fn as_str(self) -> &'static str {
        match self {
            Bad::UnknownFormat => "unknown_format",
            Bad::Truncated => "truncated",
            Bad::Field(_) => "bad_field",
            Bad::NotUtf8 => "not_utf8",
            Bad::Oversized => "oversized",
        }
    }
}

/// The class of an answer a server sent: 429 rate limited, 5xx server error, other 4xx client
/// error, the rest success.
pub fn class_of_status(status: i32) -> OutcomeClass {
    match status {
        429 => OutcomeClass::RateLimited,
        500..=599 => OutcomeClass::ServerError,
        400..=499 => OutcomeClass::ClientError,
        _ => OutcomeClass::Success,
    }
}

/// A Retry-After value in milliseconds: delay-seconds only (an HTTP date needs a clock).
pub fn retry_after_ms(v: &str) -> Option<i64> {
    let v = v.trim();
    if v.is_empty() || v.len() > 9 || !v.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    v.parse::<i64>().ok().map(|s| s * 1000)
}

/// An `x-ratelimit-reset-*` value in milliseconds: the time until the limit resets as OpenAI
/// and the APIs that copy its headers write it (`20ms`, `1s`, `6m0s`, `1h2m3.5s`), or plain
/// seconds. None for anything else, or past a day.
pub fn ratelimit_reset_ms(v: &str) -> Option<i64> {
    let v = header_value(v)?;
    if let Ok(secs) = v.parse::<f64>() {
        return within_a_day(secs * 1000.0);
    }
    let (mut total, mut rest) = (0.0f64, v);
    while !rest.is_empty() {
        let digits = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        if digits == 0 {
            return None;
        }
        let n: f64 = rest[..digits].parse().ok()?;
        rest = &rest[digits..];
        let (unit_ms, len) = if rest.starts_with("ms") {
            (1.0, 2)
        } else if rest.starts_with('h') {
            (3_600_000.0, 1)
        } else if rest.starts_with('m') {
            (60_000.0, 1)
        } else if rest.starts_with('s') {
            (1000.0, 1)
        } else {
            return None;
        };
        total += n * unit_ms;
        rest = &rest[len..];
    }
    within_a_day(total)
}

/// A delay header's value, trimmed: None when empty or longer than any delay is written.
fn header_value(v: &str) -> Option<&str> {
    let v = v.trim();
    (!v.is_empty() && v.len() <= 24).then_some(v)
}

/// `ms` rounded, if it is a delay within a day (not negative, not NaN, not infinite).
fn within_a_day(ms: f64) -> Option<i64> {
    (0.0..=86_400_000.0).contains(&ms).then(|| ms.round() as i64)
}

/// A `retry-after-ms` value (OpenAI's and Azure OpenAI's, which their SDKs read before
/// Retry-After): milliseconds, whole or not, within a day. None for anything else.
pub fn retry_after_exact_ms(v: &str) -> Option<i64> {
    within_a_day(header_value(v)?.parse::<f64>().ok()?)
}

/// When a 429's limit lifts, in milliseconds, from the response headers `header` gives (by
/// lower-case name): `retry-after-ms` first, then `Retry-After`, else the `x-ratelimit-reset-*`
/// of the limit that ran out (requests or tokens, by their `x-ratelimit-remaining-*`; the later
/// of the two when the headers do not say which). A header that does not parse is passed over.
pub fn limit_lifts_in_ms<S: AsRef<str>>(header: impl Fn(&str) -> Option<S>) -> Option<i64> {
    if let Some(ms) = header("retry-after-ms").and_then(|v| retry_after_exact_ms(v.as_ref())) {
        return Some(ms);
    }
    if let Some(ms) = header("retry-after").and_then(|v| retry_after_ms(v.as_ref())) {
        return Some(ms);
    }
    let reset = |kind: &str| header(&format!("x-ratelimit-reset-{kind}")).and_then(|v| ratelimit_reset_ms(v.as_ref()));
    let out = |kind: &str| {
        header(&format!("x-ratelimit-remaining-{kind}"))
            .and_then(|v| v.as_ref().trim().parse::<f64>().ok())
            .is_some_and(|n| n <= 0.0)
    };
    match (out("requests"), out("tokens")) {
        (true, false) => reset("requests"),
        (false, true) => reset("tokens"),
        _ => reset("requests").max(reset("tokens")),
    }
}

/// A 128-bit FNV-1a of `bytes` as 32 hex digits: the id of a line that carries none.
pub fn line_id(bytes: &[u8]) -> String {
    const PRIME: u128 = 0x0000_0000_0100_0000_0000_0000_0000_013B;
    let mut h: u128 = 0x6c62_272e_07bb_0142_62b8_2175_6295_c58d;
    for b in bytes {
        h ^= u128::from(*b);
        h = h.wrapping_mul(PRIME);
    }
    format!("{h:032x}")
}

/// Whole milliseconds (HAProxy's timers; -1 when the step never happened) as µs.
fn ms(v: i64) -> i64 {
    v.max(0).saturating_mul(1000)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ratelimit_resets_read_openai_durations_and_plain_seconds() {
        for (v, ms) in [
            ("20ms", 20),
            ("1s", 1000),
            ("6m0s", 360_000),
            ("1h2m3.5s", 3_723_500),
            ("0.5s", 500),
            (" 2 ", 2000),
            ("1.25", 1250),
        ] {
            assert_eq!(ratelimit_reset_ms(v), Some(ms), "{v}");
        }
        for v in ["", "s", "1x", "m1s", "-1s", "1d", "25h", "90000", "1s2", "NaN", "inf"] {
            assert_eq!(ratelimit_reset_ms(v), None, "{v}");
        }
    }

    #[test]
    fn a_limit_lifts_when_retry_after_says_else_when_the_exhausted_limit_resets() {
        fn lifts(pairs: &[(&str, &'static str)]) -> Option<i64> {
            limit_lifts_in_ms(|name| pairs.iter().find(|(k, _)| *k == name).map(|(_, v)| *v))
        }
        let (rq, tk) = (
            ("x-ratelimit-reset-requests", "2s"),
            ("x-ratelimit-reset-tokens", "6m0s"),
        );
        assert_eq!(lifts(&[("retry-after", "7"), rq, tk]), Some(7000));
        assert_eq!(lifts(&[rq, tk]), Some(360_000), "the later, when unsaid");
        let remaining = |requests, tokens| {
            [
                ("x-ratelimit-remaining-requests", requests),
                ("x-ratelimit-remaining-tokens", tokens),
                rq,
                tk,
            ]
        };
        assert_eq!(lifts(&remaining("0", "900")), Some(2000));
        assert_eq!(lifts(&remaining("12", "0")), Some(360_000));
        assert_eq!(lifts(&[("retry-after", "soon")]), None);
        assert_eq!(lifts(&[]), None);
        // retry-after-ms first; one that does not parse is passed over.
        let ra = ("retry-after", "7");
        assert_eq!(lifts(&[("retry-after-ms", "1500"), ra, rq, tk]), Some(1500));
        assert_eq!(lifts(&[("retry-after-ms", "20.4"), ra]), Some(20));
        for bad in ["inf", "NaN", "-5", "", "1e309", "soon", "86400001"] {
            assert_eq!(lifts(&[("retry-after-ms", bad), ra]), Some(7000), "{bad}");
        }
    }

    #[test]
    fn retry_after_takes_seconds_and_refuses_the_rest() {
        assert_eq!(retry_after_ms("7"), Some(7000));
        assert_eq!(retry_after_ms(" 30 "), Some(30_000));
        assert_eq!(retry_after_ms("Wed, 21 Oct 2015 07:28:00 GMT"), None);
        assert_eq!(retry_after_ms("-1"), None);
        assert_eq!(retry_after_ms("99999999999"), None);
        assert_eq!(retry_after_ms(""), None);
    }

    #[test]
    fn a_line_id_is_stable_and_tells_lines_apart() {
        assert_eq!(line_id(b"a"), line_id(b"a"));
        assert_ne!(line_id(b"a"), line_id(b"b"));
        assert_eq!(line_id(b"").len(), 32);
    }
}
