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
use job_inbound_email_poller::MailLimits;
use serde::{Deserialize, Serialize};
use worker_core::RetryPolicy;

use crate::secret::Secret;

pub use crate::schedule::Schedule;
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
    pub auto_replies: AutoReplySettings,
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
            auto_replies: AutoReplySettings::default(),
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
    /// How the connection is protected, as libpq's `sslmode`: `disable`, `prefer` (TLS when
    /// the server offers it, the certificate not checked), `require` (TLS, not checked),
    /// `verify-ca` (TLS, the certificate signed by a trusted CA) or `verify-full` (and naming
    /// `host`).
    pub ssl_mode: SslMode,
    /// The CA certificates (PEM) that `verify-ca` and `verify-full` trust; unset: the
    /// public web PKI's roots.
    pub ssl_root_cert: Option<PathBuf>,
    /// Lets the password go to a host that is not loopback with `ssl_mode` `disable` or
    /// `prefer` (which falls back to plain text); refused otherwise.
    pub allow_plaintext: bool,
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
            ssl_mode: SslMode::Prefer,
            ssl_root_cert: None,
            allow_plaintext: false,
        }
    }
}

/// `database.ssl_mode`: libpq's `sslmode` values, without `allow`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum SslMode {
    Disable,
    Prefer,
    Require,
    VerifyCa,
    VerifyFull,
}

impl SslMode {
    /// Whether the password may cross the network in plain text in this mode.
    pub fn may_be_plaintext(self) -> bool {
        matches!(self, Self::Disable | Self::Prefer)
    }

    /// Whether the server's certificate is checked against a CA in this mode.
    pub fn verifies(self) -> bool {
        matches!(self, Self::VerifyCa | Self::VerifyFull)
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
    /// `amqps` instead of `amqp`; the certificate is always checked, and must name `host`.
    pub tls: bool,
    /// The CA certificates (PEM) trusted for `amqps`; unset: the public web PKI's roots.
    pub ca_file: Option<PathBuf>,
    /// Lets the password go to a host that is not loopback without `tls`; refused otherwise.
    pub allow_plaintext: bool,
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
            // The host's own user on its own vhost (`scripts/services.sh` creates both), not
            // guest: guest is an administrator of every vhost.
            vhost: "worker_host".into(),
            username: "worker_host".into(),
            password: None,
            password_file: None,
            heartbeat: Duration::from_secs(10),
            tls: false,
            ca_file: None,
            allow_plaintext: false,
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

impl Security {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Plain => "plain",
            Self::Starttls => "starttls",
            Self::Tls => "tls",
        }
    }
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
    /// The CA certificates (PEM) trusted for `starttls` and `tls` (a private CA); unset: the
    /// public web PKI's roots. The certificate must name `host`.
    pub ca_file: Option<PathBuf>,
    /// Lets the login go to a host that is not loopback with `security = "plain"`; refused
    /// otherwise.
    pub allow_plaintext: bool,
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
            ca_file: None,
            allow_plaintext: false,
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
    /// Announce the mail already in the mailbox at the account's first poll. Off (the
    /// default), the first poll starts after the mail that arrived before the host first
    /// watched the account, so that a new installation does not answer years of mail.
    #[serde(default)]
    pub backfill: bool,
    /// The CA certificates (PEM) trusted for `starttls` and `tls` (a private CA); unset: the
    /// public web PKI's roots. The certificate must name `host`.
    #[serde(default)]
    pub ca_file: Option<PathBuf>,
    /// Lets the login go to a host that is not loopback with `security = "plain"`; refused
    /// otherwise.
    #[serde(default)]
    pub allow_plaintext: bool,
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
    /// Mail past any of these four is recorded as skipped without being parsed (a cheap
    /// pre-scan, before the parser): MIME parts at all levels together,
    pub max_mime_parts: usize,
    /// multiparts and attached messages inside one another,
    pub max_mime_depth: usize,
    /// header fields in all header sections together,
    pub max_header_fields: usize,
    /// and bytes of one header section.
    pub max_header_bytes: usize,
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
            max_mime_parts: MailLimits::default().max_parts,
            max_mime_depth: MailLimits::default().max_depth,
            max_header_fields: MailLimits::default().max_header_fields,
            max_header_bytes: MailLimits::default().max_header_bytes,
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

/// `[auto_replies]`: the reply limit of `send_email` actions. One automation sends one address
/// at most `per_recipient` mails within `window`; past it the address is left out of the
/// mail (the execution is `skipped` when no `to` is left), so that a sender who forges
/// someone else's address cannot turn an automation into a mail cannon.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct AutoReplySettings {
    pub per_recipient: u32,
    #[serde(with = "humantime_serde")]
    pub window: Duration,
}

