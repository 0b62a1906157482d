//! The settings tree: one TOML file, every key overridable from the environment as
//! `WORKER_HOST__SECTION__KEY`, validated as a whole before anything starts.
//!
//! Loading goes: defaults → the TOML file → the environment → secrets from `*_file` keys →
//! validation. Every error names the file, the key and what was expected.

use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use figment::Figment;
use figment::providers::{Format, Serialized, Toml};
use serde::{Deserialize, Serialize};
use worker_core::RetryPolicy;

use crate::secret::Secret;

pub use budget::{DEDICATED, Need};

/// The settings file used when neither `--config` nor `WORKER_HOST_CONFIG` names one.
pub const DEFAULT_PATH: &str = "config/worker-host.toml";
/// The prefix of environment overrides; levels are separated by a double underscore.
pub const ENV_PREFIX: &str = "WORKER_HOST__";

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct Settings {
    /// Which client installation this host serves; a resource attribute of every trace.
    pub installation: String,
    /// Automation files (TOML or JSON) imported at start, by name: for demos and fixed
    /// installations (the platform normally writes automations itself). A relative path is
    /// relative to the settings file's folder.
    pub automations_files: Vec<PathBuf>,
    pub database: DatabaseSettings,
    pub broker: BrokerSettings,
    pub smtp: SmtpSettings,
    pub imap: ImapSettings,
    pub telemetry: TelemetrySettings,
    pub admin: AdminSettings,
    pub workers: WorkersSettings,
    pub jobs: JobsSettings,
    pub alerts: AlertSettings,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            installation: "local".into(),
            automations_files: Vec::new(),
            database: DatabaseSettings::default(),
            broker: BrokerSettings::default(),
            smtp: SmtpSettings::default(),
            imap: ImapSettings::default(),
            telemetry: TelemetrySettings::default(),
            admin: AdminSettings::default(),
            workers: WorkersSettings::default(),
            jobs: JobsSettings::default(),
            alerts: AlertSettings::default(),
        }
    }
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct DatabaseSettings {
    pub host: String,
    pub port: u16,
    pub name: String,
    pub username: String,
    pub password: Option<Secret>,
    pub password_file: Option<PathBuf>,
    /// Connections in the shared pool; the jobs' concurrency must fit in it (`budget`).
    pub max_connections: u32,
    #[serde(with = "humantime_serde")]
    pub acquire_timeout: Duration,
    /// Attempts to reach the database at start before giving up.
    pub connect_attempts: u32,
    pub migrate_on_start: bool,
}

