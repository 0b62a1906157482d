//! What an operator can do to a timer job while the host runs: run it now, and pause or
//! resume it.
//!
//! "Run now" is in-process: a tick handed to this host's loop, which runs it like any
//! other (busy guard, lease, timeout), even while the job is paused, since the operator asked
//! for it by name. A pause lives in the database (`job_pauses`), so that every replica obeys it:
//! each scheduled tick asks [`PauseCheck`] first and, paused, is skipped and counted.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use chrono::{DateTime, Utc};
use futures::future::BoxFuture;
use serde::Serialize;
use tokio::sync::mpsc::{self, error::TrySendError};

use super::schedule::Schedule;
use super::stats::{TimerSnapshot, TimerStats};

/// Whether a job is paused, as every replica reads it.
pub trait PauseCheck: Send + Sync + std::fmt::Debug {
    /// `Ok(true)` when the job is paused; an error says why it could not be read.
    fn is_paused<'a>(&'a self, job: &'a str) -> BoxFuture<'a, Result<bool, String>>;
}

/// How long a tick waits to learn whether its job is paused. A database too slow to answer
/// must not stop the schedule: past this the tick runs, and says so.
pub const PAUSE_CHECK_TIMEOUT: Duration = Duration::from_secs(2);

/// Asks `pauses` about `job`; an unreadable pause state counts as not paused (logged), since a
/// job held back by a database that is down would hide its own failure.
pub async fn paused(pauses: &dyn PauseCheck, job: &str) -> bool {
    match tokio::time::timeout(PAUSE_CHECK_TIMEOUT, pauses.is_paused(job)).await {
        Ok(Ok(paused)) => paused,
        Ok(Err(why)) => {
            tracing::warn!(job, error = %why, "could not read whether the job is paused; running the tick");
            false
        }
        Err(_) => {
            tracing::warn!(job, timeout = ?PAUSE_CHECK_TIMEOUT, "no answer on whether the job is paused; running the tick");
            false
        }
    }
}

/// The pauses as the database holds them (`job_pauses`), shared by every replica, read at
/// most once per [`PAUSES_FRESH`] for all jobs together: the outbox drain ticks at every
/// commit, and a query per tick to learn that nothing is paused would cost more than the
/// tick. A pause or a resume therefore takes effect within that time on every replica.
#[derive(Debug)]
pub struct DatabasePauses {
    pool: sqlx::PgPool,
    read: tokio::sync::Mutex<Option<(tokio::time::Instant, std::collections::HashSet<String>)>>,
}

/// How long a reading of the paused jobs is taken as current.
pub const PAUSES_FRESH: Duration = Duration::from_secs(1);

impl DatabasePauses {
    pub fn new(pool: sqlx::PgPool) -> Self {
        Self {
            pool,
            read: tokio::sync::Mutex::new(None),
        }
    }
}

impl PauseCheck for DatabasePauses {
    fn is_paused<'a>(&'a self, job: &'a str) -> BoxFuture<'a, Result<bool, String>> {
        Box::pin(async move {
            let mut read = self.read.lock().await;
            if let Some((at, paused)) = read.as_ref()
                && at.elapsed() < PAUSES_FRESH
            {
                return Ok(paused.contains(job));
            }
            let paused: std::collections::HashSet<String> = worker_store::pauses::list(&self.pool)
                .await
                .map_err(|e| e.to_string())?
                .into_iter()
                // A pause under a job's earlier name is its pause.
                .map(|p| crate::settings::find(&p.job).map_or(p.job, |spec| spec.name.to_string()))
                .collect();
            let answer = paused.contains(job);
            *read = Some((tokio::time::Instant::now(), paused));
            Ok(answer)
        })
    }
}

/// The loop's side of a timer's controls, moved into [`super::TimerTask`].
#[derive(Debug, Default)]
pub struct Control {
    /// Ticks an operator asked to run now.
    pub run_now_requests: Option<mpsc::Receiver<()>>,
    /// Where paused state is read; `None` runs every scheduled tick.
    pub pauses: Option<Arc<dyn PauseCheck>>,
}

