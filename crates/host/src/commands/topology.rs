//! `worker-host topology declare`: declares the exchanges, queues, retry tiers and dead
//! letters, then exits, as the host's start does ([`crate::topology`]).

use tracing::Instrument;

use crate::exit::Fatal;
use crate::settings::Settings;
use crate::topology::declare_topology;

#[derive(Debug, clap::Subcommand)]
pub enum TopologyAction {
    /// Declare the exchanges, the consumer queues, their retry tiers and dead letters
    /// (idempotent; `run` does the same at start). A queue that exists with other arguments
    /// is reported with the argument that differs and how to resolve it.
    Declare,
}

/// `worker-host topology declare`: declares the exchanges, queues, retry tiers and dead
/// letters, then exits.
pub async fn declare(settings: &Settings) -> Result<(), Fatal> {
    declare_topology(settings)
        .instrument(tracing::info_span!("topology.declare"))
        .await
}
