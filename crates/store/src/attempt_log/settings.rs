//! `[workers.attempt_log]`: whether and how the attempt log is written (how long it is kept is
//! `jobs.retention.attempt_log`).

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// `[workers.attempt_log]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AttemptLogSettings {
    /// Write the attempt log at all.
    pub enabled: bool,
    /// Also write successful tries and first-try successes (one row per message: costly).
    pub log_successes: bool,
    /// Records waiting for the writer before new ones are dropped.
    pub capacity: usize,
    /// Records per `INSERT`; a full batch is written at once.
    pub batch_size: usize,
    /// Longest a record waits before its batch is written.
    #[serde(with = "humantime_serde")]
    pub flush_interval: Duration,
}

impl Default for AttemptLogSettings {
    fn default() -> Self {
        Self {
            enabled: true,
            log_successes: false,
            capacity: 10_000,
            batch_size: 500,
            flush_interval: Duration::from_millis(500),
        }
    }
}

impl AttemptLogSettings {
    /// Checks what an operator wrote; the message names the offending key.
    pub fn validate(&self) -> Result<(), String> {
        if self.capacity == 0 {
            return Err("`capacity` must be at least 1".into());
        }
        if self.batch_size == 0 {
            return Err("`batch_size` must be at least 1".into());
        }
        if self.flush_interval.is_zero() {
            return Err("`flush_interval` must be longer than zero".into());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn settings_are_validated() {
        assert!(AttemptLogSettings::default().validate().is_ok());
        let bad = AttemptLogSettings {
            batch_size: 0,
            ..AttemptLogSettings::default()
        };
        assert!(bad.validate().unwrap_err().contains("batch_size"));
    }
}
