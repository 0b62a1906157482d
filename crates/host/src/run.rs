//! The host's lifecycle: reach the services, migrate, serve the admin endpoints, run until
//! a signal, then shut down within the grace period.

use std::sync::Arc;

use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::Instrument;

use crate::admin::{self, AdminState, ReadinessCheck};
use crate::connections::{self, BrokerCheck, DatabaseCheck};
use crate::exit;
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

/// `worker-host run`: runs until SIGTERM or SIGINT, then stops within the grace period.
pub async fn run(settings: Settings) -> Result<(), Fatal> {
    let shutdown = CancellationToken::new();
    let tracker = TaskTracker::new();

    let (pool, broker) = async {
        let pool = worker_store::connect(&connections::pool_options(&settings.database))
            .await
            .map_err(Fatal::unavailable)?;
        if settings.database.migrate_on_start {
            worker_store::migrate(&pool).await.map_err(|e| Fatal::software(format!("migrating the database: {e}")))?;
        }
        let broker = Arc::new(connections::connect_broker(&settings.broker).await.map_err(Fatal::unavailable)?);
        tracing::info!(
            database = %format!("{}:{}/{}", settings.database.host, settings.database.port, settings.database.name),
            broker = %connections::broker_address(&settings.broker),
            "connected"
        );
        Ok::<_, Fatal>((pool, broker))
    }
    .instrument(tracing::info_span!("host.start", installation = %settings.installation))
    .await?;

    if settings.admin.enabled {
        let checks: Vec<Box<dyn ReadinessCheck>> = vec![
            Box::new(DatabaseCheck(pool.clone())),
            Box::new(BrokerCheck(broker.clone())),
        ];
        let server = admin::serve(
            settings.admin.listen,
            AdminState::new(checks),
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
    if let Err(e) = broker.close(200, "worker host shutting down".into()).await {
        tracing::debug!(error = %e, "closing the broker connection");
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
