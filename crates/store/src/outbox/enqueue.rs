//! Writing into the outbox: a message, inside the caller's transaction, announced on commit.

use std::collections::HashMap;
use std::fmt;
use std::sync::LazyLock;

use serde::Serialize;
use serde_json::{Map, Value};
use sqlx::PgConnection;
use tracing_opentelemetry::OpenTelemetrySpanExt;
use worker_core::Failure;

use crate::classify;

/// The `LISTEN`/`NOTIFY` channel a committed outbox row is announced on.
pub const CHANNEL: &str = "outbox";

/// The W3C header that carries the trace and parent span ids.
pub const TRACEPARENT: &str = "traceparent";

/// A message to put in the outbox.
#[derive(Clone, PartialEq)]
pub struct OutboxMessage {
    /// The message id consumers dedup on: unique per logical message, stable across retries.
    pub message_id: String,
    /// The AMQP `type` property (`email.received`, `automation.action.execute`).
    pub message_type: Option<String>,
    pub content_type: Option<String>,
    pub correlation_id: Option<String>,
    /// Application headers: strings, numbers and booleans. The trace context of the
    /// enqueuing span is added by [`enqueue`] unless a `traceparent` is already here.
    pub headers: Map<String, Value>,
    pub body: Vec<u8>,
}

impl fmt::Debug for OutboxMessage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OutboxMessage")
            .field("message_id", &self.message_id)
            .field("message_type", &self.message_type)
            .field("content_type", &self.content_type)
            .field("correlation_id", &self.correlation_id)
            .field("headers", &self.headers)
            .field("bytes", &self.body.len())
            .finish()
    }
}

impl OutboxMessage {
    /// A message with `body` as is and no type.
    pub fn new(message_id: impl Into<String>, body: impl Into<Vec<u8>>) -> Self {
        Self {
            message_id: message_id.into(),
            message_type: None,
            content_type: None,
            correlation_id: None,
            headers: Map::new(),
            body: body.into(),
        }
    }

    /// A JSON message of type `message_type`.
    pub fn json<T: Serialize + ?Sized>(
        message_id: impl Into<String>,
        message_type: impl Into<String>,
        value: &T,
    ) -> Result<Self, serde_json::Error> {
        let mut message = Self::new(message_id, serde_json::to_vec(value)?);
        message.message_type = Some(message_type.into());
        message.content_type = Some("application/json".into());
        Ok(message)
    }

    #[must_use]
    pub fn with_type(mut self, message_type: impl Into<String>) -> Self {
        self.message_type = Some(message_type.into());
        self
    }

    #[must_use]
    pub fn with_content_type(mut self, content_type: impl Into<String>) -> Self {
        self.content_type = Some(content_type.into());
        self
    }

    #[must_use]
    pub fn with_correlation_id(mut self, correlation_id: impl Into<String>) -> Self {
        self.correlation_id = Some(correlation_id.into());
        self
    }

    /// Adds an application header (a string, number or boolean; other JSON values are
    /// published as their JSON text).
    #[must_use]
    pub fn with_header(mut self, key: impl Into<String>, value: impl Into<Value>) -> Self {
        self.headers.insert(key.into(), value.into());
        self
    }

    /// The headers to store: the message's own, plus the current trace context unless they
    /// carry one already. For a caller that writes the row itself ([`INSERT_INTO`]), or later
    /// than, or outside, the span that should start its trace (the poller's batch).
    pub fn stored_headers(&self) -> Value {
        let mut headers = self.headers.clone();
        if !headers.contains_key(TRACEPARENT) {
            for (key, value) in current_trace_context() {
                headers.entry(key).or_insert(Value::String(value));
            }
        }
        Value::Object(headers)
    }
}

/// The current span's trace context as W3C headers (`traceparent`, `tracestate`), through
/// the global OpenTelemetry propagator; empty when no propagator or no OpenTelemetry layer
/// is installed.
pub fn current_trace_context() -> HashMap<String, String> {
    let cx = tracing::Span::current().context();
    let mut carrier = HashMap::new();
    opentelemetry::global::get_text_map_propagator(|p| p.inject_context(&cx, &mut carrier));
    carrier
}

