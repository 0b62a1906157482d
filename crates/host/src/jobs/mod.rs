//! The jobs this host runs: built from the one list of jobs ([`crate::settings::JobsSettings`],
//! whose lines name each job's [`worker_core::JobSpec`]), each wrapped as its kind wants:
//! consumers in a [`worker_broker::ConsumerRunner`] (retry, timeout, the recoverability
//! pipeline), timer jobs in a [`crate::scheduler::TimerTask`] (busy guard, lease, timeout).
//!
//! - `list.rs`: the jobs by name, what an operator may pause;
//! - `gates.rs`: consumer jobs' pauses on this replica, kept in step with the database;
//! - `build.rs`: each job built from its section and the host's shared parts;
//! - `run.rs`: the wrapping of a consumer and of a timer, and their tasks.

use std::sync::Arc;

use sqlx::PgPool;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use worker_store::{AdvisoryLease, AttemptLog};

use crate::metrics::Metrics;
use crate::scheduler::control::PauseCheck;
use crate::settings::Settings;
use crate::status::JobEntry;

mod build;
mod gates;
mod list;
mod run;

pub use build::{poller_config, reconciler_config, start_all};
pub use gates::{ConsumerGates, watch as watch_pauses};
pub use list::{all, find, job_names, pausable, pause_of, timer_names};
pub use run::Built;
pub use run::consumer;

/// What every job is built from.
#[derive(Debug, Clone)]
pub struct JobsContext {
    pub settings: Arc<Settings>,
    /// The `[oauth.NAME]` token sources, shared by the poller's accounts and the sender.
    pub oauth: worker_mail_auth::TokenSources,
    pub pool: PgPool,
    pub supervisor: worker_broker::Supervisor,
    pub publisher: worker_broker::Publisher,
    pub lease: Arc<AdvisoryLease>,
    pub attempt_log: AttemptLog,
    /// Where every job counts its finished units for the history.
    pub history: worker_store::history::Tally,
    pub metrics: Metrics,
    pub tracker: TaskTracker,
    pub shutdown: CancellationToken,
    /// Where timer jobs read whether an operator paused them (every replica reads the same).
    pub pauses: Option<Arc<dyn PauseCheck>>,
    /// Where consumer jobs learn whether an operator paused them; `None` consumes always.
    pub consumer_gates: Option<Arc<ConsumerGates>>,
    /// The circuits of the dependencies (the relay, IMAP accounts, webhook hosts), shared by
    /// every replica through the database.
    pub circuits: worker_store::circuits::Circuits,
    /// Every unit of work in progress, for the watchdog ([`crate::watchdog`]).
    pub liveness: worker_core::liveness::Liveness,
}

/// A job that cannot be built from the settings; names the job and why.
#[derive(Debug, thiserror::Error)]
#[error("job {job}: {problem}")]
pub struct JobError {
    pub job: String,
    pub problem: String,
}

fn job_error(job: &str, problem: impl std::fmt::Display) -> JobError {
    JobError {
        job: job.to_string(),
        problem: problem.to_string(),
    }
}

/// What the running jobs expose to the rest of the host.
#[derive(Debug)]
pub struct Started {
    pub entries: Vec<JobEntry>,
    pub health: job_db_health::HealthHandle,
    /// The consumer jobs' pauses as this replica obeys them.
    pub gates: Option<Arc<ConsumerGates>>,
    /// The SMTP account's sending rate as email-send last read it, for `/status`; none when
    /// email-send does not run here.
    pub sending_rate: Option<Arc<dyn crate::status::Reading>>,
}
