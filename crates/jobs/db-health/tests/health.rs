//! The health monitor against the real PostgreSQL: healthy, then its database is dropped
//! (unhealthy, one transition), then recreated (healthy again, one more transition); on a
//! connection of its own, so that a starved shared pool or a terminated session is not a
//! database that is down.

use std::time::Duration;

use job_db_health::{DbHealth, DbHealthConfig, HealthStatus};
use sqlx::Connection;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use tokio_util::sync::CancellationToken;
use worker_core::{NoLease, SkipIfBusy, TickOutcome, WorkContext, tick_once};
use worker_testkit::TestDb;

const TICK: Duration = Duration::from_secs(10);

async fn tick(job: &DbHealth, busy: &SkipIfBusy) -> String {
    let ctx = WorkContext::new("db-health", CancellationToken::new());
    match tick_once(job, busy, None::<&NoLease>, TICK, &ctx).await {
        TickOutcome::Ran(report) => report.detail.unwrap_or_default(),
        other => panic!("the health tick should always run, got {other:?}"),
    }
}

async fn admin(sql: &str) -> anyhow::Result<()> {
    let mut conn = sqlx::PgConnection::connect(&worker_testkit::database_url()).await?;
    sqlx::query(sql).execute(&mut conn).await?;
    conn.close().await?;
    Ok(())
}

