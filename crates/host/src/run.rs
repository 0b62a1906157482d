//! The host's lifecycle: reach the services, migrate, serve the admin endpoints, run until
//! a signal, then shut down within the grace period.

use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::Instrument;

use crate::admin::{self, AdminState, ReadinessCheck};
use crate::connections::{self, BrokerCheck, DatabaseCheck};
use crate::exit;
use crate::metrics::{Metrics, PrometheusReader};
use crate::settings::Settings;

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
        worker_broker::declare(&channel, &topology)
            .await
            .map_err(topology_failure)
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

    if settings.admin.enabled {
        let checks: Vec<Box<dyn ReadinessCheck>> = vec![
            Box::new(DatabaseCheck(pool.clone())),
            Box::new(BrokerCheck(supervisor.status())),
        ];
        let server = admin::serve(
            settings.admin.listen,
            AdminState::new(checks).with_metrics(observability.prometheus.clone()),
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
