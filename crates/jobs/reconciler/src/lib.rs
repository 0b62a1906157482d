//! # job-reconciler: stuck work is seen and healed
//!
//! An action execution or an outbound email is finished by a command: an [`ActionCommand`](worker_messages::ActionCommand)
//! on `automation.action`, an [`EmailSendCommand`](worker_messages::EmailSendCommand) on `email.send`. When that command is
//! gone — given up after its last retry tier, dead-lettered and never replayed, lost with a
//! failed outbox row, purged from the archive — the row stays unfinished for ever, and
//! nothing else looks at it. This timer job (under the lease) does.
//!
//! ## What is stuck
//!
//! A row is **stuck** when all three hold:
//!
//! * it is unfinished: an execution not `succeeded` or `failed` (so `pending`, or a
//!   `running` claim), an email not `sent` or `failed` (so `queued`, a `sending` claim, or
//!   `unknown`). The finished states are named, not the unfinished ones, so that states added
//!   later count as unfinished;
//! * it last changed (`updated_at`) longer ago than [`ReconcilerConfig::stuck_after`] (by
//!   default 2 h: longer than the whole retry ladder, 10 s + 30 s + 2 min + 10 min + 30 min,
//!   during which every failed try touches the row);
//! * its command has no live outbox row: no `pending` row whose message id is the row's id
//!   (the action command's message id is the execution id, the email command's the email id).
//!
//! [`count_stuck`] counts them; the host's sampler reads it into the gauge
//! `worker_stuck_work{kind=execution|email}`, and an alert (`alerts.stuck_work`) shows on
//! `/status` while any are stuck.
//!
//! ## One tick
//!
//! For each kind, batches of at most [`ReconcilerConfig::batch_size`] stuck rows, oldest
//! first, each batch one transaction that locks its rows `FOR UPDATE SKIP LOCKED` (a row a
//! handler holds is passed over), up to [`ReconcilerConfig::max_batches_per_tick`] batches.
//! In that transaction each row is either
//!
//! * **re-queued**, while it has been re-queued fewer than
//!   [`ReconcilerConfig::max_requeues`] times: its command goes into the outbox (to the
//!   commands exchange with the job's routing key, header `x-requeued-by: reconciler`), its
//!   `reconciler_requeues` goes up by one and its `updated_at` is set to now, so that it is
//!   not stuck again before another `stuck_after` has passed; or
//! * **given up on**: marked `failed` with a `last_error` that says why, and a row written to
//!   the dead-letter archive (`dead_letters`, source `outbox`, queue `outbox`, reason
//!   [`REASON`]) holding the command, so that `worker-host dlq list` shows it and
//!   `worker-host dlq replay` sends the command again after a fix.
//!
//! ## Why a re-queue is safe
//!
//! The command carries the same id as the original, and the consumers are guarded on it: the
//! executor and the sender skip a row that already finished, and a claim (`running`,
//! `sending`) that is still fresh makes a parallel duplicate back off. A re-queued command
//! that races a slow original is therefore dropped as a duplicate. The one exception is an
//! email in `unknown` (the server may have accepted it): re-queuing it sends it again, the
//! same risk the send path takes when it resends an `unknown` mail on a later delivery; the
//! row's `last_error` says so if it ends up given up on.
//!
//! ## Limits
//!
//! * A command that is not lost but only late — waiting behind a backlog longer than
//!   `stuck_after` — is re-queued all the same (the duplicate is dropped by the guard), and
//!   after `max_requeues + 1` thresholds its row is given up on while it may still arrive. An
//!   execution still runs when its command arrives (only `succeeded` ends it); whether a late
//!   command still sends an email marked `failed` is the sender's decision. Keep
//!   `stuck_after` well above any backlog the queues are expected to hold.
//! * Only the outbox is looked at for a live command: a command parked in a retry tier is
//!   live too, which is why `stuck_after` must exceed the whole retry ladder (every failed try
//!   touches the row's `updated_at`).
//!
//! ## Guarantees
//!
//! * **Bounded**: at most `batch_size × max_batches_per_tick` rows of each kind per tick, one
//!   short transaction per batch, no row locked longer than its batch.
//! * **Safe to re-run, and on replicas**: the lease keeps ticks apart, `SKIP LOCKED` keeps a
//!   replica without it off the same rows, and a re-queued row is no longer stuck.
//! * **Every row ends**: after `max_requeues` re-queues a row that is still stuck is
//!   `failed`, visibly, with a dead letter; nothing is re-queued for ever.
//!
//! ```no_run
//! # async fn wire(pool: sqlx::PgPool) -> Result<(), worker_core::Failure> {
//! use job_reconciler::{Reconciler, ReconcilerConfig};
//! let reconciler = Reconciler::new(pool.clone(), ReconcilerConfig::default());
//! let stuck = job_reconciler::count_stuck(&pool, reconciler.config().stuck_after).await?;
//! println!("{} executions and {} emails are stuck", stuck.executions, stuck.emails);
//! # Ok(()) }
//! ```

