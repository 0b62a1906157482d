//! # job-db-health: is the database answering, and how fast?
//!
//! A timer job that times a probe query (`SELECT pg_is_in_recovery()`, connecting included
//! when it has to) under its own timeout and keeps the latest result in a [`HealthHandle`].
//! The host's `/readyz` and its metrics read the handle; they never touch the database
//! themselves, so a slow database cannot make the admin endpoints slow.
//!
//! ## A connection of its own
//!
//! The probe never draws on the pool the jobs share. It holds **one dedicated connection**,
//! opened on the first probe with the pool's connect options ([`DbHealth::beside`]) and
//! opened again after any failure. A pool whose every connection is held by slow work (a
//! slow SMTP server, a webhook that takes its time) is a busy host, not a sick database: it
//! must not make `/readyz` answer 503, which would take a healthy replica out of rotation
//! just when it has most to do.
//!
//! ## A standby is not healthy
//!
//! The probe asks `SELECT pg_is_in_recovery()`: a server that answers but takes no writes (a
//! standby, before or after a failover) fails it, so readiness and the alert on failed probes
//! see "no primary" as the outage it is for the jobs. Beside a pool that follows the primary
//! of a list of members ([`worker_store::primary`]), each fresh connection of the probe goes
//! where the pool's connect options point at that moment, so the probe follows the primary
//! too.
//!
//! ## What a tick does
//!
//! 1. Run the probe on the dedicated connection, bounded by [`DbHealthConfig::probe_timeout`]
//!    and by the tick's cancellation token. When the connection it had fails (the server
//!    restarted, the session was terminated), it opens a fresh one and probes again within
//!    the same timeout, so that a stale session is not reported as a database that is down.
//!    A probe that fails or is cut short drops its connection: the next one starts clean.
//! 2. Record the outcome in the handle: status, latency, the error if any, when, and the
//!    number of consecutive failures.
//! 3. Log a **transition** — healthy to unhealthy, or back — once, when it happens. A database
//!    that stays down is not logged again on every tick; the handle and the metrics carry it.
//!
//! The tick itself succeeds whether or not the probe did: the job's work is to *record* the
//! health, and a failed tick would make the host log an error on every tick of an outage.
//! A cancelled tick records nothing.
//!
//! ```no_run
//! # fn wire(pool: &sqlx::PgPool) {
//! use job_db_health::{DbHealth, DbHealthConfig};
//! let health = DbHealth::beside(pool, DbHealthConfig::default()); // its own connection
//! let handle = health.handle(); // cloned into /readyz and the metrics
//! // the host ticks `health` on its schedule, on every replica (no lease): each replica's
//! // readiness is its own
//! let ready: Result<(), String> = handle.readiness(Some(std::time::Duration::from_secs(90)));
//! # let _ = ready; }
//! ```
//!
//! Before the first probe the status is [`HealthStatus::Unknown`] and the handle reports not
//! ready.

pub mod settings;

use std::fmt;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::postgres::PgConnectOptions;
use sqlx::{Connection, PgConnection, PgPool};
use tokio::sync::Mutex;
use tokio::time::Instant;
use worker_core::{Failure, TickReport, TimerJob, WorkContext};

pub use settings::DbHealthSettings;

/// The job's name, in logs, metrics and the attempt log.
pub const JOB_NAME: &str = "db-health";

/// What the host needs to know of this job (its name, kind and lease).
pub const JOB: worker_core::JobSpec =
    worker_core::catalog::JobSpec::timer(JOB_NAME, worker_core::catalog::Lease::EveryReplica);

/// How the probe runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DbHealthConfig {
    /// The probe (`SELECT pg_is_in_recovery()`, and connecting when it has to) must answer
    /// within this.
    pub probe_timeout: Duration,
    /// Consecutive failed probes before the database is declared unhealthy (at least 1).
    /// One successful probe makes it healthy again.
    pub unhealthy_after: u32,
}

impl Default for DbHealthConfig {
    fn default() -> Self {
        Self {
            probe_timeout: Duration::from_secs(5),
            unhealthy_after: 1,
        }
    }
}

/// The database's status as the last probes saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum HealthStatus {
    /// No probe has finished yet.
    Unknown,
    Healthy,
    Unhealthy,
}

impl HealthStatus {
    /// `unknown`, `healthy` or `unhealthy`.
    pub const fn as_str(&self) -> &'static str {
        match self {
            Self::Unknown => "unknown",
            Self::Healthy => "healthy",
            Self::Unhealthy => "unhealthy",
        }
    }
}

