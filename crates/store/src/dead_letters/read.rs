//! Reading the archive: `dlq list`, `dlq show`, `dlq show ID`, what a replay or a purge would
//! act on ([`count`]), and the numbers behind the dead-letter metrics and alerts. Every result
//! is a plain struct that serializes to the JSON `--json` prints; the host lays the same out
//! as a table, and the console as pages ([`super::browse`]).

use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use sqlx::{PgPool, Postgres, QueryBuilder};
use worker_core::Failure;

use super::filter::Filter;
use super::outbox_rows::not_retried_in_outbox_sql;
use super::row::Status;
use crate::classify;

/// How many characters of a body `show` previews.
pub const PREVIEW_CHARS: usize = 200;

/// The fingerprints `list` shows per queue.
pub const TOP_FINGERPRINTS: u32 = 5;

/// The rows `show` lists when no `--limit` is given.
pub const DEFAULT_SHOW_LIMIT: u32 = 50;

/// One fingerprint of a queue and how many dead letters carry it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, sqlx::FromRow)]
pub struct FingerprintCount {
    pub fingerprint: String,
    pub count: i64,
    /// The error as normalized: what the fingerprint stands for.
    pub normalized: String,
    /// The reasons among them (usually one).
    pub reasons: Vec<String>,
    /// The most recent dead letter with it, for `dlq show ID`.
    pub latest_id: i64,
}

/// One queue of `dlq list`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct QueueSummary {
    pub queue: String,
    /// Dead letters waiting (status `dead`).
    pub dead: i64,
    pub replayed: i64,
    pub purged: i64,
    /// When the oldest and newest waiting dead letters died.
    pub oldest: Option<DateTime<Utc>>,
    pub newest: Option<DateTime<Utc>>,
    /// The most frequent fingerprints among the waiting ones, most frequent first.
    pub top_fingerprints: Vec<FingerprintCount>,
}

/// `dlq list`: per queue, the waiting count, oldest, newest and top fingerprints
/// ([`TOP_FINGERPRINTS`] of them). Queues whose dead letters were all replayed or purged are
/// listed with `dead = 0` until the retention sweep removes their rows.
pub async fn list(pool: &PgPool) -> Result<Vec<QueueSummary>, Failure> {
    list_top(pool, TOP_FINGERPRINTS).await
}

/// [`list`] with `top` fingerprints per queue.
pub async fn list_top(pool: &PgPool, top: u32) -> Result<Vec<QueueSummary>, Failure> {
    #[derive(sqlx::FromRow)]
    struct Row {
        queue: String,
        dead: i64,
        replayed: i64,
        purged: i64,
        oldest: Option<DateTime<Utc>>,
        newest: Option<DateTime<Utc>>,
    }
    let rows: Vec<Row> = sqlx::query_as(
        "SELECT queue, \
                count(*) FILTER (WHERE status = 'dead') AS dead, \
                count(*) FILTER (WHERE status = 'replayed') AS replayed, \
                count(*) FILTER (WHERE status = 'purged') AS purged, \
                min(died_at) FILTER (WHERE status = 'dead') AS oldest, \
                max(died_at) FILTER (WHERE status = 'dead') AS newest \
         FROM dead_letters GROUP BY queue ORDER BY queue",
    )
    .fetch_all(pool)
    .await
    .map_err(classify)?;
    #[derive(sqlx::FromRow)]
    struct Top {
        queue: String,
        #[sqlx(flatten)]
        fp: FingerprintCount,
    }
    let tops: Vec<Top> = sqlx::query_as(
        "SELECT queue, fingerprint, count, normalized, reasons, latest_id FROM ( \
             SELECT queue, error_fingerprint AS fingerprint, count(*) AS count, \
                    min(error_normalized) AS normalized, \
                    array_agg(DISTINCT reason ORDER BY reason) AS reasons, \
                    max(id) AS latest_id, \
                    row_number() OVER (PARTITION BY queue ORDER BY count(*) DESC, error_fingerprint) AS rank \
             FROM dead_letters WHERE status = 'dead' \
             GROUP BY queue, error_fingerprint) t \
         WHERE rank <= $1 ORDER BY queue, rank",
    )
    .bind(i64::from(top))
    .fetch_all(pool)
    .await
    .map_err(classify)?;
    let mut out: Vec<QueueSummary> = rows
        .into_iter()
        .map(|r| QueueSummary {
            queue: r.queue,
            dead: r.dead,
            replayed: r.replayed,
            purged: r.purged,
            oldest: r.oldest,
            newest: r.newest,
            top_fingerprints: Vec::new(),
        })
        .collect();
    for top in tops {
        if let Some(q) = out.iter_mut().find(|q| q.queue == top.queue) {
            q.top_fingerprints.push(top.fp);
        }
    }
    Ok(out)
}

