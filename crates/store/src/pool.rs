use std::sync::Arc;
use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{ConnectOptions, Connection, PgPool};
use worker_core::Backoff;

use crate::primary::{self, Member, PrimaryWatch, Shared};

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
///
/// Five seconds, not one: sqlx hands out the connection idle longest (its idle queue is first
/// in, first out), so at a trickle the pool's connections take turns and each sits idle for
/// about the pool's size over the rate of acquires: a second or two for a few mails a second,
/// and with a one-second window nearly every acquire paid the ping. A connection that died
/// within the window fails its statement instead, which is a transient failure, tried again.
pub const PING_IF_IDLE_FOR: Duration = Duration::from_secs(5);

/// How to reach the database and how patiently.
#[derive(Clone)]
pub struct PoolOptions {
    /// Credentials, database, TLS and session settings; its host and port are the database's
    /// when `members` is empty.
    pub connect: PgConnectOptions,
    /// The members of a database with standbys, in the order they are tried: the pool
    /// connects to the first that takes writes and follows the primary ([`crate::primary`]).
    /// Empty: the one server of `connect`.
    pub members: Vec<Member>,
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
            .field("members", &self.members)
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
    /// No member of the list took writes, attempt after attempt.
    #[error(
        "no member of the database ({server}) took writes after {attempts} attempts: {answers}"
    )]
    NoPrimary {
        server: String,
        attempts: u32,
        /// Each member's last answer (`db-a:5432: a standby (read-only); …`).
        answers: String,
    },
}

/// An open pool, and, for a list of members, the view of its follower: which member is
/// primary.
#[derive(Debug)]
pub struct Connected {
    pub pool: PgPool,
    /// `Some` when [`PoolOptions::members`] is set.
    pub primary: Option<PrimaryWatch>,
}

/// Opens the pool, retrying a bounded number of times with backoff, and names the server in
/// the error when it stays unreachable. A failed TLS handshake is returned at once. With
/// [`PoolOptions::members`], the pool is on the member that takes writes and follows the
/// primary ([`crate::primary`]; [`connect_watched`] also returns which member that is).
pub async fn connect(options: &PoolOptions) -> Result<PgPool, ConnectError> {
    Ok(connect_watched(options).await?.pool)
}

/// [`connect`], with the view of the primary's follower when there are members.
pub async fn connect_watched(options: &PoolOptions) -> Result<Connected, ConnectError> {
    if options.members.is_empty() {
        let pool = connect_single(options).await?;
        return Ok(Connected {
            pool,
            primary: None,
        });
    }
    connect_members(options).await
}

/// The sqlx pool options: the sizes, and the hooks. Every pooled connection idle for
/// [`PoolOptions::ping_if_idle_for`] is pinged before it is handed out; with `shared` (a
/// list of members), a new connection to a member that takes no writes is refused, and a
/// connection opened before the pool moved to another member is closed instead of handed out.
fn pool_options(options: &PoolOptions, shared: Option<Arc<Shared>>) -> PgPoolOptions {
    let ping_if_idle_for = options.ping_if_idle_for;
    let before = shared.clone();
    let mut pool = PgPoolOptions::new()
        .max_connections(options.max_connections)
        .min_connections(options.min_connections)
        .acquire_timeout(options.acquire_timeout)
        .test_before_acquire(false)
        .before_acquire(move |conn, meta| {
            let shared = before.clone();
            Box::pin(async move {
                if let Some(shared) = &shared
                    && shared.opened_before_switch(meta.age)
                {
                    // To the member that was primary before: closed, and the pool opens
                    // another (to the new one).
                    return Ok(false);
                }
                if meta.idle_for >= ping_if_idle_for
                    && let Err(err) = conn.ping().await
                {
                    if let Some(shared) = &shared {
                        shared.suspect();
                    }
                    // An error closes the connection, and the pool opens another.
                    return Err(err);
                }
                Ok(true)
            })
        });
    if let Some(shared) = shared {
        pool = pool.after_connect(move |conn, _meta| {
            let shared = shared.clone();
            Box::pin(async move { primary::refuse_standby(conn, &shared).await })
        });
    }
    pool
}

fn with_slow_log(connect: PgConnectOptions) -> PgConnectOptions {
    connect.log_slow_statements(tracing::log::LevelFilter::Warn, SLOW_STATEMENT)
}

/// Every member asked in order, attempt after attempt, until one takes writes; the pool opens
/// on it and its follower starts.
async fn connect_members(options: &PoolOptions) -> Result<Connected, ConnectError> {
    let attempts = options.connect_attempts.max(1);
    let members: Vec<String> = options.members.iter().map(Member::to_string).collect();
    let server = format!(
        "{}/{}",
        members.join(", "),
        options.connect.get_database().unwrap_or("")
    );
    let base = with_slow_log(options.connect.clone());
    let mut backoff = Backoff::doubling(options.connect_backoff, Duration::from_secs(10));
    let mut answers = String::new();
    for attempt in 1..=attempts {
        let (found, survey) = primary::survey(&base, &options.members).await;
        answers = primary::describe(&survey);
        if let Some(index) = found {
            let shared = Arc::new(Shared::default());
            let opened = pool_options(options, Some(shared.clone()))
                .connect_with(options.members[index].connect_options(&base))
                .await;
            match opened {
                Ok(pool) => {
                    let found = primary::Found {
                        members: options.members.clone(),
                        base,
                        primary: index,
                        survey,
                    };
                    let watch = primary::follow(pool.clone(), found, shared);
                    return Ok(Connected {
                        pool,
                        primary: Some(watch),
                    });
                }
                Err(err) => {
                    answers = format!(
                        "{}: the pool did not open: {}",
                        options.members[index],
                        worker_core::error_chain(&err)
                    );
                }
            }
        }
        tracing::warn!(%server, attempt, attempts, %answers, "no member of the database takes writes yet");
        if attempt < attempts {
            tokio::time::sleep(backoff.next_wait()).await;
        }
    }
    Err(ConnectError::NoPrimary {
        server,
        attempts,
        answers,
    })
}

async fn connect_single(options: &PoolOptions) -> Result<PgPool, ConnectError> {
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
        let result = pool_options(options, None)
            .connect_with(with_slow_log(options.connect.clone()))
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
            members: vec![Member::new("db-a", 5432)],
            max_connections: 7,
            min_connections: 1,
            acquire_timeout: Duration::from_secs(3),
            connect_attempts: 2,
            connect_backoff: Duration::from_millis(500),
            ping_if_idle_for: PING_IF_IDLE_FOR,
        };
        let shown = format!("{options:?}");
        assert!(!shown.contains("hunter2-secret"), "{shown}");
        for part in [
            "db.example",
            "6543",
            "worker",
            "jobs",
            "max_connections: 7",
            "db-a",
        ] {
            assert!(shown.contains(part), "{part} in {shown}");
        }
    }
}
