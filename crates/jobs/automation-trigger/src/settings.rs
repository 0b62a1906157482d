//! `[jobs.automation_trigger]`: the runner's keys (prefetch, concurrency, attempts, the
//! handler's `timeout`, retry, in-process wait) and the queue, which takes every domain event.

use serde::{Deserialize, Serialize};
use worker_broker::{
    ConsumerSection, ConsumerSettings, QueueDefaults, QueueSettings, TopologySettings,
};
use worker_core::{Section, SettingError};
use worker_messages::queues;

#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct AutomationTriggerSettings {
    #[serde(flatten)]
    pub runner: ConsumerSettings,
    pub queue: QueueSettings,
}

impl Section for AutomationTriggerSettings {
    fn validate(&self) -> Vec<SettingError> {
        worker_broker::validate_runner(&self.runner)
    }
}

impl ConsumerSection for AutomationTriggerSettings {
    fn queue_defaults(&self, topology: &TopologySettings) -> QueueDefaults {
        QueueDefaults::events(
            queues::AUTOMATION_TRIGGER,
            queues::AUTOMATION_TRIGGER_EVENTS,
            topology,
        )
    }

    fn queue(&self) -> &QueueSettings {
        &self.queue
    }

    fn runner(&self) -> ConsumerSettings {
        self.runner.clone()
    }
}
