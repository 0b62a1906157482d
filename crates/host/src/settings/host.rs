//! The host's own sections: the connections it opens for every job (database, broker, SMTP,
//! IMAP accounts), telemetry, alerts, and what the workers share
//! (shutdown, the default retry, dedup and attempt-log retention).

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use worker_broker::{AddressError, BrokerAddress};
use worker_core::RetryPolicy;

use super::SettingsError;
use crate::secret::Secret;

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct DatabaseSettings {
    /// The one server's host, when `hosts` is unset.
    pub host: String,
    /// The one server's port, when `hosts` is unset.
    pub port: u16,
    /// The members of a database with standbys, `host:port` each, tried in order: the host
    /// connects to the first that takes writes (as libpq's `target_session_attrs=read-write`)
    /// and follows the primary when a standby is promoted (`worker_store::primary`). Set, it
    /// replaces `host` and `port`, which are then not used.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hosts: Option<Vec<String>>,
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
            hosts: None,
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

impl DatabaseSettings {
    /// Each member of `hosts` with the key that sets it (`database.hosts[i]`), or why it is
    /// not `host:port`; empty when `hosts` is unset (the one server of `host` and `port`).
    pub fn member_entries(
        &self,
    ) -> Vec<(
        String,
        Result<worker_store::Member, worker_store::primary::MemberError>,
    )> {
        self.hosts
            .iter()
            .flatten()
            .enumerate()
            .map(|(i, text)| (format!("database.hosts[{i}]"), text.parse()))
            .collect()
    }

    /// The members the pool follows the primary among, in order (empty without `hosts`);
    /// the first entry that is not `host:port` (settings validation refuses those before
    /// anything starts) as a settings error.
    pub fn members(&self) -> Result<Vec<worker_store::Member>, SettingsError> {
        self.member_entries()
            .into_iter()
            .map(|(key, entry)| {
                entry.map_err(|e| SettingsError {
                    source: None,
                    key,
                    problem: e.to_string(),
                })
            })
            .collect()
    }

    /// Every host the host may reach the database at: each member's, else `host`.
    pub fn server_hosts(&self) -> Vec<String> {
        match &self.hosts {
            Some(_) => self
                .member_entries()
                .into_iter()
                .filter_map(|(_, entry)| entry.ok().map(|member| member.host))
                .collect(),
            None => vec![self.host.clone()],
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
    /// The one broker's host, when `addresses` is unset.
    pub host: String,
    /// The one broker's port, when `addresses` is unset.
    pub port: u16,
    /// The nodes of a RabbitMQ cluster, `host:port` each, tried in turn: the host connects to
    /// the first that answers, and when the node it is on fails or goes away, the next
    /// reconnect starts at the one after it. Set, it replaces `host` and `port`, which are
    /// then not used.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub addresses: Option<Vec<String>>,
    pub vhost: String,
    pub username: String,
    pub password: Option<Secret>,
    pub password_file: Option<PathBuf>,
    #[serde(with = "humantime_serde")]
    pub heartbeat: Duration,
    /// The largest AMQP frame asked for, in bytes (at least 4096). The client keeps 32 frames
    /// of buffer each way per connection: 16 KiB costs 1 MiB, the broker's default 128 KiB 8.
    pub frame_max: u32,
    /// `amqps` instead of `amqp`; the certificate is always checked, and must name the host
    /// it is reached by (`host`, or each entry's host in `addresses`).
    pub tls: bool,
    /// The CA certificates (PEM) trusted for `amqps`; unset: the public web PKI's roots.
    pub ca_file: Option<PathBuf>,
    /// Lets the password go to a host that is not loopback without `tls`; refused otherwise
    /// (for each of `addresses`).
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
            addresses: None,
            // The host's own user on its own vhost (`scripts/services.sh` creates both), not
            // guest: guest is an administrator of every vhost.
            vhost: "worker_host".into(),
            username: "worker_host".into(),
            password: None,
            password_file: None,
            heartbeat: Duration::from_secs(10),
            frame_max: worker_broker::DEFAULT_FRAME_MAX,
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

impl BrokerSettings {
    /// Each address the host connects to, in order, with the key that sets it: the entries
    /// of `addresses` (`broker.addresses[i]`) when set, else `host:port` (`broker.host`).
    /// An entry that is not `host:port` comes back as why.
    pub fn address_entries(&self) -> Vec<(String, Result<BrokerAddress, AddressError>)> {
        match &self.addresses {
            Some(list) => list
                .iter()
                .enumerate()
                .map(|(i, text)| (format!("broker.addresses[{i}]"), text.parse()))
                .collect(),
            None => vec![(
                "broker.host".into(),
                Ok(BrokerAddress::new(self.host.clone(), self.port)),
            )],
        }
    }

    /// The addresses the host connects to, in order; the first entry that is not one
    /// (settings validation refuses those before anything starts) as a settings error.
    pub fn broker_addresses(&self) -> Result<Vec<BrokerAddress>, SettingsError> {
        self.address_entries()
            .into_iter()
            .map(|(key, entry)| {
                entry.map_err(|e| SettingsError {
                    source: None,
                    key,
                    problem: e.to_string(),
                })
            })
            .collect()
    }
}

/// `[smtp]`: the sender's own section, which it runs as the settings give it.
pub use job_email_send::SmtpSettings;

#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct ImapSettings {
    pub accounts: Vec<ImapAccount>,
}

/// `[[imap.accounts]]`: each account is the poller's own [`ImapAccount`], which the poller
/// runs as the settings give it.
pub use job_inbound_email_poller::ImapAccount;

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
pub struct WorkersSettings {
    /// How long a graceful shutdown may take before work in flight is abandoned.
    #[serde(with = "humantime_serde")]
    pub shutdown_grace: Duration,
    /// How long each consumer, once shutdown starts, keeps settling the deliveries it already
    /// holds before it returns the rest to the queue; more than a second shorter than
    /// `shutdown_grace`, which must leave time to cancel, return and close. Unset: two thirds
    /// of `shutdown_grace`.
    #[serde(with = "humantime_serde", skip_serializing_if = "Option::is_none")]
    pub settle_deadline: Option<Duration>,
    /// How long a replica that vanished without closing its connections (its machine lost,
    /// the network cut) keeps the leases it held: the server ends a lease's session that has
    /// gone unanswered this long, and another replica takes the lease at its next tick. More
    /// than the 5 s in which a holder gives up a silent session itself.
    #[serde(with = "humantime_serde")]
    pub lease_timeout: Duration,
    /// The in-process retry policy of every consumer whose section does not set its own.
    pub retry: RetryPolicy,
    /// The attempt log: a row per failed try and per final outcome.
    pub attempt_log: worker_store::AttemptLogSettings,
    /// How often each replica reads the paused jobs, besides the notice every pause and
    /// resume sends at once: the bound on how long a replica that missed the notice (its
    /// listening connection down) keeps consuming a paused job's queue, or keeps a resumed
    /// one stopped.
    #[serde(with = "humantime_serde")]
    pub pause_poll: Duration,
}

impl WorkersSettings {
    /// The consumers' settle deadline: as set, else two thirds of the shutdown grace, which
    /// leaves the rest of the grace to cancel, return what is left and close.
    pub fn settle_deadline(&self) -> Duration {
        self.settle_deadline
            .unwrap_or(self.shutdown_grace.mul_f64(2.0 / 3.0))
    }
}

impl Default for WorkersSettings {
    fn default() -> Self {
        Self {
            shutdown_grace: Duration::from_secs(30),
            settle_deadline: None,
            lease_timeout: Duration::from_secs(15),
            retry: RetryPolicy::default(),
            attempt_log: worker_store::AttemptLogSettings::default(),
            pause_poll: Duration::from_secs(5),
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
    /// The oldest dead letter waiting for an operator for longer than this.
    #[serde(with = "humantime_serde")]
    pub dead_letter_oldest_age: Duration,
    /// Outbox rows waiting to be published above this.
    pub outbox_pending: u64,
    /// The oldest pending outbox row older than this.
    #[serde(with = "humantime_serde")]
    pub outbox_oldest_pending: Duration,
    /// Outbox rows that gave up, waiting for an operator, above this.
    pub outbox_failed: u64,
    /// Failed database probes in a row above this.
    pub db_probe_failures: u32,
    /// Stuck executions or emails (of either kind) above this.
    pub stuck_work: u64,
    /// A replica that has not reported for this long, and never said it stopped, is silent;
    /// any silent replica is an alert.
    #[serde(with = "humantime_serde")]
    pub replica_silent_after: Duration,
    /// Replies the reply limit held back in the last 10 minutes, over every automation,
    /// above this: "we stopped answering someone" before anyone asks.
    pub reply_limit_skips: u64,
    /// A job paused for longer than this (a pause forgotten) is an alert, per job.
    #[serde(with = "humantime_serde")]
    pub pause_age: Duration,
}

impl Default for AlertSettings {
    fn default() -> Self {
        Self {
            interval: Duration::from_secs(15),
            dead_letter_depth: 100,
            dead_letter_inflow_per_minute: 50,
            dead_letter_oldest_age: Duration::from_secs(24 * 3600),
            outbox_pending: 1000,
            outbox_oldest_pending: Duration::from_secs(300),
            outbox_failed: 0,
            db_probe_failures: 3,
            stuck_work: 0,
            replica_silent_after: Duration::from_secs(60),
            reply_limit_skips: 20,
            pause_age: Duration::from_secs(4 * 3600),
        }
    }
}
