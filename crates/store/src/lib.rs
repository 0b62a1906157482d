//! The PostgreSQL adapter: the connection pool (on the member of a list that takes writes,
//! following it when a standby is promoted: [`primary`]), the embedded migrations, the
//! processed-message guard and the singleton lease for timer jobs, the outbox, the attempt log
//! and the dead-letter archive's table ([`dead_letters`]: its row, fingerprint and readings),
//! and what operators act through: the audit trail, job pauses, the replicas' reports, and the
//! operators' accounts and console sessions; and the schema's contract ([`schema`]): which
//! release migrated the database, and whether this binary may run on it.
//!
//! The statements on the tables shared by several crates live here (ARCHITECTURE.md, "Who
//! owns each table"); a job crate writes statements only on the tables of its own job, and
//! takes a pool or a transaction (sqlx's types) to call this crate with. The jobs see the core
//! traits ([`worker_core::ProcessedGuard`], [`worker_core::SingletonLease`]) and this crate's
//! concrete types. Database errors are classified once, in [`classify`], into the core's
//! transient or permanent failures.

mod classify;
mod guard;
pub mod lease;
mod pool;
pub mod primary;

pub use classify::{classify, classify_sqlx};
pub use guard::ProcessedMessages;
pub use lease::{AdvisoryLease, KeepAlive, LeaseGuard};
pub use pool::{
    ConnectError, Connected, PING_IF_IDLE_FOR, PoolOptions, Redacted, SLOW_STATEMENT, connect,
    connect_watched,
};
pub use primary::{Member, PrimaryStatus, PrimaryWatch};
pub use schema::migrate;

/// The migrations in `migrations/` at the workspace root, embedded in the binary.
pub static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("../../migrations");

/// The transaction type the adapters hand to jobs.
pub type Tx = sqlx::Transaction<'static, sqlx::Postgres>;

pub mod attempt_log;
pub mod audit;
pub mod circuits;
pub mod dead_letters;
pub mod history;
pub mod migration_rules;
pub mod operators;
pub mod outbox;
pub mod pauses;
pub mod privacy;
pub mod replicas;
pub mod schema;
pub mod sessions;

pub use attempt_log::{AttemptLog, AttemptLogSettings, AttemptLogWriter, AttemptRecord};
pub use outbox::{OutboxMessage, OutboxRow, OutboxStatus};
