//! # job-outbox-drain: publishes what the outbox holds
//!
//! A job that changes the database and must also publish a message writes the message into
//! the outbox in the same transaction ([`worker_store::outbox::enqueue`]). This timer job
//! publishes those rows with publisher confirms and marks each processed, or failed, by its
//! row id.
//!
//! ## One tick
//!
//! A tick drains batches until a batch comes back short (the outbox is drained) or the tick's
//! token fires. Each batch is one transaction:
//!
//! 1. claim up to `batch_size` due rows in id order, `FOR UPDATE SKIP LOCKED`, so that
//!    replicas share the outbox without a lease (each takes rows the others do not hold);
//! 2. publish them with [`Publisher::publish_many`]: mandatory, confirmed, pipelined;
//! 3. mark the confirmed rows processed (one statement); add an attempt to each failed one
//!    with a backoff, or mark it `failed` with its error once it has had `max_attempts`;
//! 4. commit.
//!
//! When the first batch is full, `batches_in_flight` lanes of batches run at once, and each lane
//! claims and publishes its next batch while the previous one writes its marks and commits, so
//! that the database work overlaps the publishing and the drain is bounded by the broker. A tick
//! holds up to `2 × batches_in_flight` pooled connections. The marks commit with
//! `synchronous_commit = off`: a commit lost to a PostgreSQL crash only publishes its rows
//! again, which at-least-once allows (the enqueuing transaction stays fully durable).
//!
//! ## Guarantees
//!
//! * **At least once.** A crash (or a tick cut short) between publish and commit rolls the
//!   marks back, so the rows are published again; consumers dedup on the message id.
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
//! The retention sweep of processed rows runs inside ticks, at most once per
//! `purge_interval`; [`OutboxDrain::purge`] runs it on demand.

pub mod publish;
pub mod settings;
pub mod waker;

use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use sqlx::{PgConnection, PgPool};
use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;
use worker_broker::{Outgoing, Publisher};
use worker_core::{Failure, RetryPolicy, TickReport, TimerJob, WorkContext};
use worker_store::outbox::{self, PublishFailure};
use worker_store::{Tx, classify};

pub use publish::Verdict;
pub use settings::OutboxDrainJobSettings;
pub use waker::{ListenerSettings, listen};

/// The job's name, in logs, metrics and the attempt log.
pub const JOB_NAME: &str = "outbox-drain";

/// What the host needs to know of this job (its name, kind and lease).
pub const JOB: worker_core::JobSpec =
    worker_core::catalog::JobSpec::timer(JOB_NAME, worker_core::catalog::Lease::EveryReplica);

/// How a batch's transaction begins ([`OutboxDrain::begin`]).
const BEGIN_BATCH: &str = "BEGIN; SET LOCAL synchronous_commit = off";

/// `[jobs.outbox_drain]`: how the drain claims, publishes, retries and sweeps.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct OutboxDrainSettings {
    /// Rows claimed and published per batch (one transaction).
    pub batch_size: u32,
    /// Batches in flight at once within a tick once the outbox has a backlog.
    pub batches_in_flight: usize,
    /// Attempts before a row is marked `failed`.
    pub max_attempts: u32,
    /// The delay before a failed row's next attempt: `delay_for(attempts + 1)` of this policy
    /// (its `max_attempts` is not used).
    pub backoff: RetryPolicy,
    /// Processed rows older than this are deleted.
    #[serde(with = "humantime_serde")]
    pub retention: Duration,
    /// The retention sweep runs at most this often, inside a tick.
    #[serde(with = "humantime_serde")]
    pub purge_interval: Duration,
    /// A tick starts no new batch after this long; the batches in flight finish and commit.
    /// Keep it well below the tick's timeout, which drops a tick (and rolls back the batches
    /// in flight, to be published again) rather than letting it finish.
    #[serde(with = "humantime_serde")]
    pub tick_budget: Duration,
}

impl Default for OutboxDrainSettings {
    fn default() -> Self {
        Self {
            batch_size: 500,
            batches_in_flight: 3,
            max_attempts: 10,
            backoff: RetryPolicy {
                max_tries: 10,
                base_delay: Duration::from_secs(1),
                factor: 2.0,
                max_delay: Duration::from_secs(300),
                jitter: true,
            },
            retention: Duration::from_secs(7 * 24 * 3600),
            purge_interval: Duration::from_secs(600),
            tick_budget: Duration::from_secs(10),
        }
    }
}

