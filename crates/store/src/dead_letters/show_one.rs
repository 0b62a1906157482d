//! `dlq show ID` and the console's page of one dead letter: the row whole, its body as text
//! or in hex.

use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::Value;
use sqlx::PgPool;
use worker_core::Failure;

use super::fingerprint::hex;
use crate::classify;

/// `dlq show ID`: one dead letter, whole.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DeadLetter {
    pub id: i64,
    pub status: String,
    pub source: String,
    pub queue: String,
    pub dead_queue: Option<String>,
    pub exchange: Option<String>,
    pub routing_key: Option<String>,
    pub message_id: Option<String>,
    pub message_type: Option<String>,
    pub reason: String,
    pub class: Option<String>,
    pub attempts: Option<i32>,
    pub last_error: Option<String>,
    pub fingerprint: String,
    pub normalized_error: String,
    pub died_at: DateTime<Utc>,
    pub archived_at: DateTime<Utc>,
    pub replayed_at: Option<DateTime<Utc>>,
    pub purged_at: Option<DateTime<Utc>>,
    /// The replay or purge that settled it.
    pub action_id: Option<i64>,
    pub outbox_id: Option<i64>,
    pub headers: Value,
    pub properties: Value,
    /// The body as text when it is UTF-8.
    pub body_text: Option<String>,
    /// The body in hex when it is not.
    pub body_hex: Option<String>,
    pub body_bytes: usize,
    #[serde(skip)]
    pub body: Vec<u8>,
}

/// `dlq show ID`: the dead letter with every header, its properties and its whole body, in
/// any state; `None` if there is no such id (or the sweep deleted it).
pub async fn show_one(pool: &PgPool, id: i64) -> Result<Option<DeadLetter>, Failure> {
    #[derive(sqlx::FromRow)]
    struct Row {
        id: i64,
        status: String,
        source: String,
        queue: String,
        dead_queue: Option<String>,
        exchange: Option<String>,
        routing_key: Option<String>,
        message_id: Option<String>,
        message_type: Option<String>,
        reason: String,
        class: Option<String>,
        attempts: Option<i32>,
        last_error: Option<String>,
        error_fingerprint: String,
        error_normalized: String,
        died_at: DateTime<Utc>,
        archived_at: DateTime<Utc>,
        replayed_at: Option<DateTime<Utc>>,
        purged_at: Option<DateTime<Utc>>,
        action_id: Option<i64>,
        outbox_id: Option<i64>,
        headers: Value,
        properties: Value,
        body: Vec<u8>,
    }
    let row: Option<Row> = sqlx::query_as(
        "SELECT id, status, source, queue, dead_queue, exchange, routing_key, message_id, \
                message_type, reason, class, attempts, last_error, error_fingerprint, \
                error_normalized, died_at, archived_at, replayed_at, purged_at, action_id, \
                outbox_id, headers, properties, body \
         FROM dead_letters WHERE id = $1",
    )
    .bind(id)
    .fetch_optional(pool)
    .await
    .map_err(classify)?;
    Ok(row.map(|r| {
        let (body_text, body_hex) = match std::str::from_utf8(&r.body) {
            Ok(text) => (Some(text.to_string()), None),
            Err(_) => (None, Some(hex(&r.body))),
        };
        DeadLetter {
            id: r.id,
            status: r.status,
            source: r.source,
            queue: r.queue,
            dead_queue: r.dead_queue,
            exchange: r.exchange,
            routing_key: r.routing_key,
            message_id: r.message_id,
            message_type: r.message_type,
            reason: r.reason,
            class: r.class,
            attempts: r.attempts,
            last_error: r.last_error,
            fingerprint: r.error_fingerprint,
            normalized_error: r.error_normalized,
            died_at: r.died_at,
            archived_at: r.archived_at,
            replayed_at: r.replayed_at,
            purged_at: r.purged_at,
            action_id: r.action_id,
            outbox_id: r.outbox_id,
            headers: r.headers,
            properties: r.properties,
            body_text,
            body_hex,
            body_bytes: r.body.len(),
            body: r.body,
        }
    }))
}
