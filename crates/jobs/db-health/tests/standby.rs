//! The health monitor beside a pool that follows the primary of a replica set (the kit's
//! private clusters): a standby is not healthy, and after a failover the probe follows the
//! pool to the promoted member.
//!
//! Needs Debian's PostgreSQL server binaries; skipped without.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use job_db_health::{DbHealth, DbHealthConfig, HealthStatus};
use sqlx::postgres::PgConnectOptions;
use tokio_util::sync::CancellationToken;
use worker_core::{NoLease, SkipIfBusy, TickOutcome, WorkContext, tick_once};
use worker_store::{Member, PoolOptions};
use worker_testkit::wait::eventually;
use worker_testkit::{PgReplicaSet, Replication};

async fn probe(job: &DbHealth) -> HealthStatus {
    let ctx = WorkContext::new("db-health", CancellationToken::new());
    let busy = SkipIfBusy::new("db-health");
    match tick_once(job, &busy, None::<&NoLease>, Duration::from_secs(10), &ctx).await {
        TickOutcome::Ran(_) => job.handle().snapshot().status,
        other => panic!("the health tick should always run, got {other:?}"),
    }
}

fn config() -> DbHealthConfig {
    DbHealthConfig {
        probe_timeout: Duration::from_secs(3),
        unhealthy_after: 1,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standby_is_unhealthy_and_the_probe_follows_the_pool_to_the_promoted_member()
-> anyhow::Result<()> {
    if !std::path::Path::new("/usr/lib/postgresql").exists() {
        eprintln!("no PostgreSQL server binaries: skipped");
        return Ok(());
    }
    let mut set = PgReplicaSet::start(Replication::Asynchronous, None).await?;

    // The standby on its own: it answers, but is no primary.
    let standby_url = set.standby().admin_url();
    let alone = DbHealth::new(standby_url.parse::<PgConnectOptions>()?, config());
    assert_eq!(probe(&alone).await, HealthStatus::Unhealthy);
    let why = alone.handle().snapshot().last_error.unwrap_or_default();
    assert!(why.contains("standby"), "{why}");

    let connected = worker_store::connect_watched(&PoolOptions {
        connect: set.admin_url().parse()?,
        members: set
            .hosts()
            .iter()
            .map(|h| h.parse::<Member>())
            .collect::<Result<_, _>>()?,
        max_connections: 2,
        min_connections: 0,
        acquire_timeout: Duration::from_secs(5),
        connect_attempts: 1,
        connect_backoff: Duration::from_millis(100),
        ping_if_idle_for: worker_store::PING_IF_IDLE_FOR,
    })
    .await?;
    let watch = connected.primary.expect("a watch");
    let job = DbHealth::beside(&connected.pool, config());
    assert_eq!(probe(&job).await, HealthStatus::Healthy);

    set.kill_primary().await?;
    assert_eq!(probe(&job).await, HealthStatus::Unhealthy);
    set.promote_standby().await?;
    let promoted = set.hosts()[1].clone();
    eventually(
        "the pool on the promoted member",
        Duration::from_secs(10),
        || {
            let watch = watch.clone();
            let promoted = promoted.clone();
            async move { Ok((watch.status().primary.as_deref() == Some(&promoted)).then_some(())) }
        },
    )
    .await?;
    assert_eq!(probe(&job).await, HealthStatus::Healthy);
    connected.pool.close().await;
    Ok(())
}
