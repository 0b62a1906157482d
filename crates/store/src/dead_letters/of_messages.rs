//! The dead letters of given messages, for a mail's story: each hop's command is found by its
//! message id (an action execution's id, an outbound mail's id).

use sqlx::PgPool;
use worker_core::Failure;

use super::read::{DeadLetterSummary, fetch_summaries, summaries};

/// The dead letters whose message id is one of `message_ids`, oldest first.
pub async fn of_messages(
    pool: &PgPool,
    message_ids: &[String],
) -> Result<Vec<DeadLetterSummary>, Failure> {
    if message_ids.is_empty() {
        return Ok(Vec::new());
    }
    let mut q = summaries();
    q.push(" AND message_id = ANY(");
    q.push_bind(message_ids.to_vec());
    q.push(") ORDER BY died_at, id");
    fetch_summaries(pool, q).await
}
