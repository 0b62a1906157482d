//! The host's lifecycle: reach the services, migrate, serve the admin endpoints, run until
//! a signal, then shut down within the grace period.

use std::sync::Arc;

use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::Instrument;

use crate::admin::{self, AdminState, ReadinessCheck};
use crate::alerts::AlertBook;
use crate::connections::{self, BrokerCheck, DatabaseCheck};
use crate::exit;
use crate::jobs::{self, JobsContext};
use crate::metrics::{Metrics, PrometheusReader};
use crate::sampler;
use crate::settings::Settings;
use crate::status::{Reading, StatusBoard};
use worker_store::{AdvisoryLease, AttemptLog};

/// A failure that ends the host, with the exit code it ends with.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct Fatal {
    pub code: i32,
    pub message: String,
}

impl Fatal {
    fn unavailable(e: impl std::fmt::Display) -> Self {
        Self {
            code: exit::UNAVAILABLE,
            message: e.to_string(),
        }
    }
    fn software(e: impl std::fmt::Display) -> Self {
        Self {
            code: exit::SOFTWARE,
            message: e.to_string(),
        }
    }
}

/// A topology that cannot be declared: a conflict with an existing queue is the operator's
/// to resolve (the message says how), so it ends the start like a bad setting.
fn topology_failure(e: worker_broker::TopologyError) -> Fatal {
    match e {
        worker_broker::TopologyError::Conflict(_)
        | worker_broker::TopologyError::Invalid { .. } => Fatal {
            code: exit::USAGE,
            message: e.to_string(),
        },
        other => Fatal::unavailable(other),
    }
}

/// Reaches the broker (bounded retries) and declares the whole topology on it, idempotently.
async fn declare_topology(settings: &Settings) -> Result<(), Fatal> {
    let topology = settings.topology().map_err(topology_failure)?;
    let connection_settings = connections::broker_connection(settings);
    let connection =
        connections::connect_broker(&connection_settings, settings.broker.connect_attempts)
            .await
            .map_err(Fatal::unavailable)?;
    let declared = async {
        let channel = connection.create_channel().await.map_err(|e| {
            Fatal::unavailable(format!(
                "opening a channel on {}: {e}",
                connection_settings.server()
            ))
        })?;
        let declared = worker_broker::declare(&channel, &topology)
            .await
            .map_err(topology_failure);
        // Closed before the connection, so that lapin does not report a channel torn down
        // under it as a connection error. A failed declare has closed it already.
        if declared.is_ok() {
            let _ = channel.close(200, "topology declared".into()).await;
        }
        declared
    }
    .await;
    if let Err(e) = connection.close(200, "topology declared".into()).await {
        tracing::debug!(error = %e, "closing the declaring connection");
    }
    declared?;
    tracing::info!(queues = topology.queues.len(), "broker topology declared");
    Ok(())
}

/// `worker-host topology declare`: declares the exchanges, queues, retry tiers and dead
/// letters, then exits.
pub async fn topology(settings: &Settings) -> Result<(), Fatal> {
    declare_topology(settings)
        .instrument(tracing::info_span!("topology.declare"))
        .await
}

/// `worker-host migrate`: applies the embedded migrations.
pub async fn migrate(settings: &Settings) -> Result<(), Fatal> {
    let span = tracing::info_span!("migrate", installation = %settings.installation);
    async {
        let pool = worker_store::connect(&connections::pool_options(&settings.database))
            .await
            .map_err(Fatal::unavailable)?;
        worker_store::migrate(&pool)
            .await
            .map_err(|e| Fatal::software(format!("migrating the database: {e}")))?;
        tracing::info!("migrations applied");
        pool.close().await;
        Ok(())
    }
    .instrument(span)
    .await
}

/// What `run` reports through: the instruments and the reader behind `/metrics`.
#[derive(Debug, Clone)]
pub struct Observability {
    pub metrics: Metrics,
    pub prometheus: PrometheusReader,
}

