//! `[jobs.outbox_drain]`: the limit of one tick and, under `drain`, how the drain claims,
//! publishes and retries; the host adds the `schedule` (the drain is also woken at once when
//! a row commits).

use std::time::Duration;

use serde::{Deserialize, Serialize};
use worker_core::{Problems, Section, SettingError, TimerSection};

use crate::OutboxDrainSettings;

#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct OutboxDrainJobSettings {
    /// One tick: its batches, published with confirms and marked.
    #[serde(with = "humantime_serde")]
    pub timeout: Duration,
    pub drain: OutboxDrainSettings,
}

impl Default for OutboxDrainJobSettings {
    fn default() -> Self {
        Self {
            timeout: Duration::from_secs(30),
            drain: OutboxDrainSettings::default(),
        }
    }
}

impl Section for OutboxDrainJobSettings {
    fn validate(&self) -> Vec<SettingError> {
        let mut problems = Problems::new();
        problems.nonzero("timeout", self.timeout);
        if let Err(problem) = self.drain.validate() {
            problems.add("drain", problem);
        }
        problems.into_vec()
    }
}

impl TimerSection for OutboxDrainJobSettings {
    const EVERY: Duration = Duration::from_secs(1);

    fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Two per lane: one lane claims and publishes while the other commits.
    fn pool_need(&self) -> worker_core::PoolNeed {
        let lanes = u32::try_from(self.drain.batches_in_flight)
            .unwrap_or(u32::MAX)
            .max(1);
        worker_core::PoolNeed::new(
            lanes.saturating_mul(2),
            format!("drain.batches_in_flight {lanes} × 2"),
        )
    }
}
