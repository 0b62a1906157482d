//! What each job has done since the host started: the counts and last results that logs,
//! `/status` and metrics report.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use chrono::{DateTime, Utc};
use serde::Serialize;

/// The running record of one timer job. Updated by the scheduler, read by reporters.
#[derive(Debug, Default)]
pub struct TimerStats {
    pub ran: AtomicU64,
    pub failed: AtomicU64,
    pub skipped_busy: AtomicU64,
    pub skipped_lease: AtomicU64,
    /// Scheduled ticks that passed while the runtime could not fire them (starved or asleep).
    pub missed: AtomicU64,
    /// Scheduled ticks not run because an operator paused the job.
    pub skipped_paused: AtomicU64,
    /// Ticks an operator asked for ("trigger now").
    pub triggered: AtomicU64,
    /// Whether the last scheduled tick found the job paused.
    paused: std::sync::atomic::AtomicBool,
    last: Mutex<LastResults>,
    durations: Mutex<Durations>,
}

/// How long the ticks that ran took.
#[derive(Debug, Default, Clone, Copy)]
struct Durations {
    last: Option<std::time::Duration>,
    max: std::time::Duration,
    total: std::time::Duration,
    count: u32,
}

/// The durations of a job's ticks, in milliseconds, as `/status` and the console show them.
#[derive(Debug, Clone, Copy, Default, Serialize, PartialEq, Eq)]
pub struct DurationSummary {
    pub last_ms: Option<u64>,
    pub mean_ms: Option<u64>,
    pub max_ms: Option<u64>,
}

impl Durations {
    fn summary(&self) -> DurationSummary {
        let ms = |d: std::time::Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
        DurationSummary {
            last_ms: self.last.map(ms),
            mean_ms: (self.count > 0).then(|| ms(self.total / self.count)),
            max_ms: (self.count > 0).then(|| ms(self.max)),
        }
    }
}

#[derive(Debug, Default, Clone, Serialize)]
pub struct LastResults {
    pub last_run: Option<DateTime<Utc>>,
    pub last_success: Option<DateTime<Utc>>,
    pub last_error: Option<String>,
    pub last_error_at: Option<DateTime<Utc>>,
}

/// A copy of [`TimerStats`] at one moment.
#[derive(Debug, Clone, Serialize)]
pub struct TimerSnapshot {
    pub ran: u64,
    pub failed: u64,
    pub skipped_busy: u64,
    pub skipped_lease: u64,
    pub missed: u64,
    pub skipped_paused: u64,
    pub triggered: u64,
    pub durations: DurationSummary,
    #[serde(flatten)]
    pub last: LastResults,
}

impl TimerStats {
    pub fn record_success(&self) {
        self.ran.fetch_add(1, Ordering::Relaxed);
        let now = Utc::now();
        if let Ok(mut last) = self.last.lock() {
            last.last_run = Some(now);
            last.last_success = Some(now);
        }
    }

    pub fn record_failure(&self, error: String) {
        self.ran.fetch_add(1, Ordering::Relaxed);
        self.failed.fetch_add(1, Ordering::Relaxed);
        let now = Utc::now();
        if let Ok(mut last) = self.last.lock() {
            last.last_run = Some(now);
            last.last_error = Some(error);
            last.last_error_at = Some(now);
        }
    }

    /// Records what the last scheduled tick learnt of the job's pause.
    pub fn set_paused(&self, paused: bool) {
        self.paused.store(paused, Ordering::Relaxed);
    }

    /// Whether the last scheduled tick found the job paused.
    pub fn is_paused(&self) -> bool {
        self.paused.load(Ordering::Relaxed)
    }

    /// Records how long a tick that ran took (succeeded or failed).
    pub fn record_duration(&self, took: std::time::Duration) {
        if let Ok(mut d) = self.durations.lock() {
            d.last = Some(took);
            d.max = d.max.max(took);
            // A mean over the ticks since start; the count saturates rather than wraps.
            if d.count < u32::MAX {
                d.total += took;
                d.count += 1;
            }
        }
    }

    pub fn snapshot(&self) -> TimerSnapshot {
        TimerSnapshot {
            ran: self.ran.load(Ordering::Relaxed),
            failed: self.failed.load(Ordering::Relaxed),
            skipped_busy: self.skipped_busy.load(Ordering::Relaxed),
            skipped_lease: self.skipped_lease.load(Ordering::Relaxed),
            missed: self.missed.load(Ordering::Relaxed),
            skipped_paused: self.skipped_paused.load(Ordering::Relaxed),
            triggered: self.triggered.load(Ordering::Relaxed),
            durations: self
                .durations
                .lock()
                .map(|d| d.summary())
                .unwrap_or_default(),
            last: self.last.lock().map(|l| l.clone()).unwrap_or_default(),
        }
    }
}

