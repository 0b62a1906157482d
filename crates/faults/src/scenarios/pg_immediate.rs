//! `pg-immediate`: a private PostgreSQL cluster, the host's only database server, crashed
//! (immediate stop), left down a few seconds, then started: crash recovery.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::Context;

use super::{Fault, Load, Scenario};
use crate::pg_cluster::{ForScenario as _, PgCluster};
use crate::run::{Run, Setup};

/// How long the server stays down after the immediate stop.
const DOWN: Duration = Duration::from_secs(4);

pub fn scenario() -> Scenario {
    Scenario {
        name: "pg-immediate",
        about: "The scenario starts a PostgreSQL cluster of its own, as `pg-restart` does. At a \
                random moment of each repetition, `pg_ctl stop -m immediate` (every server \
                process killed at once, no checkpoint, as a crash would leave it; transactions \
                in flight are lost to the server, committed ones are in the WAL), 4 s down \
                (the host's connects are refused), then `pg_ctl start`, which replays the WAL \
                (crash recovery) before it accepts connections. \"Ready again\" is from `pg_ctl \
                start`'s return (recovery done, the server accepting connections).",
        fault: Some(|| Box::new(PgImmediate::default())),
        full: Load {
            repetitions: 3,
            per_repetition: 30,
        },
        quick: Load {
            repetitions: 1,
            per_repetition: 20,
        },
        rate_per_sec: 10.0,
        settle: Duration::from_secs(180),
        heartbeat: super::DEFAULT_HEARTBEAT,
    }
}

/// The fault: see [`scenario`]'s description. Holds the private cluster (stopped and removed
/// when the fault is dropped, at the scenario's end).
#[derive(Default)]
struct PgImmediate {
    cluster: Option<PgCluster>,
}

#[async_trait::async_trait]
impl Fault for PgImmediate {
    async fn prepare(&mut self, dir: &Path) -> anyhow::Result<Setup> {
        let (cluster, setup) = PgCluster::for_scenario(dir).await?;
        self.cluster = Some(cluster);
        Ok(setup)
    }

    async fn apply(&mut self, run: &mut Run) -> anyhow::Result<()> {
        let cluster = self.cluster.as_ref().context("no private cluster")?;
        cluster.stop_immediate().await?;
        tokio::time::sleep(DOWN).await;
        cluster.start_again().await?;
        run.record_ready_after(Instant::now()).await
    }
}
