//! Dead letters of outbox rows, where the two tables meet: how such a dead letter is keyed,
//! which failed rows wait to be archived, which dead letters an operator's `outbox retry` has
//! settled, and which a replay must pass over, and the outbox row a replay settles.

use sqlx::{PgConnection, PgPool};
use worker_core::Failure;

use super::row::OUTBOX_QUEUE;
use crate::classify;
use crate::outbox::OutboxRow;

/// The archive key of an outbox row's failure: `outbox:<id>` for the first, then
/// `outbox:<id>:<retries>` for each failure after an operator's `outbox retry`.
/// [`OUTBOX_KEY_SQL`] is the same in SQL, over an `outbox` aliased `o`.
pub fn outbox_dedup_key(id: i64, retries: i32) -> String {
    if retries == 0 {
        format!("outbox:{id}")
    } else {
        format!("outbox:{id}:{retries}")
    }
}

/// A condition on `dead_letters`: not a dead letter of an outbox row that an operator has
/// retried since (`outbox retry`; the drain publishes it again), nor of one that is gone (the
/// drain deletes a row once it is published, so a row that failed and is gone was published
/// since), which a replay must not send a second time. The archive's maintenance settles such
/// rows `replayed` ([`settle_retried`]); this keeps a replay that runs before it from sending
/// them.
pub fn not_retried_in_outbox_sql() -> String {
    format!(
        " AND NOT (dead_letters.source = 'outbox' AND dead_letters.outbox_id IS NOT NULL \
             AND NOT EXISTS (SELECT 1 FROM outbox o WHERE o.id = dead_letters.outbox_id \
                             AND dead_letters.dedup_key = {OUTBOX_KEY_SQL}))"
    )
}

/// [`outbox_dedup_key`] in SQL, over an `outbox` aliased `o`.
pub const OUTBOX_KEY_SQL: &str =
    "CASE WHEN o.retries = 0 THEN 'outbox:' || o.id ELSE 'outbox:' || o.id || ':' || o.retries END";

/// A failed outbox row whose failure is not archived yet ([`failed_unarchived`]): the row as
/// the drain reads it, with its last error and its operator retries.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct FailedOutboxRow {
    #[sqlx(flatten)]
    pub row: OutboxRow,
    pub last_error: Option<String>,
    pub retries: i32,
}

/// Up to `limit` outbox rows that ended `failed` and whose failure is not archived yet (no
/// dead letter under its [`outbox_dedup_key`]), in id order.
pub async fn failed_unarchived(pool: &PgPool, limit: u32) -> Result<Vec<FailedOutboxRow>, Failure> {
    sqlx::query_as(&format!(
        "SELECT o.id, o.message_id, o.message_type, o.content_type, o.correlation_id, \
                o.exchange, o.routing_key, o.headers, o.body, o.created_at, o.attempts, \
                o.last_error, o.retries \
         FROM outbox o \
         WHERE o.status = 'failed' \
           AND NOT EXISTS (SELECT 1 FROM dead_letters d WHERE d.dedup_key = {OUTBOX_KEY_SQL}) \
         ORDER BY o.id LIMIT $1"
    ))
    .bind(i64::from(limit.max(1)))
    .fetch_all(pool)
    .await
    .map_err(classify)
}

/// Settles as `replayed` the dead letters of outbox rows still waiting from before an
/// operator's `outbox retry` (the retry republished them, or is about to), and of rows gone
/// since (published, then deleted by the drain), so that a `dlq replay` does not send the
/// message again beside the retry. Returns how many.
pub async fn settle_retried(pool: &PgPool) -> Result<u64, Failure> {
    let done = sqlx::query(&format!(
        "UPDATE dead_letters d SET status = 'replayed', replayed_at = now() \
         WHERE d.queue = '{OUTBOX_QUEUE}' AND d.status = 'dead' AND d.source = 'outbox' \
           AND d.outbox_id IS NOT NULL \
           AND NOT EXISTS (SELECT 1 FROM outbox o \
                           WHERE o.id = d.outbox_id AND d.dedup_key = {OUTBOX_KEY_SQL})"
    ))
    .execute(pool)
    .await
    .map_err(classify)?;
    Ok(done.rows_affected())
}

/// Deletes the failed outbox rows of the dead letters `ids` that a replay has just published,
/// in the replay's transaction, as the drain deletes what it published: `outbox retry
/// --all-failed` must not publish them once more.
pub async fn settle_replayed_outbox(tx: &mut PgConnection, ids: &[i64]) -> Result<(), Failure> {
    sqlx::query(
        "DELETE FROM outbox \
         WHERE status = 'failed' AND id IN ( \
             SELECT outbox_id FROM dead_letters \
             WHERE id = ANY($1) AND source = 'outbox' AND outbox_id IS NOT NULL)",
    )
    .bind(ids)
    .execute(tx)
    .await
    .map_err(classify)?;
    Ok(())
}
