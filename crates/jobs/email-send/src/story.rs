//! The outbound mails of given action executions, read back for a mail's story: what was
//! sent, to whom, how many tries it took and what the SMTP server answered.

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::PgPool;
use uuid::Uuid;
use worker_core::Failure;

/// One outbound mail, as its story shows it (bodies left out).
#[derive(Debug, Clone, PartialEq, Serialize, sqlx::FromRow)]
pub struct OutboundRecord {
    pub id: Uuid,
    pub action_execution_id: Option<Uuid>,
    /// The Message-ID header, without angle brackets.
    pub message_id: String,
    pub to_addresses: Vec<String>,
    pub cc_addresses: Vec<String>,
    pub subject: String,
    /// `queued`, `sending`, `sent`, `failed`, `unknown` or `expired`.
    pub status: String,
    pub attempts: i32,
    pub last_error: Option<String>,
    /// The server's answer to the accepted mail.
    pub smtp_response: Option<String>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    pub sent_at: Option<DateTime<Utc>>,
    /// The age limit: the row's own, or, once `expired`, the one it passed (`last_error`
    /// then names which).
    pub expires_at: Option<DateTime<Utc>>,
    /// The mail an operator edited into this one.
    pub supersedes: Option<Uuid>,
    /// The operator's edit that replaced this mail.
    pub superseded_by: Option<Uuid>,
}

/// The mails queued by the executions `execution_ids`, and the copies operators edited them
/// into (followed by `superseded_by`, a key lookup each), oldest first.
pub async fn outbound_of(
    pool: &PgPool,
    execution_ids: &[Uuid],
) -> Result<Vec<OutboundRecord>, Failure> {
    if execution_ids.is_empty() {
        return Ok(Vec::new());
    }
    sqlx::query_as(
        "WITH RECURSIVE mails AS ( \
             SELECT * FROM outbound_emails WHERE action_execution_id = ANY($1) \
             UNION ALL \
             SELECT e.* FROM outbound_emails e JOIN mails m ON e.id = m.superseded_by) \
         SELECT id, action_execution_id, message_id, to_addresses, cc_addresses, subject, \
                status, attempts, last_error, smtp_response, created_at, updated_at, sent_at, \
                expires_at, supersedes, superseded_by \
         FROM mails ORDER BY created_at, id",
    )
    .bind(execution_ids)
    .fetch_all(pool)
    .await
    .map_err(worker_store::classify)
}

/// The action execution that queued the mail `id`, through the mails an operator edited it
/// from (`supersedes`, a key lookup each); `None` for a mail no execution queued.
pub async fn execution_of(pool: &PgPool, id: Uuid) -> Result<Option<Uuid>, Failure> {
    sqlx::query_scalar(
        "WITH RECURSIVE chain AS ( \
             SELECT id, supersedes, action_execution_id, 0 AS depth FROM outbound_emails \
             WHERE id = $1 \
             UNION ALL \
             SELECT e.id, e.supersedes, e.action_execution_id, c.depth + 1 \
             FROM outbound_emails e JOIN chain c ON e.id = c.supersedes WHERE c.depth < 100) \
         SELECT action_execution_id FROM chain WHERE action_execution_id IS NOT NULL LIMIT 1",
    )
    .bind(id)
    .fetch_optional(pool)
    .await
    .map_err(worker_store::classify)
}