mod command;
pub mod settings;
mod stuck;

use std::time::Duration;

use sqlx::{PgConnection, PgPool};
use tokio::time::Instant;
use uuid::Uuid;
use worker_core::{Failure, TickReport, TimerJob, WorkContext};
use worker_messages::{AUTOMATION_ACTION, EMAIL_SEND};
use worker_store::classify;
use worker_store::outbox;

use command::{archive, command, why};
pub use settings::ReconcilerSettings;
pub use stuck::{StuckCounts, WorkKind, count_stuck};
use stuck::{StuckRow, table};

/// The job's name, in logs, metrics and the attempt log.
pub const JOB_NAME: &str = "reconciler";

/// What the host needs to know of this job (its name, kind and lease).
pub const JOB: worker_core::JobSpec =
    worker_core::catalog::JobSpec::timer(JOB_NAME, worker_core::catalog::Lease::OneReplica);

/// The dead-letter reason of a row the reconciler gave up on.
pub const REASON: &str = "stuck";

/// The header a re-queued command carries, so that a consumer's log can tell it apart.
pub const REQUEUED_BY_HEADER: &str = "x-requeued-by";

/// How the reconciler finds stuck rows, what it does with them, and where commands go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReconcilerConfig {
    /// A row unfinished and unchanged for longer than this, with no live outbox row, is stuck.
    /// Keep it longer than the whole retry ladder.
    pub stuck_after: Duration,
    /// Re-queues of one row before it is given up on (0: give up at once).
    pub max_requeues: u32,
    /// Rows per batch (one transaction). At least 1.
    pub batch_size: u32,
    /// Batches of each kind per tick at most (at least 1); the rest waits for the next tick.
    pub max_batches_per_tick: u32,
    /// Where commands go: the commands exchange.
    pub commands_exchange: String,
    /// The routing key of [`ActionCommand`](worker_messages::ActionCommand)s.
    pub action_routing_key: String,
    /// The routing key of [`EmailSendCommand`](worker_messages::EmailSendCommand)s.
    pub email_routing_key: String,
}

impl Default for ReconcilerConfig {
    fn default() -> Self {
        Self {
            stuck_after: Duration::from_secs(2 * 3600),
            max_requeues: 1,
            batch_size: 100,
            max_batches_per_tick: 10,
            commands_exchange: "commands".into(),
            action_routing_key: AUTOMATION_ACTION.into(),
            email_routing_key: EMAIL_SEND.into(),
        }
    }
}

/// What one batch did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BatchOutcome {
    /// Stuck rows the batch took (re-queued plus given up on).
    pub taken: u64,
    pub requeued: u64,
    pub given_up: u64,
}

