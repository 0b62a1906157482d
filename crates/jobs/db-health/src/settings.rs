//! `[jobs.db_health]`: the probe's limits; the host adds the `schedule`.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use worker_core::{Problems, Section, SettingError, TimerSection};

use crate::DbHealthConfig;

#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct DbHealthSettings {
    /// One tick, the probe and recording its outcome.
    #[serde(with = "humantime_serde")]
    pub timeout: Duration,
    /// The probe must answer within this.
    #[serde(with = "humantime_serde")]
    pub probe_timeout: Duration,
    /// Failed probes in a row before the database counts as unhealthy.
    pub unhealthy_after: u32,
}

impl Default for DbHealthSettings {
    fn default() -> Self {
        let config = DbHealthConfig::default();
        Self {
            timeout: Duration::from_secs(30),
            probe_timeout: config.probe_timeout,
            unhealthy_after: config.unhealthy_after,
        }
    }
}

impl DbHealthSettings {
    pub fn config(&self) -> DbHealthConfig {
        DbHealthConfig {
            probe_timeout: self.probe_timeout,
            unhealthy_after: self.unhealthy_after,
        }
    }
}

impl Section for DbHealthSettings {
    fn validate(&self) -> Vec<SettingError> {
        let mut problems = Problems::new();
        problems.nonzero("timeout", self.timeout);
        problems.nonzero("probe_timeout", self.probe_timeout);
        problems.positive("unhealthy_after", u64::from(self.unhealthy_after));
        problems.into_vec()
    }
}

impl TimerSection for DbHealthSettings {
    const EVERY: Duration = Duration::from_secs(5);

    fn timeout(&self) -> Duration {
        self.timeout
    }

    /// None: the probe has a connection of its own, so that a starved pool cannot fail
    /// `/readyz`.
    fn pool_need(&self) -> worker_core::PoolNeed {
        worker_core::PoolNeed::new(0, "its own connection, outside the pool")
    }
}