/// `worker-host run`: runs until SIGTERM or SIGINT, then stops within the grace period.
pub async fn run(settings: Settings, observability: Observability) -> Result<(), Fatal> {
    let shutdown = CancellationToken::new();
    let tracker = TaskTracker::new();

    let (pool, supervisor) = async {
        let pool = worker_store::connect(&connections::pool_options(&settings.database))
            .await
            .map_err(Fatal::unavailable)?;
        if settings.database.migrate_on_start {
            worker_store::migrate(&pool)
                .await
                .map_err(|e| Fatal::software(format!("migrating the database: {e}")))?;
        }
        for file in &settings.automations_files {
            let report = job_automation_trigger::import::import_file(&pool, file)
                .await
                .map_err(|e| Fatal {
                    code: exit::USAGE,
                    message: format!("importing automations from {}: {e}", file.display()),
                })?;
            tracing::info!(file = %file.display(), "automations imported:\n{report}");
        }
        declare_topology(&settings).await?;
        let topology = settings.topology().map_err(topology_failure)?;
        let supervisor =
            worker_broker::Supervisor::new(connections::broker_connection(&settings), topology);
        Ok::<_, Fatal>((pool, supervisor))
    }
    .instrument(tracing::info_span!("host.start", installation = %settings.installation))
    .await?;

    // The supervisor reconnects and redeclares for as long as the host runs; after shutdown
    // starts it keeps the connection up until the consumers have let go of it.
    tracker.spawn(supervisor.clone().run(shutdown.clone()));

    let settings = Arc::new(settings);
    let (attempt_log, attempt_writer) =
        AttemptLog::new(pool.clone(), &settings.workers.attempt_log);
    tracker.spawn(attempt_writer.run(shutdown.child_token()));
    let jobs_context = JobsContext {
        settings: settings.clone(),
        pool: pool.clone(),
        publisher: supervisor.publisher(settings.broker.publisher.clone()),
        supervisor: supervisor.clone(),
        lease: Arc::new(AdvisoryLease::new(pool.clone())),
        attempt_log,
        metrics: observability.metrics.clone(),
        tracker: tracker.clone(),
        shutdown: shutdown.clone(),
    };
    let started = jobs::start_all(&jobs_context).map_err(|e| Fatal {
        code: exit::USAGE,
        message: e.to_string(),
    })?;

    // Readings for the gauges and the alerts. No alert touches readiness: restarting the
    // host cures none of them.
    let alerts = Arc::new(AlertBook::default());
    let readings = Arc::new(std::sync::RwLock::new(sampler::Readings::default()));
    sampler::register_gauges(&observability.metrics, readings.clone());
    tracker.spawn(sampler::run(
        sampler::Sources {
            pool: pool.clone(),
            supervisor: supervisor.clone(),
            health: started.health.clone(),
            stuck_after: settings.jobs.reconciler.job.stuck_after,
        },
        readings,
        alerts.clone(),
        settings.alerts.clone(),
        shutdown.child_token(),
    ));

    if settings.admin.enabled {
        let checks: Vec<Box<dyn ReadinessCheck>> = vec![
            Box::new(DatabaseCheck {
                health: started.health.clone(),
                stale_after: settings.jobs.db_health.timeout() * 3,
            }),
            Box::new(BrokerCheck(supervisor.status())),
        ];
        let board = StatusBoard {
            installation: settings.installation.clone(),
            started_at: chrono::Utc::now(),
            jobs: started.entries,
            broker: supervisor.status(),
            alerts: alerts.clone(),
            database: Arc::new(DatabaseReading(started.health.clone())),
        };
        let server = admin::serve(
            settings.admin.listen,
            AdminState::new(checks)
                .with_metrics(observability.prometheus.clone())
                .with_status(board),
            shutdown.clone(),
        )
        .await
        .map_err(Fatal::unavailable)?;
        tracker.spawn(async move {
            if let Err(e) = server.await {
                tracing::error!(error = %e, "the admin server stopped");
            }
        });
    }
    tracker.close();

    tracing::info!(installation = %settings.installation, "worker host running");
    wait_for_signal().await;
    tracing::info!(grace = ?settings.workers.shutdown_grace, "shutting down");
    shutdown.cancel();
    if tokio::time::timeout(settings.workers.shutdown_grace, tracker.wait())
        .await
        .is_err()
    {
        tracing::warn!(grace = ?settings.workers.shutdown_grace, "work still in flight at the end of the grace period was abandoned");
    }
    pool.close().await;
    tracing::info!("stopped");
    Ok(())
}

async fn wait_for_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match (
            signal(SignalKind::terminate()),
            signal(SignalKind::interrupt()),
        ) {
            (Ok(mut term), Ok(mut int)) => {
                tokio::select! {
                    _ = term.recv() => tracing::info!("SIGTERM received"),
                    _ = int.recv() => tracing::info!("SIGINT received"),
                }
            }
            _ => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}

