//! Paused jobs (`job_pauses`): an operator's pause holds back a timer job's scheduled ticks
//! on every replica, since each reads this table before a tick, and stops a consumer job's
//! consumers on every replica, since each host watches this table ([`CHANNEL`] for at once, a
//! poll as the bound), until it is resumed. Both are recorded in the audit trail, with why
//! (the reason is kept in the pause's audit row, `filter ->> 'reason'`), in the transaction
//! that changes the pause, which also notifies [`CHANNEL`] on commit.

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::PgPool;
use worker_core::{Failure, JobSpec};

use crate::audit::{self, Actor, EntryKind, NewEntry};
use crate::classify;

/// The channel every pause and resume is announced on (`NOTIFY`, on commit), with the job's
/// name as the payload.
pub const CHANNEL: &str = "job_pauses";

/// The longest reason kept, in characters; a longer one is cut.
pub const REASON_MAX: usize = 500;

/// A paused job, with who paused it and why.
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
    /// Why, as the operator gave it.
    pub reason: Option<String>,
}

impl Pause {
    /// How long it has been paused, at `now`.
    pub fn age(&self, now: DateTime<Utc>) -> std::time::Duration {
        (now - self.paused_at).to_std().unwrap_or_default()
    }

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

fn target(job: &str, reason: Option<&str>) -> serde_json::Value {
    match reason {
        Some(reason) => serde_json::json!({ "job": job, "reason": reason }),
        None => serde_json::json!({ "job": job }),
    }
}

/// A reason as kept: trimmed, at most [`REASON_MAX`] characters, none when blank.
pub fn clean_reason(reason: Option<&str>) -> Option<String> {
    let reason = reason?.trim();
    (!reason.is_empty()).then(|| reason.chars().take(REASON_MAX).collect())
}

/// Announces a change of `job`'s pause to every replica, when `tx` commits.
async fn announce(tx: &mut sqlx::PgConnection, job: &str) -> Result<(), Failure> {
    sqlx::query("SELECT pg_notify($1, $2)")
        .bind(CHANNEL)
        .bind(job)
        .execute(tx)
        .await
        .map_err(classify)?;
    Ok(())
}

/// Pauses `job` on every replica, recorded with `actor` and `reason`. A pause under one of its
/// earlier names counts as its pause.
pub async fn pause(
    pool: &PgPool,
    job: &JobSpec,
    actor: &Actor,
    reason: Option<&str>,
) -> Result<PauseChange, Failure> {
    let names: Vec<&str> = job.names().collect();
    let job = job.name;
    let reason = clean_reason(reason);
    let mut tx = pool.begin().await.map_err(classify)?;
    // The audit row first, so that the pause can name it; a job already paused keeps the
    // pause it had, and the trail says this one changed nothing.
    let action_id = audit::begin(
        &mut tx,
        &NewEntry::new(EntryKind::Pause, actor, target(job, reason.as_deref())),
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
    let note = if changed {
        reason.clone()
    } else {
        Some("already paused".to_string())
    };
    audit::finish(&mut tx, action_id, note, None).await?;
    if changed {
        announce(&mut tx, job).await?;
    }
    tx.commit().await.map_err(classify)?;
    tracing::info!(job, action_id, actor = %actor.label(), reason = reason.as_deref().unwrap_or(""), changed, "job paused");
    Ok(PauseChange { action_id, changed })
}

/// Resumes `job` on every replica, recorded with `actor` and `reason`: its pause under any of
/// its names.
pub async fn resume(
    pool: &PgPool,
    job: &JobSpec,
    actor: &Actor,
    reason: Option<&str>,
) -> Result<PauseChange, Failure> {
    let names: Vec<&str> = job.names().collect();
    let job = job.name;
    let reason = clean_reason(reason);
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
        &NewEntry::new(EntryKind::Resume, actor, target(job, reason.as_deref())),
        u64::from(changed),
        0,
        if changed {
            reason
        } else {
            Some("was not paused".to_string())
        },
    )
    .await?;
    if changed {
        announce(&mut tx, job).await?;
    }
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

/// Every paused job, with who paused it and why.
pub async fn list(pool: &PgPool) -> Result<Vec<Pause>, Failure> {
    sqlx::query_as(
        "SELECT p.job, p.paused_at, p.action_id, a.actor_user, a.actor_host, a.actor, \
                a.account, a.via, a.filter ->> 'reason' AS reason \
         FROM job_pauses p JOIN dead_letter_actions a ON a.id = p.action_id ORDER BY p.job",
    )
    .fetch_all(pool)
    .await
    .map_err(classify)
}

/// A listener on [`CHANNEL`] on a connection of its own, opened with `pool`'s connect
/// options: a listening connection is held for good and must not take one of the pool's.
/// sqlx reconnects it by itself; a notice sent meanwhile is lost (`try_recv` answers `None`).
pub async fn listen(pool: &PgPool) -> Result<sqlx::postgres::PgListener, Failure> {
    let options = (*pool.connect_options())
        .clone()
        .application_name("worker-host pause listener");
    let own = sqlx::postgres::PgPoolOptions::new()
        .max_connections(1)
        .min_connections(0)
        .max_lifetime(None)
        .idle_timeout(None)
        .acquire_timeout(std::time::Duration::from_secs(10))
        .connect_lazy_with(options);
    let mut listener = sqlx::postgres::PgListener::connect_with(&own)
        .await
        .map_err(classify)?;
    listener.ignore_pool_close_event(true);
    listener.listen(CHANNEL).await.map_err(classify)?;
    Ok(listener)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reason_is_trimmed_bounded_and_none_when_blank() {
        assert_eq!(clean_reason(None), None);
        assert_eq!(clean_reason(Some("  ")), None);
        assert_eq!(
            clean_reason(Some(" smtp down ")).as_deref(),
            Some("smtp down")
        );
        let long = "x".repeat(REASON_MAX + 10);
        assert_eq!(clean_reason(Some(&long)).map(|r| r.len()), Some(REASON_MAX));
    }
}
