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

pub use endpoint::{noise_run, Tracker};
pub use pool::PoolState;
pub use vitals_contracts::lateness::ClockChange;
pub use window::{Rate, Totals, Window};

use rustc_hash::FxHashMap as HashMap;
use serde::Serializer;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use vitals_contracts::{EndpointState, HealthChanged, Micros, Policy, PoolHealthChanged, Signal};

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

/// The engine of one partition as stored: its stream time and one snapshot per pool, in pool
/// order. [`Engine::from_snapshot`] continues exactly where [`Engine::partition_snapshot`] left.
#[derive(Debug, Clone, PartialEq)]
pub struct PartitionSnapshot {
    pub stream_time: Micros,
    /// (pool, state bytes), sorted by pool.
    pub pools: Vec<(String, Vec<u8>)>,
}

/// The state of every pool of one partition. Its fields are private: only signals change it
/// (`apply`), and readers get shared references.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Engine {
    /// Stream time of the partition: the largest record timestamp seen.
    now: Micros,
    /// The policy a pool gets until a policy change for it arrives.
    default_policy: Policy,
    #[serde(serialize_with = "sorted")]
    pools: HashMap<String, PoolState>,
    /// What the last signals did beside decisions, until taken ([`Engine::take_notes`]).
    #[serde(skip)]
    notes: Notes,
}

/// What signals did beside decisions, for the processor's metrics: reports set aside as late,
/// and reporters' clocks a pool named off or back. Working memory, not state: equal engines may
/// hold different notes, and a snapshot holds none.
#[derive(Debug, Clone, Default)]
pub struct Notes {
    pub late: u64,
    /// (pool, change).
    pub clocks: Vec<(String, ClockChange)>,
}

impl Notes {
    pub fn is_empty(&self) -> bool {
        self.late == 0 && self.clocks.is_empty()
    }
}

impl PartialEq for Notes {
    fn eq(&self, _: &Notes) -> bool {
        true
    }
}

impl Engine {
    pub fn new(default_policy: Policy) -> Engine {
        Engine {
            now: 0,
            default_policy,
            pools: HashMap::default(),
            notes: Notes::default(),
        }
    }

    /// Stream time: the largest record timestamp applied.
    pub fn now(&self) -> Micros {
        self.now
    }

    pub fn pool(&self, name: &str) -> Option<&PoolState> {
        self.pools.get(name)
    }

    /// Every pool, in name order.
    /// Pools the engine holds.
    pub fn pool_count(&self) -> usize {
        self.pools.len()
    }

    pub fn pools(&self) -> impl Iterator<Item = &PoolState> {
        let mut v: Vec<&PoolState> = self.pools.values().collect();
        v.sort_unstable_by(|a, b| a.name().cmp(b.name()));
        v.into_iter()
    }

    /// Apply one signal at stream time `at`; decisions are appended to `out`. When the signal
    /// names an endpoint the engine had not seen, its first state is returned (healthy, at full
    /// weight, before any transition): the state projection and the compacted state topic
    /// learn every member of a pool from it.
    ///
    /// A signal the engine refuses (see [`Engine::refusal`]) changes nothing, not even the
    /// stream time: the processor dead-letters it.
    pub fn apply(&mut self, at: Micros, signal: &Signal, out: &mut Vec<Decision>) -> Option<EndpointState> {
        match self.admit(at, signal) {
            Admission::Refused(_) => None,
            Admission::Repeat => {
                if self.refusal(signal).is_none() {
                    self.apply_signal(at, signal, out);
                }
                None
            }
            Admission::Apply { first_seen, .. } => self.apply_admitted(at, signal, first_seen, out),
        }
    }

    /// What [`Engine::apply`] would do with `signal` at stream time `at`, found with one look-up
    /// of its pool: the processor asks first, to count and dead-letter what is not applied.
    pub fn admit(&self, at: Micros, signal: &Signal) -> Admission {
        let Some(name) = signal.pool() else {
            return Admission::Apply {
                new_pool: false,
                first_seen: false,
            };
        };
        let Some(pool) = self.pools.get(name) else {
            return Admission::Apply {
                new_pool: true,
                first_seen: signal.endpoint().is_some(),
            };
        };
        if pool.is_repeat(signal, at.max(self.now)) {
            return Admission::Repeat;
        }
        match signal.endpoint() {
            Some(ep) if pool.endpoint(ep).is_none() => match refusal(pool, name, ep) {
                Some(why) => Admission::Refused(why),
                None => Admission::Apply {
                    new_pool: false,
                    first_seen: true,
                },
            },
            _ => Admission::Apply {
                new_pool: false,
                first_seen: false,
            },
        }
    }

