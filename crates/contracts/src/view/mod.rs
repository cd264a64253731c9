//! The JSON view of the contracts: what the HTTP API answers, and what the dashboard and the
//! command-line tool read and write. Enumerations use their readable names (`healthy`,
//! `server_error`), times are RFC 3339, and every conversion from a contract type is exhaustive:
//! a value this build does not know is an error, never a default.

mod pages;
mod records;

pub use crate::types::{Action, DependencyStatusName, Outcome, ProbeKindName, ReasonCode, StateName};
pub use pages::*;
pub use records::*;
