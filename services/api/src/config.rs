//! Configuration of the API: flags with environment variables. Tokens are never printed.

use clap::Parser;
use std::net::SocketAddr;
use std::time::Duration;
use vitals_runtime::args::{KafkaArgs, PostgresArgs, TopicArgs};

#[derive(Parser, Clone)]
#[command(name = "vitals-api", version, about = "The vitals HTTP API")]
pub struct Config {
    #[arg(long, env = "VITALS_API_ADDR", default_value = "127.0.0.1:8080")]
    pub http_addr: SocketAddr,
    #[command(flatten)]
    pub db: PostgresArgs,
    #[command(flatten)]
    pub kafka: KafkaArgs,
    #[command(flatten)]
    pub topics: TopicArgs,
    /// API tokens, `name:role:secret` with role reader, reporter (ingest only, bound to the
    /// gateways and pools it may report for: `name:reporter;gateways=edge-*;pools=chat:secret`),
    /// writer (read and ingest) or admin (operator actions and policies); repeatable or
    /// comma-separated. A secret on the command line is
    /// visible to every user of the machine (`ps`): prefer --tokens-file or the environment.
    #[arg(long = "token", env = "VITALS_API_TOKENS", value_delimiter = ',')]
    pub tokens: Vec<String>,
    /// A file of tokens, one `name:role:secret` a line (blank lines and `#` comments skipped),
    /// read at start and again whenever it changes (a file that no longer parses keeps the
    /// tokens before it); with --token, both count.
    #[arg(long, env = "VITALS_API_TOKENS_FILE")]
    pub tokens_file: Option<std::path::PathBuf>,
    /// Require a reader token for the read routes (history, health, stream).
    #[arg(long, env = "VITALS_READ_REQUIRES_TOKEN", default_value_t = false, action = clap::ArgAction::Set)]
    pub read_requires_token: bool,
    /// Largest request body accepted, in bytes (413 beyond).
    #[arg(long, env = "VITALS_MAX_BODY_BYTES", default_value_t = 1_048_576)]
    pub max_body_bytes: usize,
    /// Most items in one ingest batch.
    #[arg(long, env = "VITALS_MAX_BATCH_ITEMS", default_value_t = 1_000)]
    pub max_batch_items: usize,
    /// Time to produce a response (not counting a live stream's body).
    #[arg(long, env = "VITALS_REQUEST_TIMEOUT_MS", default_value_t = 15_000)]
    pub request_timeout_ms: u64,
    /// Time the broker has to confirm an ingested record.
    #[arg(long, env = "VITALS_PRODUCE_TIMEOUT_MS", default_value_t = 10_000)]
    pub produce_timeout_ms: u64,
    /// Records the producer may hold unconfirmed; beyond it ingest answers 503 with Retry-After.
    #[arg(long, env = "VITALS_PRODUCER_QUEUE", default_value_t = 100_000)]
    pub producer_queue: usize,
    /// Live streams served at once (503 beyond). A quarter of them is kept for clients with a
    /// token: anonymous clients cannot take every slot. One reader of the changes topic feeds
    /// them all (each open stream holds a connection: see --max-connections and `ulimit -n`).
    #[arg(long, env = "VITALS_MAX_STREAMS", default_value_t = 10_000)]
    pub max_streams: usize,
    /// Of those, streams served by a Kafka consumer of their own: clients resuming from further
    /// back than the recent events the API keeps (--stream-ring). A quarter is kept for clients
    /// with a token.
    #[arg(long, env = "VITALS_MAX_KAFKA_STREAMS", default_value_t = 64)]
    pub max_kafka_streams: usize,
    /// Of those, the most one client may hold at once (per token, or per IP address).
    #[arg(long, env = "VITALS_MAX_KAFKA_STREAMS_PER_CLIENT", default_value_t = 2)]
    pub max_kafka_streams_per_client: usize,
    /// Memory the Kafka consumers of those streams may prefetch into, all together (MB): each
    /// gets its share (this over --max-kafka-streams) for its queue of fetched events and its
    /// fetches, so that clients that resume from far back and never read cannot grow the API.
    #[arg(long, env = "VITALS_KAFKA_STREAMS_MEMORY_MB", default_value_t = 256)]
    pub kafka_streams_memory_mb: u64,
    /// Recent events kept for clients that resume (`Last-Event-ID`).
    #[arg(long, env = "VITALS_STREAM_RING", default_value_t = 10_000)]
    pub stream_ring: usize,
    /// Events a client may fall behind the live feed before it is dropped with a `lagged` event.
    #[arg(long, env = "VITALS_STREAM_CLIENT_BUFFER", default_value_t = 1_024)]
    pub stream_client_buffer: usize,
    /// Threads that write the live streams (0: one per core).
    #[arg(long, env = "VITALS_STREAM_WRITERS", default_value_t = 0)]
    pub stream_writers: usize,
    /// Live streams one client may hold at once: per token, or per IP address without one.
    #[arg(long, env = "VITALS_MAX_STREAMS_PER_CLIENT", default_value_t = 8)]
    pub max_streams_per_client: usize,
    /// A live stream ends after this many seconds with a `reconnect` event; the client resumes
    /// with `Last-Event-ID` and loses nothing.
    #[arg(long, env = "VITALS_STREAM_MAX_LIFETIME_SECS", default_value_t = 3600)]
    pub stream_max_lifetime_secs: u64,
    /// Open connections at once; beyond it a connection gets 503 and is closed. 0 (the
    /// default): as many as the process's open-file limit leaves room for, at most 11,000. A
    /// number the limit cannot hold is refused at start.
    #[arg(long, env = "VITALS_MAX_CONNECTIONS", default_value_t = 0)]
    pub max_connections: usize,
    /// Time a connection has to send a request's headers; also how long an idle keep-alive
    /// connection stays open.
    #[arg(long, env = "VITALS_HEADER_READ_TIMEOUT_MS", default_value_t = 10_000)]
    pub header_read_timeout_ms: u64,
    /// Requests one route serves at once (the live stream has its own limits); beyond it, and
    /// after waiting up to a second, 503 `busy` with Retry-After. The default is half the
    /// default database pool, so one busy route leaves connections for the others.
    #[arg(long, env = "VITALS_MAX_CONCURRENT_PER_ROUTE", default_value_t = 4)]
    pub max_concurrent_per_route: usize,
    /// Postgres connections of the API (it only reads).
    #[arg(long, env = "VITALS_DB_MAX_CONNECTIONS", default_value_t = 8)]
    pub db_max_connections: u32,
}

