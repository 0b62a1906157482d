//! Paused timer jobs (`job_pauses`): an operator's pause holds back a job's scheduled ticks
//! on every replica, since each reads this table before a tick, until it is resumed. Both
//! are recorded in the audit trail, in the transaction that changes the pause.

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::PgPool;
use worker_core::{Failure, JobSpec};

use crate::audit::{self, Actor, EntryKind, NewEntry};
use crate::classify;

/// A paused job, with who paused it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, sqlx::FromRow)]
pub struct Pause {
    pub job: String,
    pub paused_at: DateTime<Utc>,
    /// The audit row of the pause.
    pub action_id: i64,
    pub actor_user: String,
    pub actor_host: String,
    pub actor: Option<String>,
    pub account: Option<String>,
    pub via: Option<String>,
}

impl Pause {
    /// Who paused it, as the audit trail shows them.
    pub fn actor_label(&self) -> String {
        Actor {
            user: self.actor_user.clone(),
            host: self.actor_host.clone(),
            name: self.actor.clone(),
            account: self.account.clone(),
            via: audit::Via::parse(self.via.as_deref()),
        }
        .label()
    }
}

/// What a pause or a resume changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct PauseChange {
    /// Its audit row.
    pub action_id: i64,
    /// `false` when the job already was in the state asked for (recorded all the same).
    pub changed: bool,
}

fn target(job: &str) -> serde_json::Value {
    serde_json::json!({ "job": job })
}

/// Pauses `job` on every replica, recorded with `actor`. A pause under one of its earlier
/// names counts as its pause.
pub async fn pause(pool: &PgPool, job: &JobSpec, actor: &Actor) -> Result<PauseChange, Failure> {
    let names: Vec<&str> = job.names().collect();
    let job = job.name;
    let mut tx = pool.begin().await.map_err(classify)?;
    // The audit row first, so that the pause can name it; a job already paused keeps the
    // pause it had, and the trail says this one changed nothing.
    let action_id = audit::begin(
        &mut tx,
        &NewEntry::new(EntryKind::Pause, actor, target(job)),
    )
    .await?;
    let changed = sqlx::query(
        "INSERT INTO job_pauses (job, action_id) SELECT $1, $2 \
         WHERE NOT EXISTS (SELECT 1 FROM job_pauses WHERE job = ANY($3)) \
         ON CONFLICT (job) DO NOTHING",
    )
    .bind(job)
    .bind(action_id)
    .bind(&names)
    .execute(&mut *tx)
    .await
    .map_err(classify)?
    .rows_affected()
        > 0;
    audit::progress(&mut tx, action_id, 1, u64::from(changed), 0).await?;
    let note = (!changed).then(|| "already paused".to_string());
    audit::finish(&mut tx, action_id, note, None).await?;
    tx.commit().await.map_err(classify)?;
    tracing::info!(job, action_id, actor = %actor.label(), changed, "job paused");
    Ok(PauseChange { action_id, changed })
}

/// Resumes `job` on every replica, recorded with `actor`: its pause under any of its names.
pub async fn resume(pool: &PgPool, job: &JobSpec, actor: &Actor) -> Result<PauseChange, Failure> {
    let names: Vec<&str> = job.names().collect();
    let job = job.name;
    let mut tx = pool.begin().await.map_err(classify)?;
    let removed = sqlx::query("DELETE FROM job_pauses WHERE job = ANY($1)")
        .bind(&names)
        .execute(&mut *tx)
        .await
        .map_err(classify)?
        .rows_affected();
    let changed = removed > 0;
    let action_id = audit::record(
        &mut tx,
        &NewEntry::new(EntryKind::Resume, actor, target(job)),
        u64::from(changed),
        0,
        (!changed).then(|| "was not paused".to_string()),
    )
    .await?;
    tx.commit().await.map_err(classify)?;
    tracing::info!(job, action_id, actor = %actor.label(), changed, "job resumed");
    Ok(PauseChange { action_id, changed })
}

/// Whether `job` is paused now, under any of its names.
pub async fn is_paused(pool: &PgPool, job: &JobSpec) -> Result<bool, Failure> {
    let names: Vec<&str> = job.names().collect();
    sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM job_pauses WHERE job = ANY($1))")
        .bind(&names)
        .fetch_one(pool)
        .await
        .map_err(classify)
}

/// Every paused job, with who paused it.
pub async fn list(pool: &PgPool) -> Result<Vec<Pause>, Failure> {
    sqlx::query_as(
        "SELECT p.job, p.paused_at, p.action_id, a.actor_user, a.actor_host, a.actor, \
                a.account, a.via \
         FROM job_pauses p JOIN dead_letter_actions a ON a.id = p.action_id ORDER BY p.job",
    )
    .fetch_all(pool)
    .await
    .map_err(classify)
}
