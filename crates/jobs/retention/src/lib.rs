//! # job-retention: the bookkeeping tables stay bounded
//!
//! Two tables grow with every message the host handles: `processed_messages` (the
//! processed-message guard's marks, kept `jobs.retention.processed_messages`) and `attempt_log` (a row
//! per failed try and final outcome, kept `jobs.retention.attempt_log`); three grow with time:
//! the history's rollups by minute, hour and day (`history_minutes`, `history_hours`,
//! `history_days`, kept `jobs.retention.history_minutes`, `history_hours`, `history_days`);
//! and `publications` (a row per message the outbox drain published, for a mail's story, kept
//! `jobs.retention.publications`). This
//! timer job deletes what is past its retention, so that none grows without bound.
//!
//! One more is personal data rather than size: an edit's diff in the audit trail (a customer's
//! mail before and after) is redacted once older than `jobs.retention.audit_diff` (30 days by
//! default), its fields' before and after replaced by `[redacted]`; the audit row itself stays,
//! with its kind, who and when ([`worker_store::privacy::aged_diffs`]). It is counted like a
//! sweep, as table `audit_diff`.
//!
//! It also removes the `outbox` rows that earlier releases marked `processed` and kept for
//! a week (today's drain deletes a row once the broker confirmed it, so it leaves none):
//! whatever their age, in the same short batches, so that an upgrade needs no migration
//! holding a long lock on a busy table. Pending and failed rows are never touched.
//!
//! ## One tick
//!
//! For each table in turn, batches of at most [`RetentionConfig::batch_size`] rows, oldest
//! first, each one short `DELETE` of its own
//! ([`ProcessedMessages::sweep_batch`](worker_store::ProcessedMessages::sweep_batch),
//! [`attempt_log::sweep_batch`](worker_store::attempt_log::sweep_batch)). A table is left when
//! a batch comes back short (nothing more is due) or after
//! [`RetentionConfig::max_batches_per_tick`] batches, so a tick deletes at most
//! `batch_size × max_batches_per_tick` rows per table and a large backlog is worked off over
//! several ticks. The tick's token (its timeout, the host stopping, a lost lease) stops it
//! between batches and during a statement. What each table lost is reported to
//! [`RetentionEvents::on_swept`] (the host counts it in `worker_retention_swept_total`).
//!
//! ## Guarantees
//!
//! * **Only rows past their retention go**: a mark younger than `processed_messages`, an attempt
//!   row younger than the attempt log's retention, are never touched; of the outbox, only rows
//!   marked `processed` (published) go, never a pending or failed one.
//! * **Safe to re-run**, and safe on several replicas at once (a `DELETE` of rows already gone
//!   deletes nothing); the host runs it under the lease all the same, so that one replica
//!   does the work.
//!
//! ## What the host wires
//!
//! ```no_run
//! # async fn host(pool: sqlx::PgPool, lease: worker_store::AdvisoryLease) {
//! use std::time::Duration;
//! use job_retention::{Retention, RetentionConfig};
//! use worker_core::{SkipIfBusy, WorkContext, tick_once};
//!
//! let job = Retention::new(pool, RetentionConfig {
//!     processed_messages: Duration::from_secs(7 * 24 * 3600), // jobs.retention.processed_messages
//!     attempt_log: Duration::from_secs(14 * 24 * 3600),       // jobs.retention.attempt_log
//!     ..RetentionConfig::default()                             // [jobs.retention]
//! });
//! let busy = SkipIfBusy::new(job_retention::JOB_NAME);
//! let ctx = WorkContext::new(job_retention::JOB_NAME, tokio_util::sync::CancellationToken::new());
//! // The scheduler does this on `jobs.retention.schedule`.
//! let outcome = tick_once(&job, &busy, Some(&lease), Duration::from_secs(60), &ctx).await;
//! # let _ = outcome; }
//! ```

pub mod settings;

use std::sync::Arc;
use std::time::Duration;

use sqlx::PgPool;
use worker_core::{Failure, TickReport, TimerJob, WorkContext};
use worker_store::ProcessedMessages;

pub use settings::RetentionSettings;

/// The job's name, in logs, metrics, the attempt log and its lease.
pub const JOB_NAME: &str = "retention";

/// What the host needs to know of this job (its name, kind and lease).
pub const JOB: worker_core::JobSpec =
    worker_core::catalog::JobSpec::timer(JOB_NAME, worker_core::catalog::Lease::OneReplica);

