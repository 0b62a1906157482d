//! What is stuck: the kinds of work, the SQL that finds their stuck rows, and the count the
//! gauge reads (see the crate docs).

use std::fmt;
use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::PgPool;
use uuid::Uuid;
use worker_core::Failure;
use worker_store::classify;

/// What kind of work a row is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum WorkKind {
    /// An `action_executions` row.
    Execution,
    /// An `outbound_emails` row.
    Email,
}

impl WorkKind {
    pub const ALL: [Self; 2] = [Self::Execution, Self::Email];

    /// `execution` or `email`: the gauge's `kind` label.
    pub const fn as_str(&self) -> &'static str {
        match self {
            Self::Execution => "execution",
            Self::Email => "email",
        }
    }

    /// The rows of this kind that are stuck, as `FROM … WHERE …` over alias `w`, with `$1`
    /// the threshold in seconds: unfinished, unchanged that long, and with no command of
    /// theirs waiting in the outbox.
    pub(crate) fn stuck_rows(&self) -> String {
        let (table, finished) = match self {
            Self::Execution => ("action_executions", "'succeeded', 'skipped', 'failed'"),
            Self::Email => ("outbound_emails", "'sent', 'failed', 'expired', 'bounced'"),
        };
        format!(
            "FROM {table} w \
             WHERE w.status NOT IN ({finished}) \
               AND w.updated_at < now() - make_interval(secs => $1) \
               AND NOT {}",
            worker_store::outbox::pending_command_sql("w.id::text")
        )
    }
}

impl fmt::Display for WorkKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How many rows are stuck now, by kind.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StuckCounts {
    pub executions: u64,
    pub emails: u64,
}

impl StuckCounts {
    pub fn get(&self, kind: WorkKind) -> u64 {
        match kind {
            WorkKind::Execution => self.executions,
            WorkKind::Email => self.emails,
        }
    }
}

/// Counts the stuck rows of each kind (see the crate docs): what the gauge and the alert read.
pub async fn count_stuck(pool: &PgPool, stuck_after: Duration) -> Result<StuckCounts, Failure> {
    let (executions, emails): (i64, i64) = sqlx::query_as(&format!(
        "SELECT (SELECT count(*) {}), (SELECT count(*) {})",
        WorkKind::Execution.stuck_rows(),
        WorkKind::Email.stuck_rows()
    ))
    .bind(stuck_after.as_secs_f64())
    .fetch_one(pool)
    .await
    .map_err(classify)?;
    Ok(StuckCounts {
        executions: u64::try_from(executions).unwrap_or_default(),
        emails: u64::try_from(emails).unwrap_or_default(),
    })
}

/// A stuck row, as a batch reads it.
#[derive(Debug, Clone, sqlx::FromRow)]
pub(crate) struct StuckRow {
    pub(crate) id: Uuid,
    pub(crate) status: String,
    pub(crate) attempts: i32,
    pub(crate) requeues: i32,
    pub(crate) updated_at: DateTime<Utc>,
    /// The event the work came from: the command's correlation id.
    pub(crate) event_id: Option<Uuid>,
    /// Executions only: the rest of the command.
    pub(crate) automation_id: Option<Uuid>,
    pub(crate) action_index: Option<i32>,
}

pub(crate) fn table(kind: WorkKind) -> &'static str {
    match kind {
        WorkKind::Execution => "action_executions",
        WorkKind::Email => "outbound_emails",
    }
}
