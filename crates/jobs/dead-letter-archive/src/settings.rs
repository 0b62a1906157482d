//! `[jobs.dead_letter_archive]`: the archiver of every `Q.dead` queue, and the limit of one
//! maintenance tick (archiving failed outbox rows, the retention sweep); the host adds the
//! maintenance's `schedule`.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use worker_core::{Problems, Section, SettingError, TimerSection};

use crate::archiver::ArchiverSettings;

#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct DeadLetterArchiveSettings {
    /// One maintenance tick: its two steps, each a few statements bounded by
    /// `archiver.insert_timeout`, so at least twice that.
    #[serde(with = "humantime_serde")]
    pub timeout: Duration,
    pub archiver: ArchiverSettings,
}

impl Default for DeadLetterArchiveSettings {
    fn default() -> Self {
        let archiver = ArchiverSettings::default();
        Self {
            timeout: archiver.insert_timeout * 2,
            archiver,
        }
    }
}

impl Section for DeadLetterArchiveSettings {
    fn validate(&self) -> Vec<SettingError> {
        let mut problems = Problems::new();
        problems.nonzero("timeout", self.timeout);
        if self.timeout < self.archiver.insert_timeout * 2 {
            problems.add(
                "timeout",
                format!(
                    "expected at least twice archiver.insert_timeout ({}), one bound for each step of a tick; found {}",
                    humantime::format_duration(self.archiver.insert_timeout * 2),
                    humantime::format_duration(self.timeout)
                ),
            );
        }
        if let Err(problem) = self.archiver.validate() {
            problems.add("archiver", problem);
        }
        problems.into_vec()
    }
}

impl TimerSection for DeadLetterArchiveSettings {
    const EVERY: Duration = Duration::from_secs(60);

    fn timeout(&self) -> Duration {
        self.timeout
    }
}
