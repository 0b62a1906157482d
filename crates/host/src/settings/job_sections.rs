//! The job sections, `[jobs.<job>]`: each defined by its job's crate, with its defaults and its
//! own `validate`, and named by its job's [`JobSpec`]. A timer job's section gets its
//! `schedule` here ([`Timer`]), since the schedule is the host's to run.
//!
//! [`job_sections!`] is the one list of jobs: a line a job makes its section's field, its
//! place in [`JobsSettings::jobs`] (from which the validation, the refinements of errors, the
//! pool budget, the scheduler's list, `/status`, the console and the command line take their
//! jobs), and the check that the field's name is the job's section name.

use std::sync::LazyLock;
use std::time::Duration;

use figment::Figment;
use figment::providers::Serialized;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use worker_broker::{ConsumerSection, QueueTopology, TopologyError, TopologySettings};
use worker_core::{JobSpec, PoolNeed, Problems, SettingError, TimerSection};

use super::Schedule;

/// The list of jobs: `section: consumer|timer Type = SPEC,` a line, in the order the host
/// starts them and `/status` lists them.
macro_rules! job_sections {
    ($($field:ident: $kind:ident $section:ty = $spec:path,)*) => {
        #[derive(Debug, Clone, Default, Deserialize, Serialize)]
        #[serde(default, deny_unknown_fields)]
        pub struct JobsSettings {
            $(pub $field: job_sections!(@type $kind $section),)*
        }

        impl JobsSettings {
            /// Every job, in the list's order, with its section.
            pub fn jobs(&self) -> Vec<ListedJob<'_>> {
                vec![$(job_sections!(@entry $kind &$spec, &self.$field),)*]
            }

            /// The section names as the list writes them, for the test that holds each to its
            /// job's name.
            #[cfg(test)]
            pub(super) fn fields() -> Vec<(&'static str, &'static JobSpec)> {
                vec![$((stringify!($field), &$spec),)*]
            }
        }
    };
    (@type consumer $section:ty) => { $section };
    (@type timer $section:ty) => { Timer<$section> };
    (@entry consumer $spec:expr, $section:expr) => { ListedJob::consumer($spec, $section) };
    (@entry timer $spec:expr, $section:expr) => { ListedJob::timer($spec, $section) };
}

job_sections! {
    automation_trigger: consumer job_automation_trigger::AutomationTriggerSettings = job_automation_trigger::JOB,
    automation_action: consumer job_automation_action::AutomationActionSettings = job_automation_action::JOB,
    email_send: consumer job_email_send::EmailSendSettings = job_email_send::JOB,
    audit_log: consumer job_audit_log::AuditLogSettings = job_audit_log::JOB,
    outbox_drain: timer job_outbox_drain::OutboxDrainJobSettings = job_outbox_drain::JOB,
    inbound_email_poller: timer job_inbound_email_poller::InboundEmailPollerSettings = job_inbound_email_poller::JOB,
    db_health: timer job_db_health::DbHealthSettings = job_db_health::JOB,
    draft_expiry: timer job_draft_expiry::DraftExpirySettings = job_draft_expiry::JOB,
    dead_letter_archive: timer job_dead_letter_archive::DeadLetterArchiveSettings = job_dead_letter_archive::JOB,
    retention: timer job_retention::RetentionSettings = job_retention::JOB,
    reconciler: timer job_reconciler::ReconcilerSettings = job_reconciler::JOB,
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

/// The list's jobs, read once: metrics look a job up per message.
static ALL: LazyLock<Vec<&'static JobSpec>> = LazyLock::new(|| {
    JobsSettings::default()
        .jobs()
        .into_iter()
        .map(|job| job.spec)
        .collect()
});

/// Every job of the list, in its order.
pub fn all() -> Vec<&'static JobSpec> {
    ALL.clone()
}

/// The job called `name`, now or in an earlier release.
pub fn find(name: &str) -> Option<&'static JobSpec> {
    ALL.iter().copied().find(|spec| spec.answers_to(name))
}

/// One job of the list, with its section.
#[derive(Debug, Clone, Copy)]
pub struct ListedJob<'a> {
    pub spec: &'static JobSpec,
    pub section: JobSection<'a>,
    /// Names the key of an error in the section's flattened part ([`refine_flattened`]).
    refine: Refine,
}

