//! The archive's timer job: archives failed outbox rows and runs the retention sweep.

use sqlx::PgPool;
use worker_core::{Failure, TickReport, TimerJob, WorkContext};

use crate::archiver::ArchiverSettings;
use crate::store;

/// Batches per tick, per task, so that one tick stays bounded; the rest waits for the next.
const MAX_BATCHES: u32 = 100;

/// One tick's work.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct MaintenanceReport {
    /// Failed outbox rows archived.
    pub outbox_archived: u64,
    /// Replayed or purged rows deleted by the retention sweep.
    pub swept: u64,
    /// A batch limit or the cancellation stopped the tick with work left.
    pub backlog_remains: bool,
}

/// A [`TimerJob`]: each tick archives every failed outbox row not archived yet
/// ([`store::archive_failed_outbox`]) and deletes rows replayed or purged longer than
/// `retention` ago ([`store::sweep`]). Safe to re-run and to run on several replicas (both
/// steps are idempotent), though a lease keeps the work in one place.
#[derive(Debug, Clone)]
pub struct ArchiveMaintenance {
    pool: PgPool,
    settings: ArchiverSettings,
}

impl ArchiveMaintenance {
    pub fn new(pool: PgPool, settings: ArchiverSettings) -> Self {
        Self { pool, settings }
    }

    /// One tick, with its report.
    pub async fn run(&self, ctx: &WorkContext) -> Result<MaintenanceReport, Failure> {
        let batch = self.settings.sweep_batch.max(1);
        let mut report = MaintenanceReport::default();
        for step in 0..MAX_BATCHES {
            if ctx.cancel.is_cancelled() {
                report.backlog_remains = true;
                return Ok(report);
            }
            let done = store::archive_failed_outbox(&self.pool, batch).await?;
            report.outbox_archived += done.inserted;
            if done.inserted + done.duplicates < u64::from(batch) {
                break;
            }
            report.backlog_remains = step + 1 == MAX_BATCHES;
        }
        for step in 0..MAX_BATCHES {
            if ctx.cancel.is_cancelled() {
                report.backlog_remains = true;
                return Ok(report);
            }
            let swept = store::sweep(&self.pool, self.settings.retention, batch).await?;
            report.swept += swept;
            if swept < u64::from(batch) {
                break;
            }
            report.backlog_remains |= step + 1 == MAX_BATCHES;
        }
        Ok(report)
    }
}

impl TimerJob for ArchiveMaintenance {
    fn name(&self) -> &str {
        crate::JOB_NAME
    }

    async fn tick(&self, ctx: &WorkContext) -> Result<TickReport, Failure> {
        let report = self.run(ctx).await?;
        let mut detail = format!(
            "archived {} failed outbox rows, swept {} settled dead letters",
            report.outbox_archived, report.swept
        );
        if report.backlog_remains {
            detail.push_str("; more remain");
        }
        Ok(TickReport::items(report.outbox_archived + report.swept).with_detail(detail))
    }
}
