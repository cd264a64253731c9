//! vitals-prober: active probes of upstream endpoints, published as `ProbeResult`s.

pub mod config;
pub mod probe;