/// The tables this job sweeps, as they are named in its reports and metric labels.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Table {
    ProcessedMessages,
    AttemptLog,
    HistoryMinutes,
    HistoryHours,
    HistoryDays,
    Publications,
    /// Outbox rows an earlier release marked processed (published) and kept.
    ProcessedOutbox,
    /// Edits in the audit trail whose diff (a customer's mail, before and after) is past its
    /// retention: the diff is redacted, the entry stays.
    AuditDiff,
    /// Other teams' audit entries (`audit_log_entries`), only when `jobs.retention.audit_log`
    /// is set.
    AuditLog,
}

impl Table {
    pub const ALL: [Self; 9] = [
        Self::ProcessedMessages,
        Self::AttemptLog,
        Self::HistoryMinutes,
        Self::HistoryHours,
        Self::HistoryDays,
        Self::Publications,
        Self::ProcessedOutbox,
        Self::AuditDiff,
        Self::AuditLog,
    ];

    /// The table's name (`processed_messages`, `attempt_log`, ...), as the metric labels it;
    /// `outbox` for the processed outbox rows.
    pub const fn as_str(&self) -> &'static str {
        match self {
            Self::ProcessedMessages => "processed_messages",
            Self::AttemptLog => "attempt_log",
            Self::HistoryMinutes => "history_minutes",
            Self::HistoryHours => "history_hours",
            Self::HistoryDays => "history_days",
            Self::Publications => "publications",
            Self::ProcessedOutbox => "outbox",
            Self::AuditDiff => "audit_diff",
            Self::AuditLog => "audit_log",
        }
    }

    /// The history's rollup this table holds, if it is one.
    const fn history(self) -> Option<worker_store::history::Resolution> {
        use worker_store::history::Resolution;
        match self {
            Self::HistoryMinutes => Some(Resolution::Minute),
            Self::HistoryHours => Some(Resolution::Hour),
            Self::HistoryDays => Some(Resolution::Day),
            Self::ProcessedMessages
            | Self::AttemptLog
            | Self::Publications
            | Self::ProcessedOutbox
            | Self::AuditDiff
            | Self::AuditLog => None,
        }
    }
}

/// How long each table keeps its rows, and how much one tick may delete.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetentionConfig {
    /// Processed-message marks older than this go (`jobs.retention.processed_messages`).
    pub processed_messages: Duration,
    /// Attempt-log rows older than this go (`jobs.retention.attempt_log`).
    pub attempt_log: Duration,
    /// The history's minute rows older than this go (`jobs.retention.history_minutes`).
    pub history_minutes: Duration,
    /// The history's hour rows older than this go (`jobs.retention.history_hours`).
    pub history_hours: Duration,
    /// The history's day rows older than this go (`jobs.retention.history_days`).
    pub history_days: Duration,
    /// Publications older than this go (`jobs.retention.publications`).
    pub publications: Duration,
    /// Edits older than this lose their diff in the audit trail (`jobs.retention.audit_diff`).
    pub audit_diff: Duration,
    /// Audit entries that occurred longer ago than this go (`jobs.retention.audit_log`);
    /// `None`: kept for good.
    pub audit_log: Option<Duration>,
    /// Rows per `DELETE` (at least 1).
    pub batch_size: u32,
    /// Batches per table per tick at most (at least 1); the rest waits for the next tick.
    pub max_batches_per_tick: u32,
}

impl Default for RetentionConfig {
    fn default() -> Self {
        Self {
            processed_messages: Duration::from_secs(7 * 24 * 3600),
            attempt_log: Duration::from_secs(14 * 24 * 3600),
            history_minutes: Duration::from_secs(2 * 24 * 3600),
            history_hours: Duration::from_secs(30 * 24 * 3600),
            history_days: Duration::from_secs(365 * 24 * 3600),
            publications: Duration::from_secs(30 * 24 * 3600),
            audit_diff: Duration::from_secs(30 * 24 * 3600),
            audit_log: None,
            batch_size: 1000,
            max_batches_per_tick: 20,
        }
    }
}

impl RetentionConfig {
    fn retention(&self, table: Table) -> Duration {
        match table {
            Table::ProcessedMessages => self.processed_messages,
            Table::AttemptLog => self.attempt_log,
            Table::HistoryMinutes => self.history_minutes,
            Table::HistoryHours => self.history_hours,
            Table::HistoryDays => self.history_days,
            Table::Publications => self.publications,
            Table::AuditDiff => self.audit_diff,
            // Unset: never reached, the table is not swept (see `sweep`).
            Table::AuditLog => self.audit_log.unwrap_or(Duration::MAX),
            // Published already: kept by no promise, whatever their age.
            Table::ProcessedOutbox => Duration::ZERO,
        }
    }
}

