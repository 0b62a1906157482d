//! Reaching PostgreSQL and RabbitMQ at start, with bounded retries, and the readiness checks
//! that watch them afterwards.

use std::time::Duration;

use futures::FutureExt;
use futures::future::BoxFuture;
use sqlx::postgres::{PgConnectOptions, PgSslMode};

use worker_broker::Rotation;

use crate::readiness::ReadinessCheck;
use crate::settings::validate::is_loopback;
use crate::settings::{DatabaseSettings, Settings, SettingsError, SslMode};

/// The pool options the settings describe.
pub fn pool_options(settings: &DatabaseSettings) -> worker_store::PoolOptions {
    pool_options_with(settings, None)
}

/// [`pool_options`], with every session's TCP keepalives set for `lease_timeout`
/// ([`worker_store::KeepAlive`]): the pool the host runs its jobs and leases on.
pub fn run_pool_options(settings: &Settings) -> worker_store::PoolOptions {
    pool_options_with(&settings.database, Some(settings.workers.lease_timeout))
}

fn pool_options_with(
    settings: &DatabaseSettings,
    lease_timeout: Option<Duration>,
) -> worker_store::PoolOptions {
    let mut connect = PgConnectOptions::new()
        .host(&settings.host)
        .port(settings.port)
        .database(&settings.name)
        .username(&settings.username)
        .application_name("worker-host")
        .ssl_mode(match settings.ssl_mode {
            SslMode::Disable => PgSslMode::Disable,
            // Encryption over loopback protects nothing: the traffic never leaves the kernel,
            // and `prefer` checks no certificate. It cost a quarter of PostgreSQL's CPU per
            // mail, and a quarter of the host's (docs/SCALING.md). `require` still encrypts.
            SslMode::Prefer if settings.server_hosts().iter().all(|h| is_loopback(h)) => {
                PgSslMode::Disable
            }
            SslMode::Prefer => PgSslMode::Prefer,
            SslMode::Require => PgSslMode::Require,
            SslMode::VerifyCa => PgSslMode::VerifyCa,
            SslMode::VerifyFull => PgSslMode::VerifyFull,
        });
    if let Some(root) = &settings.ssl_root_cert {
        connect = connect.ssl_root_cert(root);
    }
    if let Some(password) = &settings.password {
        connect = connect.password(password.expose());
    }
    if let Some(takeover) = lease_timeout {
        connect = worker_store::KeepAlive::for_takeover(takeover).connect_options(connect);
    }
    worker_store::PoolOptions {
        connect,
        // Validation refused a malformed entry before anything connects.
        members: settings.members().unwrap_or_default(),
        max_connections: settings.max_connections,
        min_connections: 1,
        acquire_timeout: settings.acquire_timeout,
        connect_attempts: settings.connect_attempts,
        connect_backoff: Duration::from_millis(500),
        ping_if_idle_for: worker_store::PING_IF_IDLE_FOR,
    }
}

/// The broker connection the settings describe, for the supervisor and for tools. Fails only
/// on an address that is not `host:port`, which settings validation refuses first.
pub fn broker_connection(
    settings: &Settings,
) -> Result<worker_broker::ConnectionSettings, SettingsError> {
    let broker = &settings.broker;
    Ok(worker_broker::ConnectionSettings {
        addresses: broker.broker_addresses()?,
        vhost: broker.vhost.clone(),
        username: broker.username.clone(),
        password: broker
            .password
            .as_ref()
            .map(|p| p.expose().to_string())
            .unwrap_or_default(),
        tls: broker.tls,
        ca_file: broker.ca_file.clone(),
        heartbeat: broker.heartbeat,
        frame_max: broker.frame_max,
        connect_timeout: broker.connect_timeout,
        connection_name: format!(
            "worker-host {} {} (pid {})",
            settings.installation,
            settings.replica_name(),
            std::process::id()
        ),
        reconnect_min: broker.reconnect_min,
        reconnect_max: broker.reconnect_max,
        // Consumers get the shutdown grace to settle; the connection must outlive them.
        close_wait: settings.workers.shutdown_grace + Duration::from_secs(5),
    })
}

#[derive(Debug, thiserror::Error)]
#[error("RabbitMQ at {server} stayed unreachable after {attempts} attempts: {cause}")]
pub struct BrokerUnreachable {
    pub server: String,
    pub attempts: u32,
    pub cause: String,
}

