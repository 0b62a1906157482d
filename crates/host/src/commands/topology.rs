//! `worker-host topology declare`: declares the exchanges, queues, retry tiers and dead
//! letters, then exits, as the host's start does ([`crate::topology`]).

use tracing::Instrument;

use crate::exit::Fatal;
use crate::settings::Settings;
use crate::topology::declare_topology;

/// `worker-host topology declare`: declares the exchanges, queues, retry tiers and dead
/// letters, then exits.
pub async fn declare(settings: &Settings) -> Result<(), Fatal> {
    declare_topology(settings)
        .instrument(tracing::info_span!("topology.declare"))
        .await
}