impl Default for DatabaseSettings {
    fn default() -> Self {
        Self {
            host: "127.0.0.1".into(),
            port: 5432,
            name: "worker_host".into(),
            username: "worker_host".into(),
            password: None,
            password_file: None,
            // What the default concurrency can ask at once (see `settings::budget`), with room.
            max_connections: 64,
            acquire_timeout: Duration::from_secs(10),
            connect_attempts: 10,
            migrate_on_start: true,
        }
    }
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct BrokerSettings {
    pub host: String,
    pub port: u16,
    pub vhost: String,
    pub username: String,
    pub password: Option<Secret>,
    pub password_file: Option<PathBuf>,
    #[serde(with = "humantime_serde")]
    pub heartbeat: Duration,
    /// `amqps` instead of `amqp`.
    pub tls: bool,
    #[serde(with = "humantime_serde")]
    pub connect_timeout: Duration,
    /// Attempts to reach the broker at start before giving up.
    pub connect_attempts: u32,
    /// First wait before reconnecting after the connection is lost; doubles each time.
    #[serde(with = "humantime_serde")]
    pub reconnect_min: Duration,
    /// Longest wait between reconnection attempts.
    #[serde(with = "humantime_serde")]
    pub reconnect_max: Duration,
    pub topology: worker_broker::TopologySettings,
    pub publisher: worker_broker::PublisherSettings,
}

impl Default for BrokerSettings {
    fn default() -> Self {
        Self {
            host: "127.0.0.1".into(),
            port: 5672,
            vhost: "/".into(),
            username: "guest".into(),
            password: None,
            password_file: None,
            heartbeat: Duration::from_secs(10),
            tls: false,
            connect_timeout: Duration::from_secs(10),
            connect_attempts: 10,
            reconnect_min: Duration::from_millis(500),
            reconnect_max: Duration::from_secs(30),
            topology: worker_broker::TopologySettings::default(),
            publisher: worker_broker::PublisherSettings::default(),
        }
    }
}

/// How a mail connection is secured.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Security {
    /// No encryption: for a server on loopback only.
    Plain,
    /// Plain connect, then upgrade with STARTTLS (refusing to go on without it).
    Starttls,
    /// TLS from the first byte.
    Tls,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct SmtpSettings {
    pub host: String,
    pub port: u16,
    pub security: Security,
    /// Leave empty for a server that takes mail without logging in.
    pub username: Option<String>,
    pub password: Option<Secret>,
    pub password_file: Option<PathBuf>,
    /// The sender of mail that does not name one.
    pub from: String,
    /// Connections kept open to the server.
    pub pool_size: u32,
    /// A `sending` claim older than this is taken over by a later try, which sends the mail
    /// again (the first try died between the server's answer and its record). Unset: the
    /// send timeout + the 30 s record budget + 60 s. Shorter means a dead host's mail goes out
    /// sooner; it must stay above the send timeout + the record budget, or a live try's claim
    /// is taken over.
    #[serde(with = "humantime_serde", skip_serializing_if = "Option::is_none")]
    pub claim_stale_after: Option<Duration>,
}

impl Default for SmtpSettings {
    fn default() -> Self {
        Self {
            host: "127.0.0.1".into(),
            port: 2525,
            security: Security::Plain,
            username: None,
            password: None,
            password_file: None,
            from: "worker-host@localhost".into(),
            pool_size: 4,
            claim_stale_after: None,
        }
    }
}

#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct ImapSettings {
    pub accounts: Vec<ImapAccount>,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ImapAccount {
    /// A short name for logs, metrics and the poll state.
    pub name: String,
    #[serde(default = "default_imap_host")]
    pub host: String,
    #[serde(default = "default_imap_port")]
    pub port: u16,
    #[serde(default = "default_imap_security")]
    pub security: Security,
    pub username: String,
    #[serde(default)]
    pub password: Option<Secret>,
    #[serde(default)]
    pub password_file: Option<PathBuf>,
    #[serde(default = "default_mailbox")]
    pub mailbox: String,
}

fn default_imap_host() -> String {
    "127.0.0.1".into()
}
fn default_imap_port() -> u16 {
    10143
}
fn default_imap_security() -> Security {
    Security::Plain
}
fn default_mailbox() -> String {
    "INBOX".into()
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    Human,
    Json,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct TelemetrySettings {
    pub log_format: LogFormat,
    /// A tracing filter (`info`, `worker_broker=debug,info`); `RUST_LOG` wins when set.
    pub log_level: String,
    /// The OTLP/HTTP endpoint (`http://127.0.0.1:4318`); traces are exported only when set.
    pub otlp_endpoint: Option<String>,
    pub service_name: String,
    #[serde(with = "humantime_serde")]
    pub export_timeout: Duration,
    /// How often metrics are pushed over OTLP (Prometheus pulls `/metrics` when it likes).
    #[serde(with = "humantime_serde")]
    pub metrics_interval: Duration,
}

impl Default for TelemetrySettings {
    fn default() -> Self {
        Self {
            log_format: LogFormat::Human,
            log_level: "info".into(),
            otlp_endpoint: None,
            service_name: "worker-host".into(),
            export_timeout: Duration::from_secs(10),
            metrics_interval: Duration::from_secs(15),
        }
    }
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct AdminSettings {
    pub enabled: bool,
    /// Where `/healthz`, `/readyz` and the other admin endpoints listen; keep it on loopback.
    pub listen: SocketAddr,
}

impl Default for AdminSettings {
    fn default() -> Self {
        Self {
            enabled: true,
            listen: SocketAddr::from(([127, 0, 0, 1], 9180)),
        }
    }
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct WorkersSettings {
    /// How long a graceful shutdown may take before work in flight is abandoned.
    #[serde(with = "humantime_serde")]
    pub shutdown_grace: Duration,
    /// How long each consumer, once shutdown starts, keeps working through the deliveries it
    /// already holds before it returns the rest to the queue; more than a second shorter than
    /// `shutdown_grace`, which must leave time to cancel, return and close. Unset: two thirds
    /// of `shutdown_grace`.
    #[serde(with = "humantime_serde", skip_serializing_if = "Option::is_none")]
    pub drain_deadline: Option<Duration>,
    /// How long processed-message marks are kept: longer than any retry tier or replay.
    #[serde(with = "humantime_serde")]
    pub dedup_retention: Duration,
    /// The in-process retry policy of every job that does not set its own.
    pub retry: RetryPolicy,
    pub timeouts: TimeoutSettings,
    /// The attempt log: a row per failed try and per final outcome.
    pub attempt_log: worker_store::AttemptLogSettings,
}

impl WorkersSettings {
    /// The consumers' drain deadline: as set, else two thirds of the shutdown grace, which
    /// leaves the rest of the grace to cancel, return what is left and close.
    pub fn drain_deadline(&self) -> Duration {
        self.drain_deadline
            .unwrap_or(self.shutdown_grace.mul_f64(2.0 / 3.0))
    }
}

impl Default for WorkersSettings {
    fn default() -> Self {
        Self {
            shutdown_grace: Duration::from_secs(30),
            drain_deadline: None,
            dedup_retention: Duration::from_secs(7 * 24 * 3600),
            retry: RetryPolicy::default(),
            timeouts: TimeoutSettings::default(),
            attempt_log: worker_store::AttemptLogSettings::default(),
        }
    }
}

/// The shared timeouts of seed 000: 30 s for automation, health and draft work, 60 s for an
/// email send and an IMAP account connect, 15 to 30 s for narrower per-item work.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct TimeoutSettings {
    #[serde(with = "humantime_serde")]
    pub automation: Duration,
    #[serde(with = "humantime_serde")]
    pub health: Duration,
    #[serde(with = "humantime_serde")]
    pub draft: Duration,
    #[serde(with = "humantime_serde")]
    pub email_send: Duration,
    #[serde(with = "humantime_serde")]
    pub imap_connect: Duration,
    /// One inbound message: fetch, parse and store.
    #[serde(with = "humantime_serde")]
    pub imap_message: Duration,
    /// One outbox batch: publish with confirms and mark.
    #[serde(with = "humantime_serde")]
    pub outbox_batch: Duration,
    /// One webhook call of an automation action.
    #[serde(with = "humantime_serde")]
    pub webhook: Duration,
}

impl Default for TimeoutSettings {
    fn default() -> Self {
        Self {
            automation: Duration::from_secs(30),
            health: Duration::from_secs(30),
            draft: Duration::from_secs(30),
            email_send: Duration::from_secs(60),
            imap_connect: Duration::from_secs(60),
            imap_message: Duration::from_secs(30),
            outbox_batch: Duration::from_secs(30),
            webhook: Duration::from_secs(15),
        }
    }
}

/// When a timer job ticks: `every 5s` (any humantime duration) or a cron expression with
/// optional seconds (`0 */5 * * * *`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub enum Schedule {
    Every(Duration),
    Cron(String),
}

impl Schedule {
    pub fn parse(text: &str) -> Result<Self, String> {
        let text = text.trim();
        if let Some(interval) = text.strip_prefix("every ") {
            let every = humantime::parse_duration(interval.trim()).map_err(|e| {
                format!("`{text}`: the interval is not a duration like `5s` or `2m` ({e})")
            })?;
            if every.is_zero() {
                return Err(format!("`{text}`: the interval must be longer than zero"));
            }
            return Ok(Self::Every(every));
        }
        crate::schedule::parse_cron(text)
            .map(|_| Self::Cron(text.to_string()))
            .map_err(|e| {
                format!("`{text}` is neither `every <duration>` nor a valid cron expression: {e}")
            })
    }
}

impl TryFrom<String> for Schedule {
    type Error = String;
    fn try_from(value: String) -> Result<Self, Self::Error> {
        Self::parse(&value)
    }
}

impl From<Schedule> for String {
    fn from(schedule: Schedule) -> Self {
        schedule.to_string()
    }
}

impl fmt::Display for Schedule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Every(every) => write!(f, "every {}", humantime::format_duration(*every)),
            Self::Cron(expr) => f.write_str(expr),
        }
    }
}

