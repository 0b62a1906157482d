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
             started_at = EXCLUDED.started_at, last_seen = now()",
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
