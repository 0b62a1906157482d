//! The running record of one timer job: what its ticks did since the host started, updated
//! by the scheduler's loop and read by `/status`, the console and the metrics.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use chrono::Utc;
use serde::Serialize;

use crate::observe::LastResults;

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
    /// Ticks an operator asked to run now.
    pub run_now: AtomicU64,
    /// Whether the last scheduled tick found the job paused.
    paused: AtomicBool,
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

/// A copy of [`TimerStats`] at one moment.
#[derive(Debug, Clone, Serialize)]
pub struct TimerSnapshot {
    pub ran: u64,
    pub failed: u64,
    pub skipped_busy: u64,
    pub skipped_lease: u64,
    pub missed: u64,
    pub skipped_paused: u64,
    /// Ticks an operator asked to run now (`triggered` in `/status` and the console's JSON,
    /// which scripts read).
    #[serde(rename = "triggered")]
    pub run_now: u64,
    pub durations: DurationSummary,
    #[serde(flatten)]
    pub last: LastResults,
}

impl TimerStats {
    pub fn record_success(&self) {
        self.ran.fetch_add(1, Ordering::Relaxed);
        if let Ok(mut last) = self.last.lock() {
            last.ran(Utc::now(), true);
        }
    }

    pub fn record_failure(&self, error: String) {
        self.ran.fetch_add(1, Ordering::Relaxed);
        self.failed.fetch_add(1, Ordering::Relaxed);
        let now = Utc::now();
        if let Ok(mut last) = self.last.lock() {
            last.ran(now, false);
            last.failed(now, error);
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
            run_now: self.run_now.load(Ordering::Relaxed),
            durations: self
                .durations
                .lock()
                .map(|d| d.summary())
                .unwrap_or_default(),
            last: self.last.lock().map(|l| l.clone()).unwrap_or_default(),
        }
    }
}
