//! `pg-terminate`: every PostgreSQL session of the host terminated at once.

use std::time::{Duration, Instant};

use anyhow::Context;

use super::{DEFAULT_HEARTBEAT, Fault, Load, Scenario};
use crate::run::Run;

pub fn scenario() -> Scenario {
    Scenario {
        name: "pg-terminate",
        about: "At a random moment of each repetition, `pg_terminate_backend` of every session \
                on the scenario's database whose `application_name` starts with `worker-host` \
                (the pool, the outbox listener, the health probe; never the harness's own \
                sessions nor another database's). \"Ready again\" is from the termination.",
        fault: Some(|| Box::new(PgTerminate)),
        full: Load {
            repetitions: 20,
            per_repetition: 20,
        },
        quick: Load {
            repetitions: 1,
            per_repetition: 20,
        },
        rate_per_sec: 10.0,
        settle: Duration::from_secs(180),
        heartbeat: DEFAULT_HEARTBEAT,
    }
}

/// The fault: see [`scenario`]'s description.
struct PgTerminate;

#[async_trait::async_trait]
impl Fault for PgTerminate {
    async fn apply(&mut self, run: &mut Run) -> anyhow::Result<()> {
        apply(run).await
    }
}

async fn apply(run: &mut Run) -> anyhow::Result<()> {
    let at = Instant::now();
    let terminated: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM (SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
         WHERE datname = $1 AND application_name LIKE 'worker-host%' \
         AND pid <> pg_backend_pid()) t",
    )
    .bind(&run.db.name)
    .fetch_one(&run.db.pool)
    .await
    .context("terminating the host's sessions")?;
    anyhow::ensure!(terminated > 0, "the host had no session to terminate");
    run.record_ready_after(at).await
}
