//! The transactional outbox: a message is written into a row inside the caller's
//! transaction, so that it is published if and only if that transaction commits.
//!
//! A job that changes the database and must also publish a message calls [`enqueue`] with the
//! transaction that makes its change. The row carries the message id, type, content type,
//! headers (with the W3C trace context of the enqueuing span) and body. The same transaction
//! sends a `NOTIFY` on [`CHANNEL`]; PostgreSQL delivers notifications only on commit, so the
//! drain is woken exactly when there is something to publish, and never by a rollback.
//!
//! The outbox drain job (crate `job-outbox-drain`) owns the other half:
//!
//! 1. [`claim`] locks up to `limit` due rows (`status = 'pending'` and
//!    `next_attempt_at <= now()`) in id order with `FOR UPDATE SKIP LOCKED`, so that replicas
//!    draining together take disjoint batches without a lease;
//! 2. it publishes them with confirms;
//! 3. [`mark_processed`] marks the confirmed ones by id, in one statement, and
//!    [`record_failures`] adds an attempt to the others with a backoff, or marks them
//!    `failed` with their last error once they have had their maximum attempts;
//! 4. it commits. A crash between the publish and the commit leaves the rows pending, so they
//!    are published again (at least once); consumers dedup on the message id.
//!
//! For operators: [`status`] (pending, due, failed, age of the oldest pending row),
//! [`failed`] and [`pending`] (the rows, with their errors), [`retry`], [`retry_failed`] and
//! [`retry_all_failed`] (make failed rows pending again, with fresh attempts, recorded in the
//! [`audit`](crate::audit) trail; [`retry_all_failed_dry_run`] counts and lists what a retry of
//! them all would put back, recorded as a dry run), and [`purge_processed`] (the retention
//! sweep).

use std::collections::HashMap;
use std::fmt;
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::{Map, Value};
use sqlx::{PgConnection, PgPool};
use tracing_opentelemetry::OpenTelemetrySpanExt;
use worker_core::Failure;

use crate::audit::{self, ActionKind, Actor, NewAction};
use crate::classify;
use worker_core::truncate;

/// The `LISTEN`/`NOTIFY` channel a committed outbox row is announced on.
pub const CHANNEL: &str = "outbox";

/// The W3C header that carries the trace and parent span ids.
pub const TRACEPARENT: &str = "traceparent";

/// The longest `last_error` kept on a row, in bytes.
pub const LAST_ERROR_MAX: usize = 2048;

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
    /// carry one already.
    fn stored_headers(&self) -> Value {
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

/// Writes `message` into the outbox inside the caller's transaction and announces it on
/// [`CHANNEL`] (delivered on commit only). Returns the row id.
///
/// Nothing is published unless the transaction commits.
pub async fn enqueue(
    tx: &mut PgConnection,
    exchange: &str,
    routing_key: &str,
    message: &OutboxMessage,
) -> Result<i64, Failure> {
    let id: i64 = sqlx::query_scalar(
        "INSERT INTO outbox (message_id, message_type, content_type, correlation_id, \
                             exchange, routing_key, headers, body) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8) RETURNING id",
    )
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
    notify(tx).await?;
    Ok(id)
}

/// Writes many messages to one exchange and routing key in one statement, inside the
/// caller's transaction, and announces them once. Returns the row ids in input order.
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
    let rows: Vec<i64> = sqlx::query_scalar(
        "INSERT INTO outbox (message_id, message_type, content_type, correlation_id, \
                             exchange, routing_key, headers, body) \
         SELECT m.id, m.kind, m.content_type, m.correlation_id, $5, $6, m.headers, m.body \
         FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $7::jsonb[], $8::bytea[]) \
              WITH ORDINALITY AS m(id, kind, content_type, correlation_id, headers, body, n) \
         ORDER BY m.n \
         RETURNING id",
    )
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
    notify(tx).await?;
    // Identity values are drawn in the order the rows are inserted, which is `n`.
    let mut rows = rows;
    rows.sort_unstable();
    Ok(rows)
}

