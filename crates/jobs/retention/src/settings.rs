//! `[jobs.retention]`: how long the bookkeeping tables keep their rows, and how much one tick
//! deletes; the host adds the `schedule`. (Until this release the ages were
//! `workers.dedup_retention` and `workers.attempt_log.retention`, read under these names.)

use std::time::Duration;

use serde::{Deserialize, Serialize};
use worker_core::{Problems, Section, SettingError, TimerSection};

use crate::RetentionConfig;

#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct RetentionSettings {
    /// How long processed-message marks are kept: longer than any retry tier or replay.
    #[serde(with = "humantime_serde")]
    pub processed_messages: Duration,
    /// How long attempt-log rows are kept.
    #[serde(with = "humantime_serde")]
    pub attempt_log: Duration,
    /// How long the history keeps its rows by minute (the console's last hour and day).
    #[serde(with = "humantime_serde")]
    pub history_minutes: Duration,
    /// How long the history keeps its rows by hour (the console's week).
    #[serde(with = "humantime_serde")]
    pub history_hours: Duration,
    /// How long the history keeps its rows by day (the console's month, and a year).
    #[serde(with = "humantime_serde")]
    pub history_days: Duration,
    /// How long each published message's record (for a mail's story) is kept.
    #[serde(with = "humantime_serde")]
    pub publications: Duration,
    /// How long an edit's diff (a customer's mail before and after) is kept in the audit
    /// trail; then it is redacted, and the entry keeps its kind, who and when.
    #[serde(with = "humantime_serde")]
    pub audit_diff: Duration,
    /// How long other teams' audit entries (`audit_log_entries`) are kept, counted from when
    /// they occurred. Unset: kept for good.
    #[serde(with = "humantime_serde", skip_serializing_if = "Option::is_none")]
    pub audit_log: Option<Duration>,
    /// One tick.
    #[serde(with = "humantime_serde")]
    pub timeout: Duration,
    /// Rows per `DELETE` (one short statement).
    pub batch_size: u32,
    /// Batches per table per tick at most; a larger backlog is worked off over several ticks.
    pub max_batches_per_tick: u32,
}

impl Default for RetentionSettings {
    fn default() -> Self {
        let config = RetentionConfig::default();
        Self {
            processed_messages: config.processed_messages,
            attempt_log: config.attempt_log,
            history_minutes: config.history_minutes,
            history_hours: config.history_hours,
            history_days: config.history_days,
            publications: config.publications,
            audit_diff: config.audit_diff,
            audit_log: config.audit_log,
            timeout: Duration::from_secs(60),
            batch_size: config.batch_size,
            max_batches_per_tick: config.max_batches_per_tick,
        }
    }
}

impl RetentionSettings {
    /// The job's configuration.
    pub fn config(&self) -> RetentionConfig {
        RetentionConfig {
            processed_messages: self.processed_messages,
            attempt_log: self.attempt_log,
            history_minutes: self.history_minutes,
            history_hours: self.history_hours,
            history_days: self.history_days,
            publications: self.publications,
            audit_diff: self.audit_diff,
            audit_log: self.audit_log,
            batch_size: self.batch_size,
            max_batches_per_tick: self.max_batches_per_tick,
        }
    }
}

impl Section for RetentionSettings {
    fn validate(&self) -> Vec<SettingError> {
        let mut problems = Problems::new();
        problems.nonzero("processed_messages", self.processed_messages);
        problems.nonzero("attempt_log", self.attempt_log);
        problems.nonzero("history_minutes", self.history_minutes);
        problems.nonzero("history_hours", self.history_hours);
        problems.nonzero("history_days", self.history_days);
        problems.nonzero("publications", self.publications);
        problems.nonzero("audit_diff", self.audit_diff);
        if let Some(audit_log) = self.audit_log {
            problems.nonzero("audit_log", audit_log);
        }
        problems.nonzero("timeout", self.timeout);
        problems.positive("batch_size", u64::from(self.batch_size));
        problems.positive("max_batches_per_tick", u64::from(self.max_batches_per_tick));
        problems.into_vec()
    }
}

impl TimerSection for RetentionSettings {
    const EVERY: Duration = Duration::from_secs(600);

    fn timeout(&self) -> Duration {
        self.timeout
    }
}
