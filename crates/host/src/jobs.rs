//! The list of jobs this host runs, and how each is wrapped: consumers in a
//! [`worker_broker::ConsumerRunner`] (retry, timeout, the recoverability pipeline), timer jobs
//! in a [`TimerTask`] (busy guard, lease, timeout). Only the host knows this list.

use std::sync::Arc;

use sqlx::PgPool;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use worker_store::{AdvisoryLease, AttemptLog};

use crate::metrics::Metrics;
use crate::observe::ConsumerObserver;
use crate::scheduler::TimerTask;
use crate::settings::{Schedule, Security, Settings};
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

/// Starts every job through the tracker.
pub fn start_all(ctx: &JobsContext) -> Result<Started, JobError> {
    let settings = &ctx.settings;
    let timeouts = &settings.workers.timeouts;
    let commands = settings.broker.topology.commands_exchange.clone();
    let mut entries = Vec::new();

    let trigger =
        job_automation_trigger::AutomationTrigger::new(ctx.pool.clone(), commands.clone());
    entries.push(
        start_consumer(ctx, "automation_trigger", trigger, timeouts.automation)
            .map_err(|e| job_error("automation_trigger", e))?,
    );

    // Validated with the settings; an entry that still does not read stops the host.
    let webhook_allow =
        job_automation_action::WebhookAllow::parse(&settings.jobs.automation_action.webhook_allow)
            .map_err(|e| job_error("automation_action", format!("webhook_allow: {e}")))?;
    let executor =
        job_automation_action::ActionExecutor::new(ctx.pool.clone(), commands, timeouts.webhook)
            .and_then(|executor| executor.with_webhook_allow(webhook_allow))
            .map_err(|e| job_error("automation_action", e))?
            .with_own_addresses([settings.smtp.from.as_str()])
            .with_reply_limit(
                settings.auto_replies.per_recipient,
                settings.auto_replies.window,
            );
    entries.push(
        start_consumer(ctx, "automation_action", executor, timeouts.automation)
            .map_err(|e| job_error("automation_action", e))?,
    );

    let smtp = smtp_config(settings);
    let sender = job_email_send::EmailSender::new(
        ctx.pool.clone(),
        &smtp,
        &settings.smtp.from,
        timeouts.email_send,
    )
    .map_err(|e| job_error("email_send", e))?;
    let unknown_outcomes = ctx
        .metrics
        .meter
        .u64_counter(crate::metrics::names::EMAIL_UNKNOWN_OUTCOMES)
        .with_description("outbound emails whose send outcome is unknown")
        .build();
    let mut sender = sender.on_unknown(move || unknown_outcomes.add(1, &[]));
    if let Some(age) = settings.smtp.claim_stale_after {
        sender = sender.with_claim_stale_after(age);
    }
    // The runner's limit sits above the send's own plus the time the job may spend recording
    // an accepted mail, so that the job records its own outcome (a cut-off record leaves a
    // claim that goes stale, and the mail is sent again).
    let email_timeout = timeouts.email_send
        + job_email_send::DEFAULT_RECORD_BUDGET
        + std::time::Duration::from_secs(5);
    entries.push(
        start_consumer(ctx, "email_send", sender, email_timeout)
            .map_err(|e| job_error("email_send", e))?,
    );

    entries.push(start_outbox_drain(ctx));

    let poller = job_inbound_email_poller::InboundEmailPoller::new(
        ctx.pool.clone(),
        poller_config(settings),
    )
    .map_err(|e| job_error("inbound_email_poller", e))?;
    let section = &settings.jobs.inbound_email_poller;
    entries.push(start_timer(
        ctx,
        poller,
        &section.schedule,
        section.timeout,
        Some(ctx.lease.clone()),
        None,
    ));

    let section = &settings.jobs.db_health;
    // On a connection of its own: a pool starved by slow work must not make `/readyz` fail.
    let health = job_db_health::DbHealth::beside(
        &ctx.pool,
        job_db_health::DbHealthConfig {
            probe_timeout: section.probe_timeout,
            unhealthy_after: section.unhealthy_after,
        },
    );
    let handle = health.handle();
    // Every replica probes for itself: its own readiness depends on it.
    entries.push(start_timer(
        ctx,
        health,
        &section.schedule,
        timeouts.health,
        None,
        None,
    ));

    let section = &settings.jobs.draft_expiry;
    let drafts = job_draft_expiry::DraftExpiry::new(
        ctx.pool.clone(),
        job_draft_expiry::DraftExpiryConfig {
            batch_size: section.batch_size,
            max_batches_per_tick: section.max_batches_per_tick,
        },
    );
    entries.push(start_timer(
        ctx,
        drafts,
        &section.schedule,
        timeouts.draft,
        Some(ctx.lease.clone()),
        None,
    ));

    entries.extend(start_dead_letter_archive(ctx));
    entries.push(start_retention(ctx));

    let section = &settings.jobs.reconciler;
    let reconciler = job_reconciler::Reconciler::new(ctx.pool.clone(), reconciler_config(settings));
    entries.push(start_timer(
        ctx,
        reconciler,
        &section.schedule,
        section.timeout,
        Some(ctx.lease.clone()),
        None,
    ));

    Ok(Started {
        entries,
        health: handle,
    })
}

