//! What the action job did for one event, read back for a mail's story: each action
//! execution with its outcome (a skip with its kind and reason, a failure with its error), and
//! the events whose answers went to one address, for the story's search by recipient.

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::PgPool;
use uuid::Uuid;
use worker_core::Failure;
use worker_store::classify;

/// One action execution, as its story shows it.
#[derive(Debug, Clone, PartialEq, Serialize, sqlx::FromRow)]
pub struct ExecutionRecord {
    pub id: Uuid,
    pub event_id: Uuid,
    pub automation_id: Uuid,
    pub action_index: i32,
    /// `send_email` or `webhook`.
    pub action_type: Option<String>,
    /// `pending`, `running`, `succeeded`, `skipped` or `failed`.
    pub status: String,
    /// `loop-guard`, `recipient-cap` or `reply-limit`, for a skip recorded with its kind.
    pub skip_kind: Option<String>,
    pub skip_reason: Option<String>,
    pub attempts: i32,
    pub last_error: Option<String>,
    pub created_at: DateTime<Utc>,
    pub finished_at: Option<DateTime<Utc>>,
}

/// The executions of the events `event_ids`, oldest first.
pub async fn executions(
    pool: &PgPool,
    event_ids: &[Uuid],
) -> Result<Vec<ExecutionRecord>, Failure> {
    sqlx::query_as(
        "SELECT id, event_id, automation_id, action_index, action ->> 'type' AS action_type, \
                status, skip_kind, skip_reason, attempts, last_error, created_at, finished_at \
         FROM action_executions WHERE event_id = ANY($1) \
         ORDER BY created_at, automation_id, action_index",
    )
    .bind(event_ids)
    .fetch_all(pool)
    .await
    .map_err(classify)
}

/// The events whose answers were addressed to `address` (to or cc, any case) between
/// `since` and `until`, newest first, at most `limit`. An operator's edited copy has no
/// execution of its own: it answers the event its original (followed through `supersedes`)
/// answered.
pub async fn events_answering(
    pool: &PgPool,
    address: &str,
    since: Option<DateTime<Utc>>,
    until: Option<DateTime<Utc>>,
    limit: u32,
) -> Result<Vec<Uuid>, Failure> {
    let address = crate::loops::bare_address(address);
    sqlx::query_scalar(
        "WITH RECURSIVE r AS ( \
             SELECT r.outbound_email_id, r.created_at FROM outbound_email_recipients r \
             WHERE r.address = $1 \
               AND ($2::timestamptz IS NULL OR r.created_at >= $2) \
               AND ($3::timestamptz IS NULL OR r.created_at < $3) \
             ORDER BY r.created_at DESC LIMIT $4), \
         answers AS ( \
             SELECT e.action_execution_id, e.supersedes FROM r \
             JOIN outbound_emails e ON e.id = r.outbound_email_id \
             UNION \
             SELECT o.action_execution_id, o.supersedes FROM answers a \
             JOIN outbound_emails o ON o.id = a.supersedes WHERE a.action_execution_id IS NULL) \
         SELECT DISTINCT x.event_id FROM answers a \
         JOIN action_executions x ON x.id = a.action_execution_id",
    )
    .bind(address)
    .bind(since)
    .bind(until)
    .bind(i64::from(limit.clamp(1, 5000)))
    .fetch_all(pool)
    .await
    .map_err(classify)
}

/// The stored inbound mail whose event led to the execution `id` (the event's data names it),
/// if the event came from a mail.
pub async fn inbound_mail_of(pool: &PgPool, id: Uuid) -> Result<Option<Uuid>, Failure> {
    let found: Option<Option<String>> = sqlx::query_scalar(
        "SELECT event -> 'data' ->> 'inbound_email_id' FROM action_executions WHERE id = $1",
    )
    .bind(id)
    .fetch_optional(pool)
    .await
    .map_err(classify)?;
    Ok(found.flatten().and_then(|id| id.parse().ok()))
}