/// What one tick did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReconcileReport {
    pub requeued_executions: u64,
    pub requeued_emails: u64,
    pub failed_executions: u64,
    pub failed_emails: u64,
    /// Batches run over both kinds.
    pub batches: u32,
    /// A kind stopped at its batch cap (or the token) with a full last batch: more may be stuck.
    pub backlog_remains: bool,
    /// The tick's token fired before it was done.
    pub cancelled: bool,
    pub elapsed: Duration,
}

impl ReconcileReport {
    fn add(&mut self, kind: WorkKind, batch: BatchOutcome) {
        match kind {
            WorkKind::Execution => {
                self.requeued_executions += batch.requeued;
                self.failed_executions += batch.given_up;
            }
            WorkKind::Email => {
                self.requeued_emails += batch.requeued;
                self.failed_emails += batch.given_up;
            }
        }
    }

    /// Rows handled: re-queued or given up on.
    pub fn items(&self) -> u64 {
        self.requeued_executions
            + self.requeued_emails
            + self.failed_executions
            + self.failed_emails
    }
}

/// The reconciler job. See the crate docs.
#[derive(Debug, Clone)]
pub struct Reconciler {
    pool: PgPool,
    config: ReconcilerConfig,
}

impl Reconciler {
    pub fn new(pool: PgPool, config: ReconcilerConfig) -> Self {
        Self { pool, config }
    }

    pub fn config(&self) -> &ReconcilerConfig {
        &self.config
    }

