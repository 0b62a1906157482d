use std::time::Duration;

use sqlx::PgPool;
use sqlx::Postgres;
use sqlx::pool::PoolConnection;
use worker_core::{Failure, SingletonLease};

use crate::classify;

/// The advisory-lock namespace of timer-job leases (the first key of the two-key form), so
/// that they never collide with another application's advisory locks on the same database.
const LEASE_NAMESPACE: i32 = 0x5748_4c53; // "WHLS"

/// How often a held lease's session is checked while its tick runs, by default.
pub const DEFAULT_CHECK_INTERVAL: Duration = Duration::from_secs(1);

/// How long a check may take before the session counts as lost, by default.
pub const DEFAULT_CHECK_TIMEOUT: Duration = Duration::from_secs(5);

/// A singleton lease per timer job across replicas, on PostgreSQL session advisory locks.
///
/// The lease is held on one pooled connection for the length of a tick. A replica that dies
/// loses its connection, and the server releases the lock with it.
///
/// While the tick runs, [`SingletonLease::watch`] sends `SELECT 1` on the held connection
/// every `check_interval`: a session that errors (terminated, connection broken) or does not
/// answer within `check_timeout` counts as lost, and `tick_once` cancels the tick, because the
/// server may already have given the lock to another replica. Polling bounds the overlap with
/// such a replica to about one `check_interval` (plus the check's own latency), not to zero:
/// the server frees the lock the moment the session ends. After the tick,
/// [`SingletonLease::release`] unlocks with `pg_advisory_unlock` and returns the connection to
/// the pool; only a guard dropped without release (a crash, a lost session) closes it.
#[derive(Debug, Clone)]
pub struct AdvisoryLease {
    pool: PgPool,
    check_interval: Duration,
    check_timeout: Duration,
}

/// A held lease. `release` unlocks it and returns the connection to the pool; dropping it
/// without `release` closes the connection instead, which releases the lock all the same.
#[derive(Debug)]
pub struct LeaseGuard {
    conn: Option<PoolConnection<Postgres>>,
    job: String,
}

impl AdvisoryLease {
    pub fn new(pool: PgPool) -> Self {
        Self {
            pool,
            check_interval: DEFAULT_CHECK_INTERVAL,
            check_timeout: DEFAULT_CHECK_TIMEOUT,
        }
    }

    /// How often a held lease's session is checked during a tick, and how long a check may
    /// take before the session counts as lost.
    #[must_use]
    pub fn with_checks(mut self, interval: Duration, timeout: Duration) -> Self {
        self.check_interval = interval.max(Duration::from_millis(10));
        self.check_timeout = timeout.max(Duration::from_millis(10));
        self
    }

    /// Resolves once the session holding `guard` is lost; see the type's docs.
    pub async fn watch(&self, guard: &mut LeaseGuard) -> Failure {
        let Some(conn) = guard.conn.as_mut() else {
            return Failure::transient("the lease was already given up");
        };
        loop {
            tokio::time::sleep(self.check_interval).await;
            let checked = tokio::time::timeout(
                self.check_timeout,
                sqlx::query("SELECT 1").execute(&mut **conn),
            )
            .await;
            match checked {
                Ok(Ok(_)) => {}
                Ok(Err(err)) => {
                    return Failure::transient(format!(
                        "the session holding the lease of `{}` was lost: {err}",
                        guard.job
                    ));
                }
                Err(_elapsed) => {
                    return Failure::transient(format!(
                        "the session holding the lease of `{}` did not answer within {:?}",
                        guard.job, self.check_timeout
                    ));
                }
            }
        }
    }

    pub async fn acquire(&self, job: &str) -> Result<Option<LeaseGuard>, Failure> {
        let mut conn = self.pool.acquire().await.map_err(classify)?;
        let held: bool = sqlx::query_scalar("SELECT pg_try_advisory_lock($1, hashtext($2))")
            .bind(LEASE_NAMESPACE)
            .bind(job)
            .fetch_one(&mut *conn)
            .await
            .map_err(classify)?;
        Ok(held.then(|| LeaseGuard {
            conn: Some(conn),
            job: job.to_string(),
        }))
    }
}

impl LeaseGuard {
    /// Unlocks the lease and gives the connection back to the pool. An unlock that fails or
    /// does not answer within [`DEFAULT_CHECK_TIMEOUT`] closes the connection instead.
    pub async fn release(mut self) {
        if let Some(mut conn) = self.conn.take() {
            let unlocked = tokio::time::timeout(
                DEFAULT_CHECK_TIMEOUT,
                sqlx::query_scalar::<_, bool>("SELECT pg_advisory_unlock($1, hashtext($2))")
                    .bind(LEASE_NAMESPACE)
                    .bind(&self.job)
                    .fetch_one(&mut *conn),
            )
            .await;
            match unlocked {
                Ok(Ok(true)) => {}
                Ok(Ok(false)) => {
                    // This session did not hold it (it never should): close it to be sure.
                    tracing::warn!(job = %self.job, "the lease was not held by its session at release");
                    conn.close_on_drop();
                }
                Ok(Err(_)) | Err(_) => {
                    // The lock's fate is unknown: closing the session is the one sure release.
                    conn.close_on_drop();
                }
            }
        }
    }

    pub fn job(&self) -> &str {
        &self.job
    }
}

impl Drop for LeaseGuard {
    fn drop(&mut self) {
        if let Some(conn) = self.conn.as_mut() {
            conn.close_on_drop();
        }
    }
}

impl SingletonLease for AdvisoryLease {
    type Guard = LeaseGuard;

    async fn try_acquire(&self, job: &str) -> Result<Option<LeaseGuard>, Failure> {
        self.acquire(job).await
    }

    async fn watch(&self, guard: &mut LeaseGuard) -> Failure {
        AdvisoryLease::watch(self, guard).await
    }

    async fn release(&self, guard: LeaseGuard) {
        guard.release().await;
    }
}
