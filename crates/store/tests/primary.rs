//! The pool on a database with a standby (the kit's [`PgReplicaSet`], each test its own
//! private clusters): it connects to the member that takes writes, refuses a standby, and
//! follows the primary when the standby is promoted.
//!
//! Needs Debian's PostgreSQL server binaries (as the kit's clusters do); skipped without.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use sqlx::PgPool;
use sqlx::postgres::PgConnectOptions;
use worker_store::primary::MemberRole;
use worker_store::{ConnectError, Member, PING_IF_IDLE_FOR, PoolOptions};
use worker_testkit::wait::eventually;
use worker_testkit::{PgReplicaSet, Replication};

const POOL_SIZE: u32 = 4;

fn have_binaries() -> bool {
    let found = std::path::Path::new("/usr/lib/postgresql").exists();
    if !found {
        eprintln!("no PostgreSQL server binaries: skipped");
    }
    found
}

/// The pool's options for `members` (`127.0.0.1:<port>` each) of `set`.
fn options(set: &PgReplicaSet, members: &[String]) -> PoolOptions {
    PoolOptions {
        connect: set.admin_url().parse::<PgConnectOptions>().unwrap(),
        members: members
            .iter()
            .map(|m| m.parse::<Member>().unwrap())
            .collect(),
        max_connections: POOL_SIZE,
        min_connections: 1,
        acquire_timeout: Duration::from_secs(5),
        connect_attempts: 2,
        connect_backoff: Duration::from_millis(100),
        ping_if_idle_for: PING_IF_IDLE_FOR,
    }
}

/// The port and recovery state of the server each of `POOL_SIZE` connections held at once
/// reached.
async fn every_connection(pool: &PgPool) -> anyhow::Result<Vec<(i32, bool)>> {
    let mut held = Vec::new();
    let mut seen = Vec::new();
    for _ in 0..POOL_SIZE {
        let mut conn = pool.acquire().await?;
        let row: (i32, bool) = sqlx::query_as("SELECT inet_server_port(), pg_is_in_recovery()")
            .fetch_one(&mut *conn)
            .await?;
        seen.push(row);
        held.push(conn);
    }
    Ok(seen)
}

async fn write(pool: &PgPool, n: i32) -> Result<(), sqlx::Error> {
    sqlx::query("INSERT INTO pool_members (n) VALUES ($1)")
        .bind(n)
        .execute(pool)
        .await
        .map(|_| ())
}