/// The settings of one RabbitMQ consumer job.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct ConsumerJobSettings {
    /// Deliveries the broker sends ahead of acks.
    pub prefetch: u16,
    /// Handlers in flight at once.
    pub concurrency: u32,
    /// Deliveries (across parks in retry tiers) before a message is dead-lettered `gave-up`.
    pub max_attempts: u32,
    /// One handler try; unset means the shared timeout of its kind.
    #[serde(with = "humantime_serde", skip_serializing_if = "Option::is_none")]
    pub timeout: Option<Duration>,
    /// The in-process retry; unset means `workers.retry`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub retry: Option<RetryPolicy>,
    /// Longest time one delivery may wait in memory between tries (a throttled webhook's
    /// `Retry-After` included); a longer wait parks the message in a retry tier instead.
    #[serde(with = "humantime_serde")]
    pub in_process_wait: Duration,
    /// The queue, its bindings, delivery limit, retry tiers and dead letters.
    pub queue: worker_broker::QueueSettings,
    /// `jobs.automation_action` only: the hosts (`name`, `name:port`, an address) and CIDR
    /// ranges inside the installation that a webhook may reach; by default none (see
    /// `job_automation_action::address`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub webhook_allow: Vec<String>,
}

impl Default for ConsumerJobSettings {
    fn default() -> Self {
        Self {
            prefetch: 50,
            concurrency: 8,
            max_attempts: 5,
            timeout: None,
            retry: None,
            in_process_wait: Duration::from_secs(30),
            queue: worker_broker::QueueSettings::default(),
            webhook_allow: Vec::new(),
        }
    }
}

/// `[jobs.inbound_email_poller]`: the accounts are under `[imap]`.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct InboundPollerJobSettings {
    pub schedule: Schedule,
    /// One tick over every account.
    #[serde(with = "humantime_serde")]
    pub timeout: Duration,
    /// Mail larger than this many bytes is recorded as skipped, without its body.
    pub max_message_bytes: u64,
    /// The text and the HTML body are each cut at this many characters.
    pub max_body_chars: usize,
    /// Messages handled per account per tick; the rest waits for the next tick.
    pub max_messages_per_account: u32,
    /// A message that fails this many ticks in a row is recorded as skipped.
    pub max_message_attempts: u32,
    /// Accounts polled at once.
    pub account_concurrency: usize,
}

impl Default for InboundPollerJobSettings {
    fn default() -> Self {
        Self {
            schedule: Schedule::Every(Duration::from_secs(10)),
            timeout: Duration::from_secs(300),
            max_message_bytes: 25 * 1024 * 1024,
            max_body_chars: 100_000,
            max_messages_per_account: 100,
            max_message_attempts: 3,
            account_concurrency: 4,
        }
    }
}

/// `[jobs.db_health]`.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct DbHealthJobSettings {
    pub schedule: Schedule,
    /// The probe must answer within this (`workers.timeouts.health` bounds the whole tick).
    #[serde(with = "humantime_serde")]
    pub probe_timeout: Duration,
    /// Failed probes in a row before the database counts as unhealthy.
    pub unhealthy_after: u32,
}

impl Default for DbHealthJobSettings {
    fn default() -> Self {
        Self {
            schedule: Schedule::Every(Duration::from_secs(5)),
            probe_timeout: Duration::from_secs(5),
            unhealthy_after: 1,
        }
    }
}