/// Told what each tick removed, table by table (the host counts it in a metric).
pub trait RetentionEvents: Send + Sync + std::fmt::Debug {
    /// `rows` rows of `table` were deleted, all in committed batches. Called once per table
    /// per tick that deleted something, including a tick cut short.
    fn on_swept(&self, table: Table, rows: u64);
}

/// Events that go nowhere.
#[derive(Debug, Default, Clone, Copy)]
pub struct NoEvents;

impl RetentionEvents for NoEvents {
    fn on_swept(&self, _table: Table, _rows: u64) {}
}

/// What one table lost in one tick.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TableReport {
    /// Rows deleted.
    pub swept: u64,
    /// `DELETE` statements run (the last may have been short or empty).
    pub batches: u32,
    /// The tick stopped at its batch cap or its token with a full last batch: more may be due.
    pub backlog_remains: bool,
}

/// What one tick did.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RetentionReport {
    pub processed_messages: TableReport,
    pub attempt_log: TableReport,
    pub history_minutes: TableReport,
    pub history_hours: TableReport,
    pub history_days: TableReport,
    pub publications: TableReport,
    /// Outbox rows an earlier release marked processed.
    pub processed_outbox: TableReport,
    /// Edits whose diff was redacted (the rows stay).
    pub audit_diff: TableReport,
    /// Other teams' audit entries past `jobs.retention.audit_log`.
    pub audit_log: TableReport,
    /// The tick's token fired before it was done.
    pub cancelled: bool,
}

impl RetentionReport {
    pub fn table(&self, table: Table) -> &TableReport {
        match table {
            Table::ProcessedMessages => &self.processed_messages,
            Table::AttemptLog => &self.attempt_log,
            Table::HistoryMinutes => &self.history_minutes,
            Table::HistoryHours => &self.history_hours,
            Table::HistoryDays => &self.history_days,
            Table::Publications => &self.publications,
            Table::ProcessedOutbox => &self.processed_outbox,
            Table::AuditDiff => &self.audit_diff,
            Table::AuditLog => &self.audit_log,
        }
    }

    fn table_mut(&mut self, table: Table) -> &mut TableReport {
        match table {
            Table::ProcessedMessages => &mut self.processed_messages,
            Table::AttemptLog => &mut self.attempt_log,
            Table::HistoryMinutes => &mut self.history_minutes,
            Table::HistoryHours => &mut self.history_hours,
            Table::HistoryDays => &mut self.history_days,
            Table::Publications => &mut self.publications,
            Table::ProcessedOutbox => &mut self.processed_outbox,
            Table::AuditDiff => &mut self.audit_diff,
            Table::AuditLog => &mut self.audit_log,
        }
    }

    /// Rows deleted over every table.
    pub fn swept(&self) -> u64 {
        Table::ALL.iter().map(|t| self.table(*t).swept).sum()
    }

    /// The history's rows deleted, over its three tables.
    pub fn history_swept(&self) -> u64 {
        self.history_minutes.swept + self.history_hours.swept + self.history_days.swept
    }
}

/// The retention job. See the crate docs.
#[derive(Debug, Clone)]
pub struct Retention {
    pool: PgPool,
    config: RetentionConfig,
    events: Arc<dyn RetentionEvents>,
}

impl Retention {
    pub fn new(pool: PgPool, config: RetentionConfig) -> Self {
        Self::observed(pool, config, Arc::new(NoEvents))
    }

    /// The job, telling `events` what each tick removed.
    pub fn observed(
        pool: PgPool,
        config: RetentionConfig,
        events: Arc<dyn RetentionEvents>,
    ) -> Self {
        Self {
            pool,
            config,
            events,
        }
    }

    pub fn config(&self) -> &RetentionConfig {
        &self.config
    }

    /// One tick's work, with its report (the [`TimerJob::tick`] is this, summarised). A
    /// failure on one table stops the tick; what was deleted before it is still reported.
    pub async fn run(&self, ctx: &WorkContext) -> Result<RetentionReport, Failure> {
        let mut report = RetentionReport::default();
        for table in Table::ALL {
            let swept = self.sweep(ctx, table, &mut report).await;
            let rows = report.table(table).swept;
            if rows > 0 {
                self.events.on_swept(table, rows);
            }
            swept.map_err(|failure| failure.context(format!("sweeping {}", table.as_str())))?;
            if report.cancelled {
                break;
            }
        }
        Ok(report)
    }

