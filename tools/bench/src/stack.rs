//! The benchmarks' view of the local stack: everything comes from `vitals-testkit` (the same
//! names, topics and started binaries as the integration tests); this file only turns the
//! benchmarks' generated signals into input records.

use vitals_contracts::{encode_signal, Signal};
pub use vitals_testkit::{brokers, database_url, producer, start_processor, unique, Service, Stamp, Topics};

/// The signals as input records: keyed by pool (ticks, which have no pool, round-robin over 8
/// partitions), stamped with their stream time.
pub fn inputs(signals: &[(i64, Signal)]) -> impl Iterator<Item = vitals_testkit::Input> + '_ {
    signals.iter().enumerate().map(|(i, (t, s))| {
        let key = s.pool().filter(|k| !k.is_empty()).map(str::to_owned);
        vitals_testkit::Input {
            partition: key.is_none().then_some((i % 8) as i32),
            ts_ms: t / 1000,
            key,
            bytes: encode_signal(s).expect("generated signals encode"),
        }
    })
}
