//! Configuration: flags, each with an environment variable. Secrets (the database URL's password,
//! Kafka SASL passwords) are never printed: `Debug` is written by hand.

use clap::Parser;
use std::net::SocketAddr;
use std::time::Duration;
use vitals_runtime::args::{KafkaArgs, PostgresArgs, TopicArgs};

#[derive(Parser, Clone)]
#[command(name = "vitals-processor", version, about = "The vitals stream processor")]
pub struct Config {
    #[command(flatten)]
    pub kafka: KafkaArgs,
    #[command(flatten)]
    pub topics: TopicArgs,
    #[command(flatten)]
    pub db: PostgresArgs,
    /// Consumer group of the processors.
    #[arg(long, env = "VITALS_GROUP", default_value = "vitals-processor")]
    pub group: String,
    /// Create the four topics if they are missing.
    #[arg(long, env = "VITALS_CREATE_TOPICS", default_value_t = true, action = clap::ArgAction::Set)]
    pub create_topics: bool,
    /// Partitions of the topics this processor creates.
    #[arg(long, env = "VITALS_PARTITIONS", default_value_t = 8)]
    pub partitions: i32,
    /// Replication factor of the topics this processor creates.
    #[arg(long, env = "VITALS_REPLICATION_FACTOR", default_value_t = 1)]
    pub replication_factor: i32,
    /// The most records in one batch (one transaction); a full batch waits for the write before
    /// it, and consumption waits with it.
    #[arg(long, env = "VITALS_BATCH_MAX_RECORDS", default_value_t = 20_000)]
    pub batch_max_records: usize,
    /// A batch goes to the writer when its first record has waited this long and the write
    /// before it is done; while a write runs, the next batch keeps growing.
    #[arg(long, env = "VITALS_BATCH_MAX_MS", default_value_t = 20)]
    pub batch_max_ms: u64,
    /// Engine snapshots are written after this many records of a partition (and at shutdown);
    /// recovery replays at most this many records.
    #[arg(long, env = "VITALS_SNAPSHOT_EVERY", default_value_t = 50_000)]
    pub snapshot_every: u64,
    /// Snapshots cost at most this many bytes per record read (0: no bound): a partition's
    /// snapshot also waits until its last snapshot's bytes over this many records were read
    /// since. A partition of many pools is snapshotted less often and replays more after a
    /// crash (1,000 pools of 10 endpoints: ~37 MB a snapshot, one per ~2.3 M records at 16).
    #[arg(long, env = "VITALS_SNAPSHOT_BYTES_PER_RECORD", default_value_t = 16)]
    pub snapshot_bytes_per_record: u64,
    /// The calls counted for request availability are written (with the batch of the moment, in
    /// its transaction) at most this often and with every snapshot: how far the per-minute
    /// counts may lag the audit log. Shorter costs Postgres more upserts.
    #[arg(long, env = "VITALS_REQUESTS_FLUSH_MS", default_value_t = 5_000)]
    pub requests_flush_ms: u64,
    /// Period of the tick records this processor writes to every signals partition (0: none).
    /// Ticks move stream time so that silence is detected.
    #[arg(long, env = "VITALS_TICK_INTERVAL_MS", default_value_t = 1_000)]
    pub tick_interval_ms: u64,
    /// Period of the tick records this processor writes to every partition of the changes
    /// topic while it is ready and no partition is stalled (0: none). Routers' health views
    /// take a silence of several periods as a processor that stopped, and fail open.
    #[arg(long, env = "VITALS_VIEW_TICK_INTERVAL_MS", default_value_t = 5_000)]
    pub view_tick_interval_ms: u64,
    /// Address of the health and metrics endpoint.
    #[arg(long, env = "VITALS_HTTP_ADDR", default_value = "127.0.0.1:9464")]
    pub http_addr: SocketAddr,
    /// Outbox relay: events published per round, about (whole outbox rows are taken: a row is a
    /// pack of up to 500 events).
    #[arg(long, env = "VITALS_RELAY_BATCH", default_value_t = 1_000)]
    pub relay_batch: i64,
    /// Months of transitions and pool events that ended more than this many days ago (by stream
    /// time) are dropped whole; 0 keeps them forever.
    #[arg(long, env = "VITALS_AUDIT_RETENTION_DAYS", default_value_t = 0)]
    pub audit_retention_days: i64,
    /// How often retention drops the months it no longer keeps (the first pass runs when the
    /// relay starts). A batch never writes rows of such months: it counts them
    /// (`vitals_processor_audit_rows_expired`).
    #[arg(long, env = "VITALS_AUDIT_RETENTION_EVERY_SECS", default_value_t = 600)]
    pub audit_retention_every_secs: u64,
    /// A partition with lag and no commit for this many seconds is stalled: `/readyz` turns
    /// false and names it.
    #[arg(long, env = "VITALS_STALL_AFTER_SECS", default_value_t = 30)]
    pub stall_after_secs: u64,
    /// Seconds to finish in-flight work after SIGTERM.
    #[arg(long, env = "VITALS_SHUTDOWN_GRACE_SECS", default_value_t = 20)]
    pub shutdown_grace_secs: u64,
    /// Record loops in this processor, each a consumer of the group with its own partitions,
    /// batches and writer: the partitions are consumed in parallel on as many cores.
    #[arg(long, env = "VITALS_LANES", default_value_t = 1)]
    pub lanes: usize,
    /// Run on a signals topic whose records carry their producers' timestamps
    /// (`message.timestamp.type=CreateTime`) instead of the broker's append time. Stream time then
    /// follows the reporters' clocks: one record stamped an hour ahead moves its partition's
    /// clock an hour on. Without this flag the processor refuses such a topic at start.
    #[arg(long, env = "VITALS_ACCEPT_CREATE_TIME", default_value_t = false, action = clap::ArgAction::Set)]
    pub accept_create_time: bool,
    /// With `--accept-create-time`: a record stamped more than this many seconds ahead of its
    /// partition's time is dead-lettered (`stamped_ahead`, counted in
    /// `vitals_processor_stamped_ahead_total`) instead of moving the partition's clock on, unless
    /// ten records in a row are (the time did move: every producer agrees). 0: no bound.
    #[arg(long, env = "VITALS_CREATE_TIME_MAX_AHEAD_SECS", default_value_t = 300)]
    pub create_time_max_ahead_secs: u64,
    /// Pools one signals partition holds at most (each ~2.4 KB of engine memory with a few
    /// endpoints, a snapshot entry and rows): a signal of a new pool beyond them is dead-lettered
    /// (`too_many_pools`, counted in `vitals_processor_pools_refused_total`). A partition's pools
    /// all live in the processor that owns it.
    #[arg(long, env = "VITALS_MAX_POOLS_PER_PARTITION", default_value_t = 10_000)]
    pub max_pools_per_partition: usize,
}

