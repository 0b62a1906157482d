//! Per-account counters and the last error of each account, for metrics and operators.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use chrono::{DateTime, Utc};
use serde::Serialize;

use crate::AccountReport;

/// One account as the poller last saw it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct AccountStatus {
    pub last_success_at: Option<DateTime<Utc>>,
    pub last_failure_at: Option<DateTime<Utc>>,
    /// Failed polls in a row; 0 after a successful one.
    pub consecutive_failures: u32,
    /// The last failure, with its class (`permanent imap-auth-failed: ...`); kept after a
    /// success so an operator can still read it.
    pub last_error: Option<String>,
    /// Totals since start.
    pub polls: u64,
    pub failures: u64,
    pub stored: u64,
    pub parse_errors: u64,
    pub skipped: u64,
    /// Its IMAP IDLE session: `idling`, `reconnecting: <why>`, `not offered by the server…`;
    /// absent while this replica does not idle on it.
    pub idle: Option<String>,
    /// Changes the server reported while idling, each of which had the IDLE session fetch
    /// (or, for what it leaves, woke the tick).
    pub idle_news: u64,
    /// Fetches made on the IDLE session itself, without a new connection; what they stored
    /// and skipped is counted in `stored`, `parse_errors` and `skipped` with the polls'.
    pub idle_fetches: u64,
    /// Ticks that skipped it because its circuit was open (not counted in `polls`).
    pub circuit_skips: u64,
    /// Why its circuit is open, while a tick last found it so; cleared when it is polled.
    pub circuit_open: Option<String>,
}

/// The shared, cheaply cloned per-account view the poller writes after each tick.
#[derive(Debug, Clone, Default)]
pub struct PollerStats {
    inner: Arc<Mutex<BTreeMap<String, AccountStatus>>>,
}

impl PollerStats {
    /// Every configured account, by name.
    pub fn snapshot(&self) -> BTreeMap<String, AccountStatus> {
        match self.inner.lock() {
            Ok(map) => map.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    pub fn account(&self, name: &str) -> Option<AccountStatus> {
        self.snapshot().remove(name)
    }

    pub(crate) fn register(&self, name: &str) {
        if let Ok(mut map) = self.inner.lock() {
            map.entry(name.to_string()).or_default();
        }
    }

    pub(crate) fn set_idle(&self, name: &str, state: &str) {
        if let Ok(mut map) = self.inner.lock() {
            map.entry(name.to_string()).or_default().idle = Some(state.to_string());
        }
    }

    pub(crate) fn idle_news(&self, name: &str) {
        if let Ok(mut map) = self.inner.lock() {
            map.entry(name.to_string()).or_default().idle_news += 1;
        }
    }

    /// A fetch on the IDLE session: what it recorded. Not a poll: its failures are left to
    /// the tick that it wakes, which records them as its own.
    pub(crate) fn record_idle_fetch(&self, report: &AccountReport) {
        if let Ok(mut map) = self.inner.lock() {
            let status = map.entry(report.account.clone()).or_default();
            status.idle_fetches += 1;
            status.stored += report.counts.stored;
            status.parse_errors += report.counts.parse_errors;
            status.skipped +=
                report.counts.too_large + report.counts.too_complex + report.counts.gave_up;
        }
    }

    pub(crate) fn record(&self, report: &AccountReport) {
        let Ok(mut map) = self.inner.lock() else {
            return;
        };
        let status = map.entry(report.account.clone()).or_default();
        if let Some(open) = &report.circuit_open {
            // Not tried: neither a poll nor a failure.
            status.circuit_skips += 1;
            status.circuit_open = Some(open.reason.clone());
            return;
        }
        status.circuit_open = None;
        let now = Utc::now();
        status.polls += 1;
        status.stored += report.counts.stored;
        status.parse_errors += report.counts.parse_errors;
        status.skipped +=
            report.counts.too_large + report.counts.too_complex + report.counts.gave_up;
        match &report.failure {
            Some(failure) => {
                status.failures += 1;
                status.consecutive_failures = status.consecutive_failures.saturating_add(1);
                status.last_failure_at = Some(now);
                status.last_error = Some(format!("{} {failure}", failure.class()));
            }
            None => {
                if status.consecutive_failures > 0 {
                    tracing::info!(
                        job = crate::JOB_NAME,
                        account = %report.account,
                        after = status.consecutive_failures,
                        "the account is polled again after failures"
                    );
                }
                status.consecutive_failures = 0;
                status.last_success_at = Some(now);
            }
        }
    }
}
