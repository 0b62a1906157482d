//! The drain's half of the outbox: a batch's transaction, the claim of due rows, the deletion of
//! what was published and the marks of what failed (see the module docs of [`super`]).

use std::fmt;
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde_json::Value;
use sqlx::{PgConnection, PgPool};
use worker_core::{Failure, truncate};

use crate::{Tx, classify};

/// The longest `last_error` kept on a row, in bytes.
pub const LAST_ERROR_MAX: usize = 2048;

/// How a batch's transaction begins ([`begin_batch`]).
const BEGIN_BATCH: &str = "BEGIN; SET LOCAL synchronous_commit = off";

/// Begins a drain batch's transaction, committing without waiting for the WAL flush: losing
/// its commit to a PostgreSQL crash only means publishing its rows again, which
/// at-least-once allows. The setting goes with the `BEGIN`, in the same round trip.
pub async fn begin_batch(pool: &PgPool) -> Result<Tx, Failure> {
    pool.begin_with(BEGIN_BATCH).await.map_err(classify)
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

/// Deletes the confirmed rows `ids` and records their publications (a mail's story reads each
/// hop's publish time and trace there), in one statement, inside the claim's transaction: a
/// row goes only with the commit that follows its broker's confirm, so a crash before that
/// commit leaves it pending, to be published again (at least once). Returns how many went.
pub async fn delete_published(tx: &mut PgConnection, ids: &[i64]) -> Result<u64, Failure> {
    if ids.is_empty() {
        return Ok(0);
    }
    let done = sqlx::query(
        "WITH gone AS ( \
             DELETE FROM outbox \
             WHERE id = ANY($1) AND status = 'pending' \
             RETURNING message_id, routing_key, headers ->> 'traceparent' AS tp) \
         INSERT INTO publications (message_id, routing_key, published_at, trace_id) \
         SELECT message_id, routing_key, now(), NULLIF(split_part(tp, '-', 2), '') \
         FROM gone",
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
