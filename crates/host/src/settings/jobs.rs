//! The list of job sections, `[jobs.<job>]`: each defined by its job's crate, with its
//! defaults and its own `validate`. A timer job's section gets its `schedule` here
//! ([`Timer`]), since the schedule is the host's to run. Adding a job adds a line to
//! [`JobsSettings`] and to the lists below.

use std::time::Duration;

use figment::Figment;
use figment::providers::Serialized;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use worker_broker::{ConsumerSection, QueueTopology, TopologyError, TopologySettings};
use worker_core::{Problems, Section, SettingError, TimerSection};

use super::Schedule;

#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct JobsSettings {
    pub automation_trigger: job_automation_trigger::AutomationTriggerSettings,
    pub automation_action: job_automation_action::AutomationActionSettings,
    pub email_send: job_email_send::EmailSendSettings,
    pub outbox_drain: Timer<job_outbox_drain::OutboxDrainJobSettings>,
    pub inbound_email_poller: Timer<job_inbound_email_poller::InboundEmailPollerSettings>,
    pub db_health: Timer<job_db_health::DbHealthSettings>,
    pub draft_expiry: Timer<job_draft_expiry::DraftExpirySettings>,
    pub dead_letter_archive: Timer<job_dead_letter_archive::DeadLetterArchiveSettings>,
    pub retention: Timer<job_retention::RetentionSettings>,
    pub reconciler: Timer<job_reconciler::ReconcilerSettings>,
}

/// A timer job's section: when it ticks, and the job's own keys beside it.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(
    default,
    deny_unknown_fields,
    bound(
        serialize = "S: Serialize",
        deserialize = "S: DeserializeOwned + TimerSection + Default"
    )
)]
pub struct Timer<S> {
    pub schedule: Schedule,
    #[serde(flatten)]
    pub job: S,
}

impl<S: TimerSection + Default> Default for Timer<S> {
    fn default() -> Self {
        Self {
            schedule: Schedule::Every(S::EVERY),
            job: S::default(),
        }
    }
}

impl<S: TimerSection> Timer<S> {
    pub fn timeout(&self) -> Duration {
        self.job.timeout()
    }
}

/// A consumer job's section, by name.
#[derive(Debug, Clone, Copy)]
pub struct ConsumerEntry<'a> {
    /// The section's name under `[jobs]`.
    pub name: &'static str,
    pub section: &'a dyn ConsumerSection,
}

impl ConsumerEntry<'_> {
    /// The queue, its retry tiers and dead letters, as the section and its defaults say.
    pub fn queue(&self, topology: &TopologySettings) -> Result<QueueTopology, TopologyError> {
        QueueTopology::from_settings(self.section.queue(), self.section.queue_defaults(topology))
    }
}

impl JobsSettings {
    /// Every consumer job's section: each has a queue, and draws on the pool per handler.
    pub fn consumers(&self) -> Vec<ConsumerEntry<'_>> {
        let entry = |name, section| ConsumerEntry { name, section };
        vec![
            entry("automation_trigger", &self.automation_trigger),
            entry("automation_action", &self.automation_action),
            entry("email_send", &self.email_send),
        ]
    }

    /// Every problem of every section, keyed from `[jobs]` (`email_send.timeout`).
    pub fn validate(&self) -> Vec<SettingError> {
        let mut problems = Problems::new();
        for job in self.consumers() {
            problems.nested(job.name, job.section.validate());
        }
        problems.nested("outbox_drain", self.outbox_drain.job.validate());
        problems.nested(
            "inbound_email_poller",
            self.inbound_email_poller.job.validate(),
        );
        problems.nested("db_health", self.db_health.job.validate());
        problems.nested("draft_expiry", self.draft_expiry.job.validate());
        problems.nested(
            "dead_letter_archive",
            self.dead_letter_archive.job.validate(),
        );
        problems.nested("retention", self.retention.job.validate());
        problems.nested("reconciler", self.reconciler.job.validate());
        problems.into_vec()
    }
}

/// Names the key of an error in a section's flattened part. Serde hands a `#[serde(flatten)]`
/// part its keys through a buffer, so figment's error stops at the section (`jobs.email_send`)
/// and carries another provider's source; this finds the key by reading the section's keys
/// one at a time into the part that was flattened, and takes the key's own source.
pub(super) fn refine_flattened(figment: &Figment, error: figment::Error) -> Vec<figment::Error> {
    type Refine = fn(&Figment, &str, &figment::Error) -> Option<figment::Error>;
    let sections: [(&str, Refine); 10] = [
        (
            "jobs.automation_trigger",
            refine::<worker_broker::ConsumerSettings>,
        ),
        (
            "jobs.automation_action",
            refine::<worker_broker::ConsumerSettings>,
        ),
        ("jobs.email_send", refine::<worker_broker::ConsumerSettings>),
        (
            "jobs.outbox_drain",
            refine::<job_outbox_drain::OutboxDrainJobSettings>,
        ),
        (
            "jobs.inbound_email_poller",
            refine::<job_inbound_email_poller::InboundEmailPollerSettings>,
        ),
        ("jobs.db_health", refine::<job_db_health::DbHealthSettings>),
        (
            "jobs.draft_expiry",
            refine::<job_draft_expiry::DraftExpirySettings>,
        ),
        (
            "jobs.dead_letter_archive",
            refine::<job_dead_letter_archive::DeadLetterArchiveSettings>,
        ),
        ("jobs.retention", refine::<job_retention::RetentionSettings>),
        (
            "jobs.reconciler",
            refine::<job_reconciler::ReconcilerSettings>,
        ),
    ];
    error
        .into_iter()
        .map(|e| {
            let at = e
                .path
                .iter()
                .filter(|p| p.as_str() != "default")
                .cloned()
                .collect::<Vec<_>>()
                .join(".");
            sections
                .iter()
                .find(|(section, _)| *section == at)
                .and_then(|(section, refine)| refine(figment, section, &e))
                .unwrap_or(e)
        })
        .collect()
}

fn refine<T: Default + Serialize + DeserializeOwned>(
    figment: &Figment,
    section: &str,
    error: &figment::Error,
) -> Option<figment::Error> {
    use figment::error::Kind;
    if let Kind::Message(message) = &error.kind
        && let Some(field) = message
            .strip_prefix("unknown field `")
            .and_then(|rest| rest.split('`').next())
    {
        let mut e = error.clone();
        e.kind = Kind::UnknownField(field.to_string(), &[]);
        e.metadata = figment.find_metadata(section).cloned();
        return Some(e);
    }
    let figment::value::Value::Dict(_, dict) = figment.find_value(section).ok()? else {
        return None;
    };
    dict.into_iter().find_map(|(key, value)| {
        let alone = Figment::from(Serialized::defaults(T::default()))
            .merge(Serialized::default(&key, value));
        let mut e = alone.extract::<T>().err()?;
        if matches!(e.kind, Kind::UnknownField(..)) {
            return None;
        }
        let full = format!("{section}.{key}");
        e.metadata = figment.find_metadata(&full).cloned();
        e.path = section
            .split('.')
            .map(String::from)
            .chain(e.path.into_iter().filter(|p| p != "default"))
            .collect();
        Some(e)
    })
}