/// The running record of one consumer job.
#[derive(Debug, Default)]
pub struct ConsumerStats {
    pub succeeded: AtomicU64,
    pub duplicate: AtomicU64,
    pub retried_in_process: AtomicU64,
    pub parked: AtomicU64,
    pub dead_lettered: AtomicU64,
    pub requeued: AtomicU64,
    last: Mutex<LastResults>,
}

/// A copy of [`ConsumerStats`] at one moment.
#[derive(Debug, Clone, Serialize)]
pub struct ConsumerSnapshot {
    pub succeeded: u64,
    pub duplicate: u64,
    pub retried_in_process: u64,
    pub parked: u64,
    pub dead_lettered: u64,
    pub requeued: u64,
    #[serde(flatten)]
    pub last: LastResults,
}

impl ConsumerStats {
    /// Records a delivery's settlement; `error` is the failure that parked or dead-lettered it.
    pub fn record(&self, counter: &AtomicU64, success: bool, error: Option<String>) {
        counter.fetch_add(1, Ordering::Relaxed);
        let now = Utc::now();
        if let Ok(mut last) = self.last.lock() {
            last.last_run = Some(now);
            if success {
                last.last_success = Some(now);
            }
            if let Some(error) = error {
                last.last_error = Some(error);
                last.last_error_at = Some(now);
            }
        }
    }

    /// Remembers the last failure seen by an in-process try.
    pub fn record_error(&self, error: String) {
        if let Ok(mut last) = self.last.lock() {
            last.last_error = Some(error);
            last.last_error_at = Some(Utc::now());
        }
    }

    pub fn snapshot(&self) -> ConsumerSnapshot {
        ConsumerSnapshot {
            succeeded: self.succeeded.load(Ordering::Relaxed),
            duplicate: self.duplicate.load(Ordering::Relaxed),
            retried_in_process: self.retried_in_process.load(Ordering::Relaxed),
            parked: self.parked.load(Ordering::Relaxed),
            dead_lettered: self.dead_lettered.load(Ordering::Relaxed),
            requeued: self.requeued.load(Ordering::Relaxed),
            last: self.last.lock().map(|l| l.clone()).unwrap_or_default(),
        }
    }
}

/// What `/status` (and `worker-host status`) reports.
#[derive(Debug, Clone)]
pub struct StatusBoard {
    pub installation: String,
    /// This replica's name.
    pub replica: String,
    pub started_at: DateTime<Utc>,
    pub jobs: Vec<JobEntry>,
    pub broker: tokio::sync::watch::Receiver<worker_broker::BrokerStatus>,
    pub alerts: std::sync::Arc<crate::alerts::AlertBook>,
    /// The database's state as the health monitor last saw it.
    pub database: std::sync::Arc<dyn Reading>,
}

/// One job on the board.
#[derive(Debug, Clone)]
pub struct JobEntry {
    pub name: String,
    pub stats: JobStats,
}

#[derive(Debug, Clone)]
pub enum JobStats {
    Consumer {
        queue: String,
        stats: std::sync::Arc<ConsumerStats>,
    },
    Timer(crate::scheduler::TimerHandle),
}

/// A piece of state `/status` shows, read at the moment of the request.
pub trait Reading: Send + Sync + std::fmt::Debug {
    fn read(&self) -> serde_json::Value;
}

impl StatusBoard {
    /// The timer job named `name`, to trigger, or to show on its page.
    pub fn timer(&self, name: &str) -> Option<&crate::scheduler::TimerHandle> {
        self.timers().find(|timer| timer.name == name)
    }

    /// Every timer job of this host, in the job list's order.
    pub fn timers(&self) -> impl Iterator<Item = &crate::scheduler::TimerHandle> {
        self.jobs.iter().filter_map(|job| match &job.stats {
            JobStats::Timer(timer) => Some(timer),
            JobStats::Consumer { .. } => None,
        })
    }

    pub fn render(&self) -> serde_json::Value {
        let broker = self.broker.borrow().clone();
        let jobs: Vec<serde_json::Value> = self
            .jobs
            .iter()
            .map(|job| match &job.stats {
                JobStats::Consumer { queue, stats } => serde_json::json!({
                    "name": job.name, "kind": "consumer", "queue": queue, "counts": stats.snapshot(),
                }),
                JobStats::Timer(timer) => serde_json::json!({
                    "name": job.name, "kind": "timer", "schedule": timer.schedule.to_string(),
                    "next_run": timer.next_run(), "leased": timer.leased,
                    "counts": timer.stats.snapshot(),
                }),
            })
            .collect();
        serde_json::json!({
            "installation": self.installation,
            "replica": self.replica,
            "release": crate::version::VERSION,
            "revision": crate::version::REVISION,
            "started_at": self.started_at,
            "broker": {
                "state": broker.state.as_str(),
                "reconnects": broker.reconnects,
                "last_error": broker.last_error,
                "address": broker.address,
            },
            "database": self.database.read(),
            "jobs": jobs,
            "alerts": self.alerts.active(),
        })
    }
}
