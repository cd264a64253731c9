//! `vitals-logbridge`: gateway access logs in, CallOutcomes out.
//!
//! - [`bridge`]: one line → its attempts (HAProxy's `vitals1` format or nginx JSON, told apart
//!   by their first byte) → reports, with every line counted by what became of it and bad lines
//!   sampled into the log at a bounded rate.
//! - [`inputs`]: syslog over UDP and a Unix datagram socket, and followed files (rotation and
//!   truncation handled), each on its own thread; one process takes any number of them.

pub mod bridge;
pub mod inputs;
