//! `dlq purge`: dead letters given up on by an operator, marked `purged` (never deleted: the
//! retention sweep deletes purged rows once they are older than its window), in batches that
//! each record their count in the audit trail, at a rate if asked, until stopped.

use serde::{Deserialize, Serialize};
use sqlx::PgPool;
use tokio::time::Instant;
use worker_core::Failure;
use worker_store::audit::{self, Actor, EntryKind};
use worker_store::{classify, dead_letters};

use crate::bulk::{Run, beyond_planned_note, check, new_entry};
use crate::query::Filter;
pub use worker_store::dead_letters::count;

/// Rows per purge transaction.
const BATCH: u32 = 500;

/// What `dlq purge` did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PurgeReport {
    pub action_id: i64,
    /// Rows marked `purged` (none for a dry run).
    pub purged: u64,
    /// Rows that matched.
    pub matched: u64,
    /// Why it stopped before the end (cancelled), if it did; the rest stays dead.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stopped: Option<String>,
    /// Dead letters that matched beyond the count the operator confirmed, left dead.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub beyond_planned: Option<u64>,
}

/// `dlq purge --yes`: marks every `dead` row matching `filter` (oldest first, at most
/// `filter.limit`) `purged`, and records it.
pub async fn purge(pool: &PgPool, filter: &Filter, actor: &Actor) -> Result<PurgeReport, Failure> {
    purge_run(pool, filter, &Run::new(actor.clone())).await
}

/// `dlq purge` without `--yes`: how many dead letters `filter` would purge, recorded as a
/// dry run (its id and the count).
pub async fn purge_dry_run(
    pool: &PgPool,
    filter: &Filter,
    actor: &Actor,
) -> Result<PurgeReport, Failure> {
    purge_run(pool, filter, &Run::new(actor.clone()).dry(true)).await
}

/// [`purge`] with every option of a [`Run`]: a dry run counts and records; a real one goes
/// in batches, each committed with its count in the audit row, at most `rate` rows a second,
/// and looks at its [`Control`](crate::Control) before each batch.
pub async fn purge_run(pool: &PgPool, filter: &Filter, run: &Run) -> Result<PurgeReport, Failure> {
    check(filter, run.rate)?;
    let mut conn = pool.acquire().await.map_err(classify)?;
    let action_id = audit::begin(&mut conn, &new_entry(EntryKind::Purge, filter, run)).await?;
    drop(conn);
    run.control.begun(action_id);
    let mut report = PurgeReport {
        action_id,
        purged: 0,
        matched: 0,
        stopped: None,
        beyond_planned: None,
    };
    let mut result = if run.dry_run {
        count(pool, filter).await.map(|n| report.matched = n)
    } else {
        purge_batches(pool, filter, run, &mut report).await
    };
    if result.is_ok() && report.stopped.is_none() {
        match run.beyond_planned(pool, filter, report.purged, 0).await {
            Ok(more) => report.beyond_planned = more,
            Err(failure) => result = Err(failure),
        }
    }
    let note = match &result {
        Err(failure) => Some(format!("stopped: {failure}")),
        Ok(()) => report
            .stopped
            .clone()
            .map(|why| format!("stopped: {why}"))
            .or_else(|| {
                report
                    .beyond_planned
                    .map(|more| beyond_planned_note(run.planned, more))
            }),
    };
    let mut conn = pool.acquire().await.map_err(classify)?;
    audit::finish(
        &mut conn,
        action_id,
        note,
        run.dry_run.then_some(report.matched),
    )
    .await?;
    if !run.dry_run {
        tracing::info!(action_id, purged = report.purged, actor = %run.actor.label(), "purged dead letters");
    }
    result.map(|()| report)
}

async fn purge_batches(
    pool: &PgPool,
    filter: &Filter,
    run: &Run,
    report: &mut PurgeReport,
) -> Result<(), Failure> {
    let batch = run.rate.map_or(BATCH, |r| r.clamp(1, BATCH));
    let started = Instant::now();
    let mut remaining = run.cap(filter.limit);
    loop {
        if let Some(why) = run.control.why() {
            report.stopped = Some(why);
            return Ok(());
        }
        let take = remaining.map_or(u64::from(batch), |r| r.min(u64::from(batch)));
        if take == 0 {
            return Ok(());
        }
        if let Some(rate) = run.rate {
            let due = started
                + std::time::Duration::from_secs_f64(report.matched as f64 / f64::from(rate));
            tokio::select! {
                () = tokio::time::sleep_until(due) => {}
                () = run.control.stopped() => continue,
            }
        }
        let mut tx = pool.begin().await.map_err(classify)?;
        let purged = dead_letters::mark_purged(&mut tx, report.action_id, filter, take).await?;
        audit::progress(&mut tx, report.action_id, purged, purged, 0).await?;
        tx.commit().await.map_err(classify)?;
        report.purged += purged;
        report.matched += purged;
        remaining = remaining.map(|r| r.saturating_sub(purged));
        if purged < take {
            return Ok(());
        }
    }
}
