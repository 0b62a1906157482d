//! The broker's topology declared at the host's start and by `worker-host topology declare`:
//! the exchanges, queues, retry tiers and dead letters, on a connection of its own that is
//! closed once they are.

use std::time::Duration;

use crate::connections;
use crate::exit::Fatal;
use crate::settings::Settings;

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
/// A declare that fails because the node went away (a silent one is caught by the
/// heartbeats) is tried again on the next address; a conflict is the operator's and ends it.
pub(crate) async fn declare_topology(settings: &Settings) -> Result<(), Fatal> {
    let topology = settings.topology().map_err(topology_failure)?;
    let connection_settings = connections::broker_connection(settings).map_err(Fatal::usage)?;
    let attempts = settings.broker.connect_attempts.max(1);
    let mut rotation = worker_broker::Rotation::new(connection_settings.addresses.len());
    let mut declares = 0;
    let mut backoff =
        worker_core::Backoff::doubling(Duration::from_millis(500), Duration::from_secs(10));
    loop {
        let (session, index) =
            connections::connect_broker_from(&connection_settings, attempts, &mut rotation)
                .await
                .map_err(Fatal::unavailable)?;
        let declared = session.declare(&topology).await;
        if let Err(e) = session.close("topology declared").await {
            tracing::debug!(error = %e, "closing the declaring connection");
        }
        declares += 1;
        let why = match declared {
            Ok(()) => break,
            Err(e) if !e.is_transient() || declares >= attempts => {
                return Err(topology_failure(e));
            }
            Err(e) => worker_core::error_chain(&e),
        };
        let server = connection_settings
            .addresses
            .get(index)
            .map(|address| connection_settings.server_at(address))
            .unwrap_or_default();
        tracing::warn!(%server, error = %why, "declaring the topology failed; trying again");
        rotation.leave(index);
        // Another node is tried at once; the one node of a single broker after a wait.
        if rotation.next() == index {
            tokio::time::sleep(backoff.next_wait()).await;
        }
    }
    tracing::info!(queues = topology.queues.len(), "broker topology declared");
    Ok(())
}
