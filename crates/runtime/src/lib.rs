//! What every vitals binary shares, so that a new service is its own logic and nothing else:
//!
//! - [`shell`]: structured logs, one cancellation token that SIGTERM or Ctrl-C fires, a grace
//!   deadline after it, and an immediate exit on a second signal.
//! - [`accept`]: what the HTTP accept loops share: connections fitted to the open-file limit,
//!   accept errors backed off.
//! - [`args`]: the flag groups (Kafka, Postgres, topics) that every binary's configuration
//!   flattens, with their environment variables and checks.
//! - [`kafka`]: one builder of librdkafka settings (ours, then the user's pass-through options).
//! - [`produce`]: one way to produce, with librdkafka's errors sorted into a full queue (wait),
//!   retriable and final ones, used by every program that produces.
//! - [`redact`]: secrets out of anything printed.
//! - [`metrics`]: the Prometheus registry and its text rendering.
//! - [`probes`]: `/healthz` and `/readyz`, the same on every service's port.
//! - [`tokens`]: bearer tokens, their roles and bindings, one file format for every way in.

#[cfg(feature = "service")]
pub mod accept;
#[cfg(feature = "service")]
pub mod args;
#[cfg(feature = "service")]
pub mod kafka;
#[cfg(feature = "service")]
pub mod metrics;
#[cfg(feature = "service")]
pub mod probes;
pub mod produce;
#[cfg(feature = "service")]
pub mod redact;
#[cfg(feature = "service")]
pub mod shell;
#[cfg(feature = "service")]
pub mod tokens;
