//! # job-outbox-drain: publishes what the outbox holds
//!
//! A job that changes the database and must also publish a message writes the message into
//! the outbox in the same transaction ([`worker_store::outbox::enqueue`]). This timer job
//! publishes those rows with publisher confirms and deletes each one the broker confirmed, or
//! marks it for another attempt (or `failed`), by its row id.
//!
//! ## One tick
//!
//! A tick drains batches until a batch comes back short (the outbox is drained) or the tick's
//! token fires. Each batch is one transaction:
//!
//! 1. claim up to `batch_size` due rows in id order, `FOR UPDATE SKIP LOCKED`, so that
//!    replicas share the outbox without a lease (each takes rows the others do not hold);
//! 2. publish them with [`Publisher::publish_many`]: mandatory, confirmed, pipelined;
//! 3. delete the confirmed rows and record their publications (one statement); add an attempt
//!    to each failed one with a backoff, or mark it `failed` with its error once it has had
//!    `max_attempts`;
//! 4. commit.
//!
//! A tick woken for a few rows first waits `gather` (a few milliseconds), so that the rows
//! committed right after the one that woke it go out in the same batch: one claim and one
//! transaction for them, not one each. It waits only when that pays ([`gathers`]): when the
//! previous drain ended less than `gather` ago or claimed more than one row, the signs that
//! rows are coming together. At a trickle (a row now and then, each drained on its own) the
//! wait would only add `gather` to every hop of every mail. A tick that follows one ending on
//! a full batch with more due does not wait either.
//!
//! When the first batch is full, `batches_in_flight` lanes of batches run at once, and each lane
//! claims and publishes its next batch while the previous one writes its deletes and commits, so
//! that the database work overlaps the publishing and the drain is bounded by the broker. A tick
//! holds up to `2 × batches_in_flight` pooled connections. The deletes commit with
//! `synchronous_commit = off`: a commit lost to a PostgreSQL crash only publishes its rows
//! again, which at-least-once allows (the enqueuing transaction stays fully durable).
//!
//! ## Guarantees
//!
//! * **At least once.** A row is deleted only in the transaction that claimed it, after the
//!   broker confirmed it. A crash (or a tick cut short) between publish and commit rolls the
//!   deletes back, so the rows are published again; consumers dedup on the message id.
//! * **No duplicates between healthy replicas.** A row is locked by the batch that claimed it
//!   until that batch commits, and `SKIP LOCKED` keeps other replicas off it.
//! * **A poisoned row delays the others by at most one batch.** Its failure is recorded on
//!   its row alone (an unroutable message is returned to us; an exchange that does not exist
//!   closes the channel, and the rows it took down are isolated and published again in the
//!   same batch, see [`publish`]), and its backoff keeps it out of the next batches.
//! * **A broker outage burns no attempts.** Rows that could not be tried because the broker
//!   is away stay pending as they were; the tick fails transiently and the next one retries.
//!
//! ## How the host runs it
//!
//! From its one line in the host's job list (`crates/host/src/jobs.rs`), built from its
//! settings section; ARCHITECTURE.md ("Adding a job") walks through that wiring.
//!
//! A tick starts no new batch once its `tick_budget` is spent (keep it below the tick's
//! timeout, which would drop the batches in flight and publish them again); with a backlog
//! left it signals the wake-up, so the next tick follows at once.
//!
//! Nothing published stays in the outbox, so the drain sweeps nothing; rows that earlier
//! releases marked processed and kept are removed by the retention job (`job-retention`).

mod batch;
pub mod publish;
pub mod settings;
pub mod waker;

use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sqlx::PgPool;
use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use worker_broker::Publisher;
use worker_core::{Failure, TickReport, TimerJob, WorkContext};
use worker_store::outbox;
use worker_store::{Tx, classify};

pub use batch::{BatchReport, PublishedBatch};
pub use publish::Verdict;
pub use settings::{DrainBackoff, OutboxDrainJobSettings, OutboxDrainSettings};
pub use waker::{ListenerSettings, listen};

/// The job's name, in logs, metrics and the attempt log.
pub const JOB_NAME: &str = "outbox-drain";

/// What the host needs to know of this job (its name, kind and lease).
pub const JOB: worker_core::JobSpec =
    worker_core::catalog::JobSpec::timer(JOB_NAME, worker_core::catalog::Lease::EveryReplica);

/// The outbox drain timer job. See the crate docs.
pub struct OutboxDrain {
    pool: PgPool,
    publisher: Publisher,
    settings: OutboxDrainSettings,
    /// What the last drain saw: whether the next one gathers ([`gathers`]).
    last: Mutex<Option<LastDrain>>,
    wake: Option<Arc<Notify>>,
}

impl fmt::Debug for OutboxDrain {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OutboxDrain")
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}

