//! Runs timer jobs on their schedules.
//!
//! tokio-cron-scheduler is the ticker and nothing more. Its fixed-interval jobs stop for good
//! once a tick is late (its #113, fix unmerged), it has no overlap guard, and it spawns a
//! detached task for every fire, so it is never handed a job's work. Each timer job gets a
//! cron-expression job of its own ([`CronTicker`]) whose only act is [`offer`]: a `try_send` of
//! a unit into a channel of capacity one, which never waits. The host's loop
//! ([`TimerTask::drive`]) drains that channel and runs each tick through the host's task
//! tracker and [`worker_core::tick_once`]: the busy guard (a tick that finds the previous one
//! still running is skipped and counted), the lease (one replica at a time), then the timeout.
//! `every` schedules run as cron expressions too ([`schedule::every_as_cron`]).
//!
//! Two counts say what a schedule lost, and neither stops it:
//! - *skipped* (`skipped_busy`, `skipped_lease`): the tick reached the loop, but the previous
//!   tick was still running, or another replica held the lease;
//! - *missed*: the tick never reached the loop, because the channel was full (the loop had not
//!   yet taken the previous tick: a starved runtime), or because the ticker fired late and
//!   passed over whole moments of the schedule ([`schedule::passed_over`]). A missed
//!   tick is never queued or run late.
//!
//! Besides the schedule, a `wake` (the outbox drain's NOTIFY) ticks at once, and on shutdown
//! the loop stops taking ticks, ticks in flight see the same cancellation, and the ticker's
//! scheduler is shut down with the loop.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio::sync::Notify;
use tokio::sync::mpsc::{self, error::TrySendError};
use tokio::time::Instant;
use tokio_cron_scheduler::{Job, JobScheduler, JobSchedulerError};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use worker_core::{
    SingletonLease, SkipIfBusy, TickOutcome, TimedTick, TimerJob, WorkContext, tick_once_timed,
};

use crate::metrics::Metrics;

pub mod control;
pub mod schedule;
pub mod stats;

pub use control::{Control, RunNowRefused, TimerHandle, TimerView};
use schedule::{Schedule, parse_cron, passed_over};
pub use stats::{DurationSummary, TimerSnapshot, TimerStats};

/// One timer job and how the host runs it.
pub struct TimerTask<J, L> {
    pub job: Arc<J>,
    pub schedule: Schedule,
    pub timeout: Duration,
    /// `None` for jobs that are safe on every replica at once.
    pub lease: Option<Arc<L>>,
    /// Ticks at once when notified (e.g. the outbox drain on a new row), besides the schedule.
    pub wake: Option<Arc<Notify>>,
    pub stats: Arc<TimerStats>,
    pub metrics: Metrics,
    /// Where failed ticks (and, if asked, every tick) are written.
    pub attempt_log: worker_store::AttemptLog,
    /// Where each tick that ran is counted for the history; `None` counts nothing.
    pub history: Option<Arc<worker_store::history::JobTally>>,
    /// An operator's run-now requests and the paused state ([`control`]).
    pub control: Control,
    /// Where each tick is recorded while it runs, for the watchdog; `None` records nothing.
    pub liveness: Option<worker_core::liveness::Liveness>,
}

impl<J, L> std::fmt::Debug for TimerTask<J, L> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TimerTask")
            .field("schedule", &self.schedule)
            .field("timeout", &self.timeout)
            .finish()
    }
}

/// Hands one tick to the loop without waiting. A full channel means the loop has not taken
/// the previous tick yet: this one is counted as missed and dropped, never queued, so that a
/// stalled loop catches up with one tick, not a burst. Returns whether the loop got it.
pub fn offer(ticks: &mpsc::Sender<()>, stats: &TimerStats, job: &str) -> bool {
    match ticks.try_send(()) {
        Ok(()) => true,
        Err(TrySendError::Full(())) => {
            stats.missed.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(
                job,
                "the timer loop had not taken the previous tick; this one is missed, not queued"
            );
            false
        }
        // The loop has ended (shutdown): nothing is waiting for ticks.
        Err(TrySendError::Closed(())) => false,
    }
}

/// How long to wait before trying again to start a ticker that would not start.
const TICKER_RETRY: Duration = Duration::from_secs(10);

/// A tokio-cron-scheduler instance that fires one timer job's cron expression into its loop.
///
/// One instance per job rather than one for the host: its lifetime is then exactly its loop's
/// (started and shut down in [`TimerTask::run`], no handle threaded through the host's
/// start-up, which is synchronous while the scheduler's construction is `async`), and a
/// ticker that fails touches one job. The cost is the crate's small idle tasks per job.
pub struct CronTicker {
    scheduler: JobScheduler,
}