impl fmt::Display for HealthStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A copy of the latest health, for `/readyz` and the metrics.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct HealthSnapshot {
    /// `status == Healthy`.
    pub healthy: bool,
    pub status: HealthStatus,
    /// How long the last probe took (to its answer, its error, or its timeout).
    pub latency: Option<Duration>,
    /// Why the last probe failed; `None` after a successful one.
    pub last_error: Option<String>,
    /// When the last probe finished.
    pub checked_at: Option<DateTime<Utc>>,
    /// Failed probes in a row; 0 after a successful one.
    pub consecutive_failures: u32,
    /// Probes run so far.
    pub probes: u64,
    /// Changes between healthy and unhealthy so far (the first status after start is not a
    /// change). Each one was logged once.
    pub transitions: u64,
}

impl HealthSnapshot {
    fn initial() -> Self {
        Self {
            healthy: false,
            status: HealthStatus::Unknown,
            latency: None,
            last_error: None,
            checked_at: None,
            consecutive_failures: 0,
            probes: 0,
            transitions: 0,
        }
    }

    /// Whether the host should report ready: healthy, and — when `stale_after` is given —
    /// checked no longer ago than that (a monitor that stopped probing is not trusted).
    pub fn readiness(&self, stale_after: Option<Duration>) -> Result<(), String> {
        match self.status {
            HealthStatus::Unknown => return Err("the database has not been probed yet".into()),
            HealthStatus::Unhealthy => {
                return Err(format!(
                    "the database is unhealthy ({} failed probes in a row): {}",
                    self.consecutive_failures,
                    self.last_error.as_deref().unwrap_or("no error recorded")
                ));
            }
            HealthStatus::Healthy => {}
        }
        if let (Some(limit), Some(at)) = (stale_after, self.checked_at) {
            let age = (Utc::now() - at).to_std().unwrap_or_default();
            if age > limit {
                return Err(format!(
                    "the last database probe is {}s old (limit {}s)",
                    age.as_secs(),
                    limit.as_secs()
                ));
            }
        }
        Ok(())
    }
}

/// The shared, cheaply cloned view of the database's health. Written by the job, read by
/// anyone; reads never wait on a probe.
#[derive(Debug, Clone)]
pub struct HealthHandle {
    inner: Arc<RwLock<HealthSnapshot>>,
}

impl Default for HealthHandle {
    fn default() -> Self {
        Self::new()
    }
}

impl HealthHandle {
    /// A handle with status [`HealthStatus::Unknown`].
    pub fn new() -> Self {
        Self {
            inner: Arc::new(RwLock::new(HealthSnapshot::initial())),
        }
    }

    /// A copy of the latest health.
    pub fn snapshot(&self) -> HealthSnapshot {
        match self.inner.read() {
            Ok(guard) => guard.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    /// `snapshot().healthy`.
    pub fn is_healthy(&self) -> bool {
        self.snapshot().healthy
    }

    /// See [`HealthSnapshot::readiness`].
    pub fn readiness(&self, stale_after: Option<Duration>) -> Result<(), String> {
        self.snapshot().readiness(stale_after)
    }

    /// Records one probe's outcome and returns the transition it caused, if any.
    fn record(
        &self,
        result: Result<(), String>,
        latency: Duration,
        unhealthy_after: u32,
    ) -> Option<(HealthStatus, HealthStatus)> {
        let mut state = match self.inner.write() {
            Ok(guard) => guard,
            Err(poisoned) => poisoned.into_inner(),
        };
        let before = state.status;
        state.probes += 1;
        state.latency = Some(latency);
        state.checked_at = Some(Utc::now());
        match result {
            Ok(()) => {
                state.consecutive_failures = 0;
                state.last_error = None;
                state.status = HealthStatus::Healthy;
            }
            Err(error) => {
                state.consecutive_failures = state.consecutive_failures.saturating_add(1);
                state.last_error = Some(error);
                if state.consecutive_failures >= unhealthy_after.max(1) {
                    state.status = HealthStatus::Unhealthy;
                } else if before == HealthStatus::Unknown {
                    // Not yet over the threshold, but nothing good is known either.
                    state.status = HealthStatus::Unknown;
                }
            }
        }
        state.healthy = state.status == HealthStatus::Healthy;
        let after = state.status;
        let changed = before != after;
        if changed && before != HealthStatus::Unknown {
            state.transitions += 1;
        }
        changed.then_some((before, after))
    }
}

/// The database health monitor. See the crate docs.
#[derive(Clone)]
pub struct DbHealth {
    options: PgConnectOptions,
    /// The pool whose connect options each fresh connection takes at that moment (they
    /// change when the pool follows a new primary); `None`: `options`, fixed.
    beside: Option<PgPool>,
    /// The dedicated connection, while the last probe on it succeeded. A probe takes it out
    /// and puts it back only after it answered, so that a probe cut short (its timeout, the
    /// host stopping) drops a connection that may be mid-query rather than reuse it.
    connection: Arc<Mutex<Option<PgConnection>>>,
    config: DbHealthConfig,
    handle: HealthHandle,
}

impl std::fmt::Debug for DbHealth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DbHealth")
            .field("options", &worker_store::Redacted(&self.options))
            .field("config", &self.config)
            .field("handle", &self.handle)
            .finish_non_exhaustive()
    }
}

