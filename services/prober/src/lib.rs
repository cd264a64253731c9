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

/// FNV-1a over `parts`, each followed by a zero byte: stable spreads and shards from ids.
pub(crate) fn fnv(parts: &[&[u8]]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for p in parts {
        for b in p.iter().chain(&[0u8]) {
            h = (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3);
        }
    }
    h
}
