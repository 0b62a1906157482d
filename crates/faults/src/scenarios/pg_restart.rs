//! `pg-restart`: a private PostgreSQL cluster, the host's only database server, restarted in
//! fast mode.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::Context;

use super::{Fault, Load, Scenario};
use crate::pg_cluster::{ForScenario as _, PgCluster};
use crate::run::{Run, Setup};

pub fn scenario() -> Scenario {
    Scenario {
        name: "pg-restart",
        about: "The scenario starts a PostgreSQL cluster of its own (`initdb` from Debian's \
                binaries, its own port, data and socket folders under the temporary folder, \
                127.0.0.1 only, the `worker_host` role; removed at the end): the scenario's \
                database lives there and the host's `database.port` points at it. At a random \
                moment of each repetition, `pg_ctl restart -m fast` of that cluster: every \
                session ends, the server checkpoints, stops and starts again (well under a \
                second here). Not disruptive: the shared PostgreSQL is untouched. \"Ready \
                again\" is from `pg_ctl restart`'s return (the server accepting connections).",
        fault: Some(|| Box::new(PgRestart::default())),
        full: Load {
            repetitions: 5,
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
struct PgRestart {
    cluster: Option<PgCluster>,
}

#[async_trait::async_trait]
impl Fault for PgRestart {
    async fn prepare(&mut self, dir: &Path) -> anyhow::Result<Setup> {
        let (cluster, setup) = PgCluster::for_scenario(dir).await?;
        self.cluster = Some(cluster);
        Ok(setup)
    }

    async fn apply(&mut self, run: &mut Run) -> anyhow::Result<()> {
        let cluster = self.cluster.as_ref().context("no private cluster")?;
        cluster.restart_fast().await?;
        run.record_ready_after(Instant::now()).await
    }
}