impl OutboxDrain {
    /// A drain over `pool` publishing through `publisher` (e.g.
    /// [`Supervisor::publisher`](worker_broker::Supervisor::publisher)). The publisher should
    /// have at least `batches_in_flight` channels.
    pub fn new(pool: PgPool, publisher: Publisher, settings: OutboxDrainSettings) -> Self {
        Self {
            pool,
            publisher,
            settings,
            last: Mutex::new(None),
            wake: None,
        }
    }

    /// Signals `wake` (the host's wake-up for this job, the one [`listen`] signals) when a
    /// tick ends on its budget with more rows due, so that the next tick follows at once
    /// instead of on the schedule.
    #[must_use]
    pub fn wake_on_backlog(mut self, wake: Arc<Notify>) -> Self {
        self.wake = Some(wake);
        self
    }

    pub fn settings(&self) -> &OutboxDrainSettings {
        &self.settings
    }

    /// Drains batches until the outbox is drained, `cancel` fires, a batch fails, or the tick
    /// budget is spent (then the report says `more_due`). Waits the gather window first when
    /// the last drain says rows are coming together ([`gathers`]).
    pub async fn drain(&self, cancel: &CancellationToken) -> Result<BatchReport, Failure> {
        self.gather(cancel).await;
        let report = self.drain_now(cancel).await;
        let seen = LastDrain {
            ended: Instant::now(),
            claimed: report.as_ref().map_or(0, |r| r.claimed),
            more_due: report.as_ref().is_ok_and(|r| r.more_due),
        };
        if let Ok(mut last) = self.last.lock() {
            *last = Some(seen);
        }
        report
    }

    /// The gather window: a wake comes with the first row of what may be a few committed
    /// together, and one claim a few milliseconds later takes them all.
    async fn gather(&self, cancel: &CancellationToken) {
        let wait = self.settings.gather;
        let last = self.last.lock().ok().and_then(|last| *last);
        if !gathers(last, Instant::now(), wait) {
            return;
        }
        tokio::select! {
            biased;
            () = cancel.cancelled() => {}
            () = tokio::time::sleep(wait) => {}
        }
    }

    async fn drain_now(&self, cancel: &CancellationToken) -> Result<BatchReport, Failure> {
        let until = Instant::now() + self.settings.tick_budget;
        let mut total = BatchReport::default();
        let first = self.drain_batch(cancel).await?;
        total.add(&first);
        if !self.is_full(&first) {
            return Ok(total);
        }
        let lanes = (0..self.settings.batches_in_flight.max(1)).map(|_| self.lane(cancel, until));
        let mut failure = None;
        for (report, error) in futures::future::join_all(lanes).await {
            total.add(&report);
            if failure.is_none() {
                failure = error;
            }
        }
        match failure {
            // What was published is committed; the failure is the tick's.
            Some(failure) if total.published == 0 => Err(failure),
            Some(failure) => {
                tracing::warn!(error = %failure, published = total.published, "a drain batch failed");
                Ok(total)
            }
            None => Ok(total),
        }
    }

    /// One lane of batches, while they come back full. The lane is pipelined: batch `k+1` is
    /// claimed and published while batch `k` writes its deletes and commits (on another
    /// connection; `SKIP LOCKED` keeps the two apart), so they stay off the critical path.
    async fn lane(
        &self,
        cancel: &CancellationToken,
        until: Instant,
    ) -> (BatchReport, Option<Failure>) {
        let mut total = BatchReport::default();
        let mut settling = None;
        loop {
            if cancel.is_cancelled() {
                break;
            }
            if Instant::now() >= until {
                total.more_due = true;
                break;
            }
            let next = self.claim_and_publish(cancel);
            let (next, settled) = match settling.take() {
                Some(settle) => {
                    let (next, settled) = futures::future::join(next, settle).await;
                    (next, Some(settled))
                }
                None => (next.await, None),
            };
            let previous_full = match settled {
                None => true,
                Some(Ok(report)) => {
                    total.add(&report);
                    self.is_full(&report)
                }
                Some(Err(failure)) => {
                    // The batch in hand is published already: settle it if the database lets us.
                    if let Ok(Some((tx, batch))) = next
                        && let Ok(report) = self.finish(tx, batch).await
                    {
                        total.add(&report);
                    }
                    return (total, Some(failure));
                }
            };
            let (tx, batch) = match next {
                Ok(Some(claimed)) => claimed,
                Ok(None) => break,
                Err(failure) => return (total, Some(failure)),
            };
            let full = batch.len() >= self.settings.batch_size as usize;
            settling = Some(Box::pin(self.finish(tx, batch)));
            if !full || !previous_full {
                break;
            }
        }
        if let Some(settle) = settling {
            match settle.await {
                Ok(report) => total.add(&report),
                Err(failure) => return (total, Some(failure)),
            }
        }
        (total, None)
    }

    /// A batch is full when it claimed a whole batch and got it out: then more may be due.
    /// A batch stopped by a broker outage is not, so that the tick ends.
    fn is_full(&self, report: &BatchReport) -> bool {
        report.claimed >= u64::from(self.settings.batch_size) && report.untouched == 0
    }

