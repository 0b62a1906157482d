//! The console as this host serves it: the console crate's pages and API
//! ([`worker_console::web`]) over [`HostRuntime`], the host's side of
//! [`worker_console::runtime::Runtime`]: its status board, its sampler's readings, its
//! timers' handles and its consumers' gates. Nothing else of the host reaches the console.

use std::sync::{Arc, RwLock};

use worker_console::runtime::{JobView, Pending, Runtime};
use worker_core::catalog::JobSpec;

use crate::jobs::ConsumerGates;
use crate::sampler::Readings;
use crate::settings::Settings;
use crate::status::{JobStats, StatusBoard};

pub use worker_console::web::{Access, BulkRuns, Console, caller, edit, page, routes, views};

/// The running host, as the console reads and drives it.
#[derive(Debug)]
pub struct HostRuntime {
    pub board: StatusBoard,
    pub readings: Arc<RwLock<Readings>>,
    /// The consumer jobs' pauses as this replica obeys them (`None` when it runs none).
    pub gates: Option<Arc<ConsumerGates>>,
    /// What reaches the broker's dead queues for an erasure.
    pub settings: Arc<Settings>,
}

impl Runtime for HostRuntime {
    fn status(&self) -> serde_json::Value {
        self.board.render()
    }

    fn jobs(&self) -> Vec<JobView> {
        self.board
            .jobs
            .iter()
            .map(|job| match &job.stats {
                JobStats::Consumer { queue, stats } => JobView {
                    name: job.name.clone(),
                    queue: Some(queue.clone()),
                    shown: serde_json::to_value(stats.snapshot()).unwrap_or_default(),
                },
                JobStats::Timer(timer) => JobView {
                    name: job.name.clone(),
                    queue: None,
                    shown: serde_json::to_value(timer.view()).unwrap_or_default(),
                },
            })
            .collect()
    }

    fn readings(&self) -> worker_console::runtime::Readings {
        // A poisoned lock only means a sampler round panicked: its last readings still stand.
        let readings = match self.readings.read() {
            Ok(readings) => readings,
            Err(poisoned) => poisoned.into_inner(),
        };
        worker_console::runtime::Readings {
            queues: readings.queues.clone(),
            dead_letter_depth: readings.dead_letter_depth.clone(),
            dead_letter_inflow_per_minute: readings.dead_letter_inflow_per_minute,
            oldest_dead_letter_age: readings.oldest_dead_letter_age,
            outbox_pending: readings.outbox_pending,
            outbox_failed: readings.outbox_failed,
            outbox_oldest_pending: readings.outbox_oldest_pending,
            db_latency: readings.db_latency,
            stuck_work: readings.stuck_work.clone(),
        }
    }

    fn sending_rate(&self) -> Option<serde_json::Value> {
        self.board.sending_rate.as_ref().map(|rate| rate.read())
    }

    fn run_now(&self, name: &str) -> Option<Result<(), String>> {
        let timer = self.board.timer(name)?;
        Some(timer.run_now().map_err(|refused| refused.to_string()))
    }

    fn stopped_here(&self, name: &str) -> bool {
        self.gates
            .as_ref()
            .is_some_and(|gates| gates.is_closed(name))
    }

    fn job(&self, name: &str) -> Option<&'static JobSpec> {
        crate::settings::find(name)
    }

    fn pausable(&self, name: &str) -> Result<&'static JobSpec, String> {
        crate::jobs::pausable(name)
    }

    fn archive_dead_queues<'a>(
        &'a self,
        pool: &'a sqlx::PgPool,
    ) -> Pending<'a, Result<u64, String>> {
        Box::pin(async move {
            crate::privacy::archive_dead_queues(&self.settings, pool)
                .await
                .map_err(|e| e.to_string())
        })
    }
}