/// One archiver per dead queue (each message archived, then acked), and the maintenance timer
/// (failed outbox rows into the archive, retention sweep) under the lease.
fn start_dead_letter_archive(ctx: &JobsContext) -> Vec<JobEntry> {
    let section = &ctx.settings.jobs.dead_letter_archive;
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
    let maintenance = job_dead_letter_archive::ArchiveMaintenance::new(
        ctx.pool.clone(),
        section.archiver.clone(),
    );
    vec![start_timer(
        ctx,
        maintenance,
        &section.maintenance_schedule,
        section.archiver.insert_timeout * 2,
        Some(ctx.lease.clone()),
        None,
    )]
}

/// The retention sweep of processed-message marks and attempt-log rows, under the lease,
/// counting what it deletes per table.
fn start_retention(ctx: &JobsContext) -> JobEntry {
    let settings = &ctx.settings;
    let section = &settings.jobs.retention;
    let swept = ctx
        .metrics
        .meter
        .u64_counter(crate::metrics::names::RETENTION_SWEPT)
        .build();
    let job = job_retention::Retention::observed(
        ctx.pool.clone(),
        job_retention::RetentionConfig {
            processed_messages: settings.workers.dedup_retention,
            attempt_log: settings.workers.attempt_log.retention,
            batch_size: section.batch_size,
            max_batches_per_tick: section.max_batches_per_tick,
        },
        Arc::new(SweptCounter(swept)),
    );
    start_timer(
        ctx,
        job,
        &section.schedule,
        section.timeout,
        Some(ctx.lease.clone()),
        None,
    )
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
    let section = &settings.jobs.reconciler;
    job_reconciler::ReconcilerConfig {
        stuck_after: section.stuck_after,
        max_requeues: section.max_requeues,
        batch_size: section.batch_size,
        max_batches_per_tick: section.max_batches_per_tick,
        commands_exchange: settings.broker.topology.commands_exchange.clone(),
        ..job_reconciler::ReconcilerConfig::default()
    }
}