impl DbHealth {
    /// A monitor on a connection of its own, opened with `options`, with a fresh handle.
    pub fn new(options: PgConnectOptions, config: DbHealthConfig) -> Self {
        Self::with_handle(options, config, HealthHandle::new())
    }

    /// A monitor on a connection of its own to the database `pool` connects to (its connect
    /// options, named `worker-host health probe`); the pool itself is never used.
    pub fn beside(pool: &PgPool, config: DbHealthConfig) -> Self {
        let mut health = Self::new(probe_options(pool), config);
        health.beside = Some(pool.clone());
        health
    }

    /// A monitor writing into an existing `handle` (so that the host can hand the handle to
    /// the admin server before the job exists).
    pub fn with_handle(
        options: PgConnectOptions,
        config: DbHealthConfig,
        handle: HealthHandle,
    ) -> Self {
        Self {
            options,
            beside: None,
            connection: Arc::new(Mutex::new(None)),
            config,
            handle,
        }
    }

    /// The handle the monitor writes into.
    pub fn handle(&self) -> HealthHandle {
        self.handle.clone()
    }

    /// Runs the probe once, without recording it: `Ok(latency)` or the failure with the time
    /// it took.
    pub async fn probe(&self) -> (Result<(), Failure>, Duration) {
        let started = Instant::now();
        let result =
            match tokio::time::timeout(self.config.probe_timeout, self.probe_untimed()).await {
                Ok(result) => result,
                Err(_) => Err(Failure::transient(format!(
                    "the probe query did not answer within {}ms",
                    self.config.probe_timeout.as_millis()
                ))),
            };
        (result, started.elapsed())
    }

    async fn probe_untimed(&self) -> Result<(), Failure> {
        let mut slot = self.connection.lock().await;
        if let Some(mut open) = slot.take() {
            match probe_query(&mut open).await {
                Ok(()) => {
                    *slot = Some(open);
                    return Ok(());
                }
                Err(failure) => tracing::debug!(
                    job = JOB_NAME,
                    error = %failure,
                    "the probe's connection failed; probing on a fresh one"
                ),
            }
        }
        let options = match &self.beside {
            Some(pool) => probe_options(pool),
            None => self.options.clone(),
        };
        let mut fresh = PgConnection::connect_with(&options)
            .await
            .map_err(worker_store::classify)?;
        probe_query(&mut fresh).await?;
        *slot = Some(fresh);
        Ok(())
    }
}

/// The pool's connect options as they are now, named `worker-host health probe`.
fn probe_options(pool: &PgPool) -> PgConnectOptions {
    (*pool.connect_options())
        .clone()
        .application_name("worker-host health probe")
}

/// The probe query: the server answers, and takes writes (see the crate's doc).
async fn probe_query(connection: &mut PgConnection) -> Result<(), Failure> {
    let standby: bool = sqlx::query_scalar("SELECT pg_is_in_recovery()")
        .fetch_one(connection)
        .await
        .map_err(worker_store::classify)?;
    if standby {
        Err(Failure::transient(
            "no primary: the server answers but is a standby (in recovery), which takes no writes",
        ))
    } else {
        Ok(())
    }
}

impl TimerJob for DbHealth {
    fn name(&self) -> &str {
        JOB_NAME
    }

