//! The event contracts of vitals.
//!
//! Every record that crosses a process boundary is described by an Avro schema in `schemas/*.avsc`
//! (at the repository root) and by a Rust type here. On the wire each record is in Avro
//! *single-object encoding*: the marker `C3 01`, the 8-byte little-endian CRC-64-AVRO (Rabin)
//! fingerprint of the writer schema's canonical form, then the Avro binary body. Any Avro library can
//! write that without a schema registry.
//!
//! - [`codec`]: encode and decode, with older schema versions resolved to the current one.
//! - [`validate`]: the rules a signal must pass before it reaches the engine; the reason of a
//!   rejection is short enough to go into a dead-letter header.

pub mod batch;
mod bounds;
pub mod cadence;
pub mod clock;
pub mod codec;
pub mod hash;
pub mod keys;
pub mod lateness;
pub mod limits;
pub mod recent;
pub mod scope;
pub mod seq;
pub mod summary;
mod symbols;
pub mod types;
pub mod validate;
#[cfg(feature = "view")]
pub mod view;

pub use codec::{decode, decode_signal, encode, encode_signal, CodecError, Record, SchemaKind};
pub use summary::{CallSummary, Histogram, HistogramBucket, OutcomeCounts, Summarizer, SummaryConfig};
pub use types::*;
pub use validate::{validate_name, validate_signal, ValidationError};

/// Kafka topic names (docs/architecture.md). Their record keys are described in [`keys`].
pub mod topics {
    pub const SIGNALS: &str = "vitals.signals.v1";
    pub const HEALTH_CHANGES: &str = "vitals.health-changes.v1";
    pub const HEALTH_STATE: &str = "vitals.health-state.v1";
    pub const SIGNALS_DLQ: &str = "vitals.signals.dlq.v1";
    /// What gateways report to when a merge stage (`vitals-merger`) stands between them and
    /// the processor: the same records as the signals topic, keyed by endpoint, merged per
    /// endpoint across the fleet onto the signals topic (docs/fleet.md).
    pub const GATEWAY_SIGNALS: &str = "vitals.gateway-signals.v1";
}
