use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{ConnectOptions, Connection, PgPool};
use worker_core::Backoff;

/// A statement that runs longer than this is logged as a warning (sqlx's slow-statement log,
/// set on every connection [`connect`] opens). The lease's deliberate waits stay below it
/// ([`crate::lease::MAX_CHECK_INTERVAL`]), so that a warning always means a slow statement.
pub const SLOW_STATEMENT: Duration = Duration::from_secs(1);

/// A pooled connection idle at least this long is pinged before it is handed out; one used
/// more recently is handed out as it is. sqlx's default pings on every acquire, a round trip
/// of its own per unit of work, though a connection used a moment ago is as good as its last
/// answer. After a quiet spell (when a restarted or failed-over server may have dropped it),
/// the ping still finds a dead connection before a statement does. HikariCP bypasses its
/// check the same way (`aliveBypassWindowMs`, 500 ms).
pub const PING_IF_IDLE_FOR: Duration = Duration::from_secs(1);

/// How to reach the database and how patiently.
#[derive(Clone)]
pub struct PoolOptions {
    pub connect: PgConnectOptions,
    pub max_connections: u32,
    pub min_connections: u32,
    pub acquire_timeout: Duration,
    /// Attempts at start before giving up (at least one).
    pub connect_attempts: u32,
    /// Delay before the second attempt; doubles each time, capped at 10 s.
    pub connect_backoff: Duration,
    /// A connection idle this long is pinged before it is handed out
    /// ([`PING_IF_IDLE_FOR`] in the host).
    pub ping_if_idle_for: Duration,
}

impl std::fmt::Debug for PoolOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PoolOptions")
            .field("connect", &Redacted(&self.connect))
            .field("max_connections", &self.max_connections)
            .field("min_connections", &self.min_connections)
            .field("acquire_timeout", &self.acquire_timeout)
            .field("connect_attempts", &self.connect_attempts)
            .field("connect_backoff", &self.connect_backoff)
            .field("ping_if_idle_for", &self.ping_if_idle_for)
            .finish()
    }
}

/// [`PgConnectOptions`] for `Debug` without its secrets: sqlx's own `Debug` prints the
/// password (and an inline client key), and whatever derives `Debug` over the options would
/// put them in a log line or a panic message.
pub struct Redacted<'a>(pub &'a PgConnectOptions);

impl std::fmt::Debug for Redacted<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let options = self.0;
        // sqlx has no getter for the password, so whether one is set cannot be told.
        f.debug_struct("PgConnectOptions")
            .field("host", &options.get_host())
            .field("port", &options.get_port())
            .field("socket", &options.get_socket())
            .field("username", &options.get_username())
            .field("password", &"<redacted>")
            .field("database", &options.get_database())
            .field("ssl_mode", &options.get_ssl_mode())
            .field("application_name", &options.get_application_name())
            .field("options", &options.get_options())
            .finish_non_exhaustive()
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    #[error("PostgreSQL at {server} stayed unreachable after {attempts} attempts: {cause}")]
    Unreachable {
        server: String,
        attempts: u32,
        cause: String,
    },
    /// The TLS handshake failed (a certificate that does not verify, a server without TLS
    /// under `require`): not retried, since waiting does not change a certificate.
    #[error("PostgreSQL at {server}: the TLS handshake failed: {cause}")]
    Tls { server: String, cause: String },
}

/// Opens the pool, retrying a bounded number of times with backoff, and names the server in
/// the error when it stays unreachable. A failed TLS handshake is returned at once.
pub async fn connect(options: &PoolOptions) -> Result<PgPool, ConnectError> {
    let attempts = options.connect_attempts.max(1);
    let server = format!(
        "{}:{}/{}",
        options.connect.get_host(),
        options.connect.get_port(),
        options.connect.get_database().unwrap_or("")
    );
    let mut backoff = Backoff::doubling(options.connect_backoff, Duration::from_secs(10));
    let mut last_error = String::new();
    let ping_if_idle_for = options.ping_if_idle_for;
    for attempt in 1..=attempts {
        let result = PgPoolOptions::new()
            .max_connections(options.max_connections)
            .min_connections(options.min_connections)
            .acquire_timeout(options.acquire_timeout)
            .test_before_acquire(false)
            .before_acquire(move |conn, meta| {
                Box::pin(async move {
                    if meta.idle_for >= ping_if_idle_for {
                        // An error closes the connection, and the pool opens another.
                        conn.ping().await?;
                    }
                    Ok(true)
                })
            })
            .connect_with(
                options
                    .connect
                    .clone()
                    .log_slow_statements(tracing::log::LevelFilter::Warn, SLOW_STATEMENT),
            )
            .await;
        match result {
            Ok(pool) => return Ok(pool),
            Err(err) if is_tls_failure(&err) => {
                return Err(ConnectError::Tls {
                    server,
                    cause: worker_core::error_chain(&err),
                });
            }
            Err(err) => {
                last_error = worker_core::error_chain(&err);
                tracing::warn!(%server, attempt, attempts, error = %last_error, "PostgreSQL not reachable yet");
                if attempt < attempts {
                    tokio::time::sleep(backoff.next_wait()).await;
                }
            }
        }
    }
    Err(ConnectError::Unreachable {
        server,
        attempts,
        cause: last_error,
    })
}

/// A TLS set-up sqlx refused (`require` to a server without TLS, a bad root certificate
/// file), or a server certificate that did not verify (sqlx reports that one as an I/O error
/// carrying rustls's).
fn is_tls_failure(err: &sqlx::Error) -> bool {
    use tokio_rustls::rustls;
    match err {
        sqlx::Error::Tls(_) => true,
        sqlx::Error::Io(io) => io
            .get_ref()
            .and_then(|inner| inner.downcast_ref::<rustls::Error>())
            .is_some_and(|e| {
                matches!(
                    e,
                    rustls::Error::InvalidCertificate(_) | rustls::Error::NoCertificatesPresented
                )
            }),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_names_the_server_but_never_the_password() {
        let options = PoolOptions {
            connect: PgConnectOptions::new()
                .host("db.example")
                .port(6543)
                .username("worker")
                .password("hunter2-secret")
                .database("jobs"),
            max_connections: 7,
            min_connections: 1,
            acquire_timeout: Duration::from_secs(3),
            connect_attempts: 2,
            connect_backoff: Duration::from_millis(500),
            ping_if_idle_for: PING_IF_IDLE_FOR,
        };
        let shown = format!("{options:?}");
        assert!(!shown.contains("hunter2-secret"), "{shown}");
        for part in ["db.example", "6543", "worker", "jobs", "max_connections: 7"] {
            assert!(shown.contains(part), "{part} in {shown}");
        }
    }
}
