//! The action execution row: loaded and locked for a command, with the guard's mark read
//! alongside ([`load`]), and a failed try that claimed nothing added to it
//! ([`record_unclaimed_failure`]).

use std::sync::LazyLock;
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde_json::Value;
use sqlx::{PgConnection, PgPool};
use uuid::Uuid;
use worker_core::{Failure, truncate};
use worker_messages::{ActionCommand, AutomationAction, DomainEvent};
use worker_store::{ProcessedMessages, classify};

use crate::{GUARD_SCOPE, LAST_ERROR_MAX};

/// The row locked, with the guard's mark of the command read in the same round trip.
static LOAD_SQL: LazyLock<String> = LazyLock::new(|| {
    format!(
        "SELECT automation_id, event_id, action_index, action, event, status, claimed_by, \
                claimed_at, coalesce(claimed_at < now() - make_interval(secs => $2), true) AS stale, \
                {} AS marked \
         FROM action_executions WHERE id = $1 FOR UPDATE",
        ProcessedMessages::marked_sql("$3", "$4")
    )
});

/// What [`load`] found.
pub(crate) enum Loaded {
    /// The guard has seen the command: a duplicate, whatever the row says.
    Marked,
    Found(Box<Execution>),
}

/// The execution row, locked.
pub(crate) struct Execution {
    pub(crate) automation_id: Uuid,
    pub(crate) event_id: Uuid,
    pub(crate) action: AutomationAction,
    pub(crate) event: DomainEvent,
    pub(crate) status: String,
    pub(crate) claimed_by: Option<Uuid>,
    pub(crate) claimed_at: Option<DateTime<Utc>>,
    /// Whether its claim, if any, is older than the stale limit.
    pub(crate) stale: bool,
}

/// The execution row as stored.
#[derive(sqlx::FromRow)]
struct ExecutionRow {
    automation_id: Uuid,
    event_id: Uuid,
    action_index: i32,
    action: Value,
    event: Value,
    status: String,
    claimed_by: Option<Uuid>,
    claimed_at: Option<DateTime<Utc>>,
    stale: bool,
    marked: bool,
}

/// Locks the execution row and reads the guard's mark of the command, in one statement;
/// decodes the row and checks it is the one the command names.
pub(crate) async fn load(
    tx: &mut PgConnection,
    command: &ActionCommand,
    stale_after: Duration,
) -> Result<Loaded, Failure> {
    let id = command.action_execution_id;
    let row: Option<ExecutionRow> = sqlx::query_as(LOAD_SQL.as_str())
        .bind(id)
        .bind(stale_after.as_secs_f64())
        .bind(GUARD_SCOPE)
        .bind(id.to_string())
        .fetch_optional(&mut *tx)
        .await
        .map_err(classify)?;
    let Some(row) = row else {
        // No row to read the mark with: a command whose row went after it was done is still
        // a duplicate.
        if ProcessedMessages::new()
            .is_marked(tx, GUARD_SCOPE, &id.to_string())
            .await?
        {
            return Ok(Loaded::Marked);
        }
        return Err(Failure::permanent(
            "unknown-execution",
            format!(
                "no action execution {} (its automation may have been deleted)",
                command.action_execution_id
            ),
        ));
    };
    if row.marked {
        return Ok(Loaded::Marked);
    }
    let (automation_id, event_id, action_index) =
        (row.automation_id, row.event_id, row.action_index);
    if (automation_id, event_id, i64::from(action_index))
        != (
            command.automation_id,
            command.event_id,
            i64::from(command.action_index),
        )
    {
        return Err(Failure::permanent(
            "mismatched-command",
            format!(
                "the command names automation {} event {} action {}, the execution row \
                 automation {automation_id} event {event_id} action {action_index}",
                command.automation_id, command.event_id, command.action_index
            ),
        ));
    }
    let action = serde_json::from_value(row.action)
        .map_err(|err| Failure::permanent("bad-action", format!("the stored action: {err}")))?;
    let event = serde_json::from_value(row.event)
        .map_err(|err| Failure::permanent("bad-event", format!("the stored event: {err}")))?;
    Ok(Loaded::Found(Box::new(Execution {
        automation_id,
        event_id,
        action,
        event,
        status: row.status,
        claimed_by: row.claimed_by,
        claimed_at: row.claimed_at,
        stale: row.stale,
    })))
}

/// Adds a failed try that claimed nothing (a `send_email`, or a webhook before its
/// claim) to the row: `failed` for a permanent failure, unchanged status otherwise. A
/// `running` row belongs to another try and a `succeeded` one is done: both are left
/// alone. Best effort: the failure itself is what the caller returns.
pub(crate) async fn record_unclaimed_failure(pool: &PgPool, id: Uuid, failure: &Failure) {
    let recorded = sqlx::query(
        "UPDATE action_executions SET attempts = attempts + 1, last_error = $2, \
             status = CASE WHEN $3 THEN 'failed' ELSE status END, \
             finished_at = CASE WHEN $3 THEN now() ELSE finished_at END, \
             updated_at = now() \
         WHERE id = $1 AND status IN ('pending', 'failed')",
    )
    .bind(id)
    .bind(last_error(failure))
    .bind(failure.is_permanent())
    .execute(pool)
    .await;
    if let Err(err) = recorded {
        tracing::warn!(
            error = %worker_core::error_chain(&err),
            "could not record the failed try on the action execution"
        );
    }
}

/// A failure as kept in `last_error`, cut to [`LAST_ERROR_MAX`].
pub(crate) fn last_error(failure: &Failure) -> String {
    truncate(&failure.to_string(), LAST_ERROR_MAX).to_string()
}