    async fn sweep(
        &self,
        ctx: &WorkContext,
        table: Table,
        report: &mut RetentionReport,
    ) -> Result<(), Failure> {
        let batch = self.config.batch_size.max(1);
        let max_batches = self.config.max_batches_per_tick.max(1);
        if table == Table::AuditLog && self.config.audit_log.is_none() {
            return Ok(());
        }
        let retention = self.config.retention(table);
        loop {
            let done = report.table(table);
            if done.batches >= max_batches {
                report.table_mut(table).backlog_remains = true;
                return Ok(());
            }
            let deleted = tokio::select! {
                biased;
                () = ctx.cancel.cancelled() => {
                    // The statement in flight may still commit on the server: harmless, it
                    // deletes only what is past retention.
                    report.cancelled = true;
                    report.table_mut(table).backlog_remains = true;
                    return Ok(());
                }
                deleted = self.sweep_batch(table, retention, batch) => deleted?,
            };
            let done = report.table_mut(table);
            done.batches += 1;
            done.swept += deleted;
            if deleted < u64::from(batch) {
                return Ok(());
            }
        }
    }

    async fn sweep_batch(
        &self,
        table: Table,
        retention: Duration,
        batch: u32,
    ) -> Result<u64, Failure> {
        if let Some(resolution) = table.history() {
            return worker_store::history::sweep_batch(&self.pool, resolution, retention, batch)
                .await;
        }
        match table {
            Table::ProcessedMessages => {
                ProcessedMessages::new()
                    .sweep_batch(&self.pool, retention, batch)
                    .await
            }
            Table::Publications => {
                worker_store::outbox::sweep_publications(&self.pool, retention, batch).await
            }
            Table::ProcessedOutbox => {
                worker_store::outbox::sweep_processed_batch(&self.pool, batch).await
            }
            Table::AuditDiff => {
                worker_store::privacy::aged_diffs::redact_batch(&self.pool, retention, batch).await
            }
            Table::AuditLog => sweep_audit_log(&self.pool, retention, batch).await,
            _ => worker_store::attempt_log::sweep_batch(&self.pool, retention, batch).await,
        }
    }
}

/// Deletes up to `batch` audit entries that occurred longer than `retention` ago, oldest
/// first; how many went. The audit-log job owns the table otherwise: this is its only delete.
async fn sweep_audit_log(pool: &PgPool, retention: Duration, batch: u32) -> Result<u64, Failure> {
    let deleted = sqlx::query(
        "DELETE FROM audit_log_entries WHERE id IN ( \
             SELECT id FROM audit_log_entries \
             WHERE occurred_at < now() - make_interval(secs => $1) \
             ORDER BY occurred_at LIMIT $2)",
    )
    .bind(retention.as_secs_f64())
    .bind(i64::from(batch))
    .execute(pool)
    .await
    .map_err(worker_store::classify)?;
    Ok(deleted.rows_affected())
}

impl TimerJob for Retention {
    fn name(&self) -> &str {
        JOB_NAME
    }

    async fn tick(&self, ctx: &WorkContext) -> Result<TickReport, Failure> {
        let report = self.run(ctx).await?;
        let mut detail = format!(
            "swept {} processed-message marks, {} attempt-log rows, {} history rows and {} publications",
            report.processed_messages.swept,
            report.attempt_log.swept,
            report.history_swept(),
            report.publications.swept
        );
        if report.processed_outbox.swept > 0 {
            detail.push_str(&format!(
                ", and {} outbox rows an earlier release marked processed",
                report.processed_outbox.swept
            ));
        }
        if report.audit_diff.swept > 0 {
            detail.push_str(&format!(
                ", and redacted the diff of {} edits in the audit trail",
                report.audit_diff.swept
            ));
        }
        if Table::ALL.iter().any(|t| report.table(*t).backlog_remains) {
            detail.push_str("; more are due");
            tracing::info!(
                job = JOB_NAME,
                processed_messages = report.processed_messages.swept,
                attempt_log = report.attempt_log.swept,
                "a backlog past retention remains for the next tick"
            );
        }
        Ok(TickReport::items(report.swept()).with_detail(detail))
    }
}