/// A job's section, as its kind has it.
#[derive(Debug, Clone, Copy)]
pub enum JobSection<'a> {
    Consumer(&'a dyn ConsumerSection),
    Timer(&'a dyn TimerEntry),
}

/// What the host reads of a timer job's section, whatever the job.
pub trait TimerEntry: std::fmt::Debug {
    fn schedule(&self) -> &Schedule;
    fn timeout(&self) -> Duration;
    fn pool_need(&self) -> PoolNeed;
    fn validate(&self) -> Vec<SettingError>;
}

impl<S: TimerSection + std::fmt::Debug> TimerEntry for Timer<S> {
    fn schedule(&self) -> &Schedule {
        &self.schedule
    }
    fn timeout(&self) -> Duration {
        self.job.timeout()
    }
    fn pool_need(&self) -> PoolNeed {
        self.job.pool_need()
    }
    fn validate(&self) -> Vec<SettingError> {
        self.job.validate()
    }
}

type Refine = fn(&Figment, &str, &figment::Error) -> Option<figment::Error>;

impl<'a> ListedJob<'a> {
    fn consumer<S: ConsumerSection>(spec: &'static JobSpec, section: &'a S) -> Self {
        Self {
            spec,
            section: JobSection::Consumer(section),
            // A consumer section flattens the runner's keys.
            refine: refine::<worker_broker::ConsumerSettings>,
        }
    }

    fn timer<S>(spec: &'static JobSpec, section: &'a Timer<S>) -> Self
    where
        S: TimerSection + std::fmt::Debug + Default + Serialize + DeserializeOwned,
    {
        Self {
            spec,
            section: JobSection::Timer(section),
            refine: refine::<S>,
        }
    }

    /// The section's path from the top of the settings (`jobs.email_send`).
    pub fn path(&self) -> String {
        format!("jobs.{}", self.spec.section())
    }

    fn validate(&self) -> Vec<SettingError> {
        match self.section {
            JobSection::Consumer(section) => section.validate(),
            JobSection::Timer(section) => section.validate(),
        }
    }
}

/// A consumer job's section, with its job.
#[derive(Debug, Clone, Copy)]
pub struct ConsumerEntry<'a> {
    pub spec: &'static JobSpec,
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
        self.jobs()
            .into_iter()
            .filter_map(|job| match job.section {
                JobSection::Consumer(section) => Some(ConsumerEntry {
                    spec: job.spec,
                    section,
                }),
                JobSection::Timer(_) => None,
            })
            .collect()
    }

    /// Every timer job's section, with its job.
    pub fn timers(&self) -> Vec<(&'static JobSpec, &dyn TimerEntry)> {
        self.jobs()
            .into_iter()
            .filter_map(|job| match job.section {
                JobSection::Timer(section) => Some((job.spec, section)),
                JobSection::Consumer(_) => None,
            })
            .collect()
    }

    /// Every problem of every section, keyed from `[jobs]` (`email_send.timeout`).
    pub fn validate(&self) -> Vec<SettingError> {
        let mut problems = Problems::new();
        for job in self.jobs() {
            problems.nested(&job.spec.section(), job.validate());
        }
        problems.into_vec()
    }
}

/// Names the key of an error in a section's flattened part. Serde hands a `#[serde(flatten)]`
/// part its keys through a buffer, so figment's error stops at the section (`jobs.email_send`)
/// and carries another provider's source; this finds the key by reading the section's keys
/// one at a time into the part that was flattened, and takes the key's own source.
pub(super) fn refine_flattened(figment: &Figment, error: figment::Error) -> Vec<figment::Error> {
    let jobs = JobsSettings::default();
    let sections: Vec<(String, Refine)> = jobs
        .jobs()
        .iter()
        .map(|job| (job.path(), job.refine))
        .collect();
    error
        .into_iter()
        .map(|e| {
            let at = super::load::error_path(&e);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_section_is_named_by_its_job() {
        for (field, spec) in JobsSettings::fields() {
            assert_eq!(field, spec.section(), "the section of {}", spec.name);
        }
    }

    #[test]
    fn each_kind_of_section_matches_its_job() {
        for job in JobsSettings::default().jobs() {
            let consumer = matches!(job.section, JobSection::Consumer(_));
            assert_eq!(consumer, !job.spec.is_timer(), "{}", job.spec.name);
        }
    }

    #[test]
    fn no_two_jobs_answer_to_one_name() {
        let settings = JobsSettings::default();
        let jobs = settings.jobs();
        let mut names: Vec<&str> = jobs.iter().flat_map(|j| j.spec.names()).collect();
        let all = names.len();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), all, "{names:?}");
    }
}
