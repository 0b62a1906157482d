//! A consumer's settings: the runner part of its section (`[jobs.<consumer>]`), validated
//! before anything starts, and [`ConsumeSettings`], what its consume loop is given.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use worker_core::RetryPolicy;

/// How a consume loop runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConsumeSettings {
    pub queue: String,
    /// Names the consumer in the management UI; the process id is appended.
    pub consumer_name: String,
    /// Deliveries the broker may send ahead of the acks (`basic.qos`).
    pub prefetch: u16,
    /// Handlers running at once.
    pub concurrency: usize,
    /// Longest wait before completed deliveries are acked.
    pub ack_interval: Duration,
    /// How long, once shutdown starts, the loop keeps settling what it holds.
    pub settle_deadline: Duration,
    /// How long `basic.cancel` waits for its answer.
    pub cancel_timeout: Duration,
}

/// RabbitMQ's default `consumer_timeout`: a delivery unacked this long closes its channel.
pub const BROKER_CONSUMER_TIMEOUT: Duration = Duration::from_secs(30 * 60);

/// The runner part of a consumer's section (`[jobs.<consumer>]`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ConsumerSettings {
    /// Deliveries the broker may send ahead of the acks (`basic.qos`).
    pub prefetch: u16,
    /// Handlers running at once.
    pub concurrency: usize,
    /// Attempts across parks before a message is dead-lettered `gave-up`.
    pub max_attempts: u32,
    /// Per-try timeout of the handler.
    #[serde(with = "humantime_serde")]
    pub timeout: Duration,
    /// The in-process retry policy; `None` uses the core's default.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub retry: Option<RetryPolicy>,
    /// Longest time one delivery may spend waiting between in-process tries (a throttled
    /// failure's `retry_after` included). A longer wait is not waited out in memory, holding
    /// the delivery and a handler slot: the message is parked in a retry tier instead. Keep it
    /// well under the broker's consumer timeout (RabbitMQ's default: 30 min), which closes
    /// the channel of a delivery held longer.
    #[serde(with = "humantime_serde")]
    pub in_process_wait: Duration,
    /// How long, once shutdown starts, the runner keeps working through the deliveries it
    /// already holds (prefetched ones too) before it cancels what is left and returns it to
    /// the queue. Shorter than the host's shutdown grace. Not a key of a job's section: the
    /// host sets it for every consumer from its own shutdown settings.
    #[serde(skip)]
    pub settle_deadline: Duration,
    /// Longest wait before completed deliveries are acked. Tuned here, not in a job's section.
    #[serde(skip)]
    pub ack_interval: Duration,
    /// How long a park or dead-letter publish waits for its confirm. Tuned here, not in a
    /// job's section.
    #[serde(skip)]
    pub publish_timeout: Duration,
}

impl ConsumerSettings {
    /// Checks what an operator wrote; the message names the offending key.
    pub fn validate(&self) -> Result<(), String> {
        if self.prefetch == 0 {
            // In AMQP a prefetch of 0 means "unlimited": the whole queue into memory.
            return Err("`prefetch` must be at least 1".into());
        }
        if self.concurrency == 0 {
            return Err("`concurrency` must be at least 1".into());
        }
        if self.max_attempts == 0 {
            return Err("`max_attempts` must be at least 1".into());
        }
        if self.timeout.is_zero() {
            return Err("`timeout` must be longer than zero".into());
        }
        if let Some(retry) = &self.retry {
            retry.validate().map_err(|e| format!("`retry`: {e}"))?;
        }
        if self.in_process_wait >= BROKER_CONSUMER_TIMEOUT {
            return Err(format!(
                "`in_process_wait` must be shorter than RabbitMQ's consumer timeout ({}), which closes the channel of a delivery held that long",
                humantime::format_duration(BROKER_CONSUMER_TIMEOUT)
            ));
        }
        if self.settle_deadline.is_zero() {
            return Err("`settle_deadline` must be longer than zero".into());
        }
        Ok(())
    }
}

impl Default for ConsumerSettings {
    fn default() -> Self {
        Self {
            prefetch: 50,
            concurrency: 8,
            max_attempts: 5,
            timeout: Duration::from_secs(30),
            retry: None,
            in_process_wait: Duration::from_secs(30),
            settle_deadline: Duration::from_secs(20),
            ack_interval: Duration::from_millis(10),
            publish_timeout: Duration::from_secs(10),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_defaults_and_toml() {
        let s: ConsumerSettings =
            toml::from_str("prefetch = 100\ntimeout = \"5s\"\n[retry]\nmax_attempts = 2").unwrap();
        assert_eq!(s.prefetch, 100);
        assert_eq!(s.concurrency, 8);
        assert_eq!(s.max_attempts, 5);
        assert_eq!(s.timeout, Duration::from_secs(5));
        assert_eq!(s.retry.unwrap().max_tries, 2);
        assert!(toml::from_str::<ConsumerSettings>("prefech = 1").is_err());
        assert_eq!(ConsumerSettings::default().validate(), Ok(()));
        let zero = ConsumerSettings {
            prefetch: 0,
            ..ConsumerSettings::default()
        };
        assert!(zero.validate().unwrap_err().contains("prefetch"));
        let held = ConsumerSettings {
            in_process_wait: BROKER_CONSUMER_TIMEOUT,
            ..ConsumerSettings::default()
        };
        assert!(held.validate().unwrap_err().contains("in_process_wait"));
        let no_settle = ConsumerSettings {
            settle_deadline: Duration::ZERO,
            ..ConsumerSettings::default()
        };
        assert!(
            no_settle
                .validate()
                .unwrap_err()
                .contains("settle_deadline")
        );
    }
}
