//! The vitals health engine: a pure function of the signal log.
//!
//! [`Engine::apply`] takes a signal and the stream time it arrived at (the Kafka record's
//! timestamp, never a wall clock) and appends the decisions it causes. There is no I/O and no
//! clock here, so replaying the same log gives the same decisions, byte for byte, and a
//! [`Engine::snapshot`] restored with [`Engine::restore`] continues exactly as the uninterrupted run.
//!
//! An `Engine` holds the pools of one input partition. Signals are routed to their pool; a tick
//! moves the stream time of every pool of the partition, which is how silence is detected.

mod endpoint;
mod pool;
mod window;

pub use endpoint::Tracker;
pub use pool::PoolState;
pub use window::{Rate, Totals, Window};

use rustc_hash::FxHashMap as HashMap;
use serde::Serializer;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use vitals_contracts::{HealthChanged, Micros, Policy, PoolHealthChanged, Signal};

/// What the engine decided. Each is recorded in the audit log and published.
#[derive(Debug, Clone, PartialEq)]
pub enum Decision {
    Endpoint(Box<HealthChanged>),
    Pool(PoolHealthChanged),
}

#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    #[error("snapshot is not valid: {0}")]
    Invalid(#[from] serde_json::Error),
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Engine {
    /// Stream time of the partition: the largest record timestamp seen.
    pub now: Micros,
    /// The policy a pool gets until a policy change for it arrives.
    pub default_policy: Policy,
    #[serde(serialize_with = "sorted")]
    pub pools: HashMap<String, PoolState>,
}

impl Engine {
    pub fn new(default_policy: Policy) -> Engine {
        Engine {
            now: 0,
            default_policy,
            pools: HashMap::default(),
        }
    }

    /// Apply one signal at stream time `at`; decisions are appended to `out`.
    pub fn apply(&mut self, at: Micros, signal: &Signal, out: &mut Vec<Decision>) {
        self.now = self.now.max(at);
        let now = self.now;
        match signal.pool() {
            None => {
                // Sorted, so that the decisions come in the same order in every run.
                let mut names: Vec<&String> = self.pools.keys().collect();
                names.sort_unstable();
                let names: Vec<String> = names.into_iter().cloned().collect();
                for name in names {
                    if let Some(pool) = self.pools.get_mut(&name) {
                        pool.advance(now, out);
                    }
                }
            }
            Some(name) => {
                let pool = match self.pools.get_mut(name) {
                    Some(p) => p,
                    None => {
                        let p = PoolState::new(name, self.default_policy.clone(), now);
                        self.pools.entry(name.to_owned()).or_insert(p)
                    }
                };
                pool.advance(now, out);
                pool.apply(signal, out);
            }
        }
    }

    /// Convenience for tests and tools: apply and return the decisions.
    pub fn step(&mut self, at: Micros, signal: &Signal) -> Vec<Decision> {
        let mut out = Vec::new();
        self.apply(at, signal, &mut out);
        out
    }

    /// The whole state as bytes (JSON: readable in the database, floats round-trip exactly).
    pub fn snapshot(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("engine state is always serializable")
    }

    pub fn restore(bytes: &[u8]) -> Result<Engine, SnapshotError> {
        Ok(serde_json::from_slice(bytes)?)
    }

    /// One pool's state as bytes; the processor stores a snapshot per pool.
    pub fn pool_snapshot(&self, pool: &str) -> Option<Vec<u8>> {
        self.pools
            .get(pool)
            .map(|p| serde_json::to_vec(p).expect("pool state is always serializable"))
    }

    pub fn restore_pool(&mut self, bytes: &[u8]) -> Result<(), SnapshotError> {
        let p: PoolState = serde_json::from_slice(bytes)?;
        self.now = self.now.max(p.now);
        self.pools.insert(p.pool.clone(), p);
        Ok(())
    }
}

/// Serialize a map in key order, so that snapshots of equal states are equal bytes.
pub(crate) fn sorted<S: Serializer, V: Serialize>(map: &HashMap<String, V>, s: S) -> Result<S::Ok, S::Error> {
    map.iter().collect::<BTreeMap<&String, &V>>().serialize(s)
}
