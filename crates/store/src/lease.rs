use std::time::Duration;

use sqlx::PgPool;
use sqlx::Postgres;
use sqlx::pool::PoolConnection;
use sqlx::postgres::PgConnectOptions;
use worker_core::{Failure, SingletonLease};

use crate::classify;

/// The advisory-lock namespace of timer-job leases (the first key of the two-key form), so
/// that they never collide with another application's advisory locks on the same database.
const LEASE_NAMESPACE: i32 = 0x5748_4c53; // "WHLS"

/// How long each wait of a held lease's session lasts while its tick runs, by default: the
/// longest a release waits for the wait in flight to end, and how long a tick runs before its
/// session is watched at all.
pub const DEFAULT_CHECK_INTERVAL: Duration = Duration::from_millis(250);

/// The longest wait of a held lease's session: half of [`crate::SLOW_STATEMENT`], so that a
/// wait, and a statement queued behind one, is never logged as a slow statement.
pub const MAX_CHECK_INTERVAL: Duration = Duration::from_millis(500);

/// How long past its end a wait may go unanswered before the session counts as lost, by
/// default.
pub const DEFAULT_CHECK_TIMEOUT: Duration = Duration::from_secs(5);

/// A singleton lease per timer job across replicas, on PostgreSQL session advisory locks.
///
/// The lease is held on one pooled connection for the length of a tick. A replica that dies
/// loses its connection, and the server releases the lock with it.
///
/// Once the tick has run for `check_interval`, [`SingletonLease::watch`] keeps the held
/// session waiting in `pg_sleep(check_interval)`, one wait after another. A session that ends
/// (terminated, its server restarted, the connection broken) ends its wait at once with an
/// error; one that does not answer within `check_timeout` past the wait counts as lost too.
/// Then `tick_once` cancels the tick, because the server has given, or may give, the lock to
/// another replica: the overlap with a replica that takes it is the time the news takes to
/// arrive (about a round trip), or `check_timeout` for a connection that goes silent. After
/// the tick, [`SingletonLease::release`] waits for the wait in flight, if any (at most
/// `check_interval`), unlocks with `pg_advisory_unlock` and returns the connection to the
/// pool; only a guard dropped without release (a crash, a lost session) closes it.
///
/// Why the watch waits one interval before its first wait: a wait in flight cannot be called
/// back, so a release waited for its end, and every tick held the lease, and the timer's busy
/// guard, for up to `check_interval` after its work, with a wake meanwhile coalesced behind it
/// (issue 41). Most ticks (the poller's on a wake, the drain's) are done well within the
/// interval, and now release at once. The price: a session lost within a tick's first
/// interval is seen when that interval ends, not at once, so the overlap with a replica that
/// took the freed lock is then at most `check_interval` (the holder's own statements on other
/// connections are untouched). Holding the lease across ticks instead would spare the lock's
/// round trips too, but would keep a connection per leased job and a wait in flight around the
/// clock, tie every tick of a job to one replica, and need the guard to outlive `tick_once`.
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

    /// How long each wait of a held lease's session lasts during a tick, and how long a tick
    /// runs before the first (at most [`MAX_CHECK_INTERVAL`]); and how long past its end a wait
    /// may go unanswered before the session counts as lost.
    #[must_use]
    pub fn with_checks(mut self, interval: Duration, timeout: Duration) -> Self {
        self.check_interval = interval.clamp(Duration::from_millis(10), MAX_CHECK_INTERVAL);
        self.check_timeout = timeout.max(Duration::from_millis(10));
        self
    }

    /// Resolves once the session holding `guard` is lost, from `check_interval` after it is
    /// called; see the type's docs.
    pub async fn watch(&self, guard: &mut LeaseGuard) -> Failure {
        let Some(conn) = guard.conn.as_mut() else {
            return Failure::transient("the lease was already given up");
        };
        // A tick that ends within the interval drops this future here, before anything was
        // sent on the session, so that its release has no wait to sit out.
        tokio::time::sleep(self.check_interval).await;
        loop {
            // A wait on the server rather than a poll from here: the end of the session
            // interrupts it at once, where a poll would learn of it only at the next check.
            let checked = tokio::time::timeout(
                self.check_interval + self.check_timeout,
                sqlx::query("SELECT pg_sleep($1)")
                    .bind(self.check_interval.as_secs_f64())
                    .execute(&mut **conn),
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
                        guard.job,
                        self.check_interval + self.check_timeout
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

/// The TCP settings of a lease's session on the server's side: with them, the server ends the
/// session of a holder that vanished without closing its connection (its machine lost, the
/// network cut), and frees its lock, within the takeover they were made for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeepAlive {
    /// Silence before the first keepalive probe.
    pub idle: Duration,
    /// Between probes.
    pub interval: Duration,
    /// Unanswered probes that end the connection.
    pub count: u32,
    /// How long written data may go unacknowledged before the connection ends.
    pub user_timeout: Duration,
}

impl KeepAlive {
    /// Probes that end a silent session within two thirds of `takeover` (a third of silence,
    /// then three probes a ninth apart), and unacknowledged writes (the lease's watch answers
    /// every check) within `takeover`. Whole seconds, one at least, as the server counts.
    pub fn for_takeover(takeover: Duration) -> Self {
        let secs = |d: Duration| Duration::from_secs(d.as_secs().max(1));
        Self {
            idle: secs(takeover / 3),
            interval: secs(takeover / 9),
            count: 3,
            user_timeout: takeover.max(Duration::from_secs(1)),
        }
    }

    /// `options` with these settings asked for at every connection's start, so that every
    /// session of the pool (a lease's among them) has them from its first moment, at no cost
    /// per lease.
    pub fn connect_options(&self, options: PgConnectOptions) -> PgConnectOptions {
        options.options([
            ("tcp_keepalives_idle", self.idle.as_secs().to_string()),
            (
                "tcp_keepalives_interval",
                self.interval.as_secs().to_string(),
            ),
            ("tcp_keepalives_count", self.count.to_string()),
            (
                "tcp_user_timeout",
                self.user_timeout.as_millis().to_string(),
            ),
        ])
    }
}

impl LeaseGuard {
    /// Unlocks the lease and gives the connection back to the pool (after the session's wait
    /// in flight, if any, has ended: there is none when the tick ended within the watch's
    /// first interval). An unlock that fails or does not answer within
    /// [`DEFAULT_CHECK_TIMEOUT`] closes the connection instead.
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_silent_holder_loses_its_session_within_the_takeover() {
        let keep = KeepAlive::for_takeover(Duration::from_secs(15));
        assert_eq!(keep.idle, Duration::from_secs(5));
        assert_eq!(keep.interval, Duration::from_secs(1));
        let ended_after = keep.idle + keep.interval * keep.count;
        assert!(ended_after <= Duration::from_secs(15), "{ended_after:?}");
        assert_eq!(keep.user_timeout, Duration::from_secs(15));
        let tiny = KeepAlive::for_takeover(Duration::from_millis(500));
        assert_eq!(
            (tiny.idle, tiny.interval),
            (Duration::from_secs(1), Duration::from_secs(1))
        );
    }
}
