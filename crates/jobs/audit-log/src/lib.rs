//! # job-audit-log: other teams' audit entries, stored once each
//!
//! A [`ConsumerJob`] on the `audit.log` queue, bound to the events exchange with
//! `audit.entry` only. Each [`AuditEntry`] is inserted into `audit_log_entries` by its `id`
//! ([`store::append`]), which the table's primary key makes idempotent: a redelivered or
//! republished entry writes nothing and is counted `duplicate` (seed 000: the table's own
//! natural key, no processed-message mark). The table is append-only (a trigger refuses an
//! update); only retention (`jobs.retention.audit_log`, unset: kept) deletes from it.
//!
//! A body that is not an entry is dead-lettered `malformed` by the runner before this job
//! sees it; a database error is classified once ([`worker_store::classify`]): an outage is
//! retried in process (the runner's policy: 3 tries, 200 ms doubling), then parked or
//! returned, never dead-lettered.
//!
//! [`find`] is the search behind `worker-host audit-log find`.

pub mod settings;
pub mod store;

use sqlx::PgPool;
use worker_core::{ConsumerJob, Failure, Handled, WorkContext};
use worker_messages::AuditEntry;

pub use settings::AuditLogSettings;
pub use store::{Cursor, Search, StoredEntry, find};

/// The job's name, in logs, metrics and the attempt log.
pub const JOB_NAME: &str = "audit-log";

/// What the host needs to know of this job (its name, kind and lease).
pub const JOB: worker_core::JobSpec = worker_core::catalog::JobSpec::consumer(JOB_NAME);

/// The audit-log consumer. Input: an [`AuditEntry`].
#[derive(Debug, Clone)]
pub struct AuditLog {
    pool: PgPool,
}

impl AuditLog {
    pub fn new(pool: PgPool) -> Self {
        Self { pool }
    }
}

impl ConsumerJob for AuditLog {
    type Input = AuditEntry;

    fn name(&self) -> &str {
        JOB_NAME
    }

    #[tracing::instrument(
        name = "audit_log",
        skip_all,
        fields(entry_id = %entry.id, action = %entry.action, attempt = ctx.attempt)
    )]
    async fn handle(&self, ctx: &WorkContext, entry: &AuditEntry) -> Result<Handled, Failure> {
        if store::append(&self.pool, entry).await? {
            Ok(Handled::Done)
        } else {
            tracing::debug!("entry already stored");
            Ok(Handled::Duplicate)
        }
    }
}
