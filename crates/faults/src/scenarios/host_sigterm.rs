//! `host-sigterm`: the host stopped with SIGTERM while it has a backlog, then started again.

use std::time::Duration;

use super::{DEFAULT_HEARTBEAT, Fault, Load, Scenario};
use crate::run::Run;

pub fn scenario() -> Scenario {
    Scenario {
        name: "host-sigterm",
        about: "Pings arrive faster than in the other scenarios (25 a second), so the host has a \
                backlog in IMAP and in its queues; at a random moment of each repetition it gets \
                SIGTERM, must exit 0 within 30 s (its `shutdown_grace` is 10 s), and is started \
                again at once. An exit other than 0 fails the scenario. \"Ready again\" is from \
                the new process's start.",
        fault: Some(|| Box::new(HostSigterm)),
        full: Load {
            repetitions: 10,
            per_repetition: 75,
        },
        quick: Load {
            repetitions: 1,
            per_repetition: 50,
        },
        rate_per_sec: 25.0,
        settle: Duration::from_secs(300),
        heartbeat: DEFAULT_HEARTBEAT,
    }
}

/// The fault: see [`scenario`]'s description.
struct HostSigterm;

#[async_trait::async_trait]
impl Fault for HostSigterm {
    async fn apply(&mut self, run: &mut Run) -> anyhow::Result<()> {
        apply(run).await
    }
}

async fn apply(run: &mut Run) -> anyhow::Result<()> {
    run.sigterm_and_restart().await
}
