//! The statements on `history_minutes`, `history_hours` and `history_days`.

use std::collections::BTreeMap;
use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::PgPool;
use sqlx::types::Json;
use worker_core::Failure;

use super::rollup::{Gauge, HistoryRow, Resolution, roll_up};
use super::tally::JobCounts;
use crate::classify;

/// Adds each job's `counts` to its minute row at `at` (a minute's start): other replicas add
/// theirs to the same row. One transaction, a statement per job.
pub async fn flush(pool: &PgPool, at: DateTime<Utc>, counts: &[JobCounts]) -> Result<(), Failure> {
    if counts.is_empty() {
        return Ok(());
    }
    let mut tx = pool.begin().await.map_err(classify)?;
    for job in counts {
        sqlx::query(
            "INSERT INTO history_minutes AS t (series, name, at, units, failures, durations) \
             VALUES ('job', $1, $2, $3, $4, $5) \
             ON CONFLICT (series, name, at) DO UPDATE SET \
               units = t.units + excluded.units, \
               failures = (SELECT coalesce(jsonb_object_agg(k, n), '{}'::jsonb) FROM ( \
                   SELECT k, sum(v::bigint) AS n FROM ( \
                     SELECT key, value FROM jsonb_each_text(t.failures) \
                     UNION ALL SELECT key, value FROM jsonb_each_text(excluded.failures)) \
                   AS both_sides(k, v) GROUP BY k) AS summed), \
               durations = ARRAY(SELECT coalesce(a, 0) + coalesce(b, 0) \
                   FROM unnest(t.durations, excluded.durations) WITH ORDINALITY AS u(a, b, i) \
                   ORDER BY i)",
        )
        .bind(&job.job)
        .bind(at)
        .bind(job.units)
        .bind(Json(&job.failures))
        .bind(&job.durations)
        .execute(&mut *tx)
        .await
        .map_err(classify)?;
    }
    tx.commit().await.map_err(classify)
}

/// Writes `rows` into `resolution`'s table, each replacing the row of its series, name and
/// period: a rollup recomputed from its finer rows, or a minute's gauges.
pub async fn write(
    pool: &PgPool,
    resolution: Resolution,
    rows: &[HistoryRow],
) -> Result<(), Failure> {
    if rows.is_empty() {
        return Ok(());
    }
    let mut tx = pool.begin().await.map_err(classify)?;
    let sql = format!(
        "INSERT INTO {} AS t (series, name, at, units, failures, durations, samples, gauges) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8) \
         ON CONFLICT (series, name, at) DO UPDATE SET units = excluded.units, \
           failures = excluded.failures, durations = excluded.durations, \
           samples = excluded.samples, gauges = excluded.gauges",
        resolution.table()
    );
    for row in rows {
        sqlx::query(&sql)
            .bind(&row.series)
            .bind(&row.name)
            .bind(row.at)
            .bind(row.units)
            .bind(Json(&row.failures))
            .bind(&row.durations)
            .bind(row.samples)
            .bind(Json(&row.gauges))
            .execute(&mut *tx)
            .await
            .map_err(classify)?;
    }
    tx.commit().await.map_err(classify)
}

type Raw = (
    String,
    String,
    DateTime<Utc>,
    i64,
    Json<BTreeMap<String, i64>>,
    Vec<i64>,
    i32,
    Json<BTreeMap<String, Gauge>>,
);

/// What to read: the series and name, or every one.
#[derive(Debug, Clone, Copy, Default)]
pub struct Select<'a> {
    pub series: Option<&'a str>,
    pub name: Option<&'a str>,
}

/// The rows of `resolution` in `[from, to)`, of the selected series and name, oldest first.
pub async fn read(
    pool: &PgPool,
    resolution: Resolution,
    from: DateTime<Utc>,
    to: DateTime<Utc>,
    select: Select<'_>,
) -> Result<Vec<HistoryRow>, Failure> {
    let sql = format!(
        "SELECT series, name, at, units, failures, durations, samples, gauges FROM {} \
         WHERE at >= $1 AND at < $2 AND ($3::text IS NULL OR series = $3) \
           AND ($4::text IS NULL OR name = $4) \
         ORDER BY at, series, name",
        resolution.table()
    );
    let raw: Vec<Raw> = sqlx::query_as(&sql)
        .bind(from)
        .bind(to)
        .bind(select.series)
        .bind(select.name)
        .fetch_all(pool)
        .await
        .map_err(classify)?;
    Ok(raw
        .into_iter()
        .map(
            |(series, name, at, units, failures, durations, samples, gauges)| HistoryRow {
                series,
                name,
                at,
                units,
                failures: failures.0,
                durations,
                samples,
                gauges: gauges.0,
            },
        )
        .collect())
}

/// Recomputes `resolution`'s rows for every period from the one holding `since` to now, from
/// the finer rollup. Safe to run again (each row is replaced by what its finer rows add up
/// to) and on a period still open. Returns the rows written.
pub async fn roll_up_since(
    pool: &PgPool,
    resolution: Resolution,
    since: DateTime<Utc>,
) -> Result<usize, Failure> {
    let Some(finer) = resolution.finer() else {
        return Ok(0);
    };
    let from = resolution.start_of(since);
    let to = Utc::now() + resolution.span();
    let rows = read(pool, finer, from, to, Select::default()).await?;
    let rolled = roll_up(&rows, resolution);
    write(pool, resolution, &rolled).await?;
    Ok(rolled.len())
}

/// Deletes at most `batch` rows of `resolution`'s table older than `retention`, oldest
/// first, in one statement. Returns how many went.
pub async fn sweep_batch(
    pool: &PgPool,
    resolution: Resolution,
    retention: Duration,
    batch: u32,
) -> Result<u64, Failure> {
    let table = resolution.table();
    let sql = format!(
        "DELETE FROM {table} WHERE ctid IN ( \
             SELECT ctid FROM {table} WHERE at < now() - make_interval(secs => $1) \
             ORDER BY at LIMIT $2)"
    );
    let done = sqlx::query(&sql)
        .bind(retention.as_secs_f64())
        .bind(i64::from(batch.max(1)))
        .execute(pool)
        .await
        .map_err(classify)?;
    Ok(done.rows_affected())
}
