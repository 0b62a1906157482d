//! How each kind of job is wrapped and run: a consumer in a [`worker_broker::ConsumerRunner`]
//! on its queue, a timer job in a [`TimerTask`] on its schedule, under its lease when it takes
//! one.

use std::sync::Arc;

use tokio::sync::Notify;

use worker_core::JobSpec;
use worker_core::lease::Keyed;

use super::{JobError, JobsContext, job_error};
use crate::observe::ConsumerObserver;
use crate::scheduler::{TimerHandle, TimerTask};
use crate::settings::{JobSection, ListedJob};
use crate::status::{JobEntry, JobStats, TimerStats};

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

/// Runs a timer job on its section's schedule, under the busy guard, the lease (when its job
/// takes one, under its lease key) and its section's timeout.
pub(super) fn timer<J: worker_core::TimerJob>(
    ctx: &JobsContext,
    listed: ListedJob<'_>,
    built: Built<J>,
) -> Result<JobEntry, JobError> {
    let JobSection::Timer(section) = listed.section else {
        return Err(job_error(
            listed.spec.name,
            "listed as a consumer, built as a timer",
        ));
    };
    let spec = listed.spec;
    let Built { job, wake } = built;
    same_name(spec, job.name())?;
    let stats = Arc::new(TimerStats::default());
    let (handle, control) = TimerHandle::new(
        spec.name,
        section.schedule().clone(),
        section.timeout(),
        spec.leased(),
        stats.clone(),
        ctx.pauses.clone(),
    );
    let entry = JobEntry {
        name: spec.name.to_string(),
        stats: JobStats::Timer(handle),
    };
    let task = TimerTask {
        job: Arc::new(job),
        schedule: section.schedule().clone(),
        timeout: section.timeout(),
        lease: spec.lease_key().map(|key| {
            Arc::new(Keyed {
                lease: ctx.lease.clone(),
                key,
            })
        }),
        wake,
        stats,
        metrics: ctx.metrics.clone(),
        attempt_log: ctx.attempt_log.clone(),
        history: Some(ctx.history.job(spec.name)),
        control,
        liveness: Some(ctx.liveness.clone()),
    };
    ctx.tracker
        .spawn(task.run(ctx.tracker.clone(), ctx.shutdown.child_token()));
    Ok(entry)
}

/// A job built under another name than its line in the list would be scheduled, paused and
/// counted under two names: refused at start.
fn same_name(spec: &JobSpec, built: &str) -> Result<(), JobError> {
    if spec.name == built {
        return Ok(());
    }
    Err(job_error(
        spec.name,
        format!("the job built for this line of the list calls itself `{built}`"),
    ))
}

/// Runs `job` on its section's queue through the recoverability pipeline, with the section's
/// runner settings (its retry, else `workers.retry`), settling what it holds within
/// `workers.settle_deadline` on shutdown, and consuming only while it is not paused.
pub fn consumer<J: worker_core::ConsumerJob>(
    ctx: &JobsContext,
    listed: ListedJob<'_>,
    job: J,
) -> Result<JobEntry, JobError> {
    let JobSection::Consumer(section) = listed.section else {
        return Err(job_error(
            listed.spec.name,
            "listed as a timer, built as a consumer",
        ));
    };
    let name = listed.spec.name;
    same_name(listed.spec, job.name())?;
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
    runner.settle_deadline = settings.workers.settle_deadline();
    let observer = Arc::new(
        ConsumerObserver::new(
            job.name(),
            ctx.metrics.clone(),
            ctx.attempt_log.clone(),
            ctx.liveness.clone(),
        )
        .counting_into(&ctx.history),
    );
    let entry = JobEntry {
        name: job.name().to_string(),
        stats: JobStats::Consumer {
            queue: queue.name.clone(),
            stats: observer.stats.clone(),
        },
    };
    let mut runner = worker_broker::ConsumerRunner::observed(job, queue, runner, observer);
    if let Some(gate) = ctx
        .consumer_gates
        .as_ref()
        .and_then(|gates| gates.gate(name))
    {
        runner = runner.gated(gate);
    }
    let supervisor = ctx.supervisor.clone();
    let shutdown = ctx.shutdown.child_token();
    ctx.tracker
        .spawn(async move { runner.run(&supervisor, shutdown).await });
    Ok(entry)
}
