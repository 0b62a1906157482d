//! The statements on `dependency_circuits`.

use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::PgPool;
use worker_core::Failure;
use worker_core::circuit::CircuitSettings;

use crate::audit::{self, Actor, EntryKind, NewEntry};
use crate::classify;
use crate::pauses::{CHANNEL, PauseChange, clean_reason};

/// The longest reason kept, in characters.
const REASON_MAX: usize = 1000;

/// An open circuit, as every replica sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, sqlx::FromRow)]
pub struct OpenCircuit {
    pub dependency: String,
    pub opened_at: DateTime<Utc>,
    /// Why, in the dependency's own words.
    pub reason: String,
    /// The replica whose failure opened it.
    pub opened_by: String,
    /// Probes failed since it opened.
    pub failed_probes: i32,
    /// When the next probe may run.
    pub probe_at: DateTime<Utc>,
    /// The replica that took the last probe.
    pub probed_by: Option<String>,
    pub last_probe_at: Option<DateTime<Utc>>,
}

impl OpenCircuit {
    /// How long until its next probe may run, at `now` (zero when it is due).
    pub fn probe_in(&self, now: DateTime<Utc>) -> Duration {
        (self.probe_at - now).to_std().unwrap_or_default()
    }
}

/// Every open circuit, by dependency.
pub async fn list(pool: &PgPool) -> Result<Vec<OpenCircuit>, Failure> {
    sqlx::query_as(
        "SELECT dependency, opened_at, reason, opened_by, failed_probes, probe_at, probed_by, \
                last_probe_at \
         FROM dependency_circuits ORDER BY dependency",
    )
    .fetch_all(pool)
    .await
    .map_err(classify)
}

async fn announce(conn: &mut sqlx::PgConnection, dependency: &str) -> Result<(), Failure> {
    sqlx::query("SELECT pg_notify($1, $2)")
        .bind(CHANNEL)
        .bind(format!("circuit:{dependency}"))
        .execute(conn)
        .await
        .map_err(classify)?;
    Ok(())
}

/// Opens `dependency`'s circuit, first probe after `cool_down`. The open circuit, and whether
/// this call opened it (`false`: it was open already, and stays as it was).
pub(crate) async fn open(
    pool: &PgPool,
    dependency: &str,
    reason: &str,
    replica: &str,
    cool_down: Duration,
) -> Result<(OpenCircuit, bool), Failure> {
    let mut tx = pool.begin().await.map_err(classify)?;
    let opened: Option<OpenCircuit> = sqlx::query_as(
        "INSERT INTO dependency_circuits (dependency, reason, opened_by, probe_at) \
         VALUES ($1, $2, $3, now() + $4 * interval '1 millisecond') \
         ON CONFLICT (dependency) DO NOTHING \
         RETURNING dependency, opened_at, reason, opened_by, failed_probes, probe_at, \
                   probed_by, last_probe_at",
    )
    .bind(dependency)
    .bind(worker_core::truncate(reason, REASON_MAX))
    .bind(replica)
    .bind(millis(cool_down))
    .fetch_optional(&mut *tx)
    .await
    .map_err(classify)?;
    let result = match opened {
        Some(circuit) => {
            announce(&mut tx, dependency).await?;
            (circuit, true)
        }
        None => (one(&mut tx, dependency).await?, false),
    };
    tx.commit().await.map_err(classify)?;
    Ok(result)
}

/// An open circuit, and whether the statement that returned it opened it.
#[derive(sqlx::FromRow)]
struct Opened {
    #[sqlx(flatten)]
    circuit: OpenCircuit,
    opened: bool,
}

/// Opens `dependency`'s circuit until `until` (its first probe then), whatever its counts say:
/// the dependency said it takes no more before then (a provider's sending quota). An open
/// circuit keeps its opening but probes no sooner than `until`, with `reason` as its reason.
/// The circuit, and whether this call opened it (`false`: it was open already).
pub(crate) async fn open_until(
    pool: &PgPool,
    dependency: &str,
    reason: &str,
    replica: &str,
    until: DateTime<Utc>,
) -> Result<(OpenCircuit, bool), Failure> {
    let mut tx = pool.begin().await.map_err(classify)?;
    // `xmax` is zero on a row this statement inserted, and set on one it updated.
    let opened: Opened = sqlx::query_as(
        "INSERT INTO dependency_circuits AS c (dependency, reason, opened_by, probe_at) \
         VALUES ($1, $2, $3, $4) \
         ON CONFLICT (dependency) DO UPDATE \
             SET reason = EXCLUDED.reason, probe_at = greatest(c.probe_at, EXCLUDED.probe_at) \
         RETURNING dependency, opened_at, reason, opened_by, failed_probes, probe_at, \
                   probed_by, last_probe_at, (xmax = 0) AS opened",
    )
    .bind(dependency)
    .bind(worker_core::truncate(reason, REASON_MAX))
    .bind(replica)
    .bind(until)
    .fetch_one(&mut *tx)
    .await
    .map_err(classify)?;
    announce(&mut tx, dependency).await?;
    tx.commit().await.map_err(classify)?;
    Ok((opened.circuit, opened.opened))
}