/// `NOTIFY outbox` inside `tx`. PostgreSQL folds identical notifications of one transaction
/// into one, so a transaction that enqueues many rows wakes the drain once.
async fn notify(tx: &mut PgConnection) -> Result<(), Failure> {
    sqlx::query("SELECT pg_notify($1, '')")
        .bind(CHANNEL)
        .execute(tx)
        .await
        .map_err(classify)?;
    Ok(())
}

/// A claimed row, locked by the claiming transaction until it commits or rolls back.
#[derive(Clone, PartialEq, sqlx::FromRow)]
pub struct OutboxRow {
    pub id: i64,
    pub message_id: String,
    pub message_type: Option<String>,
    pub content_type: Option<String>,
    pub correlation_id: Option<String>,
    pub exchange: String,
    pub routing_key: String,
    pub headers: Value,
    pub body: Vec<u8>,
    pub created_at: DateTime<Utc>,
    /// Failed attempts so far.
    pub attempts: i32,
}

impl fmt::Debug for OutboxRow {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OutboxRow")
            .field("id", &self.id)
            .field("message_id", &self.message_id)
            .field("message_type", &self.message_type)
            .field("exchange", &self.exchange)
            .field("routing_key", &self.routing_key)
            .field("attempts", &self.attempts)
            .field("bytes", &self.body.len())
            .finish_non_exhaustive()
    }
}

/// Locks up to `limit` due pending rows in id order, skipping rows another transaction holds
/// (`FOR UPDATE SKIP LOCKED`). The rows stay locked until `tx` ends.
pub async fn claim(tx: &mut PgConnection, limit: u32) -> Result<Vec<OutboxRow>, Failure> {
    sqlx::query_as(
        "SELECT id, message_id, message_type, content_type, correlation_id, exchange, \
                routing_key, headers, body, created_at, attempts \
         FROM outbox \
         WHERE status = 'pending' AND next_attempt_at <= now() \
         ORDER BY id \
         LIMIT $1 \
         FOR UPDATE SKIP LOCKED",
    )
    .bind(i64::from(limit))
    .fetch_all(tx)
    .await
    .map_err(classify)
}

/// Marks the rows `ids` processed, in one statement. Returns how many were marked.
pub async fn mark_processed(tx: &mut PgConnection, ids: &[i64]) -> Result<u64, Failure> {
    if ids.is_empty() {
        return Ok(0);
    }
    let done = sqlx::query(
        "UPDATE outbox SET status = 'processed', processed_at = now() \
         WHERE id = ANY($1) AND status = 'pending'",
    )
    .bind(ids)
    .execute(tx)
    .await
    .map_err(classify)?;
    Ok(done.rows_affected())
}

/// One row's failed publish.
#[derive(Debug, Clone, PartialEq)]
pub struct PublishFailure {
    pub id: i64,
    /// Why, as an operator should read it (truncated to [`LAST_ERROR_MAX`] bytes).
    pub error: String,
    /// How long to wait before the next attempt, if there is one.
    pub retry_in: Duration,
}

/// What [`record_failures`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct FailureCounts {
    /// Rows with an attempt added, pending again after their backoff.
    pub retrying: u64,
    /// Rows that had their last attempt: now `failed`.
    pub failed: u64,
}

