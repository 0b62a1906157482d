//! The settings tree: one TOML file, every key overridable from the environment as
//! `WORKER_HOST__SECTION__KEY`, validated as a whole before anything starts.
//!
//! Loading goes: defaults → the TOML file → the environment → secrets from `*_file` keys →
//! validation. Every error names the file, the key and what was expected.
//!
//! Each job owns its section (`[jobs.<job>]`): the job's crate defines it with its defaults
//! and a `validate` that names keys relative to the section; [`JobsSettings`] lists the
//! sections and puts `jobs.<job>.` in front of their keys. The host's own sections (the
//! connections, telemetry, admin, alerts, the workers' shared retry and shutdown) are here.
//!
//! - `load.rs`: figment, the file's syntax check, environment overrides, and
//!   [`SettingsError`] (file, line and key; never a secret's value);
//! - `secrets.rs`: passwords from `*_file` keys, and the missing ones;
//! - `admin.rs`: the admin endpoints and the console;
//! - `host.rs` and `validate.rs`: the host's own sections and their checks (TLS and
//!   credentials among them);
//! - `jobs.rs`: the list of job sections;
//! - `budget.rs`: what the jobs may ask of the database pool at once.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

pub use crate::schedule::Schedule;
pub use budget::{DEDICATED, Need};
pub use host::{
    AlertSettings, BrokerSettings, DatabaseSettings, ImapAccount, ImapSettings, LogFormat,
    SmtpSettings, SslMode, TelemetrySettings, WorkersSettings,
};
pub use job_sections::{
    ConsumerEntry, JobSection, JobsSettings, ListedJob, Timer, TimerEntry, all, find,
};
pub use load::{DEFAULT_PATH, ENV_PREFIX, SettingsError, SettingsSource, source_from};
pub use worker_console::settings::{AdminSettings, AuthProxy, PasswordHashing, parse_network};

mod budget;
mod host;
mod job_sections;
mod load;
pub mod renames;
mod secrets;
pub(crate) mod validate;

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct Settings {
    /// Which client installation this host serves; a resource attribute of every trace.
    pub installation: String,
    /// This process's name among the installation's replicas, on `/status`, in the console's
    /// list of replicas and on every trace. Unset: the machine's host name.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub replica: Option<String>,
    /// Automation files (TOML or JSON) imported at start, by name: for demos and fixed
    /// installations (the platform normally writes automations itself). A relative path is
    /// relative to the settings file's folder.
    pub automations_files: Vec<PathBuf>,
    pub database: DatabaseSettings,
    pub broker: BrokerSettings,
    pub smtp: SmtpSettings,
    pub imap: ImapSettings,
    /// Token sources by name (`[oauth.NAME]`), for the IMAP accounts and `[smtp]` that sign in
    /// with `auth = "xoauth2"` or `"oauthbearer"`.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub oauth: BTreeMap<String, worker_mail_auth::OAuthSettings>,
    pub telemetry: TelemetrySettings,
    pub admin: AdminSettings,
    pub workers: WorkersSettings,
    /// Each job's own section, `[jobs.<job>]`, defined by the job's crate.
    pub jobs: JobsSettings,
    pub alerts: AlertSettings,
    /// When a dependency's circuit opens and how it is probed (`worker_core::circuit`).
    pub circuits: worker_core::circuit::CircuitSettings,
    /// Old keys the settings were read with, under their new names: said at every start.
    #[serde(skip)]
    pub deprecations: Vec<renames::Deprecation>,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            installation: "local".into(),
            replica: None,
            automations_files: Vec::new(),
            database: DatabaseSettings::default(),
            broker: BrokerSettings::default(),
            smtp: SmtpSettings::default(),
            imap: ImapSettings::default(),
            oauth: BTreeMap::new(),
            telemetry: TelemetrySettings::default(),
            admin: AdminSettings::default(),
            workers: WorkersSettings::default(),
            jobs: JobsSettings::default(),
            alerts: AlertSettings::default(),
            circuits: worker_core::circuit::CircuitSettings::default(),
            deprecations: Vec::new(),
        }
    }
}

impl Settings {
    /// How long the tables a mail's story reads keep their rows (`worker-host mail` and the
    /// console's `/mail`).
    pub fn story_retention(&self) -> worker_console::story::Retention {
        worker_console::story::Retention {
            attempt_log: self.jobs.retention.job.attempt_log,
            publications: self.jobs.retention.job.publications,
        }
    }

    /// This replica's name: `replica` as set, else the machine's host name.
    pub fn replica_name(&self) -> String {
        self.replica
            .clone()
            .unwrap_or_else(|| whoami::fallible::hostname().unwrap_or_else(|_| "unknown".into()))
    }

    /// The effective settings as TOML, with every secret redacted.
    pub fn to_redacted_toml(&self) -> String {
        toml::to_string_pretty(self)
            .unwrap_or_else(|e| format!("# the settings could not be printed: {e}\n"))
    }

    /// The broker topology the settings describe: the exchanges and, for each consumer job,
    /// its queue with retry tiers and dead letters.
    pub fn topology(&self) -> Result<worker_broker::Topology, worker_broker::TopologyError> {
        let queues = self
            .jobs
            .consumers()
            .into_iter()
            .map(|job| job.queue(&self.broker.topology))
            .collect::<Result<Vec<_>, _>>()?;
        worker_broker::Topology::from_settings(&self.broker.topology, queues)
    }
}

#[cfg(test)]
mod tests;
