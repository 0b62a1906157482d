use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{ConnectOptions, PgPool};
use worker_core::Backoff;

/// A statement that runs longer than this is logged as a warning (sqlx's slow-statement log,
/// set on every connection [`connect`] opens). The lease's deliberate waits stay below it
/// ([`crate::lease::MAX_CHECK_INTERVAL`]), so that a warning always means a slow statement.
pub const SLOW_STATEMENT: Duration = Duration::from_secs(1);

/// How to reach the database and how patiently.
#[derive(Debug, Clone)]
pub struct PoolOptions {
    pub connect: PgConnectOptions,
    pub max_connections: u32,
    pub min_connections: u32,
    pub acquire_timeout: Duration,
    /// Attempts at start before giving up (at least one).
    pub connect_attempts: u32,
    /// Delay before the second attempt; doubles each time, capped at 10 s.
    pub connect_backoff: Duration,
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
    for attempt in 1..=attempts {
        let result = PgPoolOptions::new()
            .max_connections(options.max_connections)
            .min_connections(options.min_connections)
            .acquire_timeout(options.acquire_timeout)
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

/// Applies the embedded migrations that have not been applied yet.
pub async fn migrate(pool: &PgPool) -> Result<(), sqlx::migrate::MigrateError> {
    crate::MIGRATOR.run(pool).await
}
