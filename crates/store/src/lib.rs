//! The audit log in Postgres, owned here: the migrations, the row types and every query. The
//! processor writes through [`audit`] (one transaction per batch: offsets, transitions, pool
//! events, the endpoint-state projection, snapshots, outbox) and publishes through [`outbox`];
//! the API and the tools read through [`read`], on a read-only session from [`connect_reader`].

pub mod audit;
pub mod months;
pub mod outbox;
mod pack;
pub mod read;
pub mod uptime;

use chrono::{DateTime, Utc};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::PgPool;
use std::str::FromStr;
use std::time::Duration;
use vitals_contracts::Micros;

pub static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("../../migrations");

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("database: {0}")]
    Sql(#[from] sqlx::Error),
    #[error("migrations: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    #[error("stored engine snapshot of partition {partition} is unreadable: {message}")]
    Snapshot { partition: i32, message: String },
    #[error("partitions {0:?} were claimed by another processor (epoch changed)")]
    Fenced(Vec<i32>),
    #[error("a row's month of the audit log was dropped under the writer ({0}); retrying")]
    MonthMissing(String),
    #[error(
        "a transition or pool event of the batch is in the audit log already ({0}): a batch retried after a \
         commit that went through; writing it again as a replay"
    )]
    AlreadyWritten(String),
    #[error("the database holds a value this build does not know: {0}")]
    Corrupt(String),
    #[error(
        "schema {schema:?} is not migrated or not readable by this role ({error}); the processor creates and \
         migrates it (start vitals-processor first), and a reader role needs USAGE on the schema and SELECT \
         on its tables"
    )]
    NotMigrated { schema: String, error: sqlx::Error },
    #[error("schema {schema:?} is at migration {have:?}, this build needs {want}: upgrade the processor first")]
    TooOld {
        schema: String,
        have: Option<i64>,
        want: i64,
    },
}

impl StoreError {
    /// Connection loss, restarts, timeouts, lock waits and serialization failures go away by
    /// themselves: the work is retried. A data error (SQLSTATE class 22, e.g. "timestamp out of
    /// range"), a constraint or a privilege error (23, 42) and every decode error are permanent:
    /// the same batch would fail the same way forever.
    pub fn is_retryable(&self) -> bool {
        match self {
            StoreError::Sql(e) => sql_retryable(e),
            StoreError::MonthMissing(_) | StoreError::AlreadyWritten(_) => true,
            _ => false,
        }
    }
}

fn sql_retryable(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::Database(d) => d.code().is_some_and(|c| sqlstate_retryable(&c)),
        sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::Protocol(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::WorkerCrashed => true,
        _ => false,
    }
}

/// Classes that are transient: connection exceptions (08), transaction rollbacks such as
/// serialization failures and deadlocks (40), insufficient resources (53), lock not available
/// (55P03) and other object-state errors (55), operator intervention such as a cancelled
/// statement, an admin shutdown or an idle-session timeout (57), system errors (58).
/// Also 25P03, idle-in-transaction timeout: the server ended a session that a frozen process
/// left open (the SESSION_LIMITS below), and the batch is simply retried on a new one.
pub fn sqlstate_retryable(code: &str) -> bool {
    code == "25P03" || matches!(code.get(..2), Some("08" | "40" | "53" | "55" | "57" | "58"))
}

/// Session settings of the writer that bound every wait on the database: a frozen or
/// partitioned processor must not hold row locks (and so the next owner's claim) for longer than
/// `idle_in_transaction_session_timeout`; no statement or lock wait runs unbounded; the server
/// notices a vanished client by TCP keepalive.
const SESSION_LIMITS: [(&str, &str); 6] = [
    ("idle_in_transaction_session_timeout", "5s"),
    ("lock_timeout", "3s"),
    ("statement_timeout", "60s"),
    ("tcp_keepalives_idle", "5"),
    ("tcp_keepalives_interval", "2"),
    ("tcp_keepalives_count", "3"),
];

/// Session settings of a reader: read-only transactions, bounded statements.
const READER_LIMITS: [(&str, &str); 3] = [
    ("default_transaction_read_only", "on"),
    ("statement_timeout", "10s"),
    ("idle_in_transaction_session_timeout", "10s"),
];

