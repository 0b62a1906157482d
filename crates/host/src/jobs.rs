//! The list of jobs this host runs, and how each is wrapped: consumers in a
//! [`worker_broker::ConsumerRunner`] (retry, timeout, the recoverability pipeline), timer jobs
//! in a [`TimerTask`] (busy guard, lease, timeout). Only the host knows this list.

use std::sync::Arc;
use std::time::Duration;

use sqlx::PgPool;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use worker_broker::ConsumerSection;
use worker_core::TimerSection;
use worker_store::{AdvisoryLease, AttemptLog};

use crate::metrics::Metrics;
use crate::observe::ConsumerObserver;
use crate::scheduler::control::PauseCheck;
use crate::scheduler::{TimerHandle, TimerTask};
use crate::settings::{ImapAccount, Settings, Timer};
use crate::status::{JobEntry, JobStats, TimerStats};

/// What every job is built from.
#[derive(Debug, Clone)]
pub struct JobsContext {
    pub settings: Arc<Settings>,
    pub pool: PgPool,
    pub supervisor: worker_broker::Supervisor,
    pub publisher: worker_broker::Publisher,
    pub lease: Arc<AdvisoryLease>,
    pub attempt_log: AttemptLog,
    pub metrics: Metrics,
    pub tracker: TaskTracker,
    pub shutdown: CancellationToken,
    /// Where timer jobs read whether an operator paused them (every replica reads the same).
    pub pauses: Option<Arc<dyn PauseCheck>>,
    /// Every unit of work in progress, for the watchdog ([`crate::watchdog`]).
    pub liveness: worker_core::liveness::Liveness,
}

/// A job that cannot be built from the settings; names the job and why.
#[derive(Debug, thiserror::Error)]
#[error("job {job}: {problem}")]
pub struct JobError {
    pub job: String,
    pub problem: String,
}

fn job_error(job: &str, problem: impl std::fmt::Display) -> JobError {
    JobError {
        job: job.to_string(),
        problem: problem.to_string(),
    }
}

/// What the running jobs expose to the rest of the host.
#[derive(Debug)]
pub struct Started {
    pub entries: Vec<JobEntry>,
    pub health: job_db_health::HealthHandle,
}

/// Whether a timer job's ticks hold the shared lease: one replica at a time, or every
/// replica on its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lease {
    /// One tick across all replicas at a time (an advisory lock for the tick).
    OneReplica,
    /// Every replica ticks: its own readiness depends on it, or the job shares its rows
    /// with the other replicas by itself (`FOR UPDATE SKIP LOCKED`).
    EveryReplica,
}

/// The timer jobs of [`start_all`], by name, in its order: what `jobs pause` and the console
/// take (a test holds the two lists together).
pub const TIMERS: &[&str] = &[
    job_outbox_drain::JOB_NAME,
    job_inbound_email_poller::JOB_NAME,
    job_db_health::JOB_NAME,
    job_draft_expiry::JOB_NAME,
    job_dead_letter_archive::MAINTENANCE_JOB_NAME,
    job_retention::JOB_NAME,
    job_reconciler::JOB_NAME,
];

/// Whether an operator may pause `job`: any timer job but the database probe, which drives
/// readiness (paused, it would take the host out of its load balancer).
pub fn pausable(job: &str) -> Result<(), String> {
    if job == job_db_health::JOB_NAME {
        return Err(format!(
            "{job} drives readiness (/readyz) and cannot be paused"
        ));
    }
    if !TIMERS.contains(&job) {
        return Err(format!(
            "no timer job is called `{job}`; the timer jobs are {}",
            TIMERS.join(", ")
        ));
    }
    Ok(())
}