#[tokio::test]
async fn healthy_then_gone_then_back_with_one_transition_each_way() -> anyhow::Result<()> {
    let db = TestDb::create().await?;
    let pool = PgPoolOptions::new()
        .max_connections(2)
        .acquire_timeout(Duration::from_secs(2))
        .connect(&db.url)
        .await?;
    let job = DbHealth::beside(
        &pool,
        DbHealthConfig {
            probe_timeout: Duration::from_secs(3),
            unhealthy_after: 1,
        },
    );
    let handle = job.handle();
    let busy = SkipIfBusy::new("db-health");
    assert!(
        handle.readiness(None).is_err(),
        "not ready before the first probe"
    );

    let detail = tick(&job, &busy).await;
    let s = handle.snapshot();
    assert!(s.healthy, "{detail}");
    assert_eq!(s.status, HealthStatus::Healthy);
    assert!(s.latency.is_some_and(|l| l < Duration::from_secs(3)));
    assert!(s.checked_at.is_some());
    assert_eq!((s.consecutive_failures, s.transitions), (0, 0));
    assert!(handle.readiness(Some(Duration::from_secs(60))).is_ok());

    // The server side of the pool goes away.
    admin(&format!(r#"DROP DATABASE "{}" WITH (FORCE)"#, db.name)).await?;
    for _ in 0..3 {
        tick(&job, &busy).await;
    }
    let s = handle.snapshot();
    assert!(!s.healthy);
    assert_eq!(s.status, HealthStatus::Unhealthy);
    assert_eq!(s.consecutive_failures, 3);
    assert_eq!(s.transitions, 1, "three failed probes, one transition");
    assert!(s.last_error.is_some());
    assert!(
        s.latency.is_some_and(|l| l <= Duration::from_secs(4)),
        "bounded by the probe timeout: {:?}",
        s.latency
    );
    let why = handle.readiness(None).unwrap_err();
    assert!(why.contains("unhealthy"), "{why}");

    // It comes back (an empty database of the same name is enough for `SELECT 1`).
    admin(&format!(r#"CREATE DATABASE "{}""#, db.name)).await?;
    let mut detail = String::new();
    for _ in 0..20 {
        detail = tick(&job, &busy).await;
        if handle.is_healthy() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let s = handle.snapshot();
    assert!(s.healthy, "healthy again: {detail}");
    assert_eq!(s.consecutive_failures, 0);
    assert_eq!(s.transitions, 2);
    assert_eq!(s.last_error, None);
    tick(&job, &busy).await;
    assert_eq!(
        handle.snapshot().transitions,
        2,
        "staying healthy is no transition"
    );
    pool.close().await;
    Ok(())
}

#[tokio::test]
async fn a_closed_port_is_unhealthy_within_the_probe_timeout() -> anyhow::Result<()> {
    // Nothing listens on port 9 of loopback: a connect is refused at once.
    let options: PgConnectOptions = "postgres://nobody:nothing@127.0.0.1:9/none".parse()?;
    let job = DbHealth::new(
        options,
        DbHealthConfig {
            probe_timeout: Duration::from_secs(1),
            unhealthy_after: 2,
        },
    );
    let busy = SkipIfBusy::new("db-health");
    let started = std::time::Instant::now();
    tick(&job, &busy).await;
    let s = job.handle().snapshot();
    assert_eq!(
        s.status,
        HealthStatus::Unknown,
        "one failure is under the threshold of two, and nothing good is known"
    );
    tick(&job, &busy).await;
    let s = job.handle().snapshot();
    assert_eq!(s.status, HealthStatus::Unhealthy);
    assert_eq!(
        s.transitions, 0,
        "unknown to unhealthy is the first status, not a change"
    );
    assert!(started.elapsed() < Duration::from_secs(5));
    Ok(())
}

#[tokio::test]
async fn a_cancelled_tick_records_nothing() -> anyhow::Result<()> {
    let db = TestDb::create().await?;
    let job = DbHealth::beside(&db.pool, DbHealthConfig::default());
    let cancel = CancellationToken::new();
    cancel.cancel();
    let ctx = WorkContext::new("db-health", cancel);
    let outcome = tick_once(
        &job,
        &SkipIfBusy::new("db-health"),
        None::<&NoLease>,
        TICK,
        &ctx,
    )
    .await;
    assert_eq!(outcome, TickOutcome::Cancelled);
    assert_eq!(job.handle().snapshot().probes, 0);
    Ok(())
}

/// Every connection of the shared pool is held (slow SMTP sends, say): the probe, on its own
/// connection, still answers at once, and readiness stays up.
#[tokio::test]
async fn a_starved_shared_pool_does_not_make_the_database_unhealthy() -> anyhow::Result<()> {
    let db = TestDb::create().await?;
    let shared = PgPoolOptions::new()
        .max_connections(2)
        .acquire_timeout(Duration::from_secs(3))
        .connect(&db.url)
        .await?;
    let job = DbHealth::beside(
        &shared,
        DbHealthConfig {
            probe_timeout: Duration::from_secs(2),
            unhealthy_after: 1,
        },
    );
    let busy = SkipIfBusy::new("db-health");
    let held = [shared.acquire().await?, shared.acquire().await?];
    assert_eq!(shared.num_idle(), 0, "the shared pool is exhausted");
    for _ in 0..3 {
        let started = std::time::Instant::now();
        let detail = tick(&job, &busy).await;
        let s = job.handle().snapshot();
        assert!(s.healthy, "a starved pool is not a sick database: {detail}");
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "the probe waited on the pool: {:?}",
            started.elapsed()
        );
    }
    assert!(
        job.handle()
            .readiness(Some(Duration::from_secs(60)))
            .is_ok()
    );
    drop(held);
    shared.close().await;
    Ok(())
}

/// The probe's own session is terminated between two probes: the next probe opens a fresh
/// connection and stays healthy, with no transition.
#[tokio::test]
async fn a_terminated_probe_session_is_not_an_outage() -> anyhow::Result<()> {
    let db = TestDb::create().await?;
    let job = DbHealth::beside(&db.pool, DbHealthConfig::default());
    let busy = SkipIfBusy::new("db-health");
    tick(&job, &busy).await;
    assert!(job.handle().is_healthy());
    let terminated: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM (SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
         WHERE datname = $1 AND application_name = 'worker-host health probe') AS t",
    )
    .bind(&db.name)
    .fetch_one(&db.pool)
    .await?;
    assert_eq!(terminated, 1, "the probe holds one connection of its own");
    let detail = tick(&job, &busy).await;
    let s = job.handle().snapshot();
    assert!(s.healthy, "{detail}");
    assert_eq!((s.consecutive_failures, s.transitions), (0, 0));
    Ok(())
}
