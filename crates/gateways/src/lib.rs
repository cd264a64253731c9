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

/// When a limit lifts, as HTTP headers say it (vitals-contracts reads them for every gateway).
pub use vitals_contracts::limits::{limit_lifts_in_ms, ratelimit_reset_ms, retry_after_exact_ms, retry_after_ms};

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
    fn a_line_id_is_stable_and_tells_lines_apart() {
        assert_eq!(line_id(b"a"), line_id(b"a"));
        assert_ne!(line_id(b"a"), line_id(b"b"));
        assert_eq!(line_id(b"").len(), 32);
    }
}
