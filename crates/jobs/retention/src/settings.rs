//! `[jobs.retention]`: how much one tick deletes. How long rows are kept is the host's
//! (`workers.dedup_retention`, `workers.attempt_log.retention`), since other parts rely on it;
//! the host adds the `schedule`.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use worker_core::{Problems, Section, SettingError, TimerSection};

use crate::RetentionConfig;

#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct RetentionSettings {
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
            timeout: Duration::from_secs(60),
            batch_size: config.batch_size,
            max_batches_per_tick: config.max_batches_per_tick,
        }
    }
}

impl RetentionSettings {
    /// The job's configuration, with how long each table keeps its rows.
    pub fn config(&self, processed_messages: Duration, attempt_log: Duration) -> RetentionConfig {
        RetentionConfig {
            processed_messages,
            attempt_log,
            batch_size: self.batch_size,
            max_batches_per_tick: self.max_batches_per_tick,
        }
    }
}

impl Section for RetentionSettings {
    fn validate(&self) -> Vec<SettingError> {
        let mut problems = Problems::new();
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
