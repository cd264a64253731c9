//! vitals-prober: active probes of upstream endpoints, published as `ProbeResult`s.

pub mod config;
pub mod follow;
pub mod http;
pub mod metrics;
pub mod probe;
pub mod readiness;
pub mod schedule;
pub mod service;
pub mod shard;
pub mod sink;
pub mod view;

/// FNV-1a over `parts`, each followed by a zero byte: stable spreads and shards from ids.
pub(crate) fn fnv(parts: &[&[u8]]) -> u64 {
    vitals_contracts::hash::Fnv64::new().parts(parts).finish()
}