/// A pool of sessions on `schema` with these session settings.
async fn pool(
    url: &str,
    schema: &str,
    settings: &[(&str, &str)],
    max_connections: u32,
    acquire_timeout: Duration,
) -> Result<PgPool, StoreError> {
    let opts = PgConnectOptions::from_str(url)?
        .options([("search_path", schema)])
        .options(settings.iter().copied());
    Ok(PgPoolOptions::new()
        .max_connections(max_connections)
        .acquire_timeout(acquire_timeout)
        .connect_with(opts)
        .await?)
}

/// The owner's pool (the processor): connect with `search_path` set to `schema`, create the
/// schema and run the migrations.
pub async fn connect_owner(url: &str, schema: &str, max_connections: u32) -> Result<PgPool, StoreError> {
    let pool = pool(url, schema, &SESSION_LIMITS, max_connections, Duration::from_secs(5)).await?;
    // Two processors starting at once race inside CREATE SCHEMA IF NOT EXISTS (a unique
    // violation on pg_namespace); the loser finds the schema there, which is all it wanted.
    if let Err(e) = sqlx::query(&format!("CREATE SCHEMA IF NOT EXISTS \"{schema}\""))
        .execute(&pool)
        .await
    {
        let raced = matches!(&e, sqlx::Error::Database(d) if matches!(d.code().as_deref(), Some("23505" | "42P06")));
        if !raced {
            return Err(e.into());
        }
    }
    MIGRATOR.run(&pool).await?;
    Ok(pool)
}

/// A reader's pool (the API, the tools): read-only sessions on `schema`, after checking that the
/// schema exists and is migrated to the version this build expects. The role needs only
/// `SELECT` on the schema's tables (docs/operations.md, "Database roles").
pub async fn connect_reader(url: &str, schema: &str, max_connections: u32) -> Result<PgPool, StoreError> {
    let db = pool(url, schema, &READER_LIMITS, max_connections, Duration::from_secs(2)).await?;
    let want = schema_version();
    let have: Option<i64> = sqlx::query_scalar("SELECT max(version) FROM _sqlx_migrations WHERE success")
        .fetch_one(&db)
        .await
        .map_err(|error| StoreError::NotMigrated {
            schema: schema.to_owned(),
            error,
        })?;
    match have {
        Some(v) if v >= want => {
            if v > want {
                tracing::warn!(
                    schema_version = v,
                    built_for = want,
                    "the schema is newer than this build"
                );
            }
            Ok(db)
        }
        have => Err(StoreError::TooOld {
            schema: schema.to_owned(),
            have,
            want,
        }),
    }
}

/// The latest migration this build knows.
pub fn schema_version() -> i64 {
    MIGRATOR.iter().map(|m| m.version).max().unwrap_or(0)
}

/// A stream time as a Postgres timestamp, clamped to years 1970..=9999 (the engine saturates
/// instead of wrapping, and a saturated time must not become a row Postgres refuses).
pub fn timestamp(us: Micros) -> DateTime<Utc> {
    const MAX_US: Micros = 253_402_300_799_999_999; // 9999-12-31T23:59:59.999999Z
    DateTime::from_timestamp_micros(us.clamp(0, MAX_US)).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn data_errors_are_permanent_and_outages_are_not() {
        assert!(!sqlstate_retryable("22008"), "datetime field overflow");
        assert!(!sqlstate_retryable("22003"), "numeric value out of range");
        assert!(!sqlstate_retryable("23505"), "unique violation");
        assert!(!sqlstate_retryable("42501"), "insufficient privilege");
        assert!(sqlstate_retryable("40001"), "serialization failure");
        assert!(sqlstate_retryable("55P03"), "lock not available");
        assert!(sqlstate_retryable("57P01"), "admin shutdown");
        assert!(sqlstate_retryable("08006"), "connection failure");
        assert!(
            sqlstate_retryable("25P03"),
            "idle-in-transaction timeout of a frozen process"
        );
        assert!(!sqlstate_retryable("25P02"), "in failed transaction");
        assert!(StoreError::Sql(sqlx::Error::PoolTimedOut).is_retryable());
        assert!(!StoreError::Fenced(vec![1]).is_retryable());
    }

    #[test]
    fn the_audit_log_accepts_exactly_the_reason_codes_of_the_contracts() {
        let sql = include_str!("../../../migrations/0012_probation_growth_reason_codes.sql");
        let sql = &sql[sql.find("CHECK").expect("a CHECK constraint")..];
        let listed: Vec<&str> = sql.split('\'').skip(1).step_by(2).collect();
        assert_eq!(listed, vitals_contracts::ReasonCode::names());
    }
}