/// `[jobs.draft_expiry]`.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct DraftExpiryJobSettings {
    pub schedule: Schedule,
    /// Drafts expired per batch (one short transaction).
    pub batch_size: u32,
    /// Batches per tick at most; a larger backlog is worked off over several ticks.
    pub max_batches_per_tick: u32,
}

impl Default for DraftExpiryJobSettings {
    fn default() -> Self {
        Self {
            schedule: Schedule::Every(Duration::from_secs(60)),
            batch_size: 1000,
            max_batches_per_tick: 10,
        }
    }
}

/// `[jobs.retention]`: when processed-message marks past `workers.dedup_retention` and
/// attempt-log rows past `workers.attempt_log.retention` are deleted, and how much per tick.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct RetentionJobSettings {
    pub schedule: Schedule,
    /// One tick.
    #[serde(with = "humantime_serde")]
    pub timeout: Duration,
    /// Rows per `DELETE` (one short statement).
    pub batch_size: u32,
    /// Batches per table per tick at most; a larger backlog is worked off over several ticks.
    pub max_batches_per_tick: u32,
}

impl Default for RetentionJobSettings {
    fn default() -> Self {
        let job = job_retention::RetentionConfig::default();
        Self {
            schedule: Schedule::Every(Duration::from_secs(600)),
            timeout: Duration::from_secs(60),
            batch_size: job.batch_size,
            max_batches_per_tick: job.max_batches_per_tick,
        }
    }
}

/// `[jobs.outbox_drain]`: when the drain ticks (it is also woken at once when a row
/// commits) and, under `[jobs.outbox_drain.drain]`, how it claims, publishes and retries.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct OutboxDrainJobSettings {
    pub schedule: Schedule,
    /// One tick; unset means `workers.timeouts.outbox_batch`.
    #[serde(with = "humantime_serde", skip_serializing_if = "Option::is_none")]
    pub timeout: Option<Duration>,
    pub drain: job_outbox_drain::OutboxDrainSettings,
}

impl Default for OutboxDrainJobSettings {
    fn default() -> Self {
        Self {
            schedule: Schedule::Every(Duration::from_secs(1)),
            timeout: None,
            drain: job_outbox_drain::OutboxDrainSettings::default(),
        }
    }
}

/// `[jobs.dead_letter_archive]`: the archiver of every `Q.dead` queue, and the schedule of its
/// maintenance (archiving failed outbox rows, the retention sweep).
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct DeadLetterArchiveJobSettings {
    /// When failed outbox rows are archived and settled rows past retention swept.
    pub maintenance_schedule: Schedule,
    pub archiver: job_dead_letter_archive::ArchiverSettings,
}

impl Default for DeadLetterArchiveJobSettings {
    fn default() -> Self {
        Self {
            maintenance_schedule: Schedule::Every(Duration::from_secs(60)),
            archiver: job_dead_letter_archive::ArchiverSettings::default(),
        }
    }
}

/// `[jobs.reconciler]`: stuck executions and emails re-queued, then given up on.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct ReconcilerJobSettings {
    pub schedule: Schedule,
    /// One tick.
    #[serde(with = "humantime_serde")]
    pub timeout: Duration,
    /// Unfinished and unchanged for longer than this, with no live outbox row: stuck. Keep it
    /// longer than the whole retry ladder.
    #[serde(with = "humantime_serde")]
    pub stuck_after: Duration,
    /// Re-queues of one stuck row before it is marked `failed` with a dead letter.
    pub max_requeues: u32,
    /// Rows per batch (one short transaction).
    pub batch_size: u32,
    /// Batches of each kind per tick at most.
    pub max_batches_per_tick: u32,
}

impl Default for ReconcilerJobSettings {
    fn default() -> Self {
        Self {
            schedule: Schedule::Every(Duration::from_secs(300)),
            timeout: Duration::from_secs(60),
            stuck_after: Duration::from_secs(2 * 3600),
            max_requeues: 1,
            batch_size: 100,
            max_batches_per_tick: 10,
        }
    }
}

/// `[alerts]`: thresholds; crossing one logs an error once and shows on `/status`.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct AlertSettings {
    /// How often the readings are taken.
    #[serde(with = "humantime_serde")]
    pub interval: Duration,
    /// Dead letters waiting in one queue's archive (or its dead queue) above this.
    pub dead_letter_depth: u64,
    /// Dead letters archived in the last minute, over all queues, above this.
    pub dead_letter_inflow_per_minute: u64,
    /// The oldest pending outbox row older than this.
    #[serde(with = "humantime_serde")]
    pub outbox_oldest_pending: Duration,
    /// Failed database probes in a row above this.
    pub db_probe_failures: u32,
    /// Stuck executions or emails (of either kind) above this.
    pub stuck_work: u64,
}

impl Default for AlertSettings {
    fn default() -> Self {
        Self {
            interval: Duration::from_secs(15),
            dead_letter_depth: 100,
            dead_letter_inflow_per_minute: 50,
            outbox_oldest_pending: Duration::from_secs(300),
            db_probe_failures: 3,
            stuck_work: 0,
        }
    }
}

