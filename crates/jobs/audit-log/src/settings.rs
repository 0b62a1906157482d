//! `[jobs.audit_log]`: the runner's keys (prefetch, concurrency, attempts, the handler's
//! `timeout`, retry, in-process wait) and the queue, bound to the events exchange with
//! `audit.entry` only.

use serde::{Deserialize, Serialize};
use worker_broker::{
    ConsumerSection, ConsumerSettings, QueueDefaults, QueueSettings, TopologySettings,
};
use worker_core::{Section, SettingError};
use worker_messages::queues;

/// Handlers at once by default: one insert each, so a few keep up, and the database pool's
/// budget (every consumer's concurrency counts in it) stays within its default size.
pub const DEFAULT_CONCURRENCY: usize = 2;

#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct AuditLogSettings {
    #[serde(flatten)]
    pub runner: ConsumerSettings,
    pub queue: QueueSettings,
}

impl Default for AuditLogSettings {
    fn default() -> Self {
        Self {
            runner: ConsumerSettings {
                concurrency: DEFAULT_CONCURRENCY,
                ..ConsumerSettings::default()
            },
            queue: QueueSettings::default(),
        }
    }
}

impl Section for AuditLogSettings {
    fn validate(&self) -> Vec<SettingError> {
        worker_broker::validate_runner(&self.runner)
    }
}

impl ConsumerSection for AuditLogSettings {
    fn queue_defaults(&self, topology: &TopologySettings) -> QueueDefaults {
        QueueDefaults::events(queues::AUDIT_LOG, queues::AUDIT_LOG_EVENTS, topology)
    }

    fn queue(&self) -> &QueueSettings {
        &self.queue
    }

    fn runner(&self) -> ConsumerSettings {
        self.runner.clone()
    }
}
