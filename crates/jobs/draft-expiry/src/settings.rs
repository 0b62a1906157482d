//! `[jobs.draft_expiry]`: how much one tick expires; the host adds the `schedule`.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use worker_core::{Problems, Section, SettingError, TimerSection};

use crate::DraftExpiryConfig;

#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct DraftExpirySettings {
    /// One tick.
    #[serde(with = "humantime_serde")]
    pub timeout: Duration,
    /// Drafts expired per batch (one short transaction).
    pub batch_size: u32,
    /// Batches per tick at most; a larger backlog is worked off over several ticks.
    pub max_batches_per_tick: u32,
}

impl Default for DraftExpirySettings {
    fn default() -> Self {
        let config = DraftExpiryConfig::default();
        Self {
            timeout: Duration::from_secs(30),
            batch_size: config.batch_size,
            max_batches_per_tick: config.max_batches_per_tick,
        }
    }
}

impl DraftExpirySettings {
    pub fn config(&self) -> DraftExpiryConfig {
        DraftExpiryConfig {
            batch_size: self.batch_size,
            max_batches_per_tick: self.max_batches_per_tick,
        }
    }
}

impl Section for DraftExpirySettings {
    fn validate(&self) -> Vec<SettingError> {
        let mut problems = Problems::new();
        problems.nonzero("timeout", self.timeout);
        problems.positive("batch_size", u64::from(self.batch_size));
        problems.positive("max_batches_per_tick", u64::from(self.max_batches_per_tick));
        problems.into_vec()
    }
}

impl TimerSection for DraftExpirySettings {
    const EVERY: Duration = Duration::from_secs(60);

    fn timeout(&self) -> Duration {
        self.timeout
    }
}
