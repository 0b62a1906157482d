//! Writing the archive: idempotent inserts, failed outbox rows, and the retention sweep.
//!
//! [`insert`] writes a batch in one transaction with `INSERT … ON CONFLICT (dedup_key) DO
//! NOTHING`, so a message archived and then redelivered (the archiver stopped between the
//! commit and the ack) is archived once. A message on its *first* delivery cannot have been
//! archived before, so when its key is taken anyway it is a second message with the very same
//! content (no id, no timestamp to tell them apart): it is archived under a key of its own
//! rather than dropped.

use std::time::Duration;

use serde_json::Value;
use sqlx::{PgPool, Postgres, QueryBuilder};
use worker_core::Failure;
use worker_store::classify;

use crate::fingerprint::fingerprint;
use crate::record::{
    MessageProperties, NewDeadLetter, OUTBOX_FAILED, OUTBOX_QUEUE, Source, json_to_table,
    scrub_json, scrub_str,
};

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
    tx.commit().await.map_err(classify)?;
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

/// A failed outbox row, as read for the archive.
#[derive(Debug, Clone, sqlx::FromRow)]
struct FailedOutboxRow {
    id: i64,
    message_id: String,
    message_type: Option<String>,
    content_type: Option<String>,
    correlation_id: Option<String>,
    exchange: String,
    routing_key: String,
    headers: Value,
    body: Vec<u8>,
    attempts: i32,
    last_error: Option<String>,
    retries: i32,
}

/// The archive key of an outbox row's failure: `outbox:<id>` for the first, then
/// `outbox:<id>:<retries>` for each failure after an operator's `outbox retry`.
/// [`OUTBOX_KEY_SQL`] is the same in SQL, over an `outbox` aliased `o`.
pub fn outbox_dedup_key(id: i64, retries: i32) -> String {
    if retries == 0 {
        format!("outbox:{id}")
    } else {
        format!("outbox:{id}:{retries}")
    }
}

/// A condition on `dead_letters`: not a dead letter of an outbox row that an operator has
/// retried since (`outbox retry`; the drain publishes it again), which a replay must not send
/// a second time. The maintenance settles such rows `replayed` ([`archive_failed_outbox`]);
/// this keeps a replay that runs before it from sending them.
pub(crate) fn not_retried_in_outbox_sql() -> String {
    format!(
        " AND NOT EXISTS (SELECT 1 FROM outbox o WHERE dead_letters.source = 'outbox' \
             AND o.id = dead_letters.outbox_id AND dead_letters.dedup_key <> {OUTBOX_KEY_SQL})"
    )
}

const OUTBOX_KEY_SQL: &str =
    "CASE WHEN o.retries = 0 THEN 'outbox:' || o.id ELSE 'outbox:' || o.id || ':' || o.retries END";

impl From<FailedOutboxRow> for NewDeadLetter {
    fn from(row: FailedOutboxRow) -> Self {
        let last_error = row.last_error.map(|e| scrub_str(&e));
        let (error_fingerprint, error_normalized) = fingerprint(last_error.as_deref());
        let properties = MessageProperties {
            content_type: row.content_type,
            correlation_id: row.correlation_id,
            message_id: Some(row.message_id.clone()),
            kind: row.message_type.clone(),
            delivery_mode: Some(2),
            ..MessageProperties::default()
        };
        let headers = scrub_json(row.headers);
        let amqp_headers = serde_json::to_value(json_to_table(&headers)).ok();
        Self {
            dedup_key: outbox_dedup_key(row.id, row.retries),
            redelivered: false,
            source: Source::Outbox,
            queue: OUTBOX_QUEUE.into(),
            dead_queue: None,
            exchange: Some(row.exchange),
            routing_key: Some(row.routing_key),
            message_id: Some(row.message_id),
            message_type: row.message_type,
            reason: OUTBOX_FAILED.into(),
            class: None,
            attempts: Some(row.attempts),
            last_error,
            error_fingerprint,
            error_normalized,
            died_at: chrono::Utc::now(),
            headers,
            amqp_headers,
            properties: serde_json::to_value(&properties).unwrap_or_default(),
            body: row.body,
            outbox_id: Some(row.id),
        }
    }
}

/// Archives up to `limit` outbox rows that ended `failed` and whose failure is not archived
/// yet (reason `outbox-failed`, queue `outbox`; idempotent per outbox id and retry, see
/// [`outbox_dedup_key`]). The outbox row itself is left as it is. Returns what was written;
/// call it until it writes fewer than `limit`.
///
/// First, an outbox row's dead letters still waiting from before an operator's `outbox retry`
/// are settled as `replayed` (the retry republished them): they no longer wait, so a
/// `dlq replay` does not send the message again beside the retry, and a row that fails again
/// shows once, with its new error.
pub async fn archive_failed_outbox(pool: &PgPool, limit: u32) -> Result<InsertReport, Failure> {
    sqlx::query(&format!(
        "UPDATE dead_letters d SET status = 'replayed', replayed_at = now() \
         FROM outbox o \
         WHERE d.queue = '{OUTBOX_QUEUE}' AND d.status = 'dead' AND d.source = 'outbox' \
           AND d.outbox_id = o.id AND d.dedup_key <> {OUTBOX_KEY_SQL}"
    ))
    .execute(pool)
    .await
    .map_err(classify)?;
    let rows: Vec<FailedOutboxRow> = sqlx::query_as(&format!(
        "SELECT o.id, o.message_id, o.message_type, o.content_type, o.correlation_id, \
                o.exchange, o.routing_key, o.headers, o.body, o.attempts, o.last_error, o.retries \
         FROM outbox o \
         WHERE o.status = 'failed' \
           AND NOT EXISTS (SELECT 1 FROM dead_letters d WHERE d.dedup_key = {OUTBOX_KEY_SQL}) \
         ORDER BY o.id LIMIT $1"
    ))
    .bind(i64::from(limit.max(1)))
    .fetch_all(pool)
    .await
    .map_err(classify)?;
    let rows: Vec<NewDeadLetter> = rows.into_iter().map(NewDeadLetter::from).collect();
    insert(pool, &rows).await
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