/// Starts every job through the tracker: the list of jobs this host runs, one a line.
pub fn start_all(ctx: &JobsContext) -> Result<Started, JobError> {
    let jobs = &ctx.settings.jobs;
    let health = db_health(ctx);
    let handle = health.job.handle();
    // One line a job; rustfmt would wrap the list into a shape that no longer reads as one.
    #[rustfmt::skip]
    let entries = vec![
        consumer(ctx, "automation_trigger", &jobs.automation_trigger, automation_trigger(ctx))?,
        consumer(ctx, "automation_action", &jobs.automation_action, automation_action(ctx)?)?,
        consumer(ctx, "email_send", &jobs.email_send, email_send(ctx)?)?,
        timer(ctx, &jobs.outbox_drain, Lease::EveryReplica, outbox_drain(ctx)),
        timer(ctx, &jobs.inbound_email_poller, Lease::OneReplica, inbound_email_poller(ctx)?),
        timer(ctx, &jobs.db_health, Lease::EveryReplica, health),
        timer(ctx, &jobs.draft_expiry, Lease::OneReplica, draft_expiry(ctx)),
        timer(ctx, &jobs.dead_letter_archive, Lease::OneReplica, dead_letter_archive(ctx)),
        timer(ctx, &jobs.retention, Lease::OneReplica, retention(ctx)),
        timer(ctx, &jobs.reconciler, Lease::OneReplica, reconciler(ctx)),
    ];
    Ok(Started {
        entries,
        health: handle,
    })
}

/// A timer job as built, with what wakes it between ticks, if anything.
#[derive(Debug)]
pub struct Built<J> {
    pub job: J,
    pub wake: Option<Arc<Notify>>,
}

impl<J> From<J> for Built<J> {
    fn from(job: J) -> Self {
        Self { job, wake: None }
    }
}

fn automation_trigger(ctx: &JobsContext) -> job_automation_trigger::AutomationTrigger {
    let commands = ctx.settings.broker.topology.commands_exchange.clone();
    job_automation_trigger::AutomationTrigger::new(ctx.pool.clone(), commands)
}

fn automation_action(ctx: &JobsContext) -> Result<job_automation_action::ActionExecutor, JobError> {
    let settings = &ctx.settings;
    let executor = job_automation_action::ActionExecutor::from_settings(
        ctx.pool.clone(),
        settings.broker.topology.commands_exchange.clone(),
        &settings.jobs.automation_action,
    )
    .map_err(|e| job_error("automation_action", e))?;
    Ok(executor.with_own_addresses([settings.smtp.from.as_str()]))
}

fn email_send(ctx: &JobsContext) -> Result<job_email_send::EmailSender, JobError> {
    let settings = &ctx.settings;
    let sender = job_email_send::EmailSender::from_settings(
        ctx.pool.clone(),
        &smtp_config(settings),
        &settings.smtp.from,
        &settings.jobs.email_send,
    )
    .map_err(|e| job_error("email_send", e))?;
    let unknown_outcomes = ctx
        .metrics
        .meter
        .u64_counter(crate::metrics::names::EMAIL_UNKNOWN_OUTCOMES)
        .with_description("outbound emails whose send outcome is unknown")
        .build();
    Ok(sender.on_unknown(move || unknown_outcomes.add(1, &[])))
}

/// The poller, woken between its scheduled ticks by its IDLE sessions, which the replica
/// holding the idle lease keeps (a task of its own, until shutdown).
fn inbound_email_poller(
    ctx: &JobsContext,
) -> Result<Built<job_inbound_email_poller::InboundEmailPoller>, JobError> {
    let poller = job_inbound_email_poller::InboundEmailPoller::new(
        ctx.pool.clone(),
        poller_config(&ctx.settings),
    )
    .map_err(|e| job_error("inbound_email_poller", e))?;
    let wake = Arc::new(Notify::new());
    let poller = poller.wake_on_backlog(wake.clone());
    // Held for as long as this replica idles: its session waits in `pg_sleep` between checks,
    // and the server ends that wait at once when the session goes, so a long wait costs
    // nothing in takeover time. The longest (half a second) keeps each wait out of the
    // slow-statement warnings.
    let idle_lease = AdvisoryLease::new(ctx.pool.clone()).with_checks(
        worker_store::lease::MAX_CHECK_INTERVAL,
        Duration::from_secs(5),
    );
    ctx.tracker.spawn(poller.idler().run(
        Arc::new(idle_lease),
        wake.clone(),
        ctx.shutdown.child_token(),
    ));
    Ok(Built {
        job: poller,
        wake: Some(wake),
    })
}

/// On a connection of its own: a pool starved by slow work must not make `/readyz` fail.
fn db_health(ctx: &JobsContext) -> Built<job_db_health::DbHealth> {
    let section = &ctx.settings.jobs.db_health.job;
    job_db_health::DbHealth::beside(&ctx.pool, section.config()).into()
}