impl std::fmt::Debug for Config {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Config")
            .field("http_addr", &self.http_addr)
            .field("db", &self.db)
            .field("kafka", &self.kafka)
            .field("topics", &self.topics)
            .field("tokens", &format!("{} configured", self.tokens.len()))
            .field("read_requires_token", &self.read_requires_token)
            .field("max_body_bytes", &self.max_body_bytes)
            .finish_non_exhaustive()
    }
}

/// The most connections `--max-connections 0` allows.
pub const MAX_CONNECTIONS: usize = 11_000;

/// The connections to allow: `requested` (0: as many as fit, at most [`MAX_CONNECTIONS`]) with
/// `reserve` open files kept for everything else, under an open-file limit of `limit`.
pub fn fit_connections(requested: usize, reserve: u64, limit: u64) -> anyhow::Result<usize> {
    vitals_runtime::accept::fit_connections(
        requested,
        reserve,
        limit,
        MAX_CONNECTIONS,
        "the API (for the database, Kafka and its own use)",
    )
}

pub use vitals_runtime::shell::open_file_limit;

impl Config {
    /// Open files the API needs besides its connections: the database pool, the Kafka
    /// consumers of streams resuming from far back (a few sockets each), the hub and producer,
    /// and a margin for logs and the rest.
    pub fn file_reserve(&self) -> u64 {
        u64::from(self.db_max_connections) + 4 * self.max_kafka_streams as u64 + 64
    }

    /// The librdkafka settings that bound one far-back stream's consumer to its share of
    /// `--kafka-streams-memory-mb`: half for the queue of fetched events, a quarter for a fetch
    /// (librdkafka's defaults, 64 MB of queue and 50 MB fetches, let one client that never
    /// reads pin about 80 MB).
    pub fn kafka_stream_prefetch(&self) -> Vec<(&'static str, String)> {
        let share = (self.kafka_streams_memory_mb << 20) / self.max_kafka_streams.max(1) as u64;
        // A fetch may not be smaller than the largest message (librdkafka's message.max.bytes);
        // neither goes above librdkafka's own defaults (64 MB of queue, 50 MB fetches).
        let fetch = (share / 4).clamp(1_000_000, 52_428_800);
        vec![
            (
                "queued.max.messages.kbytes",
                (share / 2 / 1024).clamp(1, 65_536).to_string(),
            ),
            ("queued.min.messages", "1000".to_string()),
            ("fetch.max.bytes", fetch.to_string()),
            ("max.partition.fetch.bytes", fetch.min(1 << 20).to_string()),
        ]
    }

    /// `--max-connections` fitted to the open-file limit (see [`fit_connections`]).
    pub fn fit_connections(&self) -> anyhow::Result<usize> {
        fit_connections(self.max_connections, self.file_reserve(), open_file_limit())
    }

    /// Parse the tokens (flags, then the file), to be read again when the file changes; the
    /// error says what to change and never shows a secret.
    pub fn tokens(&self) -> anyhow::Result<vitals_runtime::tokens::Watched> {
        vitals_runtime::tokens::Watched::open(self.tokens_file.as_deref(), &self.tokens).map_err(anyhow::Error::msg)
    }

