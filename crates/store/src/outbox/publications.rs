//! Each message the drain published (`publications`), read back for a mail's story: the
//! outbox's own rows are not kept once published.

use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::PgPool;
use worker_core::Failure;

use crate::classify;

/// One confirmed publish of one message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, sqlx::FromRow)]
pub struct Publication {
    pub message_id: String,
    pub routing_key: String,
    pub published_at: DateTime<Utc>,
    /// The W3C trace id it carried.
    pub trace_id: Option<String>,
}

/// The publications of `message_ids`, oldest first (a message published again, by an
/// operator's retry, has one per publish).
pub async fn publications(
    pool: &PgPool,
    message_ids: &[String],
) -> Result<Vec<Publication>, Failure> {
    if message_ids.is_empty() {
        return Ok(Vec::new());
    }
    sqlx::query_as(
        "SELECT message_id, routing_key, published_at, trace_id FROM publications \
         WHERE message_id = ANY($1) ORDER BY published_at, id",
    )
    .bind(message_ids)
    .fetch_all(pool)
    .await
    .map_err(classify)
}

/// Deletes at most `batch` publications older than `retention`, oldest first, in one
/// statement (the identity orders them by age). Returns how many went.
pub async fn sweep_publications(
    pool: &PgPool,
    retention: Duration,
    batch: u32,
) -> Result<u64, Failure> {
    let done = sqlx::query(
        "DELETE FROM publications WHERE id IN ( \
             SELECT id FROM publications \
             WHERE published_at < now() - make_interval(secs => $1) \
             ORDER BY id LIMIT $2)",
    )
    .bind(retention.as_secs_f64())
    .bind(i64::from(batch.max(1)))
    .execute(pool)
    .await
    .map_err(classify)?;
    Ok(done.rows_affected())
}