impl OutboxDrainSettings {
    /// Checks what an operator wrote; the message names the offending key.
    pub fn validate(&self) -> Result<(), String> {
        if self.batch_size == 0 {
            return Err("`batch_size` must be at least 1".into());
        }
        if self.batches_in_flight == 0 {
            return Err("`batches_in_flight` must be at least 1".into());
        }
        if self.max_attempts == 0 {
            return Err("`max_attempts` must be at least 1".into());
        }
        self.backoff
            .validate()
            .map_err(|e| format!("`backoff`: {e}"))?;
        if self.retention.is_zero() {
            return Err("`retention` must be longer than zero".into());
        }
        if self.tick_budget.is_zero() {
            return Err("`tick_budget` must be longer than zero".into());
        }
        Ok(())
    }

    /// The wait before the next attempt of a row that has now failed `attempts` times.
    fn retry_in(&self, attempts: u32) -> Duration {
        self.backoff.jittered_delay_for(attempts.saturating_add(1))
    }
}

/// What one batch did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BatchReport {
    pub claimed: u64,
    pub published: u64,
    /// Failed this time, pending again after their backoff.
    pub retrying: u64,
    /// Failed for the last time: now `failed`.
    pub failed: u64,
    /// Not tried to the end (broker away, tick cancelled): left pending as they were.
    pub untouched: u64,
    /// The drain stopped on its tick budget while full batches kept coming: more is due.
    pub more_due: bool,
}

impl BatchReport {
    fn add(&mut self, other: &Self) {
        self.more_due |= other.more_due;
        self.claimed += other.claimed;
        self.published += other.published;
        self.retrying += other.retrying;
        self.failed += other.failed;
        self.untouched += other.untouched;
    }
}

/// A claimed batch after its publish, before its marks: see [`OutboxDrain::publish_batch`].
#[derive(Debug)]
pub struct PublishedBatch {
    rows: Vec<(i64, i32, String)>,
    verdicts: Vec<Verdict>,
}

impl PublishedBatch {
    /// Rows claimed.
    pub fn len(&self) -> usize {
        self.rows.len()
    }

    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    /// The row ids that were confirmed.
    pub fn published_ids(&self) -> Vec<i64> {
        self.rows
            .iter()
            .zip(&self.verdicts)
            .filter(|(_, v)| v.is_published())
            .map(|((id, _, _), _)| *id)
            .collect()
    }
}