#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct JobsSettings {
    pub automation_trigger: ConsumerJobSettings,
    pub automation_action: ConsumerJobSettings,
    pub email_send: ConsumerJobSettings,
    pub outbox_drain: OutboxDrainJobSettings,
    pub inbound_email_poller: InboundPollerJobSettings,
    pub db_health: DbHealthJobSettings,
    pub draft_expiry: DraftExpiryJobSettings,
    pub dead_letter_archive: DeadLetterArchiveJobSettings,
    pub retention: RetentionJobSettings,
    pub reconciler: ReconcilerJobSettings,
}

/// A settings file, or the environment, that cannot be used; names where and what.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SettingsError {
    /// The file the offending value came from, when it came from one.
    pub source: Option<String>,
    /// The dotted key (`database.port`), empty for the file as a whole.
    pub key: String,
    /// What was wrong and what was expected.
    pub problem: String,
}

impl fmt::Display for SettingsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(source) = &self.source {
            write!(f, "{source}: ")?;
        }
        if !self.key.is_empty() {
            write!(f, "key `{}`: ", self.key)?;
        }
        f.write_str(&self.problem)
    }
}

impl std::error::Error for SettingsError {}

/// Where the settings come from.
#[derive(Debug, Clone)]
pub struct SettingsSource {
    pub path: PathBuf,
    /// True when the path was asked for (by flag or variable): a missing file is then an
    /// error, where a missing default file only means "defaults and environment".
    pub explicit: bool,
}

impl Settings {
    /// Loads, resolves secrets and validates. `env` is the environment to read overrides
    /// from (the process's in production, a fixed list in tests).
    pub fn load(
        source: &SettingsSource,
        env: &[(String, String)],
    ) -> Result<Self, Vec<SettingsError>> {
        let path_text = source.path.display().to_string();
        let mut figment = Figment::from(Serialized::defaults(Settings::default()));
        if source.path.exists() {
            if let Err(e) = std::fs::read_to_string(&source.path) {
                return Err(vec![SettingsError {
                    source: Some(path_text),
                    key: String::new(),
                    problem: format!("cannot be read: {e}"),
                }]);
            }
            figment = figment.merge(Toml::file_exact(&source.path));
        } else if source.explicit {
            return Err(vec![SettingsError {
                source: Some(path_text),
                key: String::new(),
                problem: "no such settings file".into(),
            }]);
        }
        // The environment is handed in rather than read here, so that tests need no
        // `set_var`; values are parsed as figment parses environment variables.
        let mut overridden = Vec::new();
        for (var, value) in env {
            if let Some(key) = env_key(var) {
                let value: figment::value::Value =
                    value.parse().unwrap_or_else(|_| value.clone().into());
                figment = figment.merge(Serialized::default(&key, value));
                overridden.push(key);
            }
        }
        let mut settings: Settings = figment
            .extract()
            .map_err(|e| from_figment(e, &path_text, &overridden))?;
        // Files named in the settings file are found beside it, wherever the host is started.
        if let Some(folder) = source.path.parent().filter(|_| source.path.exists()) {
            for file in &mut settings.automations_files {
                if file.is_relative() {
                    *file = folder.join(&*file);
                }
            }
        }
        let mut errors = Vec::new();
        settings.resolve_secrets(&path_text, &mut errors);
        settings.validate(&path_text, &mut errors);
        if errors.is_empty() {
            Ok(settings)
        } else {
            Err(errors)
        }
    }

    fn resolve_secrets(&mut self, file: &str, errors: &mut Vec<SettingsError>) {
        resolve(
            file,
            "database",
            &mut self.database.password,
            &self.database.password_file,
            true,
            errors,
        );
        resolve(
            file,
            "broker",
            &mut self.broker.password,
            &self.broker.password_file,
            true,
            errors,
        );
        let smtp_needs = self.smtp.username.is_some();
        resolve(
            file,
            "smtp",
            &mut self.smtp.password,
            &self.smtp.password_file,
            smtp_needs,
            errors,
        );
        for (i, account) in self.imap.accounts.iter_mut().enumerate() {
            let section = format!("imap.accounts[{i}]");
            resolve(
                file,
                &section,
                &mut account.password,
                &account.password_file,
                true,
                errors,
            );
        }
    }

