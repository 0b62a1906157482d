//! The replicas that report in (`replicas`): each host process writes its name, machine,
//! version and start on an interval, so that any replica's console can list them all and say
//! when each was last seen.

use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::PgPool;
use worker_core::Failure;

use crate::classify;

/// How long a replica that stopped reporting stays listed.
pub const FORGET_AFTER: Duration = Duration::from_secs(7 * 24 * 3600);

/// One host process, as it reports itself.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, sqlx::FromRow)]
pub struct Replica {
    pub name: String,
    pub installation: String,
    pub host: String,
    pub pid: i32,
    pub version: String,
    pub started_at: DateTime<Utc>,
    pub last_seen: DateTime<Utc>,
}

/// Writes `replica`'s report, seen now by the database's clock, and forgets replicas that
/// have not reported for [`FORGET_AFTER`].
pub async fn report(pool: &PgPool, replica: &Replica) -> Result<(), Failure> {
    let mut tx = pool.begin().await.map_err(classify)?;
    sqlx::query(
        "INSERT INTO replicas (name, installation, host, pid, version, started_at, last_seen) \
         VALUES ($1, $2, $3, $4, $5, $6, now()) \
         ON CONFLICT (name) DO UPDATE SET installation = EXCLUDED.installation, \
             host = EXCLUDED.host, pid = EXCLUDED.pid, version = EXCLUDED.version, \
             started_at = EXCLUDED.started_at, last_seen = now(), stopped_at = NULL",
    )
    .bind(&replica.name)
    .bind(&replica.installation)
    .bind(&replica.host)
    .bind(replica.pid)
    .bind(&replica.version)
    .bind(replica.started_at)
    .execute(&mut *tx)
    .await
    .map_err(classify)?;
    sqlx::query("DELETE FROM replicas WHERE last_seen < now() - make_interval(secs => $1)")
        .bind(FORGET_AFTER.as_secs_f64())
        .execute(&mut *tx)
        .await
        .map_err(classify)?;
    tx.commit().await.map_err(classify)?;
    Ok(())
}

/// Records that the replica `name` stopped cleanly: it is no longer expected to report.
pub async fn stopped(pool: &PgPool, name: &str) -> Result<(), Failure> {
    sqlx::query("UPDATE replicas SET stopped_at = now() WHERE name = $1")
        .bind(name)
        .execute(pool)
        .await
        .map_err(classify)?;
    Ok(())
}

/// Forgets the replica `name` (one that is gone for good without a clean stop); whether there
/// was one.
pub async fn forget(pool: &PgPool, name: &str) -> Result<bool, Failure> {
    let deleted = sqlx::query("DELETE FROM replicas WHERE name = $1")
        .bind(name)
        .execute(pool)
        .await
        .map_err(classify)?;
    Ok(deleted.rows_affected() > 0)
}

/// The replicas that are expected to report, by whether they do.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Census {
    /// Reported within the window.
    pub live: u64,
    /// Not reported within the window, and never stopped cleanly.
    pub silent: u64,
}

/// Counts the replicas that reported within `silent_after` (live) and those that did not and
/// never said they stopped (silent), by the database's clock.
pub async fn census(pool: &PgPool, silent_after: Duration) -> Result<Census, Failure> {
    let (live, silent): (i64, i64) = sqlx::query_as(
        "SELECT count(*) FILTER (WHERE last_seen >= now() - make_interval(secs => $1)), \
                count(*) FILTER (WHERE last_seen < now() - make_interval(secs => $1)) \
         FROM replicas WHERE stopped_at IS NULL",
    )
    .bind(silent_after.as_secs_f64())
    .fetch_one(pool)
    .await
    .map_err(classify)?;
    Ok(Census {
        live: u64::try_from(live).unwrap_or_default(),
        silent: u64::try_from(silent).unwrap_or_default(),
    })
}

/// A replica as `worker-host replicas list` shows it: what it reported, and its state by the
/// database's clock (`live`, `silent` or `stopped`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, sqlx::FromRow)]
pub struct Standing {
    #[sqlx(flatten)]
    #[serde(flatten)]
    pub replica: Replica,
    pub stopped_at: Option<DateTime<Utc>>,
    pub state: String,
}

/// Every replica that reported within [`FORGET_AFTER`] with its state, as [`census`] counts
/// them, the most recently seen first.
pub async fn standings(pool: &PgPool, silent_after: Duration) -> Result<Vec<Standing>, Failure> {
    sqlx::query_as(
        "SELECT name, installation, host, pid, version, started_at, last_seen, stopped_at, \
                CASE WHEN stopped_at IS NOT NULL THEN 'stopped' \
                     WHEN last_seen >= now() - make_interval(secs => $1) THEN 'live' \
                     ELSE 'silent' END AS state \
         FROM replicas ORDER BY last_seen DESC, name",
    )
    .bind(silent_after.as_secs_f64())
    .fetch_all(pool)
    .await
    .map_err(classify)
}

/// Every replica that reported within [`FORGET_AFTER`], the most recently seen first.
pub async fn list(pool: &PgPool) -> Result<Vec<Replica>, Failure> {
    sqlx::query_as(
        "SELECT name, installation, host, pid, version, started_at, last_seen \
         FROM replicas ORDER BY last_seen DESC, name",
    )
    .fetch_all(pool)
    .await
    .map_err(classify)
}