fn draft_expiry(ctx: &JobsContext) -> Built<job_draft_expiry::DraftExpiry> {
    let section = &ctx.settings.jobs.draft_expiry.job;
    job_draft_expiry::DraftExpiry::new(ctx.pool.clone(), section.config()).into()
}

fn reconciler(ctx: &JobsContext) -> Built<job_reconciler::Reconciler> {
    job_reconciler::Reconciler::new(ctx.pool.clone(), reconciler_config(&ctx.settings)).into()
}

/// One archiver per dead queue (each message archived, then acked), and the maintenance timer
/// (failed outbox rows into the archive, retention sweep) that the list runs.
fn dead_letter_archive(ctx: &JobsContext) -> Built<job_dead_letter_archive::ArchiveMaintenance> {
    let section = &ctx.settings.jobs.dead_letter_archive.job;
    let archived = ctx
        .metrics
        .meter
        .u64_counter(crate::metrics::names::DEAD_LETTERS_ARCHIVED)
        .build();
    let archiver = job_dead_letter_archive::Archiver::observed(
        ctx.pool.clone(),
        section.archiver.clone(),
        Arc::new(ArchiveCounter(archived)),
    );
    for dead in job_dead_letter_archive::dead_queues(ctx.supervisor.topology()) {
        let (archiver, supervisor, shutdown) = (
            archiver.clone(),
            ctx.supervisor.clone(),
            ctx.shutdown.child_token(),
        );
        ctx.tracker
            .spawn(async move { archiver.run(&supervisor, dead, shutdown).await });
    }
    job_dead_letter_archive::ArchiveMaintenance::new(ctx.pool.clone(), section.archiver.clone())
        .into()
}

/// The retention sweep of processed-message marks and attempt-log rows, counting what it
/// deletes per table.
fn retention(ctx: &JobsContext) -> Built<job_retention::Retention> {
    let settings = &ctx.settings;
    let swept = ctx
        .metrics
        .meter
        .u64_counter(crate::metrics::names::RETENTION_SWEPT)
        .build();
    let config = settings.jobs.retention.job.config(
        settings.workers.dedup_retention,
        settings.workers.attempt_log.retention,
    );
    job_retention::Retention::observed(ctx.pool.clone(), config, Arc::new(SweptCounter(swept)))
        .into()
}

/// Counts the rows the retention job deleted, per table.
#[derive(Debug)]
struct SweptCounter(opentelemetry::metrics::Counter<u64>);

impl job_retention::RetentionEvents for SweptCounter {
    fn on_swept(&self, table: job_retention::Table, rows: u64) {
        self.0.add(
            rows,
            &[opentelemetry::KeyValue::new("table", table.as_str())],
        );
    }
}

/// Counts archived dead letters per dead queue; archive errors are logged by the archiver.
#[derive(Debug)]
struct ArchiveCounter(opentelemetry::metrics::Counter<u64>);

impl job_dead_letter_archive::ArchiveEvents for ArchiveCounter {
    fn on_archived(&self, dead_queue: &str, report: &job_dead_letter_archive::InsertReport) {
        self.0.add(
            report.inserted,
            &[opentelemetry::KeyValue::new(
                "dead_queue",
                dead_queue.to_string(),
            )],
        );
    }
}

/// The reconciler's thresholds and where its re-queued commands go: the commands exchange,
/// with the default routing keys, as the trigger and the executor publish them.
pub fn reconciler_config(settings: &Settings) -> job_reconciler::ReconcilerConfig {
    let commands = &settings.broker.topology.commands_exchange;
    settings.jobs.reconciler.job.config(commands)
}

/// The SMTP connection the settings describe.
pub fn smtp_config(settings: &Settings) -> job_email_send::SmtpConfig {
    let smtp = &settings.smtp;
    job_email_send::SmtpConfig {
        host: smtp.host.clone(),
        port: smtp.port,
        security: smtp.security,
        username: smtp.username.clone(),
        password: smtp
            .password
            .as_ref()
            .map(|p| secrecy::SecretString::from(p.expose().to_string())),
        ca_file: smtp.ca_file.clone(),
        pool_size: smtp.pool_size,
        ..job_email_send::SmtpConfig::default()
    }
}