/// The SMTP connection the settings describe.
pub fn smtp_config(settings: &Settings) -> job_email_send::SmtpConfig {
    let smtp = &settings.smtp;
    job_email_send::SmtpConfig {
        host: smtp.host.clone(),
        port: smtp.port,
        security: match smtp.security {
            Security::Plain => job_email_send::SmtpSecurity::Plain,
            Security::Starttls => job_email_send::SmtpSecurity::Starttls,
            Security::Tls => job_email_send::SmtpSecurity::Tls,
        },
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
    use job_inbound_email_poller::{ImapAccount, PollerConfig, Security as ImapSecurity};
    let section = &settings.jobs.inbound_email_poller;
    PollerConfig {
        accounts: settings
            .imap
            .accounts
            .iter()
            .map(|account| ImapAccount {
                name: account.name.clone(),
                host: account.host.clone(),
                port: account.port,
                security: match account.security {
                    Security::Plain => ImapSecurity::Plain,
                    Security::Starttls => ImapSecurity::Starttls,
                    Security::Tls => ImapSecurity::Tls,
                },
                username: account.username.clone(),
                password: account
                    .password
                    .as_ref()
                    .map(|p| p.expose().to_string())
                    .unwrap_or_default(),
                mailbox: account.mailbox.clone(),
                backfill: account.backfill,
                ca_file: account.ca_file.clone(),
            })
            .collect(),
        connect_timeout: settings.workers.timeouts.imap_connect,
        message_timeout: settings.workers.timeouts.imap_message,
        max_message_size: section.max_message_bytes,
        max_body_chars: section.max_body_chars,
        mail_limits: job_inbound_email_poller::MailLimits {
            max_parts: section.max_mime_parts,
            max_depth: section.max_mime_depth,
            max_header_fields: section.max_header_fields,
            max_header_bytes: section.max_header_bytes,
        },
        max_messages_per_account: section.max_messages_per_account,
        max_message_attempts: section.max_message_attempts,
        account_concurrency: section.account_concurrency,
        events_exchange: settings.broker.topology.events_exchange.clone(),
    }
}

/// Runs a timer job on its schedule, under the busy guard, the lease (when given) and the
/// timeout.
fn start_timer<J: worker_core::TimerJob>(
    ctx: &JobsContext,
    job: J,
    schedule: &Schedule,
    timeout: std::time::Duration,
    lease: Option<Arc<AdvisoryLease>>,
    wake: Option<Arc<Notify>>,
) -> JobEntry {
    let stats = Arc::new(TimerStats::default());
    let entry = JobEntry {
        name: job.name().to_string(),
        stats: JobStats::Timer {
            schedule: schedule.to_string(),
            stats: stats.clone(),
        },
    };
    let task = TimerTask {
        job: Arc::new(job),
        schedule: schedule.clone(),
        timeout,
        lease,
        wake,
        stats,
        metrics: ctx.metrics.clone(),
        attempt_log: ctx.attempt_log.clone(),
    };
    ctx.tracker
        .spawn(task.run(ctx.tracker.clone(), ctx.shutdown.child_token()));
    entry
}

/// The outbox drain: on its schedule, and at once when a row commits (LISTEN/NOTIFY). No
/// lease: replicas share the rows through `FOR UPDATE SKIP LOCKED`.
fn start_outbox_drain(ctx: &JobsContext) -> JobEntry {
    let section = &ctx.settings.jobs.outbox_drain;
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
    let timeout = section
        .timeout
        .unwrap_or(ctx.settings.workers.timeouts.outbox_batch);
    start_timer(ctx, drain, &section.schedule, timeout, None, Some(wake))
}

/// Runs `job` on its queue through the recoverability pipeline, with its section's prefetch,
/// concurrency, attempts, timeout (else `default_timeout`), retry (else `workers.retry`) and
/// in-process wait budget, draining within `workers.drain_deadline` on shutdown.
pub fn start_consumer<J: worker_core::ConsumerJob>(
    ctx: &JobsContext,
    section: &str,
    job: J,
    default_timeout: std::time::Duration,
) -> Result<JobEntry, worker_broker::TopologyError> {
    let settings = &ctx.settings;
    let (_, job_settings, defaults) = settings
        .consumers()
        .into_iter()
        .find(|(name, _, _)| *name == section)
        .ok_or_else(|| worker_broker::TopologyError::Invalid {
            queue: String::new(),
            key: section.to_string(),
            problem: "is not a consumer job of this host".into(),
        })?;
    let queue = worker_broker::QueueTopology::from_settings(&job_settings.queue, defaults)?;
    let consumer = worker_broker::ConsumerSettings {
        prefetch: job_settings.prefetch,
        concurrency: usize::try_from(job_settings.concurrency).unwrap_or(usize::MAX),
        max_attempts: job_settings.max_attempts,
        timeout: job_settings.timeout.unwrap_or(default_timeout),
        retry: Some(
            job_settings
                .retry
                .clone()
                .unwrap_or_else(|| settings.workers.retry.clone()),
        ),
        in_process_wait: job_settings.in_process_wait,
        drain_deadline: settings.workers.drain_deadline(),
        ..worker_broker::ConsumerSettings::default()
    };
    let observer = Arc::new(ConsumerObserver::new(
        job.name(),
        ctx.metrics.clone(),
        ctx.attempt_log.clone(),
    ));
    let entry = JobEntry {
        name: job.name().to_string(),
        stats: JobStats::Consumer {
            queue: queue.name.clone(),
            stats: observer.stats.clone(),
        },
    };
    let runner = worker_broker::ConsumerRunner::observed(job, queue, consumer, observer);
    let supervisor = ctx.supervisor.clone();
    let shutdown = ctx.shutdown.child_token();
    ctx.tracker
        .spawn(async move { runner.run(&supervisor, shutdown).await });
    Ok(entry)
}