    /// One batch in one transaction: claim, publish, delete (or mark what failed), commit.
    pub async fn drain_batch(&self, cancel: &CancellationToken) -> Result<BatchReport, Failure> {
        match self.claim_and_publish(cancel).await? {
            None => Ok(BatchReport::default()),
            Some((tx, batch)) => self.finish(tx, batch).await,
        }
    }

    /// Begins a batch's transaction ([`outbox::begin_batch`]: its commit does not wait for the
    /// WAL flush, which at-least-once allows).
    pub async fn begin(&self) -> Result<Tx, Failure> {
        outbox::begin_batch(&self.pool).await
    }

    /// Begins a transaction, claims a batch and publishes it; `None` when nothing is due.
    async fn claim_and_publish(
        &self,
        cancel: &CancellationToken,
    ) -> Result<Option<(Tx, PublishedBatch)>, Failure> {
        let mut tx = self.begin().await?;
        let batch = self.publish_batch(&mut tx, cancel).await?;
        if batch.is_empty() {
            tx.rollback().await.map_err(classify)?;
            return Ok(None);
        }
        Ok(Some((tx, batch)))
    }

    /// Writes a published batch's deletes and marks and commits; rolls back when nothing could
    /// be tried.
    async fn finish(&self, mut tx: Tx, batch: PublishedBatch) -> Result<BatchReport, Failure> {
        let report = self.settle(&mut tx, &batch).await?;
        if report.published == 0 && report.retrying == 0 && report.failed == 0 {
            // Nothing could be tried: the broker is away. Leave the rows as they were.
            tx.rollback().await.map_err(classify)?;
            let why = batch
                .verdicts
                .iter()
                .find_map(|v| match v {
                    Verdict::Untouched(Some(err)) => Some(err.to_string()),
                    _ => None,
                })
                .unwrap_or_else(|| "cancelled".to_string());
            return Err(Failure::transient(format!(
                "{} outbox rows left pending: {why}",
                report.untouched
            )));
        }
        tx.commit().await.map_err(classify)?;
        Ok(report)
    }
}

/// What a drain saw, for whether the next one gathers.
#[derive(Debug, Clone, Copy)]
pub struct LastDrain {
    /// When it ended.
    pub ended: Instant,
    /// The rows it claimed, in all its batches.
    pub claimed: u64,
    /// It stopped on its budget with more rows due.
    pub more_due: bool,
}

/// Whether a drain starting `now` waits the gather window `gather` first, after `last`: only
/// when rows are coming together, so that the wait takes more than one row into its claim.
/// They are when the last drain claimed more than one row (several were committed within its
/// own window or while it ran), or ended less than a window ago (the wake followed it at once,
/// as under load). Not when more is due (the rows are there: claim at once), and not after a
/// quiet spell or before any drain: a trickle's row is drained on its own anyway, and the wait
/// would be a delay of every hop.
pub fn gathers(last: Option<LastDrain>, now: Instant, gather: Duration) -> bool {
    let Some(last) = last else {
        return false;
    };
    !gather.is_zero()
        && !last.more_due
        && (last.claimed > 1 || now.saturating_duration_since(last.ended) < gather)
}

impl TimerJob for OutboxDrain {
    fn name(&self) -> &str {
        JOB_NAME
    }

    async fn tick(&self, ctx: &WorkContext) -> Result<TickReport, Failure> {
        let report = self.drain(&ctx.cancel).await?;
        if report.more_due
            && let Some(wake) = &self.wake
        {
            wake.notify_one();
        }
        let mut tick = TickReport::items(report.published);
        if report.claimed > 0 {
            tick = tick.with_detail(format!(
                "claimed {} in {} batches, published {}, retrying {}, failed {}, left pending {}",
                report.claimed,
                report.batches,
                report.published,
                report.retrying,
                report.failed,
                report.untouched
            ));
        }
        Ok(tick)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn a_drain_gathers_only_after_one_that_was_recent_or_took_several_rows() {
        let now = Instant::now() + Duration::from_secs(10);
        let gather = ms(5);
        let last = |ago: Duration, claimed: u64, more_due: bool| {
            Some(LastDrain {
                ended: now - ago,
                claimed,
                more_due,
            })
        };
        assert!(!gathers(None, now, gather), "nothing says rows are coming");
        assert!(!gathers(last(ms(500), 1, false), now, gather), "a trickle");
        assert!(
            !gathers(last(ms(500), 0, false), now, gather),
            "an idle tick"
        );
        assert!(gathers(last(ms(2), 1, false), now, gather), "recent");
        assert!(
            gathers(last(ms(500), 2, false), now, gather),
            "several rows"
        );
        assert!(
            gathers(last(ms(500), 500, false), now, gather),
            "a full batch"
        );
        assert!(!gathers(last(ms(1), 500, true), now, gather), "more is due");
        assert!(!gathers(last(ms(1), 5, false), now, Duration::ZERO), "off");
    }
}