    /// One tick's work, with its report (the [`TimerJob::tick`] is this, summarised).
    pub async fn run(&self, ctx: &WorkContext) -> Result<ReconcileReport, Failure> {
        let started = Instant::now();
        let batch_size = self.config.batch_size.max(1);
        let max_batches = self.config.max_batches_per_tick.max(1);
        let mut report = ReconcileReport::default();
        'kinds: for kind in WorkKind::ALL {
            let mut batches = 0;
            loop {
                if batches >= max_batches {
                    report.backlog_remains = true;
                    break;
                }
                let batch = tokio::select! {
                    biased;
                    () = ctx.cancel.cancelled() => {
                        // A batch cut short rolls back as a whole: nothing half done.
                        report.cancelled = true;
                        report.backlog_remains = true;
                        break 'kinds;
                    }
                    batch = self.reconcile_batch(kind) => batch?,
                };
                batches += 1;
                report.batches += 1;
                report.add(kind, batch);
                if batch.taken < u64::from(batch_size) {
                    break;
                }
            }
        }
        report.elapsed = started.elapsed();
        Ok(report)
    }

    /// One batch of stuck rows of `kind`, in one transaction: each re-queued or given up on.
    pub async fn reconcile_batch(&self, kind: WorkKind) -> Result<BatchOutcome, Failure> {
        let columns = match kind {
            WorkKind::Execution => {
                "w.id, w.status, w.attempts, w.reconciler_requeues AS requeues, w.updated_at, \
                 w.event_id, w.automation_id, w.action_index"
            }
            WorkKind::Email => {
                "w.id, w.status, w.attempts, w.reconciler_requeues AS requeues, w.updated_at, \
                 (SELECT e.event_id FROM action_executions e \
                  WHERE e.id = w.action_execution_id) AS event_id, \
                 NULL::uuid AS automation_id, NULL::integer AS action_index"
            }
        };
        let mut tx = self.pool.begin().await.map_err(classify)?;
        let rows: Vec<StuckRow> = sqlx::query_as(&format!(
            "SELECT {columns} {} ORDER BY w.updated_at LIMIT $2 FOR UPDATE OF w SKIP LOCKED",
            kind.stuck_rows()
        ))
        .bind(self.config.stuck_after.as_secs_f64())
        .bind(i64::from(self.config.batch_size.max(1)))
        .fetch_all(&mut *tx)
        .await
        .map_err(classify)?;
        let limit = i32::try_from(self.config.max_requeues).unwrap_or(i32::MAX);
        let (requeue, give_up): (Vec<StuckRow>, Vec<StuckRow>) =
            rows.into_iter().partition(|row| row.requeues < limit);
        self.requeue(&mut tx, kind, &requeue).await?;
        self.give_up(&mut tx, kind, &give_up).await?;
        tx.commit().await.map_err(classify)?;
        let outcome = BatchOutcome {
            taken: (requeue.len() + give_up.len()) as u64,
            requeued: requeue.len() as u64,
            given_up: give_up.len() as u64,
        };
        if outcome.taken > 0 {
            tracing::warn!(
                job = JOB_NAME,
                kind = %kind,
                requeued = outcome.requeued,
                given_up = outcome.given_up,
                requeued_ids = ?requeue.iter().map(|r| r.id).collect::<Vec<_>>(),
                given_up_ids = ?give_up.iter().map(|r| r.id).collect::<Vec<_>>(),
                "stuck work: commands re-queued, or rows given up on"
            );
        }
        Ok(outcome)
    }

    /// Puts each row's command into the outbox and counts the re-queue on the row.
    async fn requeue(
        &self,
        tx: &mut PgConnection,
        kind: WorkKind,
        rows: &[StuckRow],
    ) -> Result<(), Failure> {
        if rows.is_empty() {
            return Ok(());
        }
        let messages = rows
            .iter()
            .map(|row| {
                command(kind, row).map(|m| {
                    m.with_header(REQUEUED_BY_HEADER, JOB_NAME)
                        .with_header("x-requeue", row.requeues + 1)
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        outbox::enqueue_many(
            tx,
            &self.config.commands_exchange,
            self.routing_key(kind),
            &messages,
        )
        .await?;
        let ids: Vec<Uuid> = rows.iter().map(|r| r.id).collect();
        sqlx::query(&format!(
            "UPDATE {} SET reconciler_requeues = reconciler_requeues + 1, updated_at = now() \
             WHERE id = ANY($1)",
            table(kind)
        ))
        .bind(&ids)
        .execute(&mut *tx)
        .await
        .map_err(classify)?;
        Ok(())
    }

    /// Marks each row `failed` with why, and archives its command as a dead letter.
    async fn give_up(
        &self,
        tx: &mut PgConnection,
        kind: WorkKind,
        rows: &[StuckRow],
    ) -> Result<(), Failure> {
        for row in rows {
            let why = why(kind, row, self.config.stuck_after);
            let finished = match kind {
                WorkKind::Execution => ", finished_at = now()",
                WorkKind::Email => "",
            };
            sqlx::query(&format!(
                "UPDATE {} SET status = 'failed', last_error = $2, updated_at = now(){finished} \
                 WHERE id = $1",
                table(kind)
            ))
            .bind(row.id)
            .bind(&why)
            .execute(&mut *tx)
            .await
            .map_err(classify)?;
            let message = command(kind, row)?;
            archive(
                tx,
                kind,
                row,
                &message,
                &self.config.commands_exchange,
                self.routing_key(kind),
                &why,
            )
            .await?;
        }
        Ok(())
    }

    fn routing_key(&self, kind: WorkKind) -> &str {
        match kind {
            WorkKind::Execution => &self.config.action_routing_key,
            WorkKind::Email => &self.config.email_routing_key,
        }
    }
}

impl TimerJob for Reconciler {
    fn name(&self) -> &str {
        JOB_NAME
    }

    async fn tick(&self, ctx: &WorkContext) -> Result<TickReport, Failure> {
        let report = self.run(ctx).await?;
        let mut detail = format!(
            "re-queued {} executions and {} emails; gave up on {} executions and {} emails",
            report.requeued_executions,
            report.requeued_emails,
            report.failed_executions,
            report.failed_emails
        );
        if report.backlog_remains {
            detail.push_str("; more may be stuck");
        }
        Ok(TickReport::items(report.items()).with_detail(detail))
    }
}