/// The head of an outbox row's insert, for a caller that writes the row as a CTE of the
/// statement that writes the effect it announces; its columns take the message's
/// `message_id`, `message_type`, `content_type`, `correlation_id`, the exchange, the routing
/// key, [`OutboxMessage::stored_headers`] and the body, in that order.
pub const INSERT_INTO: &str = "INSERT INTO outbox (message_id, message_type, content_type, \
     correlation_id, exchange, routing_key, headers, body)";

/// Writes `message` into the outbox inside the caller's transaction; the table's trigger
/// announces it on [`CHANNEL`] (delivered on commit only). Returns the row id.
///
/// Nothing is published unless the transaction commits.
pub async fn enqueue(
    tx: &mut PgConnection,
    exchange: &str,
    routing_key: &str,
    message: &OutboxMessage,
) -> Result<i64, Failure> {
    static ONE: LazyLock<String> = LazyLock::new(|| {
        format!("{INSERT_INTO} VALUES ($1, $2, $3, $4, $5, $6, $7, $8) RETURNING id")
    });
    let id: i64 = sqlx::query_scalar(ONE.as_str())
        .bind(&message.message_id)
        .bind(&message.message_type)
        .bind(&message.content_type)
        .bind(&message.correlation_id)
        .bind(exchange)
        .bind(routing_key)
        .bind(message.stored_headers())
        .bind(&message.body)
        .fetch_one(&mut *tx)
        .await
        .map_err(classify)?;
    Ok(id)
}

/// Writes many messages to one exchange and routing key in one statement, inside the
/// caller's transaction; the table's trigger announces them once. Returns the row ids in input order.
pub async fn enqueue_many(
    tx: &mut PgConnection,
    exchange: &str,
    routing_key: &str,
    messages: &[OutboxMessage],
) -> Result<Vec<i64>, Failure> {
    if messages.is_empty() {
        return Ok(Vec::new());
    }
    let ids: Vec<&str> = messages.iter().map(|m| m.message_id.as_str()).collect();
    let types: Vec<Option<&str>> = messages.iter().map(|m| m.message_type.as_deref()).collect();
    let content_types: Vec<Option<&str>> =
        messages.iter().map(|m| m.content_type.as_deref()).collect();
    let correlations: Vec<Option<&str>> = messages
        .iter()
        .map(|m| m.correlation_id.as_deref())
        .collect();
    let headers: Vec<Value> = messages.iter().map(OutboxMessage::stored_headers).collect();
    let bodies: Vec<&[u8]> = messages.iter().map(|m| m.body.as_slice()).collect();
    static MANY: LazyLock<String> = LazyLock::new(|| {
        format!(
            "{INSERT_INTO} \
         SELECT m.id, m.kind, m.content_type, m.correlation_id, $5, $6, m.headers, m.body \
         FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $7::jsonb[], $8::bytea[]) \
              WITH ORDINALITY AS m(id, kind, content_type, correlation_id, headers, body, n) \
         ORDER BY m.n \
         RETURNING id"
        )
    });
    let rows: Vec<i64> = sqlx::query_scalar(MANY.as_str())
        .bind(&ids)
        .bind(&types)
        .bind(&content_types)
        .bind(&correlations)
        .bind(exchange)
        .bind(routing_key)
        .bind(&headers)
        .bind(&bodies)
        .fetch_all(&mut *tx)
        .await
        .map_err(classify)?;
    // Identity values are drawn in the order the rows are inserted, which is `n`.
    let mut rows = rows;
    rows.sort_unstable();
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_messages_carry_their_type_and_content_type() {
        let m = OutboxMessage::json("m-1", "email.received", &serde_json::json!({"a": 1}))
            .unwrap()
            .with_correlation_id("c-1")
            .with_header("tenant", "acme");
        assert_eq!(m.message_type.as_deref(), Some("email.received"));
        assert_eq!(m.content_type.as_deref(), Some("application/json"));
        assert_eq!(m.body, br#"{"a":1}"#);
        assert_eq!(m.headers.get("tenant"), Some(&Value::from("acme")));
        assert!(format!("{m:?}").contains("bytes: 7"));
    }

    #[test]
    fn a_traceparent_given_by_the_caller_is_kept() {
        let m = OutboxMessage::new("m", b"x".to_vec()).with_header(TRACEPARENT, "00-given");
        let stored = m.stored_headers();
        assert_eq!(stored[TRACEPARENT], "00-given");
    }
}
