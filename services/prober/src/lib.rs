//! vitals-prober: active probes of upstream endpoints, published as `ProbeResult`s.

pub mod config;
pub mod follow;
pub mod http;
pub mod metrics;
pub mod probe;
pub mod schedule;
pub mod service;
pub mod shard;
pub mod sink;
pub mod view;