/// Opens one AMQP connection, retrying a bounded number of times with backoff: the start-up
/// check that the broker is there at all, before the supervisor takes over. Each attempt
/// tries every address once, in turn, from the first.
pub async fn connect_broker(
    connection: &worker_broker::ConnectionSettings,
    attempts: u32,
) -> Result<worker_broker::Session, BrokerUnreachable> {
    let mut rotation = Rotation::new(connection.addresses.len());
    connect_broker_from(connection, attempts, &mut rotation)
        .await
        .map(|(session, _)| session)
}

/// [`connect_broker`] from the rotation's cursor on; returns the session and the index of
/// the address it is connected to, and leaves the rotation past every address that failed.
pub async fn connect_broker_from(
    connection: &worker_broker::ConnectionSettings,
    attempts: u32,
    rotation: &mut Rotation,
) -> Result<(worker_broker::Session, usize), BrokerUnreachable> {
    let attempts = attempts.max(1);
    let mut backoff =
        worker_core::Backoff::doubling(Duration::from_millis(500), Duration::from_secs(10));
    // Why each address failed in the last pass (each names its server).
    let mut causes = vec![String::from("no broker address to connect to")];
    for attempt in 1..=attempts {
        causes.clear();
        for index in rotation.pass() {
            let Some(address) = connection.addresses.get(index) else {
                continue;
            };
            let cause = match connection.connect_to(address).await {
                Ok(connected) => return Ok((worker_broker::Session::new(connected), index)),
                Err(e) => worker_core::error_chain(&e),
            };
            tracing::warn!(server = %connection.server_at(address), attempt, attempts, error = %cause, "RabbitMQ not reachable yet");
            causes.push(cause);
            rotation.leave(index);
        }
        if attempt < attempts {
            tokio::time::sleep(backoff.next_wait()).await;
        }
    }
    Err(BrokerUnreachable {
        server: connection.server(),
        attempts,
        cause: causes.join("; "),
    })
}

/// Ready while the health monitor's last probe succeeded, and is recent; with
/// `database.hosts`, also while a member takes writes ("no primary" otherwise, with each
/// member's answer).
#[derive(Debug)]
pub struct DatabaseCheck {
    pub health: job_db_health::HealthHandle,
    /// A monitor that stopped probing is not trusted past this.
    pub stale_after: Duration,
    /// The pool's follower of the primary, with `database.hosts`.
    pub primary: Option<worker_store::PrimaryWatch>,
}

impl ReadinessCheck for DatabaseCheck {
    fn name(&self) -> &'static str {
        "database"
    }

    fn check(&self) -> BoxFuture<'_, Result<(), String>> {
        let primary = self.primary.as_ref().map_or(Ok(()), |p| p.readiness());
        let result = primary.and_then(|()| self.health.readiness(Some(self.stale_after)));
        futures::future::ready(result).boxed()
    }
}

/// Ready while the supervisor holds an open AMQP connection.
#[derive(Debug)]
pub struct BrokerCheck(pub tokio::sync::watch::Receiver<worker_broker::BrokerStatus>);

impl ReadinessCheck for BrokerCheck {
    fn name(&self) -> &'static str {
        "broker"
    }

    fn check(&self) -> BoxFuture<'_, Result<(), String>> {
        let status = self.0.borrow().clone();
        let result = if status.is_ready() {
            Ok(())
        } else {
            let why = status
                .last_error
                .map(|e| format!(": {e}"))
                .unwrap_or_default();
            Err(format!("the broker link is {}{why}", status.state.as_str()))
        };
        futures::future::ready(result).boxed()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mode(host: &str, ssl_mode: SslMode) -> PgSslMode {
        let settings = DatabaseSettings {
            host: host.into(),
            ssl_mode,
            ..DatabaseSettings::default()
        };
        pool_options(&settings).connect.get_ssl_mode()
    }

    #[test]
    fn prefer_talks_plain_to_a_database_on_this_machine_only() {
        for host in ["127.0.0.1", "localhost", "::1", "/var/run/postgresql"] {
            assert!(
                matches!(mode(host, SslMode::Prefer), PgSslMode::Disable),
                "{host}"
            );
        }
        assert!(matches!(
            mode("db.example.com", SslMode::Prefer),
            PgSslMode::Prefer
        ));
        assert!(matches!(
            mode("10.0.0.5", SslMode::Prefer),
            PgSslMode::Prefer
        ));
    }

    #[test]
    fn require_and_stricter_encrypt_on_this_machine_too() {
        assert!(matches!(
            mode("127.0.0.1", SslMode::Require),
            PgSslMode::Require
        ));
        assert!(matches!(
            mode("127.0.0.1", SslMode::VerifyFull),
            PgSslMode::VerifyFull
        ));
    }
}
