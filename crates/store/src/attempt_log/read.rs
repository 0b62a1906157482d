//! The attempt log as operators read it: failures per job ([`summary`]), one message's story
//! ([`for_message`]) and a job's latest rows ([`recent`]).

use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::PgPool;
use worker_core::Failure;

use super::record::AttemptRecord;
use crate::classify;

/// Failures per job, outcome and class since `since`: what failed, and how often.
#[derive(Debug, Clone, PartialEq, Serialize, sqlx::FromRow)]
pub struct AttemptSummary {
    pub job: String,
    pub outcome: String,
    pub is_final: bool,
    pub failure_class: Option<String>,
    pub count: i64,
    pub last_at: DateTime<Utc>,
    pub last_error: Option<String>,
}

/// Counts the rows written since `since`, grouped by job, outcome and failure class, with
/// the latest error of each group.
pub async fn summary(pool: &PgPool, since: Duration) -> Result<Vec<AttemptSummary>, Failure> {
    sqlx::query_as(
        "SELECT job, outcome, is_final, failure_class, count(*) AS count, max(at) AS last_at, \
                (array_agg(error ORDER BY at DESC))[1] AS last_error \
         FROM attempt_log WHERE at >= now() - make_interval(secs => $1) \
         GROUP BY job, outcome, is_final, failure_class \
         ORDER BY job, is_final, outcome, failure_class",
    )
    .bind(since.as_secs_f64())
    .fetch_all(pool)
    .await
    .map_err(classify)
}

type Row = (
    String,
    Option<String>,
    Option<i64>,
    i32,
    i32,
    String,
    bool,
    Option<String>,
    Option<String>,
    f64,
    DateTime<Utc>,
);

const ROW_COLUMNS: &str = "job, message_id, tick, attempt, try_number, outcome, is_final, \
                           failure_class, error, duration_ms, at";

fn record_of(r: Row) -> AttemptRecord {
    AttemptRecord {
        job: r.0,
        message_id: r.1,
        tick: r.2,
        attempt: r.3,
        try_number: r.4,
        outcome: r.5,
        is_final: r.6,
        failure_class: r.7,
        error: r.8,
        duration: Duration::from_secs_f64((r.9 / 1000.0).max(0.0)),
        at: r.10,
    }
}

/// The rows of one message of one job, in order, for an operator following its story.
pub async fn for_message(
    pool: &PgPool,
    job: &str,
    message_id: &str,
) -> Result<Vec<AttemptRecord>, Failure> {
    let rows: Vec<Row> = sqlx::query_as(&format!(
        "SELECT {ROW_COLUMNS} FROM attempt_log WHERE job = $1 AND message_id = $2 ORDER BY at, id"
    ))
    .bind(job)
    .bind(message_id)
    .fetch_all(pool)
    .await
    .map_err(classify)?;
    Ok(rows.into_iter().map(record_of).collect())
}

/// The rows of the messages `message_ids` of `job`, in order: the tries of a mail's hops.
pub async fn for_messages(
    pool: &PgPool,
    job: &str,
    message_ids: &[String],
) -> Result<Vec<AttemptRecord>, Failure> {
    if message_ids.is_empty() {
        return Ok(Vec::new());
    }
    let rows: Vec<Row> = sqlx::query_as(&format!(
        "SELECT {ROW_COLUMNS} FROM attempt_log WHERE job = $1 AND message_id = ANY($2) \
         ORDER BY at, id"
    ))
    .bind(job)
    .bind(message_ids)
    .fetch_all(pool)
    .await
    .map_err(classify)?;
    Ok(rows.into_iter().map(record_of).collect())
}

/// What [`recent`] selects from: a job's (`$1`) latest `$2` rows, newest first. A range of
/// `attempt_log_job_at`, however many rows the other jobs wrote. Public so that a test can
/// read its plan.
pub const RECENT: &str = "FROM attempt_log WHERE job = $1 ORDER BY at DESC, id DESC LIMIT $2";

/// A job's latest rows (a timer's failed ticks, say), newest first, at most `limit`.
pub async fn recent(pool: &PgPool, job: &str, limit: u32) -> Result<Vec<AttemptRecord>, Failure> {
    let rows: Vec<Row> = sqlx::query_as(&format!("SELECT {ROW_COLUMNS} {RECENT}"))
        .bind(job)
        .bind(i64::from(limit.max(1)))
        .fetch_all(pool)
        .await
        .map_err(classify)?;
    Ok(rows.into_iter().map(record_of).collect())
}
