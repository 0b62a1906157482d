use sqlx::PgPool;
use sqlx::Postgres;
use sqlx::pool::PoolConnection;
use worker_core::{Failure, SingletonLease};

use crate::classify;

/// The advisory-lock namespace of timer-job leases (the first key of the two-key form), so
/// that they never collide with another application's advisory locks on the same database.
const LEASE_NAMESPACE: i32 = 0x5748_4c53; // "WHLS"

/// A singleton lease per timer job across replicas, on PostgreSQL session advisory locks.
///
/// The lease is held on one pooled connection for the length of a tick. A replica that dies
/// loses its connection, and the server releases the lock with it.
#[derive(Debug, Clone)]
pub struct AdvisoryLease {
    pool: PgPool,
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
        Self { pool }
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
    /// Unlocks the lease and gives the connection back to the pool.
    pub async fn release(mut self) {
        if let Some(mut conn) = self.conn.take() {
            let unlocked = sqlx::query("SELECT pg_advisory_unlock($1, hashtext($2))")
                .bind(LEASE_NAMESPACE)
                .bind(&self.job)
                .execute(&mut *conn)
                .await;
            if unlocked.is_err() {
                // The lock's fate is unknown: closing the session is the one sure release.
                conn.close_on_drop();
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
}