/// Why an operator's run now was not taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum RunNowRefused {
    #[error("a tick asked to run now is already waiting to run")]
    Waiting,
    #[error("the job has stopped (the host is shutting down)")]
    Stopped,
}

/// One timer job as an operator sees it: what it is, how it went, and the way to run it now.
#[derive(Debug, Clone)]
pub struct TimerHandle {
    pub name: String,
    pub schedule: Schedule,
    pub timeout: Duration,
    /// One replica at a time (the lease), or every replica.
    pub leased: bool,
    pub stats: Arc<TimerStats>,
    run_now: mpsc::Sender<()>,
}

impl TimerHandle {
    /// A handle and the [`Control`] its loop takes.
    pub fn new(
        name: impl Into<String>,
        schedule: Schedule,
        timeout: Duration,
        leased: bool,
        stats: Arc<TimerStats>,
        pauses: Option<Arc<dyn PauseCheck>>,
    ) -> (Self, Control) {
        // One waiting run now at most: pressing the button twice runs the job once more, not
        // twice more.
        let (run_now, run_now_requests) = mpsc::channel(1);
        let handle = Self {
            name: name.into(),
            schedule,
            timeout,
            leased,
            stats,
            run_now,
        };
        let control = Control {
            run_now_requests: Some(run_now_requests),
            pauses,
        };
        (handle, control)
    }

    /// Hands the loop a tick to run as soon as it can, without waiting.
    pub fn run_now(&self) -> Result<(), RunNowRefused> {
        match self.run_now.try_send(()) {
            Ok(()) => {
                self.stats.run_now.fetch_add(1, Ordering::Relaxed);
                Ok(())
            }
            Err(TrySendError::Full(())) => Err(RunNowRefused::Waiting),
            Err(TrySendError::Closed(())) => Err(RunNowRefused::Stopped),
        }
    }

    /// When the schedule next fires, by this host's clock.
    pub fn next_run(&self) -> Option<DateTime<Utc>> {
        self.schedule.next_after(Utc::now())
    }

    /// What `/status` and the console's JSON show of it.
    pub fn view(&self) -> TimerView {
        TimerView {
            name: self.name.clone(),
            schedule: self.schedule.to_string(),
            timeout_ms: u64::try_from(self.timeout.as_millis()).unwrap_or(u64::MAX),
            leased: self.leased,
            next_run: self.next_run(),
            counts: self.stats.snapshot(),
        }
    }
}

/// A timer job at one moment.
#[derive(Debug, Clone, Serialize)]
pub struct TimerView {
    pub name: String,
    pub schedule: String,
    pub timeout_ms: u64,
    pub leased: bool,
    pub next_run: Option<DateTime<Utc>>,
    pub counts: TimerSnapshot,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn handle() -> (TimerHandle, Control) {
        TimerHandle::new(
            "draft_expiry",
            Schedule::parse("every 1m").unwrap(),
            Duration::from_secs(10),
            true,
            Arc::new(TimerStats::default()),
            None,
        )
    }

    #[test]
    fn a_run_now_waits_for_the_loop_once_and_is_counted() {
        let (handle, mut control) = handle();
        assert_eq!(handle.run_now(), Ok(()));
        assert_eq!(handle.run_now(), Err(RunNowRefused::Waiting));
        assert_eq!(handle.stats.snapshot().run_now, 1);
        let requests = control.run_now_requests.as_mut().unwrap();
        assert!(requests.try_recv().is_ok());
        assert_eq!(handle.run_now(), Ok(()), "taken, so another may wait");
    }

    #[test]
    fn a_run_now_after_the_loop_stopped_is_refused() {
        let (handle, control) = handle();
        drop(control);
        assert_eq!(handle.run_now(), Err(RunNowRefused::Stopped));
        assert_eq!(handle.stats.snapshot().run_now, 0);
    }

    #[derive(Debug)]
    struct Broken;
    impl PauseCheck for Broken {
        fn is_paused<'a>(&'a self, _job: &'a str) -> BoxFuture<'a, Result<bool, String>> {
            Box::pin(async { Err("the database is down".to_string()) })
        }
    }

    #[tokio::test]
    async fn an_unreadable_pause_state_runs_the_tick() {
        assert!(!paused(&Broken, "draft_expiry").await);
    }
}
