//! Writing the archive: failed outbox rows made dead letters. The idempotent insert and the
//! retention sweep are the store's, which owns `dead_letters` ([`insert`], [`sweep`]; see
//! [`worker_store::dead_letters`]); re-exported here under their old paths.

use serde_json::Value;
use sqlx::PgPool;
use worker_core::Failure;
use worker_store::classify;
pub use worker_store::dead_letters::{InsertReport, insert, outbox_dedup_key, sweep};
use worker_store::dead_letters::{OUTBOX_KEY_SQL, fingerprint};

use crate::record::{
    MessageProperties, NewDeadLetter, OUTBOX_FAILED, OUTBOX_QUEUE, Source, json_to_table,
    scrub_json, scrub_str,
};

/// A failed outbox row, as read for the archive.
#[derive(Debug, Clone, sqlx::FromRow)]
struct FailedOutboxRow {
    id: i64,
    message_id: String,
    message_type: Option<String>,
    content_type: Option<String>,
    correlation_id: Option<String>,
    exchange: String,
    routing_key: String,
    headers: Value,
    body: Vec<u8>,
    attempts: i32,
    last_error: Option<String>,
    retries: i32,
}

impl From<FailedOutboxRow> for NewDeadLetter {
    fn from(row: FailedOutboxRow) -> Self {
        let last_error = row.last_error.map(|e| scrub_str(&e));
        let (error_fingerprint, error_normalized) = fingerprint(last_error.as_deref());
        let properties = MessageProperties {
            content_type: row.content_type,
            correlation_id: row.correlation_id,
            message_id: Some(row.message_id.clone()),
            kind: row.message_type.clone(),
            delivery_mode: Some(2),
            ..MessageProperties::default()
        };
        let headers = scrub_json(row.headers);
        let amqp_headers = serde_json::to_value(json_to_table(&headers)).ok();
        Self {
            dedup_key: outbox_dedup_key(row.id, row.retries),
            redelivered: false,
            source: Source::Outbox,
            queue: OUTBOX_QUEUE.into(),
            dead_queue: None,
            exchange: Some(row.exchange),
            routing_key: Some(row.routing_key),
            message_id: Some(row.message_id),
            message_type: row.message_type,
            reason: OUTBOX_FAILED.into(),
            class: None,
            attempts: Some(row.attempts),
            last_error,
            error_fingerprint,
            error_normalized,
            died_at: chrono::Utc::now(),
            headers,
            amqp_headers,
            properties: serde_json::to_value(&properties).unwrap_or_default(),
            body: row.body,
            outbox_id: Some(row.id),
        }
    }
}

/// Archives up to `limit` outbox rows that ended `failed` and whose failure is not archived
/// yet (reason `outbox-failed`, queue `outbox`; idempotent per outbox id and retry, see
/// [`outbox_dedup_key`]). The outbox row itself is left as it is. Returns what was written;
/// call it until it writes fewer than `limit`.
///
/// First, an outbox row's dead letters still waiting from before an operator's `outbox retry`
/// are settled as `replayed` (the retry republished them): they no longer wait, so a
/// `dlq replay` does not send the message again beside the retry, and a row that fails again
/// shows once, with its new error.
pub async fn archive_failed_outbox(pool: &PgPool, limit: u32) -> Result<InsertReport, Failure> {
    sqlx::query(&format!(
        "UPDATE dead_letters d SET status = 'replayed', replayed_at = now() \
         FROM outbox o \
         WHERE d.queue = '{OUTBOX_QUEUE}' AND d.status = 'dead' AND d.source = 'outbox' \
           AND d.outbox_id = o.id AND d.dedup_key <> {OUTBOX_KEY_SQL}"
    ))
    .execute(pool)
    .await
    .map_err(classify)?;
    let rows: Vec<FailedOutboxRow> = sqlx::query_as(&format!(
        "SELECT o.id, o.message_id, o.message_type, o.content_type, o.correlation_id, \
                o.exchange, o.routing_key, o.headers, o.body, o.attempts, o.last_error, o.retries \
         FROM outbox o \
         WHERE o.status = 'failed' \
           AND NOT EXISTS (SELECT 1 FROM dead_letters d WHERE d.dedup_key = {OUTBOX_KEY_SQL}) \
         ORDER BY o.id LIMIT $1"
    ))
    .bind(i64::from(limit.max(1)))
    .fetch_all(pool)
    .await
    .map_err(classify)?;
    let rows: Vec<NewDeadLetter> = rows.into_iter().map(NewDeadLetter::from).collect();
    insert(pool, &rows).await
}
