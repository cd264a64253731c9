//! `vitals-spans`: OpenTelemetry trace spans into vitals call reports.
//!
//! - [`decode`]: OTLP export bodies (protobuf or JSON, gzip) into requests, with the limits
//!   checked before anything large is allocated.
//! - [`map`]: the span → call table (`--map`, TOML): which spans are upstream calls, and which
//!   pool, endpoint and gateway they are, by templates over the span's and the resource's
//!   attributes ([`template`]).
//! - [`classify`]: the call's outcome class by the semantic conventions (status code, error
//!   type, span status).
//!
//! Everything here is pure (no clock, no I/O): `vitals-otlp` serves it over OTLP/HTTP and
//! OTLP/gRPC.

pub mod attrs;
pub mod classify;
pub mod decode;
pub mod map;
pub mod template;
pub mod view;

pub use map::{Map, Verdict};

/// Why a span gave no call report although it was read. Counted by reason; never an error.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Skip {
    /// No rule of the table takes it: not an upstream call (a server span, a database call...).
    NotACall,
    /// A call, but no pool template rendered.
    NoPool,
    /// A call, but no endpoint template rendered.
    NoEndpoint,
    /// A name that vitals refuses (empty, over 256 bytes, control characters).
    BadName,
    /// Its pool is in `skip_pools`.
    PoolSkipped,
}

impl Skip {
    pub const ALL: [Skip; 5] = [
        Skip::NotACall,
        Skip::NoPool,
        Skip::NoEndpoint,
        Skip::BadName,
        Skip::PoolSkipped,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Skip::NotACall => "not_a_call",
            Skip::NoPool => "no_pool",
            Skip::NoEndpoint => "no_endpoint",
            Skip::BadName => "bad_name",
            Skip::PoolSkipped => "pool_skipped",
        }
    }
}

/// What became of the spans of one request.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Tally {
    pub spans: u64,
    pub calls: u64,
    /// By [`Skip`] (its index).
    pub skipped: [u64; Skip::ALL.len()],
    /// Malformed spans (bad ids or times): OTLP's `rejected_spans`.
    pub rejected: u64,
    /// Why the first rejected span was (OTLP's partial success `error_message`).
    pub first_rejection: Option<String>,
}

#[cfg(test)]
mod tests;