/// One line of `dlq show`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, sqlx::FromRow)]
pub struct DeadLetterSummary {
    pub id: i64,
    pub queue: String,
    pub source: String,
    pub reason: String,
    pub class: Option<String>,
    pub attempts: Option<i32>,
    pub message_id: Option<String>,
    pub message_type: Option<String>,
    pub error: Option<String>,
    pub fingerprint: String,
    pub died_at: DateTime<Utc>,
    pub archived_at: DateTime<Utc>,
    pub status: String,
    /// When an operator replayed it, if one did.
    pub replayed_at: Option<DateTime<Utc>>,
    /// The first [`PREVIEW_CHARS`] characters of the body, lossy UTF-8.
    pub body_preview: String,
    /// The whole body's size.
    pub body_bytes: i64,
}

/// `dlq show [filters]`: the matching dead letters, newest first, at most `filter.limit`
/// ([`DEFAULT_SHOW_LIMIT`] when not given), each with a bounded body preview.
pub async fn show(pool: &PgPool, filter: &Filter) -> Result<Vec<DeadLetterSummary>, Failure> {
    filter
        .validate()
        .map_err(|e| Failure::permanent("bad-filter", e))?;
    let mut q = summaries();
    q.push(" AND status = ");
    q.push_bind(filter.status.unwrap_or(Status::Dead).as_str());
    filter.push_where(&mut q);
    q.push(" ORDER BY died_at DESC, id DESC LIMIT ");
    q.push_bind(i64::from(filter.limit.unwrap_or(DEFAULT_SHOW_LIMIT)));
    fetch_summaries(pool, q).await
}

/// How many dead letters (status `dead`) match `filter`, up to its limit: what a replay or a
/// purge would act on, for the host's confirmation prompt.
pub async fn count(pool: &PgPool, filter: &Filter) -> Result<u64, Failure> {
    filter
        .validate()
        .map_err(|e| Failure::permanent("bad-filter", e))?;
    let mut q =
        QueryBuilder::new("SELECT count(*) FROM (SELECT 1 FROM dead_letters WHERE status = 'dead'");
    filter.push_where(&mut q);
    q.push(not_retried_in_outbox_sql());
    if let Some(limit) = filter.limit {
        q.push(" LIMIT ").push_bind(i64::from(limit));
    }
    q.push(") t");
    let n: i64 = q
        .build_query_scalar()
        .fetch_one(pool)
        .await
        .map_err(classify)?;
    Ok(u64::try_from(n).unwrap_or(0))
}

/// `SELECT` of [`DeadLetterSummary`] rows (plus the body's head) `FROM dead_letters WHERE
/// true`: the caller adds its conditions, order and limit, then calls [`fetch_summaries`].
pub fn summaries<'a>() -> QueryBuilder<'a, Postgres> {
    // Four bytes per character at most: enough bytes for the preview, never the whole body.
    let preview_bytes = i32::try_from(PREVIEW_CHARS * 4).unwrap_or(i32::MAX);
    let mut q = QueryBuilder::new(
        "SELECT id, queue, source, reason, class, attempts, message_id, message_type, \
                last_error AS error, error_fingerprint AS fingerprint, died_at, archived_at, \
                status, replayed_at, '' AS body_preview, octet_length(body)::bigint AS body_bytes, \
                substring(body FROM 1 FOR ",
    );
    q.push_bind(preview_bytes);
    q.push(") AS head FROM dead_letters WHERE true");
    q
}

