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
use crate::settings::Settings;
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

/// Starts every job through the tracker; returns their entries for `/status`.
pub fn start_all(ctx: &JobsContext) -> Vec<JobEntry> {
    vec![start_outbox_drain(ctx)]
}

/// The outbox drain: on its schedule, and at once when a row commits (LISTEN/NOTIFY). No
/// lease: replicas share the rows through `FOR UPDATE SKIP LOCKED`.
fn start_outbox_drain(ctx: &JobsContext) -> JobEntry {
    let section = &ctx.settings.jobs.outbox_drain;
    let drain = job_outbox_drain::OutboxDrain::new(
        ctx.pool.clone(),
        ctx.publisher.clone(),
        section.drain.clone(),
    );
    let wake = Arc::new(Notify::new());
    ctx.tracker.spawn(job_outbox_drain::listen(
        ctx.pool.clone(),
        job_outbox_drain::ListenerSettings::default(),
        wake.clone(),
        ctx.shutdown.child_token(),
    ));
    let stats = Arc::new(TimerStats::default());
    let task = TimerTask {
        job: Arc::new(drain),
        schedule: section.schedule.clone(),
        timeout: section
            .timeout
            .unwrap_or(ctx.settings.workers.timeouts.outbox_batch),
        lease: None::<Arc<AdvisoryLease>>,
        wake: Some(wake),
        stats: stats.clone(),
        metrics: ctx.metrics.clone(),
        attempt_log: ctx.attempt_log.clone(),
    };
    ctx.tracker
        .spawn(task.run(ctx.tracker.clone(), ctx.shutdown.child_token()));
    JobEntry {
        name: job_outbox_drain::JOB_NAME.to_string(),
        stats: JobStats::Timer {
            schedule: section.schedule.to_string(),
            stats,
        },
    }
}

/// Runs `job` on its queue through the recoverability pipeline, with its section's prefetch,
/// concurrency, attempts, timeout (else `default_timeout`) and retry (else `workers.retry`).
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
        shutdown_grace: settings.workers.shutdown_grace,
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