    pub fn validate(&self) -> anyhow::Result<()> {
        self.tokens()?;
        anyhow::ensure!(self.max_body_bytes >= 1024, "--max-body-bytes must be at least 1024");
        anyhow::ensure!(self.max_batch_items >= 1, "--max-batch-items must be at least 1");
        anyhow::ensure!(self.max_streams >= 1, "--max-streams must be at least 1");
        anyhow::ensure!(
            self.kafka_streams_memory_mb >= 4 && self.kafka_streams_memory_mb <= 1 << 20,
            "--kafka-streams-memory-mb must be between 4 and 1048576"
        );
        anyhow::ensure!(
            self.max_kafka_streams_per_client >= 1,
            "--max-kafka-streams-per-client must be at least 1"
        );
        anyhow::ensure!(
            self.max_streams_per_client >= 1,
            "--max-streams-per-client must be at least 1"
        );
        anyhow::ensure!(
            self.stream_max_lifetime_secs >= 1,
            "--stream-max-lifetime-secs must be at least 1"
        );
        anyhow::ensure!(
            self.header_read_timeout_ms >= 100,
            "--header-read-timeout-ms must be at least 100"
        );
        anyhow::ensure!(
            self.max_concurrent_per_route >= 1,
            "--max-concurrent-per-route must be at least 1"
        );
        anyhow::ensure!(self.db_max_connections >= 1, "--db-max-connections must be at least 1");
        self.db.check().map_err(anyhow::Error::msg)?;
        self.kafka.check().map_err(anyhow::Error::msg)?;
        self.topics.check().map_err(anyhow::Error::msg)?;
        Ok(())
    }

    pub fn request_timeout(&self) -> Duration {
        Duration::from_millis(self.request_timeout_ms)
    }
}

#[cfg(test)]
mod tests {
    use super::{fit_connections, Config};
    use clap::Parser;

    fn tokens(list: &[&str]) -> anyhow::Result<usize> {
        let mut args = vec!["vitals-api"];
        for t in list {
            args.extend(["--token", t]);
        }
        Config::try_parse_from(args).unwrap().tokens().map(|t| t.get().len())
    }

    #[test]
    fn far_back_streams_prefetch_within_their_share_of_the_memory_budget() {
        let c = Config::try_parse_from(["vitals-api"]).unwrap();
        let set: std::collections::HashMap<&str, u64> = c
            .kafka_stream_prefetch()
            .into_iter()
            .map(|(k, v)| (k, v.parse().unwrap()))
            .collect();
        // 256 MB over 64 streams: 4 MB each, 2 MB of queue and 1 MB fetches.
        assert_eq!(set["queued.max.messages.kbytes"], 2_048);
        assert_eq!(set["fetch.max.bytes"], 1_048_576);
        assert_eq!(set["max.partition.fetch.bytes"], 1_048_576);
        let c = Config::try_parse_from([
            "vitals-api",
            "--kafka-streams-memory-mb",
            "4",
            "--max-kafka-streams",
            "1000",
        ])
        .unwrap();
        let set: std::collections::HashMap<&str, String> = c.kafka_stream_prefetch().into_iter().collect();
        assert_eq!(set["queued.max.messages.kbytes"], "2");
        assert_eq!(set["fetch.max.bytes"], "1000000", "never below the largest message");
        let c = Config::try_parse_from(["vitals-api", "--kafka-streams-memory-mb", "1048576"]).unwrap();
        let set: std::collections::HashMap<&str, String> = c.kafka_stream_prefetch().into_iter().collect();
        assert_eq!(
            set["queued.max.messages.kbytes"], "65536",
            "librdkafka's default at most"
        );
        assert_eq!(set["fetch.max.bytes"], "52428800");
    }

    #[test]
    fn tokens_are_refused_when_a_name_or_a_secret_is_given_twice_and_errors_never_show_a_secret() {
        assert_eq!(
            tokens(&["ops:admin:aaaaaaaaaaaaaaaa", "ci:writer:bbbbbbbbbbbbbbbb"]).unwrap(),
            2
        );
        let e = tokens(&["ops:admin:aaaaaaaaaaaaaaaa", "ops:reader:bbbbbbbbbbbbbbbb"]).unwrap_err();
        assert!(e.to_string().contains("same name"), "{e}");
        let e = tokens(&["ops:admin:aaaaaaaaaaaaaaaa", "dash:reader:aaaaaaaaaaaaaaaa"]).unwrap_err();
        assert!(e.to_string().contains("same secret"), "{e}");
        for wrong_order in ["s3cr3t-s3cr3t-s3cr3t:admin:ops", "s3cr3t-s3cr3t-s3cr3t:ops:admin"] {
            let e = tokens(&[wrong_order]).unwrap_err().to_string();
            assert!(!e.contains("s3cr3t"), "the secret is printed: {e}");
            assert!(e.contains("#1"), "{e}");
        }
    }

    #[test]
    fn connections_fit_the_open_file_limit_or_are_refused_with_the_numbers() {
        assert_eq!(
            fit_connections(0, 200, 1_024).unwrap(),
            824,
            "the default fits the limit"
        );
        assert_eq!(fit_connections(0, 200, 1_048_576).unwrap(), 11_000, "at most 11,000");
        assert_eq!(fit_connections(500, 200, 1_024).unwrap(), 500);
        let e = fit_connections(11_000, 200, 1_024).unwrap_err().to_string();
        assert!(
            e.contains("open-file limit is 1024") && e.contains("at most 824"),
            "{e}"
        );
        assert!(fit_connections(0, 200, 210).is_err(), "no room at all");
    }
}