/// Runs a [`summaries`] query and makes each body's head its preview.
pub async fn fetch_summaries(
    pool: &PgPool,
    mut q: QueryBuilder<'_, Postgres>,
) -> Result<Vec<DeadLetterSummary>, Failure> {
    #[derive(sqlx::FromRow)]
    struct Row {
        #[sqlx(flatten)]
        summary: DeadLetterSummary,
        head: Vec<u8>,
    }
    let rows: Vec<Row> = q.build_query_as().fetch_all(pool).await.map_err(classify)?;
    Ok(rows
        .into_iter()
        .map(|r| {
            let mut s = r.summary;
            s.body_preview = preview(&r.head, PREVIEW_CHARS);
            let cut = usize::try_from(s.body_bytes).unwrap_or(0) > r.head.len();
            if cut && !s.body_preview.ends_with('…') {
                s.body_preview.push('…');
            }
            s
        })
        .collect())
}

/// The first `chars` characters of `body`, lossy UTF-8, with `…` when cut.
pub fn preview(body: &[u8], chars: usize) -> String {
    let text = String::from_utf8_lossy(body);
    let mut out: String = text.chars().take(chars).collect();
    if text.chars().nth(chars).is_some() {
        out.push('…');
    }
    out
}

/// Waiting dead letters of one queue, for the depth metric.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, sqlx::FromRow)]
pub struct QueueDepth {
    pub queue: String,
    /// Rows with status `dead`.
    pub dead: i64,
    /// When the oldest of them died.
    pub oldest: Option<DateTime<Utc>>,
}

/// Waiting dead letters per queue (only queues with some).
pub async fn depth_by_queue(pool: &PgPool) -> Result<Vec<QueueDepth>, Failure> {
    sqlx::query_as(
        "SELECT queue, count(*) AS dead, min(died_at) AS oldest \
         FROM dead_letters WHERE status = 'dead' GROUP BY queue ORDER BY queue",
    )
    .fetch_all(pool)
    .await
    .map_err(classify)
}

/// The age of the oldest waiting dead letter, in seconds: one end of the index
/// `dead_letters_dead_by_age`, however many wait. Public so that a test can read its plan.
pub const OLDEST_AGE: &str = "SELECT extract(epoch FROM now() - min(died_at))::float8 \
     FROM dead_letters WHERE status = 'dead'";

/// The age of the oldest waiting dead letter (since it died), by the database's clock;
/// `None` when none waits.
pub async fn oldest_age(pool: &PgPool) -> Result<Option<Duration>, Failure> {
    let secs: Option<f64> = sqlx::query_scalar(OLDEST_AGE)
        .fetch_one(pool)
        .await
        .map_err(classify)?;
    Ok(secs.map(|s| Duration::from_secs_f64(s.max(0.0))))
}

/// Dead letters archived at or after `since` (whatever became of them since): the inflow.
/// Call it with the time of the previous scrape, or `now - 1 minute` for a per-minute rate.
pub async fn inflow_since(pool: &PgPool, since: DateTime<Utc>) -> Result<u64, Failure> {
    let n: i64 = sqlx::query_scalar("SELECT count(*) FROM dead_letters WHERE archived_at >= $1")
        .bind(since)
        .fetch_one(pool)
        .await
        .map_err(classify)?;
    Ok(u64::try_from(n).unwrap_or(0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn previews_are_bounded_and_lossy() {
        assert_eq!(preview(b"short", 200), "short");
        let long = "é".repeat(300);
        let p = preview(long.as_bytes(), 200);
        assert_eq!(p.chars().count(), 201);
        assert!(p.ends_with('…'));
        assert_eq!(preview(&[0xff, b'a'], 200), "\u{FFFD}a");
    }
}