impl std::fmt::Debug for Config {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Config")
            .field("kafka", &self.kafka)
            .field("topics", &self.topics)
            .field("db", &self.db)
            .field("group", &self.group)
            .field("batch_max_records", &self.batch_max_records)
            .field("batch_max_ms", &self.batch_max_ms)
            .field("snapshot_every", &self.snapshot_every)
            .field("snapshot_bytes_per_record", &self.snapshot_bytes_per_record)
            .field("requests_flush_ms", &self.requests_flush_ms)
            .field("tick_interval_ms", &self.tick_interval_ms)
            .field("view_tick_interval_ms", &self.view_tick_interval_ms)
            .field("http_addr", &self.http_addr)
            .field("lanes", &self.lanes)
            .field("accept_create_time", &self.accept_create_time)
            .field("create_time_max_ahead_secs", &self.create_time_max_ahead_secs)
            .field("max_pools_per_partition", &self.max_pools_per_partition)
            .finish_non_exhaustive()
    }
}

/// Lanes in one processor at most: each holds a consumer with its own fetch buffers, a thread
/// and a database connection; past the cores a machine has, more processors spread better.
pub const MAX_LANES: usize = 64;

#[derive(Debug, thiserror::Error)]
#[error("invalid configuration: {0}")]
pub struct ConfigError(String);

impl Config {
    /// How far ahead of its partition's time a record may be stamped: bounded on a topic its
    /// producers stamp (`--accept-create-time`), not on one the broker stamps.
    pub fn max_ahead(&self) -> Option<vitals_contracts::Micros> {
        (self.accept_create_time && self.create_time_max_ahead_secs > 0)
            .then(|| i64::try_from(self.create_time_max_ahead_secs.saturating_mul(1_000_000)).unwrap_or(i64::MAX))
    }

    /// Cross-field checks, with a message that says what to change.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let err = |m: String| Err(ConfigError(m));
        if self.batch_max_records == 0 {
            return err("--batch-max-records must be at least 1".into());
        }
        if self.batch_max_ms == 0 {
            return err("--batch-max-ms must be at least 1".into());
        }
        if self.snapshot_every == 0 {
            return err("--snapshot-every must be at least 1".into());
        }
        if self.requests_flush_ms == 0 {
            return err("--requests-flush-ms must be at least 1".into());
        }
        if self.audit_retention_days < 0 {
            return err("--audit-retention-days must be at least 0".into());
        }
        if self.audit_retention_every_secs == 0 {
            return err("--audit-retention-every-secs must be at least 1".into());
        }
        if !(1..=MAX_LANES).contains(&self.lanes) {
            return err(format!("--lanes must be between 1 and {MAX_LANES}"));
        }
        if self.partitions < 1 {
            return err("--partitions must be at least 1".into());
        }
        if self.max_pools_per_partition == 0 {
            return err("--max-pools-per-partition must be at least 1".into());
        }
        self.kafka.check().map_err(ConfigError)?;
        self.topics.check().map_err(ConfigError)?;
        self.db.check().map_err(ConfigError)?;
        Ok(())
    }

    pub fn batch_max_wait(&self) -> Duration {
        Duration::from_millis(self.batch_max_ms)
    }

    pub fn requests_flush(&self) -> Duration {
        Duration::from_millis(self.requests_flush_ms)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_say_what_to_change_and_the_shared_groups_are_checked() {
        let c = Config::parse_from(["p", "--batch-max-records", "0"]);
        assert!(c.validate().unwrap_err().to_string().contains("--batch-max-records"));
        let c = Config::parse_from(["p", "--dlq-topic", "vitals.signals.v1"]);
        assert!(c.validate().unwrap_err().to_string().contains("named twice"));
        let c = Config::parse_from(["p", "--database-url", "postgres://u:hunter2@db/x"]);
        assert!(!format!("{c:?}").contains("hunter2"));
        let c = Config::parse_from(["p", "--lanes", "0"]);
        assert!(c
            .validate()
            .unwrap_err()
            .to_string()
            .contains("--lanes must be between 1"));
        assert!(Config::parse_from(["p"]).validate().is_ok());
    }
}
