//! What the console needs of the running host, and nothing more: the host implements
//! [`Runtime`] over its status board, its sampler's readings, its consumers' gates and its
//! timers' handles, and the console's pages reach the host only through it. Everything else a
//! page shows or does goes through the database (pauses, circuits, the audit trail, dead
//! letters) or the broker, which every replica shares.

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use worker_core::catalog::JobSpec;

/// A future the host's side of an action returns.
pub type Pending<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// The running host, as the console reads and drives it.
pub trait Runtime: Send + Sync + std::fmt::Debug {
    /// What `/status` shows now: installation, release, broker, database, jobs, alerts,
    /// circuits.
    fn status(&self) -> serde_json::Value;

    /// Every job this host runs, in the job list's order, with its counts now.
    fn jobs(&self) -> Vec<JobView>;

    /// The sampler's latest readings.
    fn readings(&self) -> Readings;

    /// email-send's sending rate as this replica last read it, when it has one.
    fn sending_rate(&self) -> Option<serde_json::Value>;

    /// Asks timer `name` to run a tick now on this replica: `None` when there is no such
    /// timer, else whether its loop took the request (and why not).
    fn run_now(&self, name: &str) -> Option<Result<(), String>>;

    /// Whether this replica holds consumer `name`'s consumers stopped now (a pause or an
    /// open circuit; it follows the database within `workers.pause_poll`).
    fn stopped_here(&self, name: &str) -> bool;

    /// The job answering to `name`, under its name or one it had before.
    fn job(&self, name: &str) -> Option<&'static JobSpec>;

    /// Job `name`'s spec, if it may be paused; else why not.
    fn pausable(&self, name: &str) -> Result<&'static JobSpec, String>;

    /// Empties every dead queue of the topology into the archive through `pool` (an
    /// erasure's first step); how many it archived, or why it could not.
    fn archive_dead_queues<'a>(
        &'a self,
        pool: &'a sqlx::PgPool,
    ) -> Pending<'a, Result<u64, String>>;
}

/// One job as the console lists it.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct JobView {
    pub name: String,
    /// A consumer's queue; `None` for a timer.
    pub queue: Option<String>,
    /// A timer's schedule, lease, next run and counts, or a consumer's counts, as `/status`
    /// shows them.
    pub shown: serde_json::Value,
}

impl JobView {
    pub fn is_timer(&self) -> bool {
        self.queue.is_none()
    }
}

/// The readings the console shows, taken on the host's sampling interval.
#[derive(Debug, Default, Clone)]
pub struct Readings {
    pub queues: Vec<QueueReading>,
    /// Dead letters per queue: archived and waiting, plus those still in `Q.dead`.
    pub dead_letter_depth: BTreeMap<String, u64>,
    pub dead_letter_inflow_per_minute: u64,
    pub oldest_dead_letter_age: Option<Duration>,
    pub outbox_pending: u64,
    pub outbox_failed: u64,
    pub outbox_oldest_pending: Option<Duration>,
    pub db_latency: Option<Duration>,
    /// Stuck rows by kind (`execution`, `email`), as the reconciler defines them.
    pub stuck_work: BTreeMap<&'static str, u64>,
}

/// One consumer queue, its retry tiers and its dead queue, with their depths.
#[derive(Debug, Default, Clone, serde::Serialize)]
pub struct QueueReading {
    pub queue: String,
    pub ready: Option<u64>,
    /// Each tier's queue and its delay, with the messages parked in it.
    pub tiers: Vec<TierReading>,
    pub dead_queue: String,
    /// Messages in the dead queue, not yet archived.
    pub dead_waiting: Option<u64>,
}

/// One retry tier of a queue.
#[derive(Debug, Default, Clone, serde::Serialize)]
pub struct TierReading {
    pub queue: String,
    #[serde(with = "humantime_serde")]
    pub delay: Duration,
    pub parked: Option<u64>,
}

/// The pause of `job` among `pauses`, under its name or an earlier one.
pub fn pause_of<'a>(
    runtime: &dyn Runtime,
    pauses: &'a [worker_store::pauses::Pause],
    job: &str,
) -> Option<&'a worker_store::pauses::Pause> {
    pauses
        .iter()
        .find(|p| runtime.job(&p.job).is_some_and(|spec| spec.name == job))
}
