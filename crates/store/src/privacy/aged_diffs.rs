//! The retention of an edit's diff in the audit trail: past `jobs.retention.audit_diff`, each
//! changed field's before and after becomes `[redacted]`. The entry keeps its kind, who made
//! it, when, its counts and which fields changed; the row is never deleted (the database's audit
//! rule allows this redaction of a finished row and nothing else: migration
//! `20261210000600_audit_redaction`).

use std::time::Duration;

use sqlx::PgPool;
use worker_core::Failure;

use crate::classify;

/// Redacts the diffs of at most `batch` finished edits started more than `older_than` ago,
/// oldest first, in one statement; returns how many it redacted.
pub async fn redact_batch(pool: &PgPool, older_than: Duration, batch: u32) -> Result<u64, Failure> {
    let done = sqlx::query(
        "UPDATE dead_letter_actions a \
         SET filter = CASE WHEN jsonb_typeof(a.filter -> 'diff') = 'object' \
                      THEN jsonb_set(a.filter, '{diff}', coalesce( \
                          (SELECT jsonb_object_agg(k, '\"[redacted]\"'::jsonb) \
                           FROM jsonb_object_keys(a.filter -> 'diff') AS k), '{}'::jsonb)) \
                      ELSE a.filter END \
                      || jsonb_build_object('redacted', \
                             coalesce(a.filter -> 'redacted', '{}'::jsonb) \
                             || jsonb_build_object('diff_aged_at', now())) \
         WHERE a.id IN ( \
             SELECT id FROM dead_letter_actions \
             WHERE action = 'edit' AND (filter #> '{redacted,diff_aged_at}') IS NULL \
               AND finished_at IS NOT NULL AND started_at < now() - make_interval(secs => $1) \
             ORDER BY started_at LIMIT $2)",
    )
    .bind(older_than.as_secs_f64())
    .bind(i64::from(batch.max(1)))
    .execute(pool)
    .await
    .map_err(classify)?;
    Ok(done.rows_affected())
}
