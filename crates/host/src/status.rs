//! The status board: every job of this host with what it has done since the host started
//! (the records themselves are kept by the consumer's observer, [`crate::observe`], and the
//! scheduler, [`crate::scheduler::stats`]), and the open circuits, as `/status`,
//! `worker-host status` and the console read it.

use chrono::{DateTime, Utc};

pub use crate::observe::{ConsumerSnapshot, ConsumerStats, LastResults};
use crate::open_circuits::ShownCircuit;
use crate::scheduler::TimerHandle;
pub use crate::scheduler::{DurationSummary, TimerSnapshot, TimerStats};

/// What `/status` (and `worker-host status`) reports.
#[derive(Debug, Clone)]
pub struct StatusBoard {
    pub installation: String,
    /// This replica's name.
    pub replica: String,
    pub started_at: DateTime<Utc>,
    pub jobs: Vec<JobEntry>,
    pub broker: tokio::sync::watch::Receiver<worker_broker::BrokerStatus>,
    pub alerts: std::sync::Arc<crate::alerts::AlertBook>,
    /// The database's state as the health monitor last saw it.
    pub database: std::sync::Arc<dyn Reading>,
    /// `admin.environment`, for the console's band and the fleet view.
    pub environment: Option<worker_pages::environment::Environment>,
    /// The schema found at start (after migrating): the fleet view shows it beside the release.
    pub schema: Option<worker_store::schema::SchemaVersion>,
    /// The dependencies' circuits as this replica sees them (kept in step with the shared
    /// table on every notice and within `workers.pause_poll`).
    pub circuits: worker_store::circuits::Circuits,
    /// The SMTP account's sending rate: its limits, what the current windows hold and the
    /// time until the next send, as this replica's email-send last read them.
    pub sending_rate: Option<std::sync::Arc<dyn Reading>>,
}

/// One job on the board.
#[derive(Debug, Clone)]
pub struct JobEntry {
    pub name: String,
    pub stats: JobStats,
}

#[derive(Debug, Clone)]
pub enum JobStats {
    Consumer {
        queue: String,
        stats: std::sync::Arc<ConsumerStats>,
    },
    Timer(TimerHandle),
}

/// A piece of state `/status` shows, read at the moment of the request.
pub trait Reading: Send + Sync + std::fmt::Debug {
    fn read(&self) -> serde_json::Value;
}

impl StatusBoard {
    /// The timer job named `name`, to run now, or to show on its page.
    pub fn timer(&self, name: &str) -> Option<&TimerHandle> {
        self.timers().find(|timer| timer.name == name)
    }

    /// Every timer job of this host, in the job list's order.
    pub fn timers(&self) -> impl Iterator<Item = &TimerHandle> {
        self.jobs.iter().filter_map(|job| match &job.stats {
            JobStats::Timer(timer) => Some(timer),
            JobStats::Consumer { .. } => None,
        })
    }

    pub fn render(&self) -> serde_json::Value {
        let broker = self.broker.borrow().clone();
        let jobs: Vec<serde_json::Value> = self
            .jobs
            .iter()
            .map(|job| match &job.stats {
                JobStats::Consumer { queue, stats } => serde_json::json!({
                    "name": job.name, "kind": "consumer", "queue": queue, "counts": stats.snapshot(),
                }),
                JobStats::Timer(timer) => serde_json::json!({
                    "name": job.name, "kind": "timer", "schedule": timer.schedule.to_string(),
                    "next_run": timer.next_run(), "leased": timer.leased,
                    "counts": timer.stats.snapshot(),
                }),
            })
            .collect();
        serde_json::json!({
            "installation": self.installation,
            "replica": self.replica,
            "release": crate::version::VERSION,
            "revision": crate::version::REVISION,
            "environment": self.environment,
            "schema": self.schema,
            "started_at": self.started_at,
            "broker": {
                "state": broker.state.as_str(),
                "reconnects": broker.reconnects,
                "last_error": broker.last_error,
                "address": broker.address,
            },
            "database": self.database.read(),
            "jobs": jobs,
            "alerts": self.alerts.active(),
            "circuits": ShownCircuit::all(&self.circuits.open_circuits(), Utc::now()),
            "sending_rate": self.sending_rate.as_ref().map(|rate| rate.read()),
        })
    }
}
