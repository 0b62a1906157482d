//! Writing the archive: failed outbox rows made dead letters (read through the store, made
//! rows here, where their headers are turned into AMQP ones). The idempotent insert and the
//! retention sweep are the store's, which owns `dead_letters` ([`insert`], [`sweep`]; see
//! [`worker_store::dead_letters`]); re-exported here under their old paths.

use sqlx::PgPool;
use worker_core::Failure;
use worker_store::dead_letters::{FailedOutboxRow, failed_unarchived, fingerprint, settle_retried};
pub use worker_store::dead_letters::{InsertReport, insert, outbox_dedup_key, sweep};

use crate::headers::{json_to_table, scrub_json, scrub_str};
use crate::record::{MessageProperties, NewDeadLetter, OUTBOX_FAILED, OUTBOX_QUEUE, Source};

/// The dead letter of a failed outbox row: its JSON headers kept readable and, typed, for a
/// replay.
fn dead_letter_of(failed: FailedOutboxRow) -> NewDeadLetter {
    let FailedOutboxRow {
        row,
        last_error,
        retries,
    } = failed;
    let last_error = last_error.map(|e| scrub_str(&e));
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
    NewDeadLetter {
        dedup_key: outbox_dedup_key(row.id, retries),
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
    settle_retried(pool).await?;
    let rows = failed_unarchived(pool, limit).await?;
    let rows: Vec<NewDeadLetter> = rows.into_iter().map(dead_letter_of).collect();
    insert(pool, &rows).await
}
