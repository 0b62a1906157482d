//! Runs timer jobs on their schedules.
//!
//! A small loop over the `croner` cron parser rather than tokio-cron-scheduler: that crate's
//! open defects are exactly the guarantees we need (a repeating job stops for good once its
//! next tick falls behind, #113; no overlap guard; detached spawns), and the loop is short.
//!
//! Each due tick is spawned through the host's task tracker and goes through
//! [`worker_core::tick_once`]: the busy guard (a tick that finds the previous one still
//! running is skipped and counted), the lease (one replica at a time), then the timeout. The
//! loop itself never waits for a tick, so a slow tick or a starved runtime costs skipped or
//! missed ticks, counted, and never stops the schedule.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use chrono::Utc;
use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use worker_core::{
    SingletonLease, SkipIfBusy, TickOutcome, TimedTick, TimerJob, WorkContext, tick_once_timed,
};

use crate::metrics::Metrics;
use crate::settings::Schedule;
use crate::status::TimerStats;

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
}

impl<J, L> std::fmt::Debug for TimerTask<J, L> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TimerTask")
            .field("schedule", &self.schedule)
            .field("timeout", &self.timeout)
            .finish()
    }
}

/// When the next tick is due, counted from `now`, and how many due ticks were missed since
/// `planned` (the tick the loop meant to fire). For an interval, ticks stay on the grid that
/// started at the first tick; ticks that passed while the loop could not fire are skipped,
/// not fired in a burst.
pub fn next_due(schedule: &Schedule, planned: Instant, now: Instant) -> (Instant, u64) {
    match schedule {
        Schedule::Every(every) => {
            let every = (*every).max(Duration::from_millis(1));
            let mut next = planned + every;
            let mut missed = 0;
            if next <= now {
                let behind = now.duration_since(next);
                let skipped = (behind.as_nanos() / every.as_nanos()) as u64 + 1;
                missed = skipped;
                next += every * u32::try_from(skipped).unwrap_or(u32::MAX);
            }
            (next, missed)
        }
        Schedule::Cron(expression) => {
            let wait = crate::schedule::parse_cron(expression)
                .ok()
                .and_then(|cron| cron.find_next_occurrence(&Utc::now(), false).ok())
                .and_then(|at| (at - Utc::now()).to_std().ok())
                // Unreachable for an expression that passed validation; wait a minute rather than spin.
                .unwrap_or(Duration::from_secs(60));
            (now + wait, 0)
        }
    }
}

impl<J: TimerJob, L: SingletonLease + 'static> TimerTask<J, L>
where
    L::Guard: 'static,
{
    /// Runs the schedule until `shutdown` fires. Ticks in flight then see the same token.
    pub async fn run(self, tracker: TaskTracker, shutdown: CancellationToken) {
        let task = Arc::new(self);
        let name = task.job.name().to_string();
        let busy = Arc::new(SkipIfBusy::new(name.clone()));
        let mut sequence: u64 = 0;
        let rerun = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let mut planned = Instant::now();
        let mut due = match &task.schedule {
            Schedule::Every(_) => planned,
            cron @ Schedule::Cron(_) => next_due(cron, planned, planned).0,
        };
        tracing::info!(job = %name, schedule = %task.schedule, timeout = ?task.timeout, "timer job scheduled");
        loop {
            let woken = async {
                match &task.wake {
                    Some(wake) => wake.notified().await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                _ = shutdown.cancelled() => break,
                _ = tokio::time::sleep_until(due) => {
                    planned = due;
                    let (next, missed) = next_due(&task.schedule, planned, Instant::now());
                    if missed > 0 {
                        task.stats.missed.fetch_add(missed, Ordering::Relaxed);
                        tracing::warn!(job = %name, missed, "the schedule fell behind; missed ticks are skipped, not run late");
                    }
                    due = next;
                }
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
            let ctx = WorkContext::new(name.as_str(), shutdown.child_token()).with_tick(sequence);
            tracker.spawn(tick(task.clone(), busy.clone(), ctx, rerun.clone()));
        }
        tracing::debug!(job = %name, "timer job stopped");
    }
}

async fn tick<J: TimerJob, L: SingletonLease>(
    task: Arc<TimerTask<J, L>>,
    busy: Arc<SkipIfBusy>,
    ctx: WorkContext,
    rerun: Arc<std::sync::atomic::AtomicBool>,
) {
    let job = task.job.as_ref();
    let stats = &task.stats;
    let span = tracing::info_span!("tick", job = %job.name(), tick = ctx.tick, outcome = tracing::field::Empty);
    let job_label = [opentelemetry::KeyValue::new("job", job.name().to_string())];
    task.metrics.in_flight.add(1, &job_label);
    let started = Instant::now();
    let TimedTick { outcome, began } = {
        use tracing::Instrument;
        tick_once_timed(job, &busy, task.lease.as_deref(), task.timeout, &ctx)
            .instrument(span.clone())
            .await
    };
    // What the job ran for: from its work's start (the lease held), not from the tick's
    // wake-up, so that the attempt log shows when it really ran.
    let ran_for = began.unwrap_or(started).elapsed();
    task.metrics.in_flight.add(-1, &job_label);
    if rerun.swap(false, Ordering::Relaxed)
        && let Some(wake) = &task.wake
    {
        wake.notify_one();
    }
    span.record("outcome", outcome.as_str());
    task.attempt_log
        .record_tick(job.name(), ctx.tick.unwrap_or_default(), &outcome, ran_for);
    let ran = matches!(outcome, TickOutcome::Ran(_) | TickOutcome::Failed(_));
    task.metrics
        .tick(job.name(), outcome.as_str(), ran.then_some(ran_for));
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
