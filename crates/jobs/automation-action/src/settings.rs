//! `[jobs.automation_action]`: the runner's keys, the queue, the webhook call's own timeout
//! and the inside addresses it may reach, and the reply limit of `send_email` actions.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use worker_broker::{
    ConsumerSection, ConsumerSettings, QueueDefaults, QueueSettings, TopologySettings,
};
use worker_core::{Problems, Section, SettingError};
use worker_messages::queues;

use crate::{DEFAULT_RECIPIENTS_MAX, DEFAULT_REPLY_LIMIT, DEFAULT_REPLY_WINDOW, WebhookAllow};

#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct AutomationActionSettings {
    /// `timeout` bounds one handler try, a webhook call and its records included.
    #[serde(flatten)]
    pub runner: ConsumerSettings,
    pub queue: QueueSettings,
    /// One webhook call (connect, send, the answer); shorter than `timeout`.
    #[serde(with = "humantime_serde")]
    pub webhook_timeout: Duration,
    /// The hosts (`name`, `name:port`, an address) and CIDR ranges inside the installation
    /// that a webhook may reach; by default none (see [`crate::address`]).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub webhook_allow: Vec<String>,
    pub auto_replies: AutoReplySettings,
}

impl Default for AutomationActionSettings {
    fn default() -> Self {
        Self {
            runner: ConsumerSettings::default(),
            queue: QueueSettings::default(),
            webhook_timeout: Duration::from_secs(15),
            webhook_allow: Vec::new(),
            auto_replies: AutoReplySettings::default(),
        }
    }
}

/// `[jobs.automation_action.auto_replies]`: one automation sends one address at most
/// `per_recipient` mails within `window`; past it the address is left out of the mail (the
/// execution is `skipped` when no `to` is left), so that a sender who forges someone else's
/// address cannot turn an automation into a mail cannon. And one mail has at most
/// `recipients_max` distinct recipients (`to` and `cc`): past it the execution is `skipped`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct AutoReplySettings {
    pub per_recipient: u32,
    #[serde(with = "humantime_serde")]
    pub window: Duration,
    pub recipients_max: u32,
}

impl Default for AutoReplySettings {
    fn default() -> Self {
        Self {
            per_recipient: DEFAULT_REPLY_LIMIT,
            window: DEFAULT_REPLY_WINDOW,
            recipients_max: DEFAULT_RECIPIENTS_MAX,
        }
    }
}

impl Section for AutomationActionSettings {
    fn validate(&self) -> Vec<SettingError> {
        let mut problems = Problems::new();
        problems.nested("", worker_broker::validate_runner(&self.runner));
        problems.nonzero("webhook_timeout", self.webhook_timeout);
        if let Err(e) = WebhookAllow::parse(&self.webhook_allow) {
            problems.add(format!("webhook_allow[{}]", e.index), e.to_string());
        }
        problems.positive(
            "auto_replies.per_recipient",
            u64::from(self.auto_replies.per_recipient),
        );
        problems.nonzero("auto_replies.window", self.auto_replies.window);
        problems.positive(
            "auto_replies.recipients_max",
            u64::from(self.auto_replies.recipients_max),
        );
        problems.into_vec()
    }
}

impl ConsumerSection for AutomationActionSettings {
    fn queue_defaults(&self, topology: &TopologySettings) -> QueueDefaults {
        QueueDefaults::command(queues::AUTOMATION_ACTION, topology)
    }

    fn queue(&self) -> &QueueSettings {
        &self.queue
    }

    fn runner(&self) -> ConsumerSettings {
        self.runner.clone()
    }
}
