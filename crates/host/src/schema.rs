//! The schema at start (ARCHITECTURE.md, "Schema contract"): before `run` or `migrate` touches
//! the database, whether this release may run on it, and what `/readyz` says about it.

use worker_store::schema::{self, Compatibility, SchemaError, SchemaVersion};

use crate::exit::Fatal;
use crate::version::VERSION;

/// What this release does with the database.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Plan {
    /// Every applied migration is this release's: apply `pending` (when asked to migrate).
    Migrate { pending: Vec<i64> },
    /// A newer release migrated it with expand steps only: run on it, never migrate.
    LeaveAhead,
}

/// Checks the database's migrations against this binary's; refuses a schema it must not run
/// on, with an error naming both releases. A newer schema this release still runs on is
/// reported as a warning.
pub async fn check(pool: &sqlx::PgPool) -> Result<Plan, Fatal> {
    match schema::check(pool, VERSION).await {
        Ok(Compatibility::Known { pending }) => Ok(Plan::Migrate { pending }),
        Ok(Compatibility::Ahead { unknown, release }) => {
            tracing::warn!(
                release = VERSION,
                schema_release = %release,
                ?unknown,
                "the database was migrated by release {release}, newer than this release ({VERSION}), with expand steps only: running on it without migrating"
            );
            Ok(Plan::LeaveAhead)
        }
        // Retrying cannot help until an operator deploys the newer release again; 64 also
        // keeps systemd from restarting it (RestartPreventExitStatus).
        Err(e @ SchemaError::Contracted { .. }) => Err(Fatal::usage(e)),
        // The newer release's next start records what it applied: worth retrying.
        Err(e @ SchemaError::Unrecorded { .. }) => Err(Fatal::unavailable(e)),
        // A standby may be promoted, or the settings corrected: worth retrying.
        Err(e @ (SchemaError::Standby { .. } | SchemaError::Database(_))) => {
            Err(Fatal::unavailable(e))
        }
    }
}

/// The schema as `/readyz` shows it; `None` (and a warning) when it cannot be read.
pub async fn version(pool: &sqlx::PgPool) -> Option<SchemaVersion> {
    match schema::version(pool).await {
        Ok(version) => version,
        Err(e) => {
            tracing::warn!(error = %e, "could not read the schema's version");
            None
        }
    }
}
