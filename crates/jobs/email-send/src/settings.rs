//! `[jobs.email_send]`: the runner's keys, the queue, and the age of a stale claim. Here
//! `timeout` bounds one SMTP send; the runner's limit on a handler try is derived from it in
//! one place, [`runner_timeout`].

use std::time::Duration;

use serde::{Deserialize, Serialize};
use worker_broker::{
    ConsumerSection, ConsumerSettings, QueueDefaults, QueueSettings, TopologySettings,
};
use worker_core::{Problems, Section, SettingError};
use worker_messages::queues;

use crate::DEFAULT_RECORD_BUDGET;

/// Added to the send timeout and the record budget to make the runner's limit.
pub const RUNNER_MARGIN: Duration = Duration::from_secs(5);

/// The runner's limit on one handler try: the send's own `timeout`, plus the time the job may
/// spend recording an accepted mail ([`DEFAULT_RECORD_BUDGET`]), plus [`RUNNER_MARGIN`]. It
/// sits above both so that the job always records its own outcome: a record the runner cut
/// off would leave a claim that goes stale, and the mail would be sent again.
pub fn runner_timeout(send_timeout: Duration) -> Duration {
    send_timeout + DEFAULT_RECORD_BUDGET + RUNNER_MARGIN
}

#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct EmailSendSettings {
    /// `timeout` is one SMTP send (connect, the envelope, DATA and its answer).
    #[serde(flatten)]
    pub send: ConsumerSettings,
    pub queue: QueueSettings,
    /// A `sending` claim older than this is taken over by a later try, which sends the mail
    /// again (the first try died between the server's answer and its record). Unset: the
    /// send timeout + the record budget + [`crate::CLAIM_MARGIN`]. Shorter means a dead
    /// host's mail goes out sooner; it must stay above the send timeout + the record budget,
    /// or a live try's claim is taken over.
    #[serde(with = "humantime_serde", skip_serializing_if = "Option::is_none")]
    pub claim_stale_after: Option<Duration>,
    /// A reply older than this when its turn comes (counted from the row's `created_at`) is
    /// recorded `expired` and not sent; a row's own `expires_at` (an automation's `max_age`)
    /// wins over it. Unset: no limit.
    #[serde(with = "humantime_serde", skip_serializing_if = "Option::is_none")]
    pub max_age: Option<Duration>,
}

impl Default for EmailSendSettings {
    fn default() -> Self {
        Self {
            send: ConsumerSettings {
                timeout: Duration::from_secs(60),
                ..ConsumerSettings::default()
            },
            queue: QueueSettings::default(),
            claim_stale_after: None,
            max_age: None,
        }
    }
}

impl Section for EmailSendSettings {
    fn validate(&self) -> Vec<SettingError> {
        let mut problems = Problems::new();
        problems.nested("", worker_broker::validate_runner(&self.send));
        if let Some(age) = self.claim_stale_after {
            let floor = self.send.timeout + DEFAULT_RECORD_BUDGET;
            if age <= floor {
                problems.add(
                    "claim_stale_after",
                    format!(
                        "expected more than `timeout` plus the {} record budget ({}), or a try still sending has its claim taken over and the mail goes out twice; found {}",
                        humantime::format_duration(DEFAULT_RECORD_BUDGET),
                        humantime::format_duration(floor),
                        humantime::format_duration(age)
                    ),
                );
            }
        }
        if let Some(age) = self.max_age {
            problems.nonzero("max_age", age);
        }
        problems.into_vec()
    }
}

impl ConsumerSection for EmailSendSettings {
    fn queue_defaults(&self, topology: &TopologySettings) -> QueueDefaults {
        QueueDefaults::command(queues::EMAIL_SEND, topology)
    }

    fn queue(&self) -> &QueueSettings {
        &self.queue
    }

    fn runner(&self) -> ConsumerSettings {
        ConsumerSettings {
            timeout: runner_timeout(self.send.timeout),
            ..self.send.clone()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_runner_outwaits_the_send_and_its_record() {
        let settings = EmailSendSettings::default();
        assert_eq!(settings.runner().timeout, Duration::from_secs(95));
        let short = EmailSendSettings {
            claim_stale_after: Some(Duration::from_secs(90)),
            ..EmailSendSettings::default()
        };
        let keys: Vec<_> = short.validate().into_iter().map(|e| e.key).collect();
        assert_eq!(keys, ["claim_stale_after"]);
    }

    #[test]
    fn a_max_age_of_zero_is_refused_by_name() {
        let zero = EmailSendSettings {
            max_age: Some(Duration::ZERO),
            ..EmailSendSettings::default()
        };
        let keys: Vec<_> = zero.validate().into_iter().map(|e| e.key).collect();
        assert_eq!(keys, ["max_age"]);
        let day: EmailSendSettings =
            serde_json::from_str(r#"{"max_age": "1day"}"#).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(day.max_age, Some(Duration::from_secs(86_400)));
        assert!(day.validate().is_empty());
    }
}
