//! Writing and deleting `attempt_log` rows: one record inside a caller's transaction, a batch in
//! one statement, and the retention sweep.

use std::time::Duration;

use sqlx::{PgConnection, PgPool};
use worker_core::Failure;

use super::record::AttemptRecord;
use crate::classify;

/// Writes one record in `conn` (inside the caller's transaction, if it is one).
pub async fn record(conn: &mut PgConnection, record: &AttemptRecord) -> Result<(), Failure> {
    insert_batch(conn, std::slice::from_ref(record)).await
}

/// Writes `records` in one statement.
pub async fn insert_batch<'c, E>(executor: E, records: &[AttemptRecord]) -> Result<(), Failure>
where
    E: sqlx::PgExecutor<'c>,
{
    if records.is_empty() {
        return Ok(());
    }
    let n = records.len();
    let mut jobs = Vec::with_capacity(n);
    let mut message_ids = Vec::with_capacity(n);
    let mut ticks = Vec::with_capacity(n);
    let mut attempts = Vec::with_capacity(n);
    let mut tries = Vec::with_capacity(n);
    let mut outcomes = Vec::with_capacity(n);
    let mut finals = Vec::with_capacity(n);
    let mut classes = Vec::with_capacity(n);
    let mut errors = Vec::with_capacity(n);
    let mut durations = Vec::with_capacity(n);
    let mut ats = Vec::with_capacity(n);
    for r in records {
        jobs.push(r.job.as_str());
        message_ids.push(r.message_id.as_deref());
        ticks.push(r.tick);
        attempts.push(r.attempt);
        tries.push(r.try_number);
        outcomes.push(r.outcome.as_str());
        finals.push(r.is_final);
        classes.push(r.failure_class.as_deref());
        errors.push(r.error.as_deref());
        durations.push(r.duration.as_secs_f64() * 1000.0);
        ats.push(r.at);
    }
    sqlx::query(
        "INSERT INTO attempt_log (job, message_id, tick, attempt, try_number, outcome, is_final, \
                                  failure_class, error, duration_ms, at) \
         SELECT * FROM unnest($1::text[], $2::text[], $3::bigint[], $4::int[], $5::int[], \
                              $6::text[], $7::bool[], $8::text[], $9::text[], $10::float8[], \
                              $11::timestamptz[])",
    )
    .bind(&jobs)
    .bind(&message_ids)
    .bind(&ticks)
    .bind(&attempts)
    .bind(&tries)
    .bind(&outcomes)
    .bind(&finals)
    .bind(&classes)
    .bind(&errors)
    .bind(&durations)
    .bind(&ats)
    .execute(executor)
    .await
    .map_err(classify)?;
    Ok(())
}

/// Deletes rows older than `retention`, at most `batch` per statement, until none is left.
/// Returns how many went. The host's retention job uses [`sweep_batch`], bounded per tick.
pub async fn sweep(pool: &PgPool, retention: Duration, batch: u32) -> Result<u64, Failure> {
    let batch = batch.max(1);
    let mut total = 0;
    loop {
        let done = sweep_batch(pool, retention, batch).await?;
        total += done;
        if done < u64::from(batch) {
            return Ok(total);
        }
    }
}

/// Deletes at most `batch` rows older than `retention`, oldest first, in one statement.
/// Returns how many went.
pub async fn sweep_batch(pool: &PgPool, retention: Duration, batch: u32) -> Result<u64, Failure> {
    let done = sqlx::query(
        "DELETE FROM attempt_log WHERE id IN ( \
             SELECT id FROM attempt_log WHERE at < now() - make_interval(secs => $1) \
             ORDER BY at LIMIT $2)",
    )
    .bind(retention.as_secs_f64())
    .bind(i64::from(batch.max(1)))
    .execute(pool)
    .await
    .map_err(classify)?;
    Ok(done.rows_affected())
}