    fn validate(&self, file: &str, errors: &mut Vec<SettingsError>) {
        let mut fail = |key: &str, problem: String| {
            errors.push(SettingsError {
                source: Some(file.to_string()),
                key: key.to_string(),
                problem,
            })
        };
        if self.installation.trim().is_empty() {
            fail(
                "installation",
                "expected the name of this client installation, found an empty string".into(),
            );
        }
        for (key, port) in [
            ("database.port", self.database.port),
            ("broker.port", self.broker.port),
            ("smtp.port", self.smtp.port),
        ] {
            if port == 0 {
                fail(
                    key,
                    "expected a port number from 1 to 65535, found 0".into(),
                );
            }
        }
        for (key, value) in [
            ("database.max_connections", self.database.max_connections),
            ("database.connect_attempts", self.database.connect_attempts),
            ("broker.connect_attempts", self.broker.connect_attempts),
            ("smtp.pool_size", self.smtp.pool_size),
        ] {
            if value == 0 {
                fail(key, "expected a positive number, found 0".into());
            }
        }
        if let Some(age) = self.smtp.claim_stale_after {
            let floor = self.workers.timeouts.email_send + job_email_send::DEFAULT_RECORD_BUDGET;
            if age <= floor {
                fail(
                    "smtp.claim_stale_after",
                    format!(
                        "expected more than workers.timeouts.email_send plus the {} record budget ({}), or a try still sending has its claim taken over and the mail goes out twice; found {}",
                        humantime::format_duration(job_email_send::DEFAULT_RECORD_BUDGET),
                        humantime::format_duration(floor),
                        humantime::format_duration(age)
                    ),
                );
            }
        }
        let mut durations: Vec<(String, Duration)> = vec![
            (
                "database.acquire_timeout".into(),
                self.database.acquire_timeout,
            ),
            ("broker.heartbeat".into(), self.broker.heartbeat),
            ("broker.connect_timeout".into(), self.broker.connect_timeout),
            ("broker.reconnect_min".into(), self.broker.reconnect_min),
            ("broker.reconnect_max".into(), self.broker.reconnect_max),
            (
                "telemetry.export_timeout".into(),
                self.telemetry.export_timeout,
            ),
            (
                "telemetry.metrics_interval".into(),
                self.telemetry.metrics_interval,
            ),
            ("workers.shutdown_grace".into(), self.workers.shutdown_grace),
            (
                "workers.dedup_retention".into(),
                self.workers.dedup_retention,
            ),
            (
                "workers.retry.max_delay".into(),
                self.workers.retry.max_delay,
            ),
            (
                "workers.timeouts.automation".into(),
                self.workers.timeouts.automation,
            ),
            (
                "workers.timeouts.health".into(),
                self.workers.timeouts.health,
            ),
            ("workers.timeouts.draft".into(), self.workers.timeouts.draft),
            (
                "workers.timeouts.email_send".into(),
                self.workers.timeouts.email_send,
            ),
            (
                "workers.timeouts.imap_connect".into(),
                self.workers.timeouts.imap_connect,
            ),
            (
                "workers.timeouts.imap_message".into(),
                self.workers.timeouts.imap_message,
            ),
            (
                "workers.timeouts.outbox_batch".into(),
                self.workers.timeouts.outbox_batch,
            ),
            (
                "workers.timeouts.webhook".into(),
                self.workers.timeouts.webhook,
            ),
        ];
        if let Some(drain) = self.workers.drain_deadline {
            durations.push(("workers.drain_deadline".into(), drain));
            if drain + worker_broker::consumer::CANCEL_WAIT >= self.workers.shutdown_grace {
                fail(
                    "workers.drain_deadline",
                    format!(
                        "expected a deadline more than {} shorter than workers.shutdown_grace ({}), which must leave time to cancel what is left, return it to the queue and close; found {}",
                        humantime::format_duration(worker_broker::consumer::CANCEL_WAIT),
                        humantime::format_duration(self.workers.shutdown_grace),
                        humantime::format_duration(drain)
                    ),
                );
            }
        }
        if let Err(problem) = self.workers.retry.validate() {
            fail("workers.retry", problem);
        }
        if let Err(problem) = self.workers.attempt_log.validate() {
            fail("workers.attempt_log", problem);
        }
        if let Err(problem) = self.jobs.outbox_drain.drain.validate() {
            fail("jobs.outbox_drain.drain", problem);
        }
        if let Err(problem) = self.jobs.dead_letter_archive.archiver.validate() {
            fail("jobs.dead_letter_archive.archiver", problem);
        }
        durations.push(("alerts.interval".into(), self.alerts.interval));
        durations.push((
            "alerts.outbox_oldest_pending".into(),
            self.alerts.outbox_oldest_pending,
        ));
        if let Some(timeout) = self.jobs.outbox_drain.timeout {
            durations.push(("jobs.outbox_drain.timeout".into(), timeout));
        }
        if let Err(e) = self.topology() {
            let key = match &e {
                worker_broker::TopologyError::Invalid { queue, key, .. } => self
                    .consumers()
                    .into_iter()
                    .find(|(_, job, defaults)| {
                        job.queue.name.as_ref().unwrap_or(&defaults.name) == queue
                    })
                    .map(|(name, _, _)| format!("jobs.{name}.queue.{key}"))
                    .unwrap_or_else(|| format!("broker.topology.{key}")),
                _ => "broker.topology".to_string(),
            };
            fail(&key, e.to_string());
        }
        if let Err(e) =
            job_automation_action::WebhookAllow::parse(&self.jobs.automation_action.webhook_allow)
        {
            fail(
                &format!("jobs.automation_action.webhook_allow[{}]", e.index),
                e.to_string(),
            );
        }
        for (name, job) in [
            ("automation_trigger", &self.jobs.automation_trigger),
            ("email_send", &self.jobs.email_send),
        ] {
            if !job.webhook_allow.is_empty() {
                fail(
                    &format!("jobs.{name}.webhook_allow"),
                    "only jobs.automation_action calls webhooks; set it there".into(),
                );
            }
        }
        for (name, job, _) in self.consumers() {
            for (field, value) in [
                ("prefetch", u32::from(job.prefetch)),
                ("concurrency", job.concurrency),
                ("max_attempts", job.max_attempts),
            ] {
                if value == 0 {
                    fail(
                        &format!("jobs.{name}.{field}"),
                        "expected a positive number, found 0".into(),
                    );
                }
            }
            if let Some(timeout) = job.timeout {
                durations.push((format!("jobs.{name}.timeout"), timeout));
            }
            if job.in_process_wait >= worker_broker::consumer::BROKER_CONSUMER_TIMEOUT {
                fail(
                    &format!("jobs.{name}.in_process_wait"),
                    format!(
                        "expected a wait well under RabbitMQ's consumer timeout ({}), which closes the channel of a delivery held that long; found {}",
                        humantime::format_duration(
                            worker_broker::consumer::BROKER_CONSUMER_TIMEOUT
                        ),
                        humantime::format_duration(job.in_process_wait)
                    ),
                );
            }
            if let Some(retry) = &job.retry {
                if let Err(problem) = retry.validate() {
                    fail(&format!("jobs.{name}.retry"), problem);
                }
                durations.push((format!("jobs.{name}.retry.max_delay"), retry.max_delay));
            }
        }
        let jobs = &self.jobs;
        durations.push((
            "jobs.inbound_email_poller.timeout".into(),
            jobs.inbound_email_poller.timeout,
        ));
        durations.push((
            "jobs.db_health.probe_timeout".into(),
            jobs.db_health.probe_timeout,
        ));
        durations.push(("jobs.retention.timeout".into(), jobs.retention.timeout));
        durations.push(("jobs.reconciler.timeout".into(), jobs.reconciler.timeout));
        durations.push((
            "jobs.reconciler.stuck_after".into(),
            jobs.reconciler.stuck_after,
        ));
        for (key, value) in [
            (
                "jobs.inbound_email_poller.max_message_bytes",
                jobs.inbound_email_poller.max_message_bytes,
            ),
            (
                "jobs.inbound_email_poller.max_body_chars",
                jobs.inbound_email_poller.max_body_chars as u64,
            ),
            (
                "jobs.inbound_email_poller.max_messages_per_account",
                u64::from(jobs.inbound_email_poller.max_messages_per_account),
            ),
            (
                "jobs.inbound_email_poller.max_message_attempts",
                u64::from(jobs.inbound_email_poller.max_message_attempts),
            ),
            (
                "jobs.inbound_email_poller.account_concurrency",
                jobs.inbound_email_poller.account_concurrency as u64,
            ),
            (
                "jobs.db_health.unhealthy_after",
                u64::from(jobs.db_health.unhealthy_after),
            ),
            (
                "jobs.draft_expiry.batch_size",
                u64::from(jobs.draft_expiry.batch_size),
            ),
            (
                "jobs.draft_expiry.max_batches_per_tick",
                u64::from(jobs.draft_expiry.max_batches_per_tick),
            ),
            (
                "jobs.retention.batch_size",
                u64::from(jobs.retention.batch_size),
            ),
            (
                "jobs.retention.max_batches_per_tick",
                u64::from(jobs.retention.max_batches_per_tick),
            ),
            (
                "jobs.reconciler.batch_size",
                u64::from(jobs.reconciler.batch_size),
            ),
            (
                "jobs.reconciler.max_batches_per_tick",
                u64::from(jobs.reconciler.max_batches_per_tick),
            ),
        ] {
            if value == 0 {
                fail(key, "expected a positive number, found 0".into());
            }
        }
        if let Err(problem) = self.check_pool_budget() {
            fail("database.max_connections", problem);
        }
        let mut names = std::collections::HashSet::new();
        for (i, account) in self.imap.accounts.iter().enumerate() {
            if !names.insert(account.name.as_str()) {
                fail(
                    &format!("imap.accounts[{i}].name"),
                    format!(
                        "expected a unique account name, but `{}` is used twice",
                        account.name
                    ),
                );
            }
        }
        for (key, duration) in durations {
            if duration.is_zero() {
                fail(
                    &key,
                    "expected a duration longer than zero (like `30s`), found 0".into(),
                );
            }
        }
        for (i, account) in self.imap.accounts.iter().enumerate() {
            if account.name.trim().is_empty() {
                fail(
                    &format!("imap.accounts[{i}].name"),
                    "expected a short account name, found an empty string".into(),
                );
            }
            if account.port == 0 {
                fail(
                    &format!("imap.accounts[{i}].port"),
                    "expected a port number from 1 to 65535, found 0".into(),
                );
            }
        }
        for (i, file) in self.automations_files.iter().enumerate() {
            if let Err(e) = job_automation_trigger::import::load_file(file) {
                fail(
                    &format!("automations_files[{i}]"),
                    format!("expected a valid automations file: {e}"),
                );
            }
        }
        if let Some(endpoint) = &self.telemetry.otlp_endpoint
            && !(endpoint.starts_with("http://") || endpoint.starts_with("https://"))
        {
            fail(
                "telemetry.otlp_endpoint",
                format!("expected an http:// or https:// URL, found `{endpoint}`"),
            );
        }
        if let Err(e) = tracing_subscriber::EnvFilter::try_new(&self.telemetry.log_level) {
            fail(
                "telemetry.log_level",
                format!("expected a level or tracing filter like `info`: {e}"),
            );
        }
    }