impl std::fmt::Debug for CronTicker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CronTicker").finish_non_exhaustive()
    }
}

impl CronTicker {
    /// Starts firing `expression` (six fields, as [`Schedule::cron`] gives) into `ticks`.
    pub async fn start(
        expression: &str,
        job: &str,
        ticks: mpsc::Sender<()>,
        stats: Arc<TimerStats>,
    ) -> Result<Self, JobSchedulerError> {
        let cron = parse_cron(expression).map_err(|_| JobSchedulerError::ParseSchedule)?;
        let job_name = job.to_string();
        let mut last_fired: Option<DateTime<Utc>> = None;
        // An async cron job, never a repeated one (#113) nor a synchronous one (it would run
        // on the crate's actor task): the closure offers a tick and returns an empty future,
        // so the task the crate spawns for it holds no work of ours.
        let fire = Job::new_async(expression, move |_, _| {
            let now = Utc::now();
            let (passed, fired) = match last_fired {
                Some(after) => passed_over(&cron, after, now),
                None => (0, now),
            };
            last_fired = Some(fired);
            if passed > 0 {
                stats.missed.fetch_add(passed, Ordering::Relaxed);
                tracing::warn!(job = %job_name, missed = passed, "the ticker fell behind; missed ticks are skipped, not run late");
            }
            offer(&ticks, &stats, &job_name);
            Box::pin(async {})
        })?;
        let scheduler = JobScheduler::new().await?;
        scheduler.add(fire).await?;
        scheduler.start().await?;
        Ok(Self { scheduler })
    }

    /// Stops the crate's ticking. Its own idle actor tasks stay parked until the runtime ends;
    /// a late fire from them finds the loop's channel closed and does nothing.
    pub async fn shutdown(mut self) {
        if let Err(e) = self.scheduler.shutdown().await {
            tracing::warn!(error = %e, "the cron ticker did not shut down cleanly");
        }
    }
}

impl<J: TimerJob, L: SingletonLease + 'static> TimerTask<J, L>
where
    L::Guard: 'static,
{
    /// Runs the schedule until `shutdown` fires: a [`CronTicker`] fires it, [`Self::drive`]
    /// runs the ticks. Ticks in flight then see the same token.
    pub async fn run(self, tracker: TaskTracker, shutdown: CancellationToken) {
        let name = self.job.name().to_string();
        let expression = match self.schedule.cron() {
            Ok(expression) => expression,
            // Unreachable for a schedule that passed validation; said loudly if not.
            Err(problem) => {
                tracing::error!(job = %name, schedule = %self.schedule, %problem, "the timer job cannot be scheduled");
                self.stats.record_failure(problem);
                return;
            }
        };
        let (sender, ticks) = mpsc::channel(1);
        if self.schedule.ticks_at_start() {
            offer(&sender, &self.stats, &name);
        }
        let ticker = loop {
            match CronTicker::start(&expression, &name, sender.clone(), self.stats.clone()).await {
                Ok(ticker) => break ticker,
                Err(e) => {
                    tracing::error!(job = %name, error = %e, retry_in = ?TICKER_RETRY, "the cron ticker would not start");
                    self.stats
                        .record_failure(format!("the cron ticker would not start: {e}"));
                    tokio::select! {
                        _ = shutdown.cancelled() => return,
                        _ = tokio::time::sleep(TICKER_RETRY) => {}
                    }
                }
            }
        };
        tracing::info!(job = %name, schedule = %self.schedule, cron = %expression, timeout = ?self.timeout, "timer job scheduled");
        self.drive(ticks, tracker, shutdown).await;
        ticker.shutdown().await;
        tracing::debug!(job = %name, "timer job stopped");
    }

    /// Runs a tick for each one taken from `ticks` and for each wake, until `shutdown` fires.
    /// The loop never waits for a tick: each is spawned through `tracker`, so that the
    /// channel is drained at once and the busy guard, not the channel, decides what a slow
    /// tick costs.
    pub async fn drive(
        mut self,
        mut ticks: mpsc::Receiver<()>,
        tracker: TaskTracker,
        shutdown: CancellationToken,
    ) {
        let mut run_now_requests = self.control.run_now_requests.take();
        let task = Arc::new(self);
        let name = task.job.name().to_string();
        let busy = Arc::new(SkipIfBusy::new(name.clone()));
        let mut sequence: u64 = 0;
        let rerun = Arc::new(std::sync::atomic::AtomicBool::new(false));
        loop {
            let woken = async {
                match &task.wake {
                    Some(wake) => wake.notified().await,
                    None => std::future::pending().await,
                }
            };
            let run_now = async {
                match run_now_requests.as_mut() {
                    Some(requests) => requests.recv().await,
                    None => std::future::pending().await,
                }
            };
            let mut manual = false;
            tokio::select! {
                _ = shutdown.cancelled() => break,
                Some(()) = ticks.recv() => {}
                Some(()) = run_now => manual = true,
                _ = woken => {
                    if busy.is_busy() {
                        // A wake is a hint, not a schedule: coalesce it into one more tick
                        // right after the running one, rather than a counted, logged skip.
                        rerun.store(true, Ordering::Relaxed);
                        continue;
                    }
                }
            }
            sequence += 1;
            let mut ctx =
                WorkContext::new(name.as_str(), shutdown.child_token()).with_tick(sequence);
            if let Some(liveness) = &task.liveness {
                ctx = ctx.with_liveness(liveness.clone());
            }
            tracker.spawn(tick(task.clone(), busy.clone(), ctx, rerun.clone(), manual));
        }
    }
}