impl Default for AutoReplySettings {
    fn default() -> Self {
        Self {
            per_recipient: job_automation_action::DEFAULT_REPLY_LIMIT,
            window: job_automation_action::DEFAULT_REPLY_WINDOW,
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
            if let Err(error) = check_toml_syntax(&source.path, &path_text) {
                return Err(vec![error]);
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
                // A secret is text as given: parsed, `007` would become the number 7.
                let value: figment::value::Value = if is_secret_key(&key) {
                    value.clone().into()
                } else {
                    value.parse().unwrap_or_else(|_| value.clone().into())
                };
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
            (
                "auto_replies.per_recipient",
                self.auto_replies.per_recipient,
            ),
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
        durations.push(("auto_replies.window".into(), self.auto_replies.window));
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
                "jobs.inbound_email_poller.max_mime_parts",
                jobs.inbound_email_poller.max_mime_parts as u64,
            ),
            (
                "jobs.inbound_email_poller.max_mime_depth",
                jobs.inbound_email_poller.max_mime_depth as u64,
            ),
            (
                "jobs.inbound_email_poller.max_header_fields",
                jobs.inbound_email_poller.max_header_fields as u64,
            ),
            (
                "jobs.inbound_email_poller.max_header_bytes",
                jobs.inbound_email_poller.max_header_bytes as u64,
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
        self.validate_transport(&mut fail);
    }

    /// TLS and credentials: no password in plain text to a host that is not loopback unless
    /// the section says `allow_plaintext = true`; a CA file that is readable PEM and is used.
    fn validate_transport(&self, fail: &mut impl FnMut(&str, String)) {
        let plain = |what: &str, host: &str, fix: &str, key: &str| {
            format!(
                "{what} would cross the network to {host} in plain text: {fix}, or set `{key}.allow_plaintext = true` if the network is trusted"
            )
        };
        let db = &self.database;
        if db.ssl_mode.may_be_plaintext() && !db.allow_plaintext && !is_loopback(&db.host) {
            fail(
                "database.ssl_mode",
                plain(
                    "the database password",
                    &db.host,
                    "set `ssl_mode = \"verify-full\"` (with `ssl_root_cert` for a private CA)",
                    "database",
                ),
            );
        }
        if let Some(path) = &db.ssl_root_cert {
            check_ca_file(
                fail,
                "database.ssl_root_cert",
                path,
                db.ssl_mode.verifies(),
                "`ssl_mode` is `verify-ca` or `verify-full`",
            );
        }
        let broker = &self.broker;
        if !broker.tls && !broker.allow_plaintext && !is_loopback(&broker.host) {
            fail(
                "broker.tls",
                plain(
                    "the broker password",
                    &broker.host,
                    "set `tls = true` (with `ca_file` for a private CA)",
                    "broker",
                ),
            );
        }
        if let Some(path) = &broker.ca_file {
            check_ca_file(fail, "broker.ca_file", path, broker.tls, "`tls = true`");
        }
        let smtp = &self.smtp;
        if smtp.security == Security::Plain
            && smtp.username.is_some()
            && !smtp.allow_plaintext
            && !is_loopback(&smtp.host)
        {
            fail(
                "smtp.security",
                plain(
                    "the SMTP login",
                    &smtp.host,
                    "set `security = \"starttls\"` or `\"tls\"` (with `ca_file` for a private CA)",
                    "smtp",
                ),
            );
        }
        if let Some(path) = &smtp.ca_file {
            check_ca_file(
                fail,
                "smtp.ca_file",
                path,
                smtp.security != Security::Plain,
                "`security` is `starttls` or `tls`",
            );
        }
        for (i, account) in self.imap.accounts.iter().enumerate() {
            let section = format!("imap.accounts[{i}]");
            if account.security == Security::Plain
                && !account.allow_plaintext
                && !is_loopback(&account.host)
            {
                fail(
                    &format!("{section}.security"),
                    plain(
                        "the IMAP login",
                        &account.host,
                        "set `security = \"tls\"` or `\"starttls\"` (with `ca_file` for a private CA)",
                        &section,
                    ),
                );
            }
            if let Some(path) = &account.ca_file {
                check_ca_file(
                    fail,
                    &format!("{section}.ca_file"),
                    path,
                    account.security != Security::Plain,
                    "`security` is `starttls` or `tls`",
                );
            }
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

/// Whether `host` is this machine: `localhost`, a loopback address, or (for PostgreSQL) a
/// Unix socket folder. A name that merely resolves to loopback does not count.
fn is_loopback(host: &str) -> bool {
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    bare.eq_ignore_ascii_case("localhost")
        || bare.starts_with('/')
        || bare
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// A CA file must be readable PEM holding at least one certificate, and be used (`used`, else
/// the installation believes a certificate is checked that is not).
fn check_ca_file(
    fail: &mut impl FnMut(&str, String),
    key: &str,
    path: &Path,
    used: bool,
    when: &str,
) {
    if !used {
        fail(
            key,
            format!("the CA file is only used when {when}; without it no certificate is checked"),
        );
        return;
    }
    match std::fs::read(path) {
        Err(e) => fail(
            key,
            format!(
                "expected a readable PEM file of CA certificates, but {} cannot be read: {e}",
                path.display()
            ),
        ),
        Ok(bytes) if !String::from_utf8_lossy(&bytes).contains("-----BEGIN CERTIFICATE-----") => {
            fail(
                key,
                format!(
                    "expected PEM CA certificates (`-----BEGIN CERTIFICATE-----`), but {} holds none",
                    path.display()
                ),
            )
        }
        Ok(_) => {}
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
            let problem = if is_secret_key(&key) {
                describe_secret_kind(&e.kind)
            } else {
                describe_kind(&e.kind, &key)
            };
            SettingsError {
                source,
                key,
                problem,
            }
        })
        .collect()
}

/// True for a key that holds a secret (`database.password`, `imap.accounts.0.password`):
/// its value is never parsed as anything but text and never quoted in an error.
fn is_secret_key(key: &str) -> bool {
    key.rsplit('.').next() == Some("password")
}

/// What is wrong with a secret's value, by its shape only: never the value itself.
fn describe_secret_kind(kind: &figment::error::Kind) -> String {
    use figment::error::{Actual, Kind};
    let shape = |actual: &Actual| match actual {
        Actual::Seq => "a list",
        Actual::Map | Actual::StructVariant => "a table",
        _ => "a value of another kind",
    };
    match kind {
        Kind::InvalidType(actual, _) | Kind::InvalidValue(actual, _) => format!(
            "expected the secret as text (a string), found {}; its value is not shown",
            shape(actual)
        ),
        _ => "expected the secret as text (a string); its value is not shown".into(),
    }
}

/// Parses the file as TOML before figment does, to report a syntax error by file, line and
/// key. The parser's own report quotes the offending line, which may hold a password: only
/// its message (what was expected) is kept, never the line's text.
fn check_toml_syntax(path: &Path, path_text: &str) -> Result<(), SettingsError> {
    let text = std::fs::read_to_string(path).map_err(|e| SettingsError {
        source: Some(path_text.to_string()),
        key: String::new(),
        problem: format!("cannot be read: {e}"),
    })?;
    let Err(error) = toml::from_str::<toml::Table>(&text) else {
        return Ok(());
    };
    let offset = error.span().map_or(text.len(), |span| span.start);
    let before = text.get(..offset).unwrap_or(&text);
    let line = before.matches('\n').count() + 1;
    let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    let key = key_at_line(&text, line);
    let message = error.message().trim().replace('\n', "; ");
    Err(SettingsError {
        source: Some(path_text.to_string()),
        key,
        problem: format!("not valid TOML at line {line}, column {column}: {message}"),
    })
}

/// The dotted key a TOML line sets (`imap.accounts[1].password`), from the table headers
/// above it and the key at the start of the line; empty when the line sets none (a header).
fn key_at_line(text: &str, line: usize) -> String {
    let mut table = String::new();
    let mut arrays: std::collections::HashMap<String, usize> = std::collections::HashMap::new();
    let mut key = String::new();
    for (index, current) in text.lines().take(line).enumerate() {
        let current = current.trim();
        let is_last = index + 1 == line;
        if let Some(name) = current
            .strip_prefix("[[")
            .and_then(|r| r.split("]]").next())
        {
            let name = name.trim().to_string();
            let n = arrays.entry(name.clone()).or_insert(0);
            table = format!("{name}[{n}]");
            *n += 1;
        } else if let Some(name) = current.strip_prefix('[').and_then(|r| r.split(']').next()) {
            table = name.trim().to_string();
        } else if is_last && let Some((name, _)) = current.split_once('=') {
            let name = name.trim().trim_matches(|c| c == '"' || c == '\'');
            key = if table.is_empty() {
                name.to_string()
            } else {
                format!("{table}.{name}")
            };
        }
        if is_last && key.is_empty() {
            key = table.clone();
        }
    }
    key
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
