//! What operators read and do about the outbox: its status, the failed and pending rows,
//! retries (recorded in the [`audit`](crate::audit) trail) and the retention job's sweep of
//! the rows earlier releases marked processed and kept.

use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::Value;
use sqlx::PgPool;
use worker_core::Failure;

use super::enqueue::CHANNEL;
use crate::audit::{self, Actor, EntryKind, NewEntry};
use crate::classify;

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
    /// No pending or failed row has that id: it was published (the drain deletes a row once
    /// the broker has confirmed it, and an earlier release's row marked processed is one), or
    /// it never existed. Nothing to do; the outbox cannot tell the two apart by id.
    Gone,
}

impl RetryResult {
    /// What an operator reads when row `id` is [`Gone`](Self::Gone).
    pub fn gone_message(id: i64) -> String {
        format!(
            "no outbox row {id} waits or failed: it was published (a published row is deleted) or never existed"
        )
    }
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
        // A row an earlier release marked processed was published, like one deleted since.
        None | Some("processed") => RetryResult::Gone,
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
        RetryResult::Gone => Some("no such row: published, or never existed".to_string()),
    };
    let target = serde_json::json!({ "outbox_id": id });
    let requeued = u64::from(result == RetryResult::Requeued);
    audit::record(
        &mut tx,
        &NewEntry::new(EntryKind::OutboxRetry, actor, target),
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
    let action = NewEntry {
        dry_run: true,
        ..NewEntry::new(EntryKind::OutboxRetry, actor, retry_all_target())
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
    let action = NewEntry {
        planned,
        ..NewEntry::new(EntryKind::OutboxRetry, actor, retry_all_target())
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

/// Deletes up to `batch` rows that an earlier release marked processed and kept (today's drain
/// deletes a row once it is published), in one short statement, whatever their age, skipping
/// rows another transaction holds. Returns how many went; fewer than `batch` means none is
/// left. The retention job calls it batch by batch, so that no statement holds many locks
/// for long.
pub async fn sweep_processed_batch(pool: &PgPool, batch: u32) -> Result<u64, Failure> {
    let done = sqlx::query(
        "DELETE FROM outbox WHERE id IN ( \
             SELECT id FROM outbox WHERE status = 'processed' \
             ORDER BY processed_at LIMIT $1 FOR UPDATE SKIP LOCKED)",
    )
    .bind(i64::from(batch.max(1)))
    .execute(pool)
    .await
    .map_err(classify)?;
    Ok(done.rows_affected())
}
/// `NOTIFY outbox` inside `tx`, for a retry that makes rows due again: the table's trigger
/// announces inserts only. PostgreSQL folds identical notifications of one transaction into
/// one.
async fn notify(tx: &mut sqlx::PgConnection) -> Result<(), Failure> {
    sqlx::query("SELECT pg_notify($1, '')")
        .bind(CHANNEL)
        .execute(tx)
        .await
        .map_err(classify)?;
    Ok(())
}