/// Adds an attempt to each row in `failures` and records its error, in one statement: a row
/// that has now had `max_attempts` attempts becomes `failed`; the others stay pending until
/// `now() + retry_in`.
pub async fn record_failures(
    tx: &mut PgConnection,
    failures: &[PublishFailure],
    max_attempts: u32,
) -> Result<FailureCounts, Failure> {
    if failures.is_empty() {
        return Ok(FailureCounts::default());
    }
    let ids: Vec<i64> = failures.iter().map(|f| f.id).collect();
    let errors: Vec<String> = failures
        .iter()
        .map(|f| truncate(&f.error, LAST_ERROR_MAX).to_string())
        .collect();
    let delays: Vec<f64> = failures.iter().map(|f| f.retry_in.as_secs_f64()).collect();
    let max_attempts = i32::try_from(max_attempts.max(1)).unwrap_or(i32::MAX);
    let statuses: Vec<String> = sqlx::query_scalar(
        "UPDATE outbox AS o SET \
             attempts = o.attempts + 1, \
             last_error = f.error, \
             status = CASE WHEN o.attempts + 1 >= $4 THEN 'failed' ELSE 'pending' END, \
             next_attempt_at = now() + make_interval(secs => f.delay) \
         FROM unnest($1::bigint[], $2::text[], $3::float8[]) AS f(id, error, delay) \
         WHERE o.id = f.id AND o.status = 'pending' \
         RETURNING o.status",
    )
    .bind(&ids)
    .bind(&errors)
    .bind(&delays)
    .bind(max_attempts)
    .fetch_all(tx)
    .await
    .map_err(classify)?;
    let failed = statuses.iter().filter(|s| s.as_str() == "failed").count() as u64;
    Ok(FailureCounts {
        retrying: statuses.len() as u64 - failed,
        failed,
    })
}

/// The outbox at a glance, for `worker-host outbox status` and the metrics.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct OutboxStatus {
    /// Rows waiting to be published (due now or backing off).
    pub pending: i64,
    /// Pending rows backing off after a failed attempt.
    pub retrying: i64,
    /// Rows that gave up; replay them with [`retry`] or [`retry_all_failed`].
    pub failed: i64,
    /// How long the oldest pending row has waited; `None` when nothing is pending.
    #[serde(with = "optional_duration")]
    pub oldest_pending_age: Option<Duration>,
}

mod optional_duration {
    use std::time::Duration;

    use serde::Serializer;

    pub fn serialize<S: Serializer>(value: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
        match value {
            Some(d) => s.serialize_some(&d.as_secs_f64()),
            None => s.serialize_none(),
        }
    }
}

/// Counts pending and failed rows and measures the age of the oldest pending one.
pub async fn status(pool: &PgPool) -> Result<OutboxStatus, Failure> {
    let (pending, retrying, oldest): (i64, i64, Option<f64>) = sqlx::query_as(
        "SELECT count(*), count(*) FILTER (WHERE attempts > 0), \
                extract(epoch FROM now() - min(created_at))::float8 \
         FROM outbox WHERE status = 'pending'",
    )
    .fetch_one(pool)
    .await
    .map_err(classify)?;
    let failed: i64 = sqlx::query_scalar("SELECT count(*) FROM outbox WHERE status = 'failed'")
        .fetch_one(pool)
        .await
        .map_err(classify)?;
    Ok(OutboxStatus {
        pending,
        retrying,
        failed,
        oldest_pending_age: oldest.map(|s| Duration::from_secs_f64(s.max(0.0))),
    })
}

/// A row that gave up, as an operator sees it.
#[derive(Debug, Clone, PartialEq, Serialize, sqlx::FromRow)]
pub struct FailedRow {
    pub id: i64,
    pub message_id: String,
    pub message_type: Option<String>,
    pub exchange: String,
    pub routing_key: String,
    pub attempts: i32,
    pub last_error: Option<String>,
    pub created_at: DateTime<Utc>,
}

/// The failed rows, oldest first, at most `limit`.
pub async fn failed(pool: &PgPool, limit: u32) -> Result<Vec<FailedRow>, Failure> {
    sqlx::query_as(
        "SELECT id, message_id, message_type, exchange, routing_key, attempts, last_error, \
                created_at \
         FROM outbox WHERE status = 'failed' ORDER BY id LIMIT $1",
    )
    .bind(i64::from(limit))
    .fetch_all(pool)
    .await
    .map_err(classify)
}

/// What [`retry`] did with the row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RetryResult {
    /// The row is pending again, due now, with its attempts reset.
    Requeued,
    /// It was published already; nothing to do.
    AlreadyProcessed,
    /// No row has that id (never existed, or swept by retention).
    NotFound,
}

