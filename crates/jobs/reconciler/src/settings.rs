//! `[jobs.reconciler]`: when work counts as stuck and what one tick does about it; the host
//! adds the `schedule`.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use worker_core::{Problems, Section, SettingError, TimerSection};

use crate::ReconcilerConfig;

#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct ReconcilerSettings {
    /// One tick.
    #[serde(with = "humantime_serde")]
    pub timeout: Duration,
    /// Unfinished and unchanged for longer than this, with no live outbox row: stuck. Keep it
    /// longer than the whole retry ladder.
    #[serde(with = "humantime_serde")]
    pub stuck_after: Duration,
    /// Re-queues of one stuck row before it is marked `failed` with a dead letter.
    pub max_requeues: u32,
    /// Rows per batch (one short transaction).
    pub batch_size: u32,
    /// Batches of each kind per tick at most.
    pub max_batches_per_tick: u32,
}

impl Default for ReconcilerSettings {
    fn default() -> Self {
        let config = ReconcilerConfig::default();
        Self {
            timeout: Duration::from_secs(60),
            stuck_after: config.stuck_after,
            max_requeues: config.max_requeues,
            batch_size: config.batch_size,
            max_batches_per_tick: config.max_batches_per_tick,
        }
    }
}

impl ReconcilerSettings {
    /// The job's configuration; its re-queued commands go to `commands_exchange` with the
    /// default routing keys, as the trigger and the executor publish them.
    pub fn config(&self, commands_exchange: &str) -> ReconcilerConfig {
        ReconcilerConfig {
            stuck_after: self.stuck_after,
            max_requeues: self.max_requeues,
            batch_size: self.batch_size,
            max_batches_per_tick: self.max_batches_per_tick,
            commands_exchange: commands_exchange.to_string(),
            ..ReconcilerConfig::default()
        }
    }
}

impl Section for ReconcilerSettings {
    fn validate(&self) -> Vec<SettingError> {
        let mut problems = Problems::new();
        problems.nonzero("timeout", self.timeout);
        problems.nonzero("stuck_after", self.stuck_after);
        problems.positive("batch_size", u64::from(self.batch_size));
        problems.positive("max_batches_per_tick", u64::from(self.max_batches_per_tick));
        problems.into_vec()
    }
}

impl TimerSection for ReconcilerSettings {
    const EVERY: Duration = Duration::from_secs(300);

    fn timeout(&self) -> Duration {
        self.timeout
    }
}
