//! Writing `dead_letters`: idempotent inserts, and the retention sweep.
//!
//! [`insert`] writes a batch in one transaction with `INSERT … ON CONFLICT (dedup_key) DO
//! NOTHING`, so a message archived and then redelivered (the archiver stopped between the
//! commit and the ack) is archived once. A message on its *first* delivery cannot have been
//! archived before, so when its key is taken anyway it is a second message with the very same
//! content (no id, no timestamp to tell them apart): it is archived under a key of its own
//! rather than dropped.

use std::time::Duration;

use sqlx::{PgConnection, PgPool, Postgres, QueryBuilder};
use worker_core::Failure;

use super::row::{NewDeadLetter, Source};
use crate::classify;

/// What one [`insert`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct InsertReport {
    /// Rows written.
    pub inserted: u64,
    /// Messages already in the archive (redeliveries): nothing written.
    pub duplicates: u64,
}

impl InsertReport {
    pub fn add(&mut self, other: Self) {
        self.inserted += other.inserted;
        self.duplicates += other.duplicates;
    }
}

/// The columns an insert writes: a [`NewDeadLetter`], in its field order.
const COLUMNS: &str = "dedup_key, source, queue, dead_queue, exchange, routing_key, message_id, \
     message_type, reason, class, attempts, last_error, error_fingerprint, error_normalized, \
     died_at, headers, amqp_headers, properties, body, outbox_id";

/// Archives `rows`: all of them or, on error, none. A batch the database refuses as such
/// (a value it cannot store) is retried row by row, and a row it still refuses is stored in a
/// reduced form (headers and properties replaced by the reason) rather than lost; only what
/// cannot be stored even so is an error, as is any transient failure.
pub async fn insert(pool: &PgPool, rows: &[NewDeadLetter]) -> Result<InsertReport, Failure> {
    if rows.is_empty() {
        return Ok(InsertReport::default());
    }
    match insert_all(pool, rows).await {
        Ok(report) => Ok(report),
        Err(failure) if failure.is_permanent() && rows.len() > 1 => {
            tracing::warn!(error = %failure, rows = rows.len(), "the batch was refused; archiving row by row");
            let mut report = InsertReport::default();
            for row in rows {
                report.add(insert_one_or_reduced(pool, row).await?);
            }
            Ok(report)
        }
        Err(failure) if failure.is_permanent() => insert_one_or_reduced(pool, &rows[0]).await,
        Err(failure) => Err(failure),
    }
}

async fn insert_one_or_reduced(
    pool: &PgPool,
    row: &NewDeadLetter,
) -> Result<InsertReport, Failure> {
    match insert_all(pool, std::slice::from_ref(row)).await {
        Err(failure) if failure.is_permanent() => {
            tracing::error!(error = %failure, dedup_key = %row.dedup_key, "a dead letter was refused; archiving it without its headers");
            let mut reduced = row.clone();
            reduced.headers = serde_json::json!({
                "x-archive-note": format!("the headers could not be stored: {failure}"),
            });
            reduced.amqp_headers = None;
            reduced.properties = serde_json::json!({});
            insert_all(pool, std::slice::from_ref(&reduced)).await
        }
        other => other,
    }
}

async fn insert_all(pool: &PgPool, rows: &[NewDeadLetter]) -> Result<InsertReport, Failure> {
    let mut tx = pool.begin().await.map_err(classify)?;
    let report = insert_in(&mut tx, rows).await?;
    tx.commit().await.map_err(classify)?;
    Ok(report)
}

/// Archives `rows` inside the caller's transaction, as one statement (and a second for twins,
/// see the module docs); nothing is retried or reduced here, that is [`insert`]'s.
pub async fn insert_in(
    tx: &mut PgConnection,
    rows: &[NewDeadLetter],
) -> Result<InsertReport, Failure> {
    // Two first deliveries with the same content in one batch are two messages.
    let mut batch: Vec<NewDeadLetter> = Vec::with_capacity(rows.len());
    let mut seen = std::collections::HashSet::new();
    for row in rows {
        let mut row = row.clone();
        if !seen.insert(row.dedup_key.clone()) && !row.redelivered {
            row.dedup_key = distinct_key(&row.dedup_key);
            seen.insert(row.dedup_key.clone());
        }
        batch.push(row);
    }
    let inserted: Vec<String> = insert_query(&batch)
        .build_query_scalar()
        .fetch_all(&mut *tx)
        .await
        .map_err(classify)?;
    let inserted: std::collections::HashSet<String> = inserted.into_iter().collect();
    let mut report = InsertReport {
        inserted: inserted.len() as u64,
        duplicates: 0,
    };
    let mut twins = Vec::new();
    for row in &batch {
        if inserted.contains(&row.dedup_key) {
            continue;
        }
        if row.redelivered || row.source == Source::Outbox {
            report.duplicates += 1;
        } else {
            let mut twin = row.clone();
            twin.dedup_key = distinct_key(&row.dedup_key);
            twins.push(twin);
        }
    }
    if !twins.is_empty() {
        let done = insert_query(&twins)
            .build()
            .execute(&mut *tx)
            .await
            .map_err(classify)?;
        report.inserted += done.rows_affected();
    }
    Ok(report)
}

fn distinct_key(key: &str) -> String {
    format!("{key}:{}", uuid::Uuid::new_v4().simple())
}

fn insert_query(rows: &[NewDeadLetter]) -> QueryBuilder<'_, Postgres> {
    let mut q = QueryBuilder::new(format!("INSERT INTO dead_letters ({COLUMNS}) "));
    q.push_values(rows, |mut b, r| {
        b.push_bind(&r.dedup_key)
            .push_bind(r.source.as_str())
            .push_bind(&r.queue)
            .push_bind(&r.dead_queue)
            .push_bind(&r.exchange)
            .push_bind(&r.routing_key)
            .push_bind(&r.message_id)
            .push_bind(&r.message_type)
            .push_bind(&r.reason)
            .push_bind(&r.class)
            .push_bind(r.attempts)
            .push_bind(&r.last_error)
            .push_bind(&r.error_fingerprint)
            .push_bind(&r.error_normalized)
            .push_bind(r.died_at)
            .push_bind(&r.headers)
            .push_bind(&r.amqp_headers)
            .push_bind(&r.properties)
            .push_bind(&r.body)
            .push_bind(r.outbox_id);
    });
    q.push(" ON CONFLICT (dedup_key) DO NOTHING RETURNING dedup_key");
    q
}

/// The retention sweep: deletes up to `batch` rows already `replayed` or `purged` more than
/// `older_than` ago. Rows still `dead` are never deleted, however old or many. Returns how
/// many went; call it until it deletes fewer than `batch`.
pub async fn sweep(pool: &PgPool, older_than: Duration, batch: u32) -> Result<u64, Failure> {
    let done = sqlx::query(
        "DELETE FROM dead_letters WHERE id IN ( \
             SELECT id FROM dead_letters \
             WHERE status <> 'dead' \
               AND coalesce(replayed_at, purged_at) < now() - make_interval(secs => $1) \
             ORDER BY coalesce(replayed_at, purged_at) LIMIT $2)",
    )
    .bind(older_than.as_secs_f64())
    .bind(i64::from(batch.max(1)))
    .execute(pool)
    .await
    .map_err(classify)?;
    Ok(done.rows_affected())
}