    /// The effective settings as TOML, with every secret redacted.
    pub fn to_redacted_toml(&self) -> String {
        toml::to_string_pretty(self)
            .unwrap_or_else(|e| format!("# the settings could not be printed: {e}\n"))
    }
}

impl Settings {
    /// The broker topology the settings describe: the exchanges and, for each consumer job,
    /// its queue with retry tiers and dead letters.
    pub fn topology(&self) -> Result<worker_broker::Topology, worker_broker::TopologyError> {
        let queues = self
            .consumers()
            .into_iter()
            .map(|(_, job, defaults)| {
                worker_broker::QueueTopology::from_settings(&job.queue, defaults)
            })
            .collect::<Result<Vec<_>, _>>()?;
        worker_broker::Topology::from_settings(&self.broker.topology, queues)
    }
}

impl Settings {
    /// Each consumer job's section name, settings and queue defaults (which follow the
    /// broker's exchange names).
    pub fn consumers(
        &self,
    ) -> [(
        &'static str,
        &ConsumerJobSettings,
        worker_broker::QueueDefaults,
    ); 3] {
        let topology = &self.broker.topology;
        let jobs = &self.jobs;
        [
            (
                "automation_trigger",
                &jobs.automation_trigger,
                worker_broker::QueueDefaults::automation_trigger(topology),
            ),
            (
                "automation_action",
                &jobs.automation_action,
                worker_broker::QueueDefaults::automation_action(topology),
            ),
            (
                "email_send",
                &jobs.email_send,
                worker_broker::QueueDefaults::email_send(topology),
            ),
        ]
    }
}

