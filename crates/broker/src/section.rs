//! A consumer job's settings section, as the host composes it: the job crate's section holds
//! the runner's settings (`#[serde(flatten)]` [`ConsumerSettings`], so its keys sit directly
//! under `[jobs.<job>]`), its `queue` and its own keys, and says what its queue is called.

use worker_core::{Problems, Section, SettingError};

use crate::consumer::{BROKER_CONSUMER_TIMEOUT, ConsumerSettings};
use crate::topology::{QueueDefaults, QueueSettings, TopologySettings};

/// What the host needs from a consumer job's section to declare its queue and run it.
pub trait ConsumerSection: Section + std::fmt::Debug {
    /// The queue's name and bindings where `queue` does not set them.
    fn queue_defaults(&self, topology: &TopologySettings) -> QueueDefaults;

    /// `[jobs.<job>.queue]`.
    fn queue(&self) -> &QueueSettings;

    /// What the runner applies. Its `timeout` bounds one handler try; the host fills `retry`
    /// (when unset) and `settle_deadline` from its shared settings.
    fn runner(&self) -> ConsumerSettings;
}

/// The problems of the runner's keys of a section, named relative to the section.
pub fn validate_runner(runner: &ConsumerSettings) -> Vec<SettingError> {
    let mut problems = Problems::new();
    problems.positive("prefetch", u64::from(runner.prefetch));
    problems.positive("concurrency", runner.concurrency as u64);
    problems.positive("max_attempts", u64::from(runner.max_attempts));
    problems.nonzero("timeout", runner.timeout);
    if runner.in_process_wait >= BROKER_CONSUMER_TIMEOUT {
        problems.add(
            "in_process_wait",
            format!(
                "expected a wait well under RabbitMQ's consumer timeout ({}), which closes the channel of a delivery held that long; found {}",
                humantime::format_duration(BROKER_CONSUMER_TIMEOUT),
                humantime::format_duration(runner.in_process_wait)
            ),
        );
    }
    if let Some(retry) = &runner.retry {
        if let Err(problem) = retry.validate() {
            problems.add("retry", problem);
        }
        problems.nonzero("retry.max_delay", retry.max_delay);
    }
    problems.into_vec()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_defaults_pass_and_zeros_are_named_by_their_key() {
        assert_eq!(validate_runner(&ConsumerSettings::default()), vec![]);
        let zero = ConsumerSettings {
            prefetch: 0,
            concurrency: 0,
            ..ConsumerSettings::default()
        };
        let keys: Vec<_> = validate_runner(&zero).into_iter().map(|e| e.key).collect();
        assert_eq!(keys, ["prefetch", "concurrency"]);
    }
}
