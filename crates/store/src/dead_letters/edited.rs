//! Dead letters settled by an operator's edit (issue 26): the ones an edit settles, locked,
//! and their status `edited`, recorded with the audit entry that holds the diff. An edited
//! row also gets `replayed_at` (when it was sent again, edited), so that the retention sweep
//! takes it like a replayed one.

use serde_json::Value;
use sqlx::PgConnection;
use worker_core::Failure;

use crate::classify;

/// A dead letter locked for an edit of its raw body.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct EditableDeadLetter {
    pub id: i64,
    pub status: String,
    pub source: String,
    pub queue: String,
    pub exchange: Option<String>,
    pub routing_key: Option<String>,
    pub message_id: Option<String>,
    pub message_type: Option<String>,
    pub reason: String,
    pub properties: Value,
    pub amqp_headers: Option<Value>,
    pub body: Vec<u8>,
    pub action_id: Option<i64>,
}

/// The dead letter `id`, locked in the caller's transaction (an edit of it and a replay or
/// another edit queue here); `None` if there is none.
pub async fn lock_for_edit(
    tx: &mut PgConnection,
    id: i64,
) -> Result<Option<EditableDeadLetter>, Failure> {
    sqlx::query_as(
        "SELECT id, status, source, queue, exchange, routing_key, message_id, message_type, \
                reason, properties, amqp_headers, body, action_id \
         FROM dead_letters WHERE id = $1 FOR UPDATE",
    )
    .bind(id)
    .fetch_optional(tx)
    .await
    .map_err(classify)
}

/// The ids of the dead letters still `dead` whose message id is `message_id` (every death of
/// one command: the first, and any replay of it that died again), locked.
pub async fn dead_of_message(tx: &mut PgConnection, message_id: &str) -> Result<Vec<i64>, Failure> {
    sqlx::query_scalar(
        "SELECT id FROM dead_letters WHERE message_id = $1 AND status = 'dead' \
         ORDER BY id FOR UPDATE",
    )
    .bind(message_id)
    .fetch_all(tx)
    .await
    .map_err(classify)
}

/// Marks the rows `ids` that are still dead `edited` by the audit entry `action_id`; how many.
pub async fn mark_edited(
    tx: &mut PgConnection,
    action_id: i64,
    ids: &[i64],
) -> Result<u64, Failure> {
    Ok(sqlx::query(
        "UPDATE dead_letters SET status = 'edited', replayed_at = now(), action_id = $1 \
         WHERE id = ANY($2) AND status = 'dead'",
    )
    .bind(action_id)
    .bind(ids)
    .execute(tx)
    .await
    .map_err(classify)?
    .rows_affected())
}

/// The status of dead letter `id`, and the audit entry that settled it (`None`: no such row).
pub async fn status_of(
    pool: &sqlx::PgPool,
    id: i64,
) -> Result<Option<(String, Option<i64>)>, Failure> {
    sqlx::query_as("SELECT status, action_id FROM dead_letters WHERE id = $1")
        .bind(id)
        .fetch_optional(pool)
        .await
        .map_err(classify)
}
