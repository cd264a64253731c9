//! Flag groups shared by the binaries: each binary's `Config` flattens the ones it uses, so a
//! flag has one name, one environment variable, one default and one check everywhere.

use crate::redact;
use clap::Args;
use vitals_contracts::topics;

/// The Kafka cluster.
#[derive(Args, Clone)]
pub struct KafkaArgs {
    /// Kafka bootstrap servers.
    #[arg(long, env = "VITALS_KAFKA_BROKERS", default_value = "127.0.0.1:9092")]
    pub brokers: String,
    /// Extra librdkafka settings, `key=value`, repeatable or comma-separated (e.g.
    /// security.protocol=SASL_SSL, sasl.mechanism=SCRAM-SHA-512, sasl.username=...,
    /// ssl.ca.location=...). Applied to every client; they win over our defaults.
    #[arg(long = "kafka-option", env = "VITALS_KAFKA_OPTIONS", value_delimiter = ',')]
    pub kafka_options: Vec<String>,
}

impl KafkaArgs {
    /// The pass-through options as (key, value).
    pub fn pairs(&self) -> impl Iterator<Item = (&str, &str)> {
        self.kafka_options.iter().filter_map(|o| o.split_once('='))
    }

    pub fn check(&self) -> Result<(), String> {
        if self.brokers.trim().is_empty() {
            return Err("--brokers must name at least one broker".into());
        }
        match self.kafka_options.iter().find(|o| !o.contains('=')) {
            Some(o) => Err(format!("--kafka-option {o:?} is not key=value")),
            None => Ok(()),
        }
    }
}

impl std::fmt::Debug for KafkaArgs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Kafka")
            .field("brokers", &self.brokers)
            .field(
                "kafka_options",
                &self.kafka_options.iter().map(|o| redact::option(o)).collect::<Vec<_>>(),
            )
            .finish()
    }
}

/// The Postgres database and the schema that holds the vitals tables.
#[derive(Args, Clone)]
pub struct PostgresArgs {
    /// Postgres URL (postgres://user:password@host:port/db).
    #[arg(
        long,
        env = "VITALS_DATABASE_URL",
        default_value = "postgres://vitals:vitals@127.0.0.1:5432/vitals"
    )]
    pub database_url: String,
    /// Postgres schema holding the vitals tables (the processor creates and migrates it).
    #[arg(long, env = "VITALS_DB_SCHEMA", default_value = "vitals")]
    pub db_schema: String,
}

impl PostgresArgs {
    pub fn check(&self) -> Result<(), String> {
        // The schema name is quoted into SQL: letters, digits and _ only.
        let s = &self.db_schema;
        if s.is_empty() || !s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
            return Err(format!("--db-schema {s:?}: use letters, digits and _ only"));
        }
        if !self.database_url.starts_with("postgres://") && !self.database_url.starts_with("postgresql://") {
            return Err(format!(
                "--database-url {} is not a postgres:// URL",
                redact::url(&self.database_url)
            ));
        }
        Ok(())
    }

    /// The URL without its password, for messages.
    pub fn shown(&self) -> String {
        redact::url(&self.database_url)
    }
}

impl std::fmt::Debug for PostgresArgs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Postgres")
            .field("database_url", &self.shown())
            .field("db_schema", &self.db_schema)
            .finish()
    }
}

/// The four topics of the contracts (`vitals_contracts::topics`).
#[derive(Args, Clone, Debug)]
pub struct TopicArgs {
    #[arg(long, env = "VITALS_SIGNALS_TOPIC", default_value = topics::SIGNALS)]
    pub signals_topic: String,
    #[arg(long, env = "VITALS_CHANGES_TOPIC", default_value = topics::HEALTH_CHANGES)]
    pub changes_topic: String,
    #[arg(long, env = "VITALS_STATE_TOPIC", default_value = topics::HEALTH_STATE)]
    pub state_topic: String,
    #[arg(long, env = "VITALS_DLQ_TOPIC", default_value = topics::SIGNALS_DLQ)]
    pub dlq_topic: String,
}

impl TopicArgs {
    pub fn check(&self) -> Result<(), String> {
        let topics = [
            &self.signals_topic,
            &self.changes_topic,
            &self.state_topic,
            &self.dlq_topic,
        ];
        for (i, a) in topics.iter().enumerate() {
            if a.is_empty() {
                return Err("topic names must not be empty".into());
            }
            if topics[i + 1..].contains(a) {
                return Err(format!("topic {a} is named twice; the four topics must differ"));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser, Debug)]
    struct Cfg {
        #[command(flatten)]
        kafka: KafkaArgs,
        #[command(flatten)]
        db: PostgresArgs,
        #[command(flatten)]
        topics: TopicArgs,
    }

    #[test]
    fn secrets_are_not_printed_and_mistakes_are_named() {
        let c = Cfg::parse_from([
            "p",
            "--database-url",
            "postgres://u:hunter2@db:5432/x",
            "--kafka-option",
            "sasl.password=hunter2",
        ]);
        let shown = format!("{c:?}");
        assert!(!shown.contains("hunter2"), "{shown}");
        assert!(shown.contains("postgres://u:***@db:5432/x"));
        let c = Cfg::parse_from(["p", "--changes-topic", "vitals.signals.v1"]);
        assert!(c.topics.check().unwrap_err().contains("named twice"));
        let c = Cfg::parse_from(["p", "--db-schema", "x; drop table"]);
        assert!(c.db.check().unwrap_err().contains("--db-schema"));
        let c = Cfg::parse_from(["p", "--kafka-option", "acks"]);
        assert!(c.kafka.check().unwrap_err().contains("key=value"));
        let c = Cfg::parse_from(["p"]);
        assert!(c.kafka.check().is_ok() && c.db.check().is_ok() && c.topics.check().is_ok());
    }
}
