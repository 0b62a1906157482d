//! "Send parked now" (issue 39): what waits in a queue's retry tiers, moved back to its work
//! queue at an operator's request, from the command line (`worker-host queues send-now`) or
//! the queue's console page. A dry run counts per tier and moves nothing; a real run moves at
//! most the count the operator confirmed. Both are audit entries (`send-now`) with who, the
//! queue and why. The broker side ([`worker_broker::parked`]) acks each message on its tier
//! only once its copy in the work queue is confirmed, and keeps its `x-attempt`.

use serde::Serialize;
use serde_json::json;
use sqlx::PgPool;
use worker_broker::parked::{self, ParkedTier};
use worker_broker::{Publisher, RetryTier, Session};
use worker_core::Failure;
use worker_store::audit::{self, Actor, EntryKind, NewEntry};

/// What an operator asked for.
#[derive(Debug, Clone)]
pub struct Request {
    pub actor: Actor,
    /// Why, kept in the audit entry's target (trimmed; none when blank).
    pub reason: Option<String>,
    /// Count only.
    pub dry_run: bool,
    /// The count the operator confirmed: a real run moves at most this many.
    pub planned: Option<u64>,
}

/// What a send-now found and did.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// Its audit entry.
    pub action_id: i64,
    pub dry_run: bool,
    pub queue: String,
    /// Per tier, shortest delay first, what waited when it started.
    pub tiers: Vec<ParkedTier>,
    /// Everything that waited when it started.
    pub waiting: u64,
    /// Moved to the work queue (0 for a dry run).
    pub moved: u64,
    /// Waiting beyond the planned count, left in the tiers.
    pub beyond_planned: Option<u64>,
    /// Why it stopped early, if it did (the broker failed mid-way).
    pub stopped: Option<String>,
}

/// Counts what waits in `tiers`, the retry tiers of `work_queue`, and, unless it is a dry run, moves at most the
/// planned count (all of it when none was planned) back to the work queue; audited either way.
pub async fn send_now(
    pool: &PgPool,
    session: &Session,
    publisher: &Publisher,
    work_queue: &str,
    tiers: &[RetryTier],
    request: &Request,
) -> Result<Report, Failure> {
    let found = parked::parked(session, work_queue, tiers).await?;
    let waiting = found.total();
    let reason = worker_store::pauses::clean_reason(request.reason.as_deref());
    let target = match &reason {
        Some(reason) => json!({ "queue": work_queue, "reason": reason }),
        None => json!({ "queue": work_queue }),
    };
    let mut entry = NewEntry::new(EntryKind::SendNow, &request.actor, target);
    entry.dry_run = request.dry_run;
    entry.planned = request.planned;
    let mut conn = pool.acquire().await.map_err(worker_store::classify)?;
    let action_id = audit::begin(&mut conn, &entry).await?;
    let mut report = Report {
        action_id,
        dry_run: request.dry_run,
        queue: work_queue.to_owned(),
        tiers: found.tiers,
        waiting,
        moved: 0,
        beyond_planned: None,
        stopped: None,
    };
    if request.dry_run {
        let note = format!("would move {waiting} from the retry tiers");
        audit::finish(&mut conn, action_id, Some(note), Some(waiting)).await?;
        return Ok(report);
    }
    let cap = request.planned.unwrap_or(waiting);
    let sent = parked::send_parked_now(session, publisher, work_queue, tiers, cap).await;
    let (moved, stopped) = match sent {
        Ok(sent) => (sent.moved, sent.stopped),
        Err(failure) => (0, Some(failure.to_string())),
    };
    report.moved = moved;
    report.stopped = stopped;
    report.beyond_planned = waiting.checked_sub(cap).filter(|&more| more > 0);
    let failed = u64::from(report.stopped.is_some());
    audit::progress(&mut conn, action_id, moved + failed, moved, failed).await?;
    let note = match &report.stopped {
        Some(why) => format!("moved {moved} of {cap}, then stopped: {why}"),
        None => format!("moved {moved} of {cap} planned"),
    };
    audit::finish(&mut conn, action_id, Some(note), None).await?;
    Ok(report)
}
