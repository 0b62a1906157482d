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
    last: Mutex<LastResults>,
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

    pub fn snapshot(&self) -> TimerSnapshot {
        TimerSnapshot {
            ran: self.ran.load(Ordering::Relaxed),
            failed: self.failed.load(Ordering::Relaxed),
            skipped_busy: self.skipped_busy.load(Ordering::Relaxed),
            skipped_lease: self.skipped_lease.load(Ordering::Relaxed),
            missed: self.missed.load(Ordering::Relaxed),
            last: self.last.lock().map(|l| l.clone()).unwrap_or_default(),
        }
    }
}