/// Makes row `id` pending again, due now, with its attempts reset (its last error is kept
/// until the next attempt), and wakes the drain. A pending row is made due now. A failed row
/// has its `retries` counted up, so that a second failure is archived as a failure of its own.
/// Recorded in the audit trail with `actor`, whatever it found.
pub async fn retry(pool: &PgPool, id: i64, actor: &Actor) -> Result<RetryResult, Failure> {
    let mut tx = pool.begin().await.map_err(classify)?;
    let status: Option<String> =
        sqlx::query_scalar("SELECT status FROM outbox WHERE id = $1 FOR UPDATE")
            .bind(id)
            .fetch_optional(&mut *tx)
            .await
            .map_err(classify)?;
    let result = match status.as_deref() {
        None => RetryResult::NotFound,
        Some("processed") => RetryResult::AlreadyProcessed,
        Some(_) => {
            // A failed row starts a new life: counted, so that its next failure is archived
            // as a dead letter of its own.
            sqlx::query(
                "UPDATE outbox SET status = 'pending', attempts = 0, next_attempt_at = now(), \
                        retries = retries + CASE WHEN status = 'failed' THEN 1 ELSE 0 END \
                 WHERE id = $1",
            )
            .bind(id)
            .execute(&mut *tx)
            .await
            .map_err(classify)?;
            notify(&mut tx).await?;
            RetryResult::Requeued
        }
    };
    let note = match result {
        RetryResult::Requeued => None,
        RetryResult::AlreadyProcessed => Some("already published".to_string()),
        RetryResult::NotFound => Some("no such row".to_string()),
    };
    let target = serde_json::json!({ "outbox_id": id });
    let requeued = u64::from(result == RetryResult::Requeued);
    audit::record(
        &mut tx,
        &NewAction::new(ActionKind::OutboxRetry, actor, target),
        requeued,
        0,
        note,
    )
    .await?;
    tx.commit().await.map_err(classify)?;
    Ok(result)
}

/// The failed rows a dry run of [`retry_failed`] lists by default.
pub const RETRY_PREVIEW_ROWS: u32 = 20;

/// What a retry of every failed row did, or, dry, would do.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RetryAllReport {
    /// Its audit row (a dry run has one too).
    pub action_id: i64,
    pub dry_run: bool,
    /// Failed rows a dry run found, or the rows a retry put back.
    pub matched: u64,
    /// Rows made pending again (none for a dry run).
    pub requeued: u64,
    /// A dry run's first failed rows, oldest first: the ones a retry puts back first.
    pub rows: Vec<FailedRow>,
    /// Failed rows left failed beyond the count the operator confirmed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub beyond_planned: Option<u64>,
}

fn retry_all_target() -> Value {
    serde_json::json!({ "outbox": "all-failed" })
}

/// How many failed rows [`retry_failed`] would make pending again, and the first `preview`
/// of them, oldest first; moves nothing, recorded in the audit trail as a dry run (its
/// `matched`, nothing succeeded).
pub async fn retry_all_failed_dry_run(
    pool: &PgPool,
    actor: &Actor,
    preview: u32,
) -> Result<RetryAllReport, Failure> {
    let matched: i64 = sqlx::query_scalar("SELECT count(*) FROM outbox WHERE status = 'failed'")
        .fetch_one(pool)
        .await
        .map_err(classify)?;
    let matched = u64::try_from(matched).unwrap_or(0);
    let rows = failed(pool, preview).await?;
    let mut tx = pool.begin().await.map_err(classify)?;
    let action = NewAction {
        dry_run: true,
        ..NewAction::new(ActionKind::OutboxRetry, actor, retry_all_target())
    };
    let action_id = audit::begin(&mut tx, &action).await?;
    audit::finish(&mut tx, action_id, None, Some(matched)).await?;
    tx.commit().await.map_err(classify)?;
    Ok(RetryAllReport {
        action_id,
        dry_run: true,
        matched,
        requeued: 0,
        rows,
        beyond_planned: None,
    })
}

