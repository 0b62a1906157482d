//! What a stuck row becomes: its command again (a re-queue), or, given up on, the `last_error`
//! that says why and the dead letter that holds its command.

use std::time::Duration;

use chrono::Utc;
use serde_json::json;
use sqlx::PgConnection;
use uuid::Uuid;
use worker_core::Failure;
use worker_messages::{
    AUTOMATION_ACTION, ActionCommand, EMAIL_SEND, EmailSendCommand, Message, SCHEMA_VERSION_HEADER,
};
use worker_store::dead_letters::{
    self, NewDeadLetter, OUTBOX_QUEUE, Source, fingerprint_of_normalized,
};
use worker_store::outbox::OutboxMessage;

use crate::REASON;
use crate::stuck::{StuckRow, WorkKind};

/// The row's command, as its first producer wrote it (same message id, type and correlation).
pub(crate) fn command(kind: WorkKind, row: &StuckRow) -> Result<OutboxMessage, Failure> {
    let serialize = |err: serde_json::Error| Failure::permanent("serialize", err);
    let message = match kind {
        WorkKind::Execution => {
            let (Some(automation_id), Some(event_id), Some(index)) =
                (row.automation_id, row.event_id, row.action_index)
            else {
                return Err(Failure::permanent(
                    "stuck-row",
                    format!("action execution {} lacks its command's fields", row.id),
                ));
            };
            let action_index = u32::try_from(index).map_err(|_| {
                Failure::permanent("stuck-row", format!("action index {index} is negative"))
            })?;
            let command = ActionCommand {
                action_execution_id: row.id,
                automation_id,
                event_id,
                action_index,
            };
            OutboxMessage::json(row.id.to_string(), AUTOMATION_ACTION, &command)
                .map_err(serialize)?
                .with_header(SCHEMA_VERSION_HEADER, ActionCommand::VERSION)
        }
        WorkKind::Email => {
            let command = EmailSendCommand {
                outbound_email_id: row.id,
            };
            OutboxMessage::json(row.id.to_string(), EMAIL_SEND, &command)
                .map_err(serialize)?
                .with_header(SCHEMA_VERSION_HEADER, EmailSendCommand::VERSION)
        }
    };
    Ok(match row.event_id {
        Some(event_id) => message.with_correlation_id(event_id.to_string()),
        None => message,
    })
}

/// The `last_error` of a row given up on, as an operator should read it.
pub(crate) fn why(kind: WorkKind, row: &StuckRow, stuck_after: Duration) -> String {
    let mut text = format!(
        "stuck: the {kind} stayed `{}` with no command queued for it since {} (over {}s), \
         and did not finish after {} re-queues by the reconciler; given up",
        row.status,
        row.updated_at.to_rfc3339(),
        stuck_after.as_secs(),
        row.requeues
    );
    if kind == WorkKind::Email && row.status == "unknown" {
        text.push_str(" (its last send had an unknown outcome: the server may have accepted it)");
    }
    text
}

/// Writes the row's command to the dead-letter archive (the `dead_letters` shape that a failed
/// outbox row has: source `outbox`, queue `outbox`, replayed to its exchange and routing key).
pub(crate) async fn archive(
    tx: &mut PgConnection,
    kind: WorkKind,
    row: &StuckRow,
    message: &OutboxMessage,
    exchange: &str,
    routing_key: &str,
    why: &str,
) -> Result<(), Failure> {
    // The cause without what varies between rows (ids, times, counts), for the fingerprint.
    let normalized = format!(
        "stuck: the {kind} stayed <str> with no command queued for it since <ts> (over <n>s), \
         and did not finish after <n> re-queues by the reconciler; given up"
    );
    let properties = json!({
        "content_type": message.content_type,
        "correlation_id": message.correlation_id,
        "message_id": message.message_id,
        "type": message.message_type,
        "delivery_mode": 2,
    });
    let headers = json!({
        "x-dead-reason": REASON,
        "x-dead-error": why,
        "x-stuck-kind": kind.as_str(),
        "x-stuck-status": row.status,
    });
    let dead = NewDeadLetter {
        // Unique per give-up: a row replayed, stuck and given up on again is archived again.
        dedup_key: format!("reconciler:{kind}:{}:{}", row.id, Uuid::new_v4().simple()),
        redelivered: false,
        source: Source::Outbox,
        queue: OUTBOX_QUEUE.into(),
        dead_queue: None,
        exchange: Some(exchange.into()),
        routing_key: Some(routing_key.into()),
        message_id: Some(message.message_id.clone()),
        message_type: message.message_type.clone(),
        reason: REASON.into(),
        class: None,
        attempts: Some(row.attempts),
        last_error: Some(why.into()),
        error_fingerprint: fingerprint_of_normalized(&normalized),
        error_normalized: normalized,
        died_at: Utc::now(),
        headers,
        amqp_headers: None,
        properties,
        body: message.body.clone(),
        outbox_id: None,
    };
    dead_letters::insert_in(tx, std::slice::from_ref(&dead)).await?;
    Ok(())
}
