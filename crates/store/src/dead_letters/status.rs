//! An operator's purge and replay as they change dead letters: the rows a replay takes, batch
//! by batch, and the status each moves to, recorded with the audit row that moved it.

use serde_json::Value;
use sqlx::{PgConnection, QueryBuilder};
use worker_core::Failure;

use super::Filter;
use super::outbox_rows::not_retried_in_outbox_sql;
use crate::classify;

/// A dead letter as a replay republishes it.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct Replayable {
    pub id: i64,
    pub source: String,
    pub queue: String,
    pub exchange: Option<String>,
    pub routing_key: Option<String>,
    pub message_id: Option<String>,
    pub reason: String,
    pub error_fingerprint: String,
    pub properties: Value,
    pub amqp_headers: Option<Value>,
    pub headers: Value,
    pub body: Vec<u8>,
}

/// The next `take` dead rows matching `filter` after id `after`, oldest first, passing over
/// those an outbox retry has settled; locked (skipping rows another replay holds) when `lock`.
pub async fn replayable_batch(
    tx: &mut PgConnection,
    filter: &Filter,
    after: i64,
    take: u64,
    lock: bool,
) -> Result<Vec<Replayable>, Failure> {
    let mut q = QueryBuilder::new(
        "SELECT id, source, queue, exchange, routing_key, message_id, reason, error_fingerprint, \
                properties, amqp_headers, headers, body \
         FROM dead_letters WHERE status = 'dead' AND id > ",
    );
    q.push_bind(after);
    filter.push_where(&mut q);
    q.push(not_retried_in_outbox_sql());
    q.push(" ORDER BY id LIMIT ");
    q.push_bind(i64::try_from(take).unwrap_or(i64::MAX));
    if lock {
        q.push(" FOR UPDATE SKIP LOCKED");
    }
    q.build_query_as().fetch_all(tx).await.map_err(classify)
}

/// Marks the rows `ids` that are still dead `replayed` by the audit row `action_id`; how many.
pub async fn mark_replayed(
    tx: &mut PgConnection,
    action_id: i64,
    ids: &[i64],
) -> Result<u64, Failure> {
    let marked = sqlx::query(
        "UPDATE dead_letters SET status = 'replayed', replayed_at = now(), action_id = $1 \
         WHERE id = ANY($2) AND status = 'dead'",
    )
    .bind(action_id)
    .bind(ids)
    .execute(&mut *tx)
    .await
    .map_err(classify)?
    .rows_affected();
    Ok(marked)
}

/// Marks the next `take` dead rows matching `filter` `purged` by the audit row `action_id`,
/// oldest first, skipping rows another operator's run holds; how many.
pub async fn mark_purged(
    tx: &mut PgConnection,
    action_id: i64,
    filter: &Filter,
    take: u64,
) -> Result<u64, Failure> {
    let mut q = QueryBuilder::new(
        "UPDATE dead_letters SET status = 'purged', purged_at = now(), action_id = ",
    );
    q.push_bind(action_id);
    q.push(" WHERE id IN (SELECT id FROM dead_letters WHERE status = 'dead'");
    filter.push_where(&mut q);
    q.push(" ORDER BY id LIMIT ")
        .push_bind(i64::try_from(take).unwrap_or(i64::MAX));
    q.push(" FOR UPDATE SKIP LOCKED)");
    let purged = q
        .build()
        .execute(&mut *tx)
        .await
        .map_err(classify)?
        .rows_affected();
    Ok(purged)
}
