//! # job-draft-expiry: drafts past their expiry become `expired`
//!
//! A timer job over the `email_drafts` table (migration `20261129000310_email_drafts.sql`).
//! A draft whose `expires_at` has passed while its status is still `draft` is marked
//! `expired`, with `expired_at` and `updated_at` set. Drafts that were sent, or expired
//! already, or that have no expiry, are never touched.
//!
//! ## One tick
//!
//! The tick runs batches of at most [`DraftExpiryConfig::batch_size`] drafts, each batch one
//! short statement (and so one short transaction of its own):
//!
//! ```sql
//! UPDATE email_drafts SET status = 'expired', ...
//! WHERE id IN (SELECT id FROM email_drafts
//!              WHERE status = 'draft' AND expires_at <= now()
//!              ORDER BY expires_at LIMIT $batch
//!              FOR UPDATE SKIP LOCKED)
//! ```
//!
//! It stops when a batch comes back short (nothing more is due), after
//! [`DraftExpiryConfig::max_batches_per_tick`] batches, or when the tick's token fires
//! (its timeout, or the host stopping). A large backlog is thus worked off over several
//! ticks, and no transaction ever holds more than one batch of row locks.
//!
//! ## Guarantees
//!
//! * **Safe to re-run**: a status sweep. A tick cut short leaves every committed batch
//!   committed and the rest for the next tick.
//! * **Replicas and the platform do not block on it**: `SKIP LOCKED` passes over a draft that
//!   another transaction holds (the platform sending it, say), and the outer `status = 'draft'`
//!   re-check means a draft sent meanwhile stays sent.
//!
//! ## How the host runs it
//!
//! From its one line in the host's job list (`crates/host/src/jobs.rs`), built from its
//! settings section; ARCHITECTURE.md ("Adding a job") walks through that wiring.

pub mod settings;

use std::time::Duration;

use sqlx::PgPool;
use tokio::time::Instant;
use worker_core::{Failure, TickReport, TimerJob, WorkContext};

pub use settings::DraftExpirySettings;

/// The job's name, in logs, metrics and the attempt log.
pub const JOB_NAME: &str = "draft-expiry";

/// What the host needs to know of this job (its name, kind and lease).
pub const JOB: worker_core::JobSpec =
    worker_core::catalog::JobSpec::timer(JOB_NAME, worker_core::catalog::Lease::OneReplica);

/// How much one tick may do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DraftExpiryConfig {
    /// Drafts expired per batch (one statement, one transaction). At least 1.
    pub batch_size: u32,
    /// Batches per tick at most (at least 1); the rest waits for the next tick.
    pub max_batches_per_tick: u32,
}

impl Default for DraftExpiryConfig {
    fn default() -> Self {
        Self {
            batch_size: 1000,
            max_batches_per_tick: 10,
        }
    }
}

/// What one tick did.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ExpiryReport {
    /// Drafts marked expired.
    pub expired: u64,
    /// Batches run (the last one may have been short or empty).
    pub batches: u32,
    /// The tick stopped at its batch cap or its token with a full last batch: more may be due.
    pub backlog_remains: bool,
    /// The tick's token fired before it was done.
    pub cancelled: bool,
    pub elapsed: Duration,
}

/// The draft expiry job. See the crate docs.
#[derive(Debug, Clone)]
pub struct DraftExpiry {
    pool: PgPool,
    config: DraftExpiryConfig,
}

impl DraftExpiry {
    pub fn new(pool: PgPool, config: DraftExpiryConfig) -> Self {
        Self { pool, config }
    }

    pub fn config(&self) -> &DraftExpiryConfig {
        &self.config
    }

    /// One tick's work, with its report (the [`TimerJob::tick`] is this, summarised).
    pub async fn run(&self, ctx: &WorkContext) -> Result<ExpiryReport, Failure> {
        let started = Instant::now();
        let batch_size = self.config.batch_size.max(1);
        let max_batches = self.config.max_batches_per_tick.max(1);
        let mut report = ExpiryReport::default();
        loop {
            if ctx.cancel.is_cancelled() {
                report.cancelled = true;
                report.backlog_remains = report.batches > 0;
                break;
            }
            if report.batches >= max_batches {
                report.backlog_remains = true;
                break;
            }
            let done = tokio::select! {
                biased;
                () = ctx.cancel.cancelled() => {
                    // The statement in flight may still commit on the server: harmless, the
                    // sweep is idempotent.
                    report.cancelled = true;
                    report.backlog_remains = true;
                    break;
                }
                done = expire_batch(&self.pool, batch_size) => done?,
            };
            report.batches += 1;
            report.expired += done;
            tracing::debug!(
                job = JOB_NAME,
                batch = report.batches,
                expired = done,
                "expired a batch of drafts"
            );
            if done < u64::from(batch_size) {
                break;
            }
        }
        report.elapsed = started.elapsed();
        Ok(report)
    }
}

/// Marks at most `limit` due drafts expired in one statement; returns how many.
pub async fn expire_batch(pool: &PgPool, limit: u32) -> Result<u64, Failure> {
    let done = sqlx::query(
        "UPDATE email_drafts \
         SET status = 'expired', expired_at = now(), updated_at = now() \
         WHERE status = 'draft' AND id IN ( \
             SELECT id FROM email_drafts \
             WHERE status = 'draft' AND expires_at <= now() \
             ORDER BY expires_at \
             LIMIT $1 \
             FOR UPDATE SKIP LOCKED)",
    )
    .bind(i64::from(limit.max(1)))
    .execute(pool)
    .await
    .map_err(worker_store::classify)?;
    Ok(done.rows_affected())
}

impl TimerJob for DraftExpiry {
    fn name(&self) -> &str {
        JOB_NAME
    }

    async fn tick(&self, ctx: &WorkContext) -> Result<TickReport, Failure> {
        let report = self.run(ctx).await?;
        if report.backlog_remains {
            tracing::info!(
                job = JOB_NAME,
                expired = report.expired,
                batches = report.batches,
                "a backlog of due drafts remains for the next tick"
            );
        }
        let mut detail = format!(
            "expired {} drafts in {} batches",
            report.expired, report.batches
        );
        if report.backlog_remains {
            detail.push_str("; more are due");
        }
        Ok(TickReport::items(report.expired).with_detail(detail))
    }
}