async fn create_table(set: &PgReplicaSet) -> anyhow::Result<()> {
    let pool = PgPool::connect(&set.admin_url()).await?;
    sqlx::query("CREATE TABLE pool_members (n int)")
        .execute(&pool)
        .await?;
    pool.close().await;
    set.wait_standby_caught_up(Duration::from_secs(30)).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_second_member_is_the_primary_and_every_connection_goes_to_it() -> anyhow::Result<()> {
    if !have_binaries() {
        return Ok(());
    }
    let set = PgReplicaSet::start(Replication::Asynchronous, None).await?;
    create_table(&set).await?;
    let hosts = set.hosts();
    // pg-b (the standby) first, pg-a (the primary) second.
    let listed = [hosts[1].clone(), hosts[0].clone()];
    let connected = worker_store::connect_watched(&options(&set, &listed)).await?;
    let pool = connected.pool;
    let status = connected.primary.expect("a watch for a list").status();
    assert_eq!(status.primary.as_deref(), Some(hosts[0].as_str()));
    assert_eq!(status.last_survey[0].role, MemberRole::Standby);
    write(&pool, 1).await?;
    for (port, in_recovery) in every_connection(&pool).await? {
        assert_eq!(port, i32::from(set.primary().port));
        assert!(!in_recovery);
    }
    pool.close().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standby_is_refused_for_writes() -> anyhow::Result<()> {
    if !have_binaries() {
        return Ok(());
    }
    let set = PgReplicaSet::start(Replication::Asynchronous, None).await?;
    let standby = set.hosts()[1].clone();
    let err = worker_store::connect(&options(&set, std::slice::from_ref(&standby)))
        .await
        .expect_err("a standby alone takes no writes");
    match &err {
        ConnectError::NoPrimary { answers, .. } => {
            assert!(
                answers.contains(&format!("{standby}: a standby (read-only)")),
                "{err}"
            );
        }
        other => panic!("expected no primary, got {other}"),
    }
    Ok(())
}

/// Kills the primary and promotes the standby (`promote`), or switches over cleanly; the
/// pool's next connections go to the new primary. Returns the time from the promotion's
/// end to the first write that succeeded through the pool.
async fn the_pool_follows(change: Change) -> anyhow::Result<Duration> {
    let mut set = PgReplicaSet::start(Replication::Synchronous, None).await?;
    create_table(&set).await?;
    let hosts = set.hosts();
    let connected = worker_store::connect_watched(&options(&set, &hosts)).await?;
    let (pool, watch) = (connected.pool, connected.primary.expect("a watch"));
    write(&pool, 1).await?;
    assert_eq!(watch.status().primary.as_deref(), Some(hosts[0].as_str()));
    // A listener's pool of its own beside it.
    let own = sqlx::postgres::PgPoolOptions::new()
        .max_connections(1)
        .connect_lazy_with(
            (*pool.connect_options())
                .clone()
                .application_name("companion"),
        );
    worker_store::primary::keep_in_step(&pool, &own);
    match change {
        Change::Failover => {
            set.failover().await?;
        }
        Change::Switchover => set.switchover().await?,
    }
    let promoted = Instant::now();
    let mut n = 1;
    eventually("a write through the pool", Duration::from_secs(30), || {
        n += 1;
        let pool = pool.clone();
        async move { Ok(write(&pool, n).await.ok()) }
    })
    .await?;
    let took = promoted.elapsed();
    let promoted_port = set.members()[1].port;
    eventually("the companion pool in step", Duration::from_secs(5), || {
        let options = own.connect_options();
        async move {
            Ok((options.get_port() == promoted_port
                && options.get_application_name() == Some("companion"))
            .then_some(()))
        }
    })
    .await?;
    own.close().await;
    assert_eq!(watch.status().primary.as_deref(), Some(hosts[1].as_str()));
    assert_eq!(watch.status().switches, 1);
    for (port, in_recovery) in every_connection(&pool).await? {
        assert_eq!(
            port,
            i32::from(set.members()[1].port),
            "every connection to pg-b"
        );
        assert!(!in_recovery);
    }
    let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM pool_members")
        .fetch_one(&pool)
        .await?;
    assert!(
        rows >= 2,
        "the synchronous commit before the change survived ({rows})"
    );
    pool.close().await;
    Ok(took)
}

enum Change {
    Failover,
    Switchover,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_failover_the_pool_connects_to_the_promoted_standby() -> anyhow::Result<()> {
    if !have_binaries() {
        return Ok(());
    }
    let took = the_pool_follows(Change::Failover).await?;
    eprintln!("failover: the first write through the pool {took:?} after the promotion");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_switchover_the_pool_connects_to_the_new_primary() -> anyhow::Result<()> {
    if !have_binaries() {
        return Ok(());
    }
    let took = the_pool_follows(Change::Switchover).await?;
    eprintln!("switchover: the first write through the pool {took:?} after the promotion");
    Ok(())
}

/// A primary turned read-only while it runs (as a failover manager fences the old primary
/// before demoting it): its writes fail with 25006, the follower sees it is no longer the
/// primary, says so, and moves to the standby once that is promoted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_primary_turned_read_only_is_left_for_the_promoted_standby() -> anyhow::Result<()> {
    if !have_binaries() {
        return Ok(());
    }
    let mut set = PgReplicaSet::start(Replication::Asynchronous, None).await?;
    create_table(&set).await?;
    let hosts = set.hosts();
    let connected = worker_store::connect_watched(&options(&set, &hosts)).await?;
    let (pool, watch) = (connected.pool, connected.primary.expect("a watch"));
    write(&pool, 1).await?;

    let mut admin = set.primary().superuser().await?;
    sqlx::query("ALTER SYSTEM SET default_transaction_read_only = on")
        .execute(&mut admin)
        .await?;
    sqlx::query("SELECT pg_reload_conf()")
        .execute(&mut admin)
        .await?;
    let refused = eventually("a write refused", Duration::from_secs(10), || {
        let pool = pool.clone();
        async move { Ok(write(&pool, 2).await.err()) }
    })
    .await?;
    let code = refused
        .as_database_error()
        .and_then(|e| e.code())
        .map(|c| c.into_owned());
    assert_eq!(code.as_deref(), Some("25006"), "{refused}");
    eventually("no primary", Duration::from_secs(10), || {
        let watch = watch.clone();
        async move { Ok(watch.readiness().err()) }
    })
    .await?;

    set.promote_standby().await?;
    eventually(
        "a write on the promoted standby",
        Duration::from_secs(30),
        || {
            let pool = pool.clone();
            async move { Ok(write(&pool, 3).await.ok()) }
        },
    )
    .await?;
    assert_eq!(watch.status().primary.as_deref(), Some(hosts[1].as_str()));
    for (port, _) in every_connection(&pool).await? {
        assert_eq!(port, i32::from(set.members()[1].port));
    }
    pool.close().await;
    Ok(())
}
