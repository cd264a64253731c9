//! What every vitals binary shares, so that a new service is its own logic and nothing else:
//!
//! - [`shell`]: structured logs, one cancellation token that SIGTERM or Ctrl-C fires, a grace
//!   deadline after it, and an immediate exit on a second signal.
//! - [`accept`]: what the HTTP accept loops share: connections fitted to the open-file limit,
//!   accept errors backed off.
//! - [`args`]: the flag groups (Kafka, Postgres, topics) that every binary's configuration
//!   flattens, with their environment variables and checks.
//! - [`kafka`]: one builder of librdkafka settings (ours, then the user's pass-through options).
//! - [`redact`]: secrets out of anything printed.
//! - [`metrics`]: the Prometheus registry and its text rendering.
//! - [`tokens`]: bearer tokens, their roles and bindings, one file format for every way in.

pub mod accept;
pub mod args;
pub mod kafka;
pub mod metrics;
pub mod redact;
pub mod shell;
pub mod tokens;