async fn one(conn: &mut sqlx::PgConnection, dependency: &str) -> Result<OpenCircuit, Failure> {
    sqlx::query_as(
        "SELECT dependency, opened_at, reason, opened_by, failed_probes, probe_at, probed_by, \
                last_probe_at \
         FROM dependency_circuits WHERE dependency = $1",
    )
    .bind(dependency)
    .fetch_one(conn)
    .await
    .map_err(classify)
}

/// Takes the due probe of `dependency`'s circuit for `replica`, moving the next one `bound`
/// on so that no other replica probes meanwhile: whether it was taken (not when the circuit
/// is closed, its probe is not due, or another replica took it).
pub(crate) async fn take_probe(
    pool: &PgPool,
    dependency: &str,
    replica: &str,
    bound: Duration,
) -> Result<bool, Failure> {
    let taken = sqlx::query(
        "UPDATE dependency_circuits \
         SET probe_at = now() + $3 * interval '1 millisecond', probed_by = $2, \
             last_probe_at = now() \
         WHERE dependency = $1 AND probe_at <= now()",
    )
    .bind(dependency)
    .bind(replica)
    .bind(millis(bound))
    .execute(pool)
    .await
    .map_err(classify)?
    .rows_affected();
    Ok(taken == 1)
}

/// Records a failed probe: the next after the cool-down for one more failed probe, with the
/// dependency's latest answer as the reason. The circuit as it now is (none: it was closed
/// meanwhile).
pub(crate) async fn probe_failed(
    pool: &PgPool,
    dependency: &str,
    reason: &str,
    settings: &CircuitSettings,
) -> Result<Option<OpenCircuit>, Failure> {
    let mut tx = pool.begin().await.map_err(classify)?;
    let failed: Option<i32> = sqlx::query_scalar(
        "SELECT failed_probes FROM dependency_circuits WHERE dependency = $1 FOR UPDATE",
    )
    .bind(dependency)
    .fetch_optional(&mut *tx)
    .await
    .map_err(classify)?;
    let Some(failed) = failed else {
        return Ok(None);
    };
    let failed = u32::try_from(failed).unwrap_or(0).saturating_add(1);
    let circuit = sqlx::query_as(
        "UPDATE dependency_circuits \
         SET failed_probes = $2, reason = $3, probe_at = now() + $4 * interval '1 millisecond' \
         WHERE dependency = $1 \
         RETURNING dependency, opened_at, reason, opened_by, failed_probes, probe_at, \
                   probed_by, last_probe_at",
    )
    .bind(dependency)
    .bind(i32::try_from(failed).unwrap_or(i32::MAX))
    .bind(worker_core::truncate(reason, REASON_MAX))
    .bind(millis(settings.cool_down_after(failed)))
    .fetch_one(&mut *tx)
    .await
    .map_err(classify)?;
    announce(&mut tx, dependency).await?;
    tx.commit().await.map_err(classify)?;
    Ok(Some(circuit))
}

/// Closes `dependency`'s circuit: whether it was open.
pub(crate) async fn close(pool: &PgPool, dependency: &str) -> Result<bool, Failure> {
    let mut tx = pool.begin().await.map_err(classify)?;
    let closed = delete(&mut tx, dependency).await?;
    if closed {
        announce(&mut tx, dependency).await?;
    }
    tx.commit().await.map_err(classify)?;
    Ok(closed)
}

async fn delete(conn: &mut sqlx::PgConnection, dependency: &str) -> Result<bool, Failure> {
    let removed = sqlx::query("DELETE FROM dependency_circuits WHERE dependency = $1")
        .bind(dependency)
        .execute(conn)
        .await
        .map_err(classify)?
        .rows_affected();
    Ok(removed > 0)
}

/// An operator closes `dependency`'s circuit on every replica, recorded with `actor` and
/// `reason` (audit kind `circuit-close`): its calls start again at once, the next failure
/// counting from zero.
pub async fn close_by_hand(
    pool: &PgPool,
    dependency: &str,
    actor: &Actor,
    reason: Option<&str>,
) -> Result<PauseChange, Failure> {
    let reason = clean_reason(reason);
    let mut tx = pool.begin().await.map_err(classify)?;
    let changed = delete(&mut tx, dependency).await?;
    let target = match &reason {
        Some(reason) => serde_json::json!({ "dependency": dependency, "reason": reason }),
        None => serde_json::json!({ "dependency": dependency }),
    };
    let note = if changed {
        reason
    } else {
        Some("was not open".to_string())
    };
    let action_id = audit::record(
        &mut tx,
        &NewEntry::new(EntryKind::CircuitClose, actor, target),
        u64::from(changed),
        0,
        note,
    )
    .await?;
    if changed {
        announce(&mut tx, dependency).await?;
    }
    tx.commit().await.map_err(classify)?;
    tracing::info!(dependency, action_id, actor = %actor.label(), changed, "circuit closed by hand");
    Ok(PauseChange { action_id, changed })
}

fn millis(wait: Duration) -> f64 {
    wait.as_secs_f64() * 1000.0
}