/// The poller's accounts and limits as the settings describe them.
pub fn poller_config(settings: &Settings) -> job_inbound_email_poller::PollerConfig {
    let accounts = settings
        .imap
        .accounts
        .iter()
        .map(ImapAccount::poller)
        .collect();
    let events = &settings.broker.topology.events_exchange;
    settings
        .jobs
        .inbound_email_poller
        .job
        .config(accounts, events)
}

/// Runs a timer job on its section's schedule, under the busy guard, the lease (when it
/// holds one) and its section's timeout.
fn timer<J: worker_core::TimerJob, S: TimerSection>(
    ctx: &JobsContext,
    section: &Timer<S>,
    lease: Lease,
    built: Built<J>,
) -> JobEntry {
    let Built { job, wake } = built;
    let stats = Arc::new(TimerStats::default());
    let (handle, control) = TimerHandle::new(
        job.name(),
        section.schedule.clone(),
        section.timeout(),
        lease == Lease::OneReplica,
        stats.clone(),
        ctx.pauses.clone(),
    );
    let entry = JobEntry {
        name: job.name().to_string(),
        stats: JobStats::Timer(handle),
    };
    let task = TimerTask {
        job: Arc::new(job),
        schedule: section.schedule.clone(),
        timeout: section.timeout(),
        lease: match lease {
            Lease::OneReplica => Some(ctx.lease.clone()),
            Lease::EveryReplica => None,
        },
        wake,
        stats,
        metrics: ctx.metrics.clone(),
        attempt_log: ctx.attempt_log.clone(),
        control,
        liveness: Some(ctx.liveness.clone()),
    };
    ctx.tracker
        .spawn(task.run(ctx.tracker.clone(), ctx.shutdown.child_token()));
    entry
}

/// The outbox drain, on its schedule and at once when a row commits (LISTEN/NOTIFY). Every
/// replica drains: they share the rows through `FOR UPDATE SKIP LOCKED`.
fn outbox_drain(ctx: &JobsContext) -> Built<job_outbox_drain::OutboxDrain> {
    let section = &ctx.settings.jobs.outbox_drain.job;
    let wake = Arc::new(Notify::new());
    let drain = job_outbox_drain::OutboxDrain::new(
        ctx.pool.clone(),
        ctx.publisher.clone(),
        section.drain.clone(),
    )
    .wake_on_backlog(wake.clone());
    ctx.tracker.spawn(job_outbox_drain::listen(
        ctx.pool.clone(),
        job_outbox_drain::ListenerSettings::default(),
        wake.clone(),
        ctx.shutdown.child_token(),
    ));
    Built {
        job: drain,
        wake: Some(wake),
    }
}

/// Runs `job` on its section's queue through the recoverability pipeline, with the section's
/// runner settings (its retry, else `workers.retry`), draining within
/// `workers.drain_deadline` on shutdown.
pub fn consumer<J: worker_core::ConsumerJob>(
    ctx: &JobsContext,
    name: &str,
    section: &dyn ConsumerSection,
    job: J,
) -> Result<JobEntry, JobError> {
    let settings = &ctx.settings;
    let queue = worker_broker::QueueTopology::from_settings(
        section.queue(),
        section.queue_defaults(&settings.broker.topology),
    )
    .map_err(|e| job_error(name, e))?;
    let mut runner = section.runner();
    runner.retry = runner
        .retry
        .or_else(|| Some(settings.workers.retry.clone()));
    runner.drain_deadline = settings.workers.drain_deadline();
    let observer = Arc::new(ConsumerObserver::new(
        job.name(),
        ctx.metrics.clone(),
        ctx.attempt_log.clone(),
        ctx.liveness.clone(),
    ));
    let entry = JobEntry {
        name: job.name().to_string(),
        stats: JobStats::Consumer {
            queue: queue.name.clone(),
            stats: observer.stats.clone(),
        },
    };
    let runner = worker_broker::ConsumerRunner::observed(job, queue, runner, observer);
    let supervisor = ctx.supervisor.clone();
    let shutdown = ctx.shutdown.child_token();
    ctx.tracker
        .spawn(async move { runner.run(&supervisor, shutdown).await });
    Ok(entry)
}