/// `worker-host status`: asks the running host's admin endpoint.
pub async fn status(settings: &Settings) -> Result<(), Fatal> {
    let url = format!("http://{}/status", settings.admin.listen);
    let response = reqwest::get(&url)
        .await
        .map_err(|e| Fatal::unavailable(format!("no host answers at {url}: {e}")))?;
    if !response.status().is_success() {
        return Err(Fatal::unavailable(format!(
            "{url} answered {}",
            response.status()
        )));
    }
    let body: serde_json::Value = response
        .json()
        .await
        .map_err(|e| Fatal::software(format!("{url}: {e}")))?;
    println!(
        "{}",
        serde_json::to_string_pretty(&body).unwrap_or_default()
    );
    Ok(())
}

/// The database line of `/status`: what the health monitor last saw.
#[derive(Debug)]
struct DatabaseReading(job_db_health::HealthHandle);

impl Reading for DatabaseReading {
    fn read(&self) -> serde_json::Value {
        serde_json::to_value(self.0.snapshot()).unwrap_or_default()
    }
}

/// `worker-host outbox status|retry`.
pub async fn outbox(settings: &Settings, action: crate::cli::OutboxAction) -> Result<(), Fatal> {
    use crate::cli::OutboxAction;
    use worker_store::outbox;
    let pool = worker_store::connect(&connections::pool_options(&settings.database))
        .await
        .map_err(Fatal::unavailable)?;
    let failed = |e: worker_core::Failure| Fatal::software(format!("the outbox: {e}"));
    match action {
        OutboxAction::Status { json } => {
            let status = outbox::status(&pool).await.map_err(failed)?;
            let rows = outbox::failed(&pool, 50).await.map_err(failed)?;
            if json {
                let body = serde_json::json!({"status": status, "failed_rows": rows});
                println!(
                    "{}",
                    serde_json::to_string_pretty(&body).unwrap_or_default()
                );
            } else {
                let oldest = status
                    .oldest_pending_age
                    .map(|d| {
                        humantime::format_duration(std::time::Duration::from_secs(d.as_secs()))
                            .to_string()
                    })
                    .unwrap_or_else(|| "-".into());
                println!(
                    "pending {}  (retrying {})  failed {}  oldest pending {oldest}",
                    status.pending, status.retrying, status.failed
                );
                if !rows.is_empty() {
                    println!(
                        "\n{:>8}  {:<36}  {:<18}  {:>8}  last error",
                        "id", "message id", "routing key", "attempts"
                    );
                    for row in rows {
                        println!(
                            "{:>8}  {:<36}  {:<18}  {:>8}  {}",
                            row.id,
                            row.message_id,
                            row.routing_key,
                            row.attempts,
                            row.last_error
                                .unwrap_or_default()
                                .chars()
                                .take(100)
                                .collect::<String>()
                        );
                    }
                }
            }
        }
        OutboxAction::Retry { id: Some(id), .. } => {
            match outbox::retry(&pool, id).await.map_err(failed)? {
                outbox::RetryResult::Requeued => println!("outbox row {id} is pending again"),
                outbox::RetryResult::AlreadyProcessed => {
                    println!("outbox row {id} was published already; nothing to do")
                }
                outbox::RetryResult::NotFound => {
                    return Err(Fatal {
                        code: exit::USAGE,
                        message: format!("no outbox row has id {id}"),
                    });
                }
            }
        }
        OutboxAction::Retry { id: None, .. } => {
            let count = outbox::retry_all_failed(&pool).await.map_err(failed)?;
            println!("{count} failed outbox rows are pending again");
        }
    }
    pool.close().await;
    Ok(())
}

/// `worker-host automations import FILE`.
pub async fn automations(
    settings: &Settings,
    action: crate::cli::AutomationsAction,
) -> Result<(), Fatal> {
    let crate::cli::AutomationsAction::Import { file, dry_run } = action;
    let invalid = |e: job_automation_trigger::import::ImportError| Fatal {
        code: exit::USAGE,
        message: format!("{}: {e}", file.display()),
    };
    if dry_run {
        let definitions = job_automation_trigger::import::load_file(&file).map_err(invalid)?;
        println!(
            "{}: {} automations, all valid",
            file.display(),
            definitions.len()
        );
        return Ok(());
    }
    let pool = worker_store::connect(&connections::pool_options(&settings.database))
        .await
        .map_err(Fatal::unavailable)?;
    let report = job_automation_trigger::import::import_file(&pool, &file)
        .await
        .map_err(invalid)?;
    println!("{report}");
    pool.close().await;
    Ok(())
}