/// Makes failed rows pending again, due now, with their attempts reset and their `retries`
/// counted up, and wakes the drain; recorded in the audit trail with `actor`. With
/// `planned` (the count a dry run showed and the operator confirmed), at most that many,
/// oldest first as the dry run lists them: rows that failed since are left failed, and the
/// report and the audit row's note say how many.
pub async fn retry_failed(
    pool: &PgPool,
    actor: &Actor,
    planned: Option<u64>,
) -> Result<RetryAllReport, Failure> {
    let mut tx = pool.begin().await.map_err(classify)?;
    let cap = planned.map_or(i64::MAX, |p| i64::try_from(p).unwrap_or(i64::MAX));
    let done = sqlx::query(
        "UPDATE outbox SET status = 'pending', attempts = 0, next_attempt_at = now(), \
                retries = retries + 1 \
         WHERE id IN (SELECT id FROM outbox WHERE status = 'failed' \
                      ORDER BY id LIMIT $1 FOR UPDATE)",
    )
    .bind(cap)
    .execute(&mut *tx)
    .await
    .map_err(classify)?
    .rows_affected();
    if done > 0 {
        notify(&mut tx).await?;
    }
    let beyond_planned = match planned {
        Some(_) => {
            let left: i64 =
                sqlx::query_scalar("SELECT count(*) FROM outbox WHERE status = 'failed'")
                    .fetch_one(&mut *tx)
                    .await
                    .map_err(classify)?;
            Some(u64::try_from(left).unwrap_or(0)).filter(|left| *left > 0)
        }
        None => None,
    };
    let note = beyond_planned.map(|more| {
        format!(
            "stopped at the {} confirmed: {more} more failed rows stay failed",
            planned.unwrap_or_default()
        )
    });
    let action = NewAction {
        planned,
        ..NewAction::new(ActionKind::OutboxRetry, actor, retry_all_target())
    };
    let action_id = audit::record(&mut tx, &action, done, 0, note).await?;
    tx.commit().await.map_err(classify)?;
    Ok(RetryAllReport {
        action_id,
        dry_run: false,
        matched: done,
        requeued: done,
        rows: Vec::new(),
        beyond_planned,
    })
}

/// [`retry_failed`] of every failed row, uncapped; how many were requeued.
pub async fn retry_all_failed(pool: &PgPool, actor: &Actor) -> Result<u64, Failure> {
    retry_failed(pool, actor, None).await.map(|r| r.requeued)
}

/// A row waiting to be published, as an operator sees it.
#[derive(Debug, Clone, PartialEq, Serialize, sqlx::FromRow)]
pub struct PendingRow {
    pub id: i64,
    pub message_id: String,
    pub message_type: Option<String>,
    pub exchange: String,
    pub routing_key: String,
    /// Failed attempts so far (0 for a row not yet tried).
    pub attempts: i32,
    pub next_attempt_at: DateTime<Utc>,
    pub last_error: Option<String>,
    pub created_at: DateTime<Utc>,
}

/// The pending rows, oldest first, at most `limit`.
pub async fn pending(pool: &PgPool, limit: u32) -> Result<Vec<PendingRow>, Failure> {
    sqlx::query_as(
        "SELECT id, message_id, message_type, exchange, routing_key, attempts, \
                next_attempt_at, last_error, created_at \
         FROM outbox WHERE status = 'pending' ORDER BY id LIMIT $1",
    )
    .bind(i64::from(limit))
    .fetch_all(pool)
    .await
    .map_err(classify)
}

/// Deletes processed rows older than `retention`, at most `batch` per statement so that no
/// statement holds many locks for long. Returns how many rows went.
pub async fn purge_processed(
    pool: &PgPool,
    retention: Duration,
    batch: u32,
) -> Result<u64, Failure> {
    let mut total = 0;
    loop {
        let done = sqlx::query(
            "DELETE FROM outbox WHERE id IN ( \
                 SELECT id FROM outbox \
                 WHERE status = 'processed' \
                   AND processed_at < now() - make_interval(secs => $1) \
                 LIMIT $2 FOR UPDATE SKIP LOCKED)",
        )
        .bind(retention.as_secs_f64())
        .bind(i64::from(batch.max(1)))
        .execute(pool)
        .await
        .map_err(classify)?;
        total += done.rows_affected();
        if done.rows_affected() < u64::from(batch.max(1)) {
            return Ok(total);
        }
    }
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