/// `WORKER_HOST__JOBS__OUTBOX_DRAIN__BATCH_SIZE` → `jobs.outbox_drain.batch_size`.
fn env_key(var: &str) -> Option<String> {
    let rest = var.strip_prefix(ENV_PREFIX)?;
    (!rest.is_empty()).then(|| {
        rest.split("__")
            .map(str::to_ascii_lowercase)
            .collect::<Vec<_>>()
            .join(".")
    })
}

/// The environment variable that overrides a dotted key.
fn env_var_for(key: &str) -> String {
    format!(
        "{ENV_PREFIX}{}",
        key.replace('.', "__").to_ascii_uppercase()
    )
}

fn resolve(
    file: &str,
    section: &str,
    password: &mut Option<Secret>,
    password_file: &Option<PathBuf>,
    required: bool,
    errors: &mut Vec<SettingsError>,
) {
    let key = format!("{section}.password_file");
    match (password.as_ref(), password_file) {
        (Some(_), Some(_)) => errors.push(SettingsError {
            source: Some(file.to_string()),
            key,
            problem: format!(
                "set either `{section}.password` or `{section}.password_file`, not both"
            ),
        }),
        (None, Some(path)) => match Secret::from_file(path) {
            Ok(secret) => *password = Some(secret),
            Err(e) => errors.push(SettingsError {
                source: Some(file.to_string()),
                key,
                problem: format!(
                    "expected a readable file holding the secret, but {} cannot be read: {e}",
                    path.display()
                ),
            }),
        },
        (None, None) if required => {
            let env = env_var_for(&format!("{section}.password"));
            errors.push(SettingsError {
                source: Some(file.to_string()),
                key: format!("{section}.password"),
                problem: format!(
                    "missing secret: expected `{section}.password`, the environment variable {env}, or `{section}.password_file`"
                ),
            })
        }
        _ => {}
    }
}

fn from_figment(error: figment::Error, file: &str, overridden: &[String]) -> Vec<SettingsError> {
    error
        .into_iter()
        .map(|e| {
            let key = e
                .path
                .iter()
                .filter(|p| p.as_str() != "default")
                .cloned()
                .collect::<Vec<_>>()
                .join(".");
            let from_env = overridden
                .iter()
                .any(|o| *o == key || key.starts_with(&format!("{o}.")));
            let source = match e.metadata.as_ref().and_then(|m| m.source.as_ref()) {
                Some(figment::Source::File(path)) => path.display().to_string(),
                _ if from_env => format!("environment variable {}", env_var_for(&key)),
                _ => file.to_string(),
            };
            let source = Some(source);
            let problem = describe_kind(&e.kind, &key);
            SettingsError {
                source,
                key,
                problem,
            }
        })
        .collect()
}

fn describe_kind(kind: &figment::error::Kind, key: &str) -> String {
    use figment::error::Kind;
    match kind {
        Kind::UnknownField(field, expected) => {
            let full = if key.is_empty() {
                field.clone()
            } else {
                format!("{key}.{field}")
            };
            format!(
                "unknown key `{full}`; expected one of: {}",
                expected.join(", ")
            )
        }
        Kind::MissingField(field) => format!("missing key `{field}`"),
        Kind::InvalidType(actual, expected) => format!("expected {expected}, found {actual}"),
        Kind::InvalidValue(actual, expected) => format!("expected {expected}, found {actual}"),
        Kind::InvalidLength(len, expected) => format!("expected {expected}, found {len} elements"),
        Kind::UnknownVariant(found, expected) => {
            format!("expected one of {}, found `{found}`", expected.join(", "))
        }
        Kind::Message(message) => message.clone(),
        other => other.to_string(),
    }
}

/// The settings path from `--config` (or `WORKER_HOST_CONFIG`, which clap folds into the
/// flag), else the default.
pub fn source_from(flag: Option<&Path>) -> SettingsSource {
    match flag {
        Some(path) => SettingsSource {
            path: path.to_path_buf(),
            explicit: true,
        },
        None => SettingsSource {
            path: PathBuf::from(DEFAULT_PATH),
            explicit: false,
        },
    }
}

mod budget;

#[cfg(test)]
mod tests;