async fn tick<J: TimerJob, L: SingletonLease>(
    task: Arc<TimerTask<J, L>>,
    busy: Arc<SkipIfBusy>,
    ctx: WorkContext,
    rerun: Arc<std::sync::atomic::AtomicBool>,
    manual: bool,
) {
    let job = task.job.as_ref();
    let stats = &task.stats;
    let paused = match (&task.control.pauses, manual) {
        (Some(pauses), false) => {
            let paused = control::paused(pauses.as_ref(), job.name()).await;
            stats.set_paused(paused);
            paused
        }
        // An operator's tick runs even while the job is paused, and says nothing of the pause.
        _ => false,
    };
    if paused {
        stats.skipped_paused.fetch_add(1, Ordering::Relaxed);
        task.metrics.tick(job.name(), "skipped-paused", None);
        tracing::debug!(job = %job.name(), "the job is paused; skipping this tick");
        return;
    }
    if manual {
        tracing::info!(job = %job.name(), "running a tick an operator asked for");
    }
    let span = tracing::info_span!("tick", job = %job.name(), tick = ctx.tick, outcome = tracing::field::Empty);
    let job_label = crate::metrics::job_labels(job.name());
    task.metrics.in_flight.add(1, &job_label);
    let started = Instant::now();
    let TimedTick {
        outcome,
        began,
        ended,
    } = {
        use tracing::Instrument;
        tick_once_timed(job, &busy, task.lease.as_deref(), task.timeout, &ctx)
            .instrument(span.clone())
            .await
    };
    // What the job ran for: from its work's start (the lease held) to its end (before the
    // lease went back), not from the tick's wake-up to now, so that the attempt log shows when
    // it really ran, and two replicas' records of a leased job never seem to overlap.
    let ended = ended.unwrap_or_else(Instant::now);
    let ran_for = ended.saturating_duration_since(began.unwrap_or(started));
    let ended_at = chrono::Utc::now() - ended.elapsed();
    task.metrics.in_flight.add(-1, &job_label);
    if rerun.swap(false, Ordering::Relaxed)
        && let Some(wake) = &task.wake
    {
        wake.notify_one();
    }
    span.record("outcome", outcome.as_str());
    task.attempt_log.record_tick(
        job.name(),
        ctx.tick.unwrap_or_default(),
        &outcome,
        ran_for,
        ended_at,
    );
    let ran = matches!(outcome, TickOutcome::Ran(_) | TickOutcome::Failed(_));
    task.metrics
        .tick(job.name(), outcome.as_str(), ran.then_some(ran_for));
    if ran {
        stats.record_duration(ran_for);
    }
    if let Some(history) = &task.history {
        match &outcome {
            TickOutcome::Ran(_) => history.record(ran_for, None),
            TickOutcome::Failed(failure) => history.record(
                ran_for,
                Some(worker_store::history::reason::failed(failure.class())),
            ),
            TickOutcome::Cancelled => history.record(ran_for, Some("cancelled")),
            TickOutcome::SkippedBusy | TickOutcome::SkippedLease => {}
        }
    }
    match outcome {
        TickOutcome::Ran(report) => {
            stats.record_success();
            if report.items > 0 {
                tracing::debug!(parent: &span, items = report.items, "tick done");
            }
        }
        TickOutcome::Failed(failure) => {
            tracing::error!(parent: &span, class = %failure.class(), error = %failure, "tick failed; the next tick tries again");
            stats.record_failure(failure.to_string());
        }
        TickOutcome::SkippedBusy => {
            stats.skipped_busy.fetch_add(1, Ordering::Relaxed);
        }
        TickOutcome::SkippedLease => {
            stats.skipped_lease.fetch_add(1, Ordering::Relaxed);
        }
        TickOutcome::Cancelled => {}
    }
}

#[cfg(test)]
mod tests;
