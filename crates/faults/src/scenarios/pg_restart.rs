//! `pg-restart`: the shared PostgreSQL restarted in fast mode (disruptive).

use std::time::{Duration, Instant};

use super::{DEFAULT_HEARTBEAT, Fault, Load, Scenario};
use crate::run::Run;
use crate::services;

pub fn scenario() -> Scenario {
    Scenario {
        name: "pg-restart",
        about: "At a random moment of each repetition, `pg_ctlcluster <version> <name> restart -m \
                fast` of the local cluster (found by its port in `pg_lsclusters`, as \
                `scripts/services.sh` does): every session of every database ends, and \
                PostgreSQL is down for the restart's length. Disruptive (the server is shared): \
                run only when named or with `--disruptive`. \"Ready again\" is from the \
                restart command's return.",
        fault: Some(|| Box::new(PgRestart)),
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
        heartbeat: DEFAULT_HEARTBEAT,
        disruptive: true,
    }
}

/// The fault: see [`scenario`]'s description.
struct PgRestart;

#[async_trait::async_trait]
impl Fault for PgRestart {
    async fn apply(&mut self, run: &mut Run) -> anyhow::Result<()> {
        apply(run).await
    }
}

async fn apply(run: &mut Run) -> anyhow::Result<()> {
    let (version, name) = services::pg_cluster().await?;
    services::command("pg_ctlcluster", &[&version, &name, "restart", "-m", "fast"]).await?;
    run.record_ready_after(Instant::now()).await
}