    async fn tick(&self, ctx: &WorkContext) -> Result<TickReport, Failure> {
        let (result, latency) = tokio::select! {
            biased;
            () = ctx.cancel.cancelled() => {
                return Err(Failure::transient("the health probe was cancelled"));
            }
            outcome = self.probe() => outcome,
        };
        let detail = match &result {
            Ok(()) => format!("healthy in {}ms", latency.as_millis()),
            Err(failure) => format!("unhealthy after {}ms: {failure}", latency.as_millis()),
        };
        let transition = self.handle.record(
            result.map_err(|f| f.to_string()),
            latency,
            self.config.unhealthy_after,
        );
        if let Some((before, after)) = transition {
            let snapshot = self.handle.snapshot();
            match after {
                HealthStatus::Unhealthy => tracing::error!(
                    job = JOB_NAME,
                    from = %before,
                    to = %after,
                    consecutive_failures = snapshot.consecutive_failures,
                    error = snapshot.last_error.as_deref().unwrap_or(""),
                    "the database is unhealthy"
                ),
                HealthStatus::Healthy if before == HealthStatus::Unknown => tracing::info!(
                    job = JOB_NAME,
                    latency_ms = latency.as_millis() as u64,
                    "the database is healthy"
                ),
                HealthStatus::Healthy => tracing::warn!(
                    job = JOB_NAME,
                    from = %before,
                    to = %after,
                    latency_ms = latency.as_millis() as u64,
                    "the database is healthy again"
                ),
                HealthStatus::Unknown => {}
            }
        }
        Ok(TickReport::items(1).with_detail(detail))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_never_shows_the_password() {
        let options = PgConnectOptions::new()
            .host("db.example")
            .username("worker")
            .password("hunter2-secret")
            .database("jobs");
        let health = DbHealth::new(options, DbHealthConfig::default());
        let shown = format!("{health:?}");
        assert!(!shown.contains("hunter2-secret"), "{shown}");
        for part in ["db.example", "worker", "jobs", "probe_timeout"] {
            assert!(shown.contains(part), "{part} in {shown}");
        }
    }

    const MS: Duration = Duration::from_millis(3);

    #[test]
    fn transitions_are_counted_once_per_change() {
        let h = HealthHandle::new();
        assert_eq!(h.snapshot().status, HealthStatus::Unknown);
        assert!(h.readiness(None).is_err());

        assert_eq!(
            h.record(Ok(()), MS, 1),
            Some((HealthStatus::Unknown, HealthStatus::Healthy))
        );
        assert_eq!(h.record(Ok(()), MS, 1), None);
        assert_eq!(
            h.snapshot().transitions,
            0,
            "the first status is not a change"
        );
        assert!(h.readiness(None).is_ok());

        assert_eq!(
            h.record(Err("down".into()), MS, 1),
            Some((HealthStatus::Healthy, HealthStatus::Unhealthy))
        );
        assert_eq!(h.record(Err("down".into()), MS, 1), None);
        assert_eq!(h.record(Err("still down".into()), MS, 1), None);
        let s = h.snapshot();
        assert_eq!(
            (s.healthy, s.consecutive_failures, s.transitions, s.probes),
            (false, 3, 1, 5)
        );
        assert_eq!(s.last_error.as_deref(), Some("still down"));
        assert!(h.readiness(None).unwrap_err().contains("still down"));

        assert_eq!(
            h.record(Ok(()), MS, 1),
            Some((HealthStatus::Unhealthy, HealthStatus::Healthy))
        );
        let s = h.snapshot();
        assert_eq!(
            (s.healthy, s.consecutive_failures, s.transitions),
            (true, 0, 2)
        );
        assert_eq!(s.last_error, None);
    }

    #[test]
    fn a_threshold_tolerates_single_failures() {
        let h = HealthHandle::new();
        h.record(Ok(()), MS, 3);
        assert_eq!(h.record(Err("blip".into()), MS, 3), None);
        assert_eq!(h.record(Err("blip".into()), MS, 3), None);
        assert!(
            h.is_healthy(),
            "two failures are under the threshold of three"
        );
        assert_eq!(
            h.record(Err("down".into()), MS, 3),
            Some((HealthStatus::Healthy, HealthStatus::Unhealthy))
        );
        assert_eq!(h.snapshot().consecutive_failures, 3);
    }

    #[test]
    fn a_stale_probe_is_not_ready() {
        let h = HealthHandle::new();
        h.record(Ok(()), MS, 1);
        assert!(h.readiness(Some(Duration::from_secs(60))).is_ok());
        if let Ok(mut s) = h.inner.write() {
            s.checked_at = Some(Utc::now() - chrono::Duration::seconds(120));
        }
        let why = h.readiness(Some(Duration::from_secs(60))).unwrap_err();
        assert!(why.contains("old"), "{why}");
        assert!(h.readiness(None).is_ok());
    }
}
