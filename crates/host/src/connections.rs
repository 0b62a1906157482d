//! Reaching PostgreSQL and RabbitMQ at start, with bounded retries, and the readiness checks
//! that watch them afterwards.

use std::time::Duration;

use futures::FutureExt;
use futures::future::BoxFuture;
use lapin::uri::{AMQPAuthority, AMQPQueryString, AMQPScheme, AMQPUri, AMQPUserInfo};
use sqlx::PgPool;
use sqlx::postgres::PgConnectOptions;

use crate::admin::ReadinessCheck;
use crate::settings::{BrokerSettings, DatabaseSettings};

/// The pool options the settings describe.
pub fn pool_options(settings: &DatabaseSettings) -> worker_store::PoolOptions {
    let mut connect = PgConnectOptions::new()
        .host(&settings.host)
        .port(settings.port)
        .database(&settings.name)
        .username(&settings.username)
        .application_name("worker-host");
    if let Some(password) = &settings.password {
        connect = connect.password(password.expose());
    }
    worker_store::PoolOptions {
        connect,
        max_connections: settings.max_connections,
        min_connections: 1,
        acquire_timeout: settings.acquire_timeout,
        connect_attempts: settings.connect_attempts,
        connect_backoff: Duration::from_millis(500),
    }
}

/// The AMQP address the settings describe, credentials included: never log it.
pub fn amqp_uri(settings: &BrokerSettings) -> AMQPUri {
    AMQPUri {
        scheme: AMQPScheme::AMQP,
        authority: AMQPAuthority {
            userinfo: AMQPUserInfo {
                username: settings.username.clone(),
                password: settings
                    .password
                    .as_ref()
                    .map(|p| p.expose().to_string())
                    .unwrap_or_default(),
            },
            host: settings.host.clone(),
            port: settings.port,
        },
        vhost: settings.vhost.clone(),
        query: AMQPQueryString {
            heartbeat: u16::try_from(settings.heartbeat.as_secs()).ok(),
            connection_timeout: u64::try_from(settings.connect_timeout.as_millis()).ok(),
            ..AMQPQueryString::default()
        },
    }
}

/// Where the broker is, for messages: no credentials.
pub fn broker_address(settings: &BrokerSettings) -> String {
    format!(
        "{}:{} vhost {}",
        settings.host, settings.port, settings.vhost
    )
}

#[derive(Debug, thiserror::Error)]
#[error("RabbitMQ at {server} stayed unreachable after {attempts} attempts: {cause}")]
pub struct BrokerUnreachable {
    pub server: String,
    pub attempts: u32,
    pub cause: String,
}

/// Opens one AMQP connection, retrying a bounded number of times with backoff.
pub async fn connect_broker(
    settings: &BrokerSettings,
) -> Result<lapin::Connection, BrokerUnreachable> {
    let server = broker_address(settings);
    let attempts = settings.connect_attempts.max(1);
    let mut delay = Duration::from_millis(500);
    let mut cause = String::new();
    for attempt in 1..=attempts {
        let properties = lapin::ConnectionProperties::default()
            .with_connection_name(format!("worker-host {}", std::process::id()).into());
        let connecting = lapin::Connection::connect_uri(amqp_uri(settings), properties);
        match tokio::time::timeout(settings.connect_timeout, connecting).await {
            Ok(Ok(connection)) => return Ok(connection),
            Ok(Err(e)) => cause = worker_core::error_chain(&e),
            Err(_) => cause = format!("no answer within {:?}", settings.connect_timeout),
        }
        tracing::warn!(%server, attempt, attempts, error = %cause, "RabbitMQ not reachable yet");
        if attempt < attempts {
            tokio::time::sleep(delay).await;
            delay = (delay * 2).min(Duration::from_secs(10));
        }
    }
    Err(BrokerUnreachable {
        server,
        attempts,
        cause,
    })
}

/// Ready while a trivial query answers.
#[derive(Debug)]
pub struct DatabaseCheck(pub PgPool);

impl ReadinessCheck for DatabaseCheck {
    fn name(&self) -> &'static str {
        "database"
    }

    fn check(&self) -> BoxFuture<'_, Result<(), String>> {
        async move {
            sqlx::query("SELECT 1")
                .execute(&self.0)
                .await
                .map(|_| ())
                .map_err(|e| worker_core::error_chain(&e))
        }
        .boxed()
    }
}

/// Ready while the AMQP connection is open.
#[derive(Debug)]
pub struct BrokerCheck(pub std::sync::Arc<lapin::Connection>);

impl ReadinessCheck for BrokerCheck {
    fn name(&self) -> &'static str {
        "broker"
    }

    fn check(&self) -> BoxFuture<'_, Result<(), String>> {
        let status = self.0.status();
        let result = if status.connected() {
            Ok(())
        } else {
            Err("the AMQP connection is not open".to_string())
        };
        futures::future::ready(result).boxed()
    }
}
