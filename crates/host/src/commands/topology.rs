//! `worker-host topology declare`: declares the exchanges, queues, retry tiers and dead
//! letters, then exits. The host's start declares the same way.

use tracing::Instrument;

use crate::connections;
use crate::exit::Fatal;
use crate::settings::Settings;

/// `worker-host topology declare`: declares the exchanges, queues, retry tiers and dead
/// letters, then exits.
pub async fn declare(settings: &Settings) -> Result<(), Fatal> {
    declare_topology(settings)
        .instrument(tracing::info_span!("topology.declare"))
        .await
}

/// A topology that cannot be declared: a conflict with an existing queue is the operator's
/// to resolve (the message says how), so it ends the start like a bad setting.
pub(crate) fn topology_failure(e: worker_broker::TopologyError) -> Fatal {
    match e {
        worker_broker::TopologyError::Conflict(_)
        | worker_broker::TopologyError::Invalid { .. } => Fatal::usage(e),
        other => Fatal::unavailable(other),
    }
}

/// Reaches the broker (bounded retries) and declares the whole topology on it, idempotently.
pub(crate) async fn declare_topology(settings: &Settings) -> Result<(), Fatal> {
    let topology = settings.topology().map_err(topology_failure)?;
    let connection_settings = connections::broker_connection(settings);
    let session =
        connections::connect_broker(&connection_settings, settings.broker.connect_attempts)
            .await
            .map_err(Fatal::unavailable)?;
    let declared = session.declare(&topology).await.map_err(topology_failure);
    if let Err(e) = session.close("topology declared").await {
        tracing::debug!(error = %e, "closing the declaring connection");
    }
    declared?;
    tracing::info!(queues = topology.queues.len(), "broker topology declared");
    Ok(())
}