/// The outbox drain timer job. See the crate docs.
pub struct OutboxDrain {
    pool: PgPool,
    publisher: Publisher,
    settings: OutboxDrainSettings,
    last_purge: Mutex<Option<Instant>>,
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
            last_purge: Mutex::new(None),
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
    /// budget is spent (then the report says `more_due`).
    pub async fn drain(&self, cancel: &CancellationToken) -> Result<BatchReport, Failure> {
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
    /// claimed and published while batch `k` writes its marks and commits (on another
    /// connection; `SKIP LOCKED` keeps the two apart), so the marks stay off the critical path.
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
                    // The batch in hand is published already: mark it if the database lets us.
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

    /// One batch in one transaction: claim, publish, mark, commit.
    pub async fn drain_batch(&self, cancel: &CancellationToken) -> Result<BatchReport, Failure> {
        match self.claim_and_publish(cancel).await? {
            None => Ok(BatchReport::default()),
            Some((tx, batch)) => self.finish(tx, batch).await,
        }
    }

    /// Begins a batch's transaction, committing without waiting for the WAL flush: losing
    /// its commit to a PostgreSQL crash only means publishing its rows again, which
    /// at-least-once allows. The setting goes with the `BEGIN`, in the same round trip.
    pub async fn begin(&self) -> Result<Tx, Failure> {
        self.pool.begin_with(BEGIN_BATCH).await.map_err(classify)
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

    /// Writes a published batch's marks and commits; rolls back when nothing could be tried.
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

    /// Claims a batch inside `tx` and publishes it; the marks are not written. The first half
    /// of [`drain_batch`](Self::drain_batch), public so that a test can "crash" between the
    /// publish and the commit by dropping `tx`.
    pub async fn publish_batch(
        &self,
        tx: &mut PgConnection,
        cancel: &CancellationToken,
    ) -> Result<PublishedBatch, Failure> {
        let claimed = outbox::claim(tx, self.settings.batch_size).await?;
        if claimed.is_empty() {
            return Ok(PublishedBatch {
                rows: Vec::new(),
                verdicts: Vec::new(),
            });
        }
        let mut rows = Vec::with_capacity(claimed.len());
        let mut messages: Vec<Outgoing> = Vec::with_capacity(claimed.len());
        let mut spans = Vec::with_capacity(claimed.len());
        for row in claimed {
            rows.push((row.id, row.attempts, row.message_id.clone()));
            let id = row.id;
            let mut message = publish::to_outgoing(row);
            // Each row's publish is a span of its own, in the trace of the work that wrote
            // the row; the message carries it to the consumers.
            spans.push(publish::publish_span(id, &mut message));
            messages.push(message);
        }
        let span = tracing::debug_span!("outbox publish", rows = rows.len());
        let verdicts = publish::publish_rows(&self.publisher, &messages, cancel)
            .instrument(span)
            .await;
        for (span, verdict) in spans.iter().zip(&verdicts) {
            publish::record_verdict(span, verdict);
        }
        Ok(PublishedBatch { rows, verdicts })
    }

    /// Writes the marks of a published batch inside `tx`: processed for the confirmed rows,
    /// an attempt (or `failed`) for the others, nothing for the untouched ones.
    pub async fn settle(
        &self,
        tx: &mut PgConnection,
        batch: &PublishedBatch,
    ) -> Result<BatchReport, Failure> {
        let mut published = Vec::new();
        let mut failures = Vec::new();
        let mut untouched = 0;
        for ((id, attempts, message_id), verdict) in batch.rows.iter().zip(&batch.verdicts) {
            match verdict {
                Verdict::Published => published.push(*id),
                Verdict::Failed(err) => {
                    let attempts = u32::try_from(*attempts).unwrap_or(0).saturating_add(1);
                    let retry_in = self.settings.retry_in(attempts);
                    tracing::warn!(
                        job = JOB_NAME,
                        row = id,
                        message_id = %message_id,
                        attempts,
                        max_attempts = self.settings.max_attempts,
                        error = %err,
                        "outbox row not published"
                    );
                    failures.push(PublishFailure {
                        id: *id,
                        error: err.to_string(),
                        retry_in,
                    });
                }
                Verdict::Untouched(_) => untouched += 1,
            }
        }
        let marked = outbox::mark_processed(tx, &published).await?;
        let counts = outbox::record_failures(tx, &failures, self.settings.max_attempts).await?;
        if counts.failed > 0 {
            tracing::error!(
                job = JOB_NAME,
                rows = counts.failed,
                "outbox rows gave up after their last attempt; see `worker-host outbox status`"
            );
        }
        Ok(BatchReport {
            claimed: batch.rows.len() as u64,
            published: marked,
            retrying: counts.retrying,
            failed: counts.failed,
            untouched,
            more_due: false,
        })
    }

    /// Deletes processed rows older than the retention window; returns how many went.
    pub async fn purge(&self) -> Result<u64, Failure> {
        outbox::purge_processed(&self.pool, self.settings.retention, 5_000).await
    }

    /// Runs [`purge`](Self::purge) when the last one is older than `purge_interval`. A
    /// failure is logged, not returned: the sweep must not hold up publishing.
    async fn purge_if_due(&self) {
        let due = {
            let Ok(mut last) = self.last_purge.lock() else {
                return;
            };
            let due = last.is_none_or(|at| at.elapsed() >= self.settings.purge_interval);
            if due {
                *last = Some(Instant::now());
            }
            due
        };
        if !due {
            return;
        }
        match self.purge().await {
            Ok(0) => {}
            Ok(n) => tracing::info!(job = JOB_NAME, rows = n, "swept processed outbox rows"),
            Err(failure) => {
                tracing::warn!(job = JOB_NAME, error = %failure, "could not sweep processed outbox rows");
            }
        }
    }
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
        self.purge_if_due().await;
        let mut tick = TickReport::items(report.published);
        if report.claimed > 0 {
            tick = tick.with_detail(format!(
                "claimed {}, published {}, retrying {}, failed {}, left pending {}",
                report.claimed, report.published, report.retrying, report.failed, report.untouched
            ));
        }
        Ok(tick)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_settings_are_valid_and_checked() {
        assert!(OutboxDrainSettings::default().validate().is_ok());
        let bad = OutboxDrainSettings {
            batch_size: 0,
            ..OutboxDrainSettings::default()
        };
        assert!(bad.validate().unwrap_err().contains("batch_size"));
    }

    #[test]
    fn backoff_grows_with_the_attempts_and_is_capped() {
        let settings = OutboxDrainSettings {
            backoff: RetryPolicy {
                max_tries: 1,
                base_delay: Duration::from_secs(1),
                factor: 2.0,
                max_delay: Duration::from_secs(10),
                jitter: false,
            },
            ..OutboxDrainSettings::default()
        };
        assert_eq!(settings.retry_in(1), Duration::from_secs(1));
        assert_eq!(settings.retry_in(2), Duration::from_secs(2));
        assert_eq!(settings.retry_in(3), Duration::from_secs(4));
        assert_eq!(settings.retry_in(30), Duration::from_secs(10));
    }

    #[test]
    fn settings_read_from_toml_with_defaults() {
        let s: OutboxDrainSettings =
            serde_json::from_value(serde_json::json!({"batch_size": 100, "retention": "3days"}))
                .unwrap();
        assert_eq!(s.batch_size, 100);
        assert_eq!(s.retention, Duration::from_secs(3 * 24 * 3600));
        assert_eq!(s.max_attempts, OutboxDrainSettings::default().max_attempts);
    }
}