    /// Apply a signal [`Engine::admit`] admitted (`first_seen` as it said): [`Engine::apply`]
    /// without asking again.
    pub fn apply_admitted(
        &mut self,
        at: Micros,
        signal: &Signal,
        first_seen: bool,
        out: &mut Vec<Decision>,
    ) -> Option<EndpointState> {
        self.apply_signal(at, signal, out);
        if !first_seen {
            return None;
        }
        let (pool, ep) = (signal.pool()?, signal.endpoint()?);
        let p = self.pools.get(pool).filter(|p| p.endpoint(ep).is_some())?;
        Some(EndpointState::first_seen(pool, ep, self.now, p.policy().version))
    }

    /// Why the engine refuses a signal, if it does: the signal names an endpoint its pool does
    /// not hold while the pool already holds its policy's `max_endpoints`. The endpoints the pool
    /// holds go on (a policy lowering the cap removes none of them).
    pub fn refusal(&self, signal: &Signal) -> Option<String> {
        let (name, ep) = (signal.pool()?, signal.endpoint()?);
        let pool = self.pools.get(name)?;
        if pool.endpoint(ep).is_some() {
            return None;
        }
        refusal(pool, name, ep)
    }

    fn apply_signal(&mut self, at: Micros, signal: &Signal, out: &mut Vec<Decision>) {
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
                pool.apply(signal, out, &mut self.notes);
            }
        }
    }

    /// What the signals applied since the last call did beside their decisions.
    pub fn take_notes(&mut self) -> Notes {
        std::mem::take(&mut self.notes)
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

    /// Endpoints restored from a snapshot whose stored flags their phase could not hold (an
    /// older build's leftovers, dropped as no rule reads them): counted, never silently.
    pub fn lossy_restores(&self) -> usize {
        self.pools.values().map(PoolState::lossy_restores).sum()
    }

    /// Stream time and one snapshot per pool (JSON each), as the processor stores them: a pool
    /// row changes only when that pool does.
    pub fn partition_snapshot(&self) -> PartitionSnapshot {
        PartitionSnapshot {
            stream_time: self.now,
            pools: self
                .pools()
                .map(|p| {
                    let bytes = serde_json::to_vec(p).expect("pool state is always serializable");
                    (p.name().to_owned(), bytes)
                })
                .collect(),
        }
    }

    /// The engine a [`PartitionSnapshot`] describes; pools it does not hold get `default_policy`.
    pub fn from_snapshot<'a>(
        default_policy: Policy,
        stream_time: Micros,
        pools: impl IntoIterator<Item = &'a [u8]>,
    ) -> Result<Engine, SnapshotError> {
        let mut engine = Engine::new(default_policy);
        for bytes in pools {
            let p: PoolState = serde_json::from_slice(bytes)?;
            engine.now = engine.now.max(p.now());
            engine.pools.insert(p.name().to_owned(), p);
        }
        engine.now = engine.now.max(stream_time);
        Ok(engine)
    }
}

/// What the engine does with a signal ([`Engine::admit`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Admission {
    /// A report its pool applied within the last five minutes: passed over (it moves stream
    /// time and fires timers, as any signal does, and changes nothing else).
    Repeat,
    /// Refused, and why ([`Engine::refusal`]): nothing changes, not even stream time.
    Refused(String),
    /// Applied. `new_pool`: the engine holds no pool of its name yet; `first_seen`: it names an
    /// endpoint its pool does not hold yet.
    Apply { new_pool: bool, first_seen: bool },
}

/// Why `pool` refuses the endpoint `ep` it does not hold: it holds its policy's `max_endpoints`.
fn refusal(pool: &PoolState, name: &str, ep: &str) -> Option<String> {
    let cap = pool.policy().max_endpoints.max(1);
    (i64::from(pool.total()) >= i64::from(cap)).then(|| {
        format!(
            "pool {name:?} holds {} endpoints, the most its policy allows (max_endpoints {cap}): \
             endpoint {ep:?} is not added",
            pool.total()
        )
    })
}

/// Serialize a map in key order, so that snapshots of equal states are equal bytes.
pub(crate) fn sorted<S: Serializer, V: Serialize>(map: &HashMap<String, V>, s: S) -> Result<S::Ok, S::Error> {
    map.iter().collect::<BTreeMap<&String, &V>>().serialize(s)
}
