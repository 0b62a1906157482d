//! Each job built from its section and the host's shared parts, and started: the list of
//! jobs this host runs, a line a job.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Notify;
use worker_store::AdvisoryLease;

use super::run::{Built, consumer, timer};
use super::{JobError, JobsContext, Started, job_error};
use crate::settings::{ListedJob, Settings};
use crate::status::{JobEntry, Reading};

/// Starts every job of the list through the tracker, in the list's order.
pub fn start_all(ctx: &JobsContext) -> Result<Started, JobError> {
    let mut health = None;
    let mut sending_rate = None;
    let entries = ctx
        .settings
        .jobs
        .jobs()
        .into_iter()
        .map(|job| start(ctx, job, &mut health, &mut sending_rate))
        .collect::<Result<Vec<_>, _>>()?;
    let health = health.ok_or_else(|| job_error(job_db_health::JOB_NAME, "not in the list"))?;
    Ok(Started {
        entries,
        health,
        gates: ctx.consumer_gates.clone(),
        sending_rate,
    })
}

/// Builds and starts one job of the list: a line a job.
fn start(
    ctx: &JobsContext,
    job: ListedJob<'_>,
    health: &mut Option<job_db_health::HealthHandle>,
    sending_rate: &mut Option<Arc<dyn Reading>>,
) -> Result<JobEntry, JobError> {
    // One line a job; rustfmt would wrap the list into a shape that no longer reads as one.
    #[rustfmt::skip]
    let entry = match job.spec.name {
        job_automation_trigger::JOB_NAME => consumer(ctx, job, automation_trigger(ctx))?,
        job_automation_action::JOB_NAME => consumer(ctx, job, automation_action(ctx)?)?,
        job_email_send::JOB_NAME => consumer(ctx, job, email_send(ctx, sending_rate)?)?,
        job_audit_log::JOB_NAME => consumer(ctx, job, job_audit_log::AuditLog::new(ctx.pool.clone()))?,
        job_outbox_drain::JOB_NAME => timer(ctx, job, outbox_drain(ctx))?,
        job_inbound_email_poller::JOB_NAME => timer(ctx, job, inbound_email_poller(ctx)?)?,
        job_db_health::JOB_NAME => timer(ctx, job, db_health(ctx, health))?,
        job_draft_expiry::JOB_NAME => timer(ctx, job, draft_expiry(ctx))?,
        job_dead_letter_archive::JOB_NAME => timer(ctx, job, dead_letter_archive(ctx))?,
        job_retention::JOB_NAME => timer(ctx, job, retention(ctx))?,
        job_reconciler::JOB_NAME => timer(ctx, job, reconciler(ctx))?,
        other => return Err(job_error(other, "the host has no builder for this job")),
    };
    Ok(entry)
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
    Ok(executor
        .with_own_addresses([settings.smtp.from.as_str()])
        .with_circuits(ctx.circuits.clone()))
}

/// The sending rate as `/status` shows it: what the sender last read of the shared budget.
#[derive(Debug)]
struct SendingRateReading(job_email_send::EmailSender);

impl Reading for SendingRateReading {
    fn read(&self) -> serde_json::Value {
        serde_json::to_value(self.0.sending_rate()).unwrap_or_default()
    }
}

fn email_send(
    ctx: &JobsContext,
    sending_rate: &mut Option<Arc<dyn Reading>>,
) -> Result<job_email_send::EmailSender, JobError> {
    let settings = &ctx.settings;
    let sender = job_email_send::EmailSender::from_settings(
        ctx.pool.clone(),
        &settings.smtp,
        &settings.smtp.from,
        &settings.jobs.email_send,
        &ctx.oauth,
    )
    .map_err(|e| job_error("email_send", e))?
    .with_circuits(ctx.circuits.clone());
    let probe = sender.relay_probe();
    ctx.tracker.spawn(crate::circuits::probe_while_open(
        ctx.circuits.clone(),
        job_email_send::relay::RELAY,
        move || {
            let probe = probe.clone();
            async move { probe.probe().await }
        },
        ctx.shutdown.child_token(),
    ));
    let unknown_outcomes = ctx
        .metrics
        .meter
        .u64_counter(crate::metrics::names::EMAIL_UNKNOWN_OUTCOMES)
        .with_description("outbound emails whose send outcome is unknown")
        .build();
    let sender = sender.on_unknown(move || unknown_outcomes.add(1, &[]));
    *sending_rate = Some(Arc::new(SendingRateReading(sender.clone())));
    Ok(sender)
}

/// The poller, woken between its scheduled ticks by its IDLE sessions, which the replica
/// holding the idle lease keeps (a task of its own, until shutdown).
fn inbound_email_poller(
    ctx: &JobsContext,
) -> Result<Built<job_inbound_email_poller::InboundEmailPoller>, JobError> {
    let config = job_inbound_email_poller::PollerConfig {
        oauth: ctx.oauth.clone(),
        ..poller_config(&ctx.settings)
    };
    let bounces = ctx
        .metrics
        .meter
        .u64_counter(crate::metrics::names::BOUNCES)
        .with_description(
            "recipients of delivery reports, by class and whether the host sent the mail",
        )
        .build();
    let poller = job_inbound_email_poller::InboundEmailPoller::new(ctx.pool.clone(), config)
        .map_err(|e| job_error("inbound_email_poller", e))?
        .on_bounces(Arc::new(move |class, matched, rows| {
            bounces.add(
                rows,
                &[
                    opentelemetry::KeyValue::new("class", class.as_str()),
                    opentelemetry::KeyValue::new("matched", matched.to_string()),
                ],
            );
        }));
    let wake = Arc::new(Notify::new());
    let poller = poller
        .wake_on_backlog(wake.clone())
        .with_circuits(ctx.circuits.clone());
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
/// Its handle goes to readiness.
fn db_health(
    ctx: &JobsContext,
    handle: &mut Option<job_db_health::HealthHandle>,
) -> Built<job_db_health::DbHealth> {
    let section = &ctx.settings.jobs.db_health.job;
    let job = job_db_health::DbHealth::beside(&ctx.pool, section.config());
    *handle = Some(job.handle());
    job.into()
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
    let config = settings.jobs.retention.job.config();
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

/// The poller's accounts and limits as the settings describe them.
pub fn poller_config(settings: &Settings) -> job_inbound_email_poller::PollerConfig {
    let accounts = settings.imap.accounts.clone();
    let events = &settings.broker.topology.events_exchange;
    settings
        .jobs
        .inbound_email_poller
        .job
        .config(accounts, events)
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
