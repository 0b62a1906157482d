//! `[jobs.outbox_drain]`: the limit of one tick and, under `drain`, how the drain claims,
//! publishes and retries; the host adds the `schedule` (the drain is also woken at once when
//! a row commits).

use std::time::Duration;

use serde::{Deserialize, Serialize};
use worker_core::{Problems, RetryPolicy, Section, SettingError, TimerSection};

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
        worker_core::PoolNeed::keyed(
            lanes.saturating_mul(2),
            format!("drain.batches_in_flight {lanes} × 2"),
        )
    }
}

/// `[jobs.outbox_drain.drain]`: how the drain gathers, claims, publishes and retries. (Its
/// `retention` and `sweep_interval` went with this release: the drain deletes a row once it
/// is published, and the retention job removes the rows earlier releases kept.)
/// The drain's shortest tick interval (the host's schedules go no finer than a second): a
/// gather window must be shorter. The host also holds it to the configured interval.
pub const GATHER_MAX: Duration = Duration::from_secs(1);

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct OutboxDrainSettings {
    /// Rows claimed and published per batch (one transaction).
    pub batch_size: u32,
    /// Batches in flight at once within a tick once the outbox has a backlog.
    pub batches_in_flight: usize,
    /// Attempts before a row is marked `failed`.
    pub max_attempts: u32,
    /// The delay before a failed row's next attempt.
    pub backoff: DrainBackoff,
    /// How long a tick woken for a few rows waits before its first claim, so that it takes
    /// the rows committed right after the one that woke it in the same batch (fewer claims
    /// and transactions when rows come together). Only when they do: after a drain that ended
    /// less than this long ago or claimed more than one row, never after a quiet spell, where
    /// it would delay every row. Zero claims at once. A tick that follows a full batch with
    /// more due does not wait: more is due. Shorter than the drain's tick interval.
    #[serde(with = "humantime_serde")]
    pub gather: Duration,
    /// A tick starts no new batch after this long; the batches in flight finish and commit.
    /// Keep it well below the tick's timeout, which drops a tick (and rolls back the batches
    /// in flight, to be published again) rather than letting it finish.
    #[serde(with = "humantime_serde")]
    pub tick_budget: Duration,
}

impl Default for OutboxDrainSettings {
    fn default() -> Self {
        Self {
            batch_size: 500,
            batches_in_flight: 3,
            max_attempts: 10,
            backoff: DrainBackoff {
                base_delay: Duration::from_secs(1),
                factor: 2.0,
                max_delay: Duration::from_secs(300),
                jitter: true,
            },
            gather: Duration::from_millis(5),
            tick_budget: Duration::from_secs(10),
        }
    }
}

impl OutboxDrainSettings {
    /// Checks what an operator wrote; the message names the offending key.
    pub fn validate(&self) -> Result<(), String> {
        if self.batch_size == 0 {
            return Err("`batch_size` must be at least 1".into());
        }
        if self.batches_in_flight == 0 {
            return Err("`batches_in_flight` must be at least 1".into());
        }
        if self.max_attempts == 0 {
            return Err("`max_attempts` must be at least 1".into());
        }
        self.backoff
            .policy()
            .validate()
            .map_err(|e| format!("`backoff`: {e}"))?;
        if self.tick_budget.is_zero() {
            return Err("`tick_budget` must be longer than zero".into());
        }
        if self.gather >= GATHER_MAX {
            return Err(format!(
                "`gather` must be shorter than the drain's tick interval, which is {} at the shortest; found {}",
                humantime::format_duration(GATHER_MAX),
                humantime::format_duration(self.gather)
            ));
        }
        if self.gather >= self.tick_budget {
            return Err(format!(
                "`gather` must be shorter than `tick_budget` ({}); found {}",
                humantime::format_duration(self.tick_budget),
                humantime::format_duration(self.gather)
            ));
        }
        Ok(())
    }

    /// The wait before the next attempt of a row that has now failed `attempts` times.
    pub(crate) fn retry_in(&self, attempts: u32) -> Duration {
        self.backoff
            .policy()
            .jittered_delay_for(attempts.saturating_add(1))
    }
}

/// `[jobs.outbox_drain.drain.backoff]`: how the wait before a failed row's next attempt grows.
/// How many attempts a row has is `max_attempts`, so the backoff has no count of its own (its
/// former `max_tries` was read and never used: the host takes it out with a warning).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DrainBackoff {
    /// The wait after the first failed attempt.
    #[serde(with = "humantime_serde")]
    pub base_delay: Duration,
    /// How much each wait grows over the previous one; at least 1.
    pub factor: f64,
    /// No wait is longer than this.
    #[serde(with = "humantime_serde")]
    pub max_delay: Duration,
    /// Spread each wait over `[d/2, d]`.
    pub jitter: bool,
}

impl Default for DrainBackoff {
    fn default() -> Self {
        OutboxDrainSettings::default().backoff
    }
}

impl DrainBackoff {
    /// The waits as core's policy computes them (its count of tries unused here).
    fn policy(&self) -> RetryPolicy {
        RetryPolicy {
            max_tries: 1,
            base_delay: self.base_delay,
            factor: self.factor,
            max_delay: self.max_delay,
            jitter: self.jitter,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_settings_are_valid_and_checked() {
        assert!(OutboxDrainSettings::default().validate().is_ok());
        let bad = OutboxDrainSettings {
            batch_size: 0,
            ..OutboxDrainSettings::default()
        };
        assert!(bad.validate().unwrap_err().contains("batch_size"));
    }

    #[test]
    fn a_gather_window_as_long_as_a_tick_is_refused_and_zero_turns_it_off() {
        assert_eq!(
            OutboxDrainSettings::default().gather,
            Duration::from_millis(5)
        );
        let off = OutboxDrainSettings {
            gather: Duration::ZERO,
            ..OutboxDrainSettings::default()
        };
        assert!(off.validate().is_ok());
        let long = OutboxDrainSettings {
            gather: Duration::from_secs(1),
            ..OutboxDrainSettings::default()
        };
        let said = long.validate().unwrap_err();
        assert!(
            said.contains("`gather`") && said.contains("tick interval"),
            "{said}"
        );
    }

    #[test]
    fn backoff_grows_with_the_attempts_and_is_capped() {
        let settings = OutboxDrainSettings {
            backoff: DrainBackoff {
                base_delay: Duration::from_secs(1),
                factor: 2.0,
                max_delay: Duration::from_secs(10),
                jitter: false,
            },
            ..OutboxDrainSettings::default()
        };
        assert_eq!(settings.retry_in(1), Duration::from_secs(1));
        assert_eq!(settings.retry_in(2), Duration::from_secs(2));
        assert_eq!(settings.retry_in(3), Duration::from_secs(4));
        assert_eq!(settings.retry_in(30), Duration::from_secs(10));
    }

    #[test]
    fn settings_read_from_toml_with_defaults() {
        let s: OutboxDrainSettings =
            serde_json::from_value(serde_json::json!({"batch_size": 100, "gather": "20ms"}))
                .unwrap();
        assert_eq!(s.batch_size, 100);
        assert_eq!(s.gather, Duration::from_millis(20));
        assert_eq!(s.max_attempts, OutboxDrainSettings::default().max_attempts);
    }
}
