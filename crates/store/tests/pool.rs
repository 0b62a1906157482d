//! The pool's connections on a real server: one that died while idle is replaced before a
//! statement meets it.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use sqlx::postgres::PgConnectOptions;
use worker_store::PING_IF_IDLE_FOR;
use worker_store::PoolOptions;
use worker_testkit::TestDb;

/// One connection, pinged once idle `ping_if_idle_for`.
fn options(db: &TestDb, ping_if_idle_for: Duration) -> PoolOptions {
    PoolOptions {
        connect: db.url.parse::<PgConnectOptions>().unwrap(),
        max_connections: 1,
        min_connections: 0,
        acquire_timeout: Duration::from_secs(5),
        connect_attempts: 1,
        connect_backoff: Duration::from_millis(100),
        ping_if_idle_for,
    }
}

async fn backend(pool: &sqlx::PgPool) -> sqlx::Result<i32> {
    sqlx::query_scalar("SELECT pg_backend_pid()")
        .fetch_one(pool)
        .await
}

#[tokio::test]
async fn a_connection_that_died_while_idle_is_replaced_before_a_statement_meets_it()
-> anyhow::Result<()> {
    let db = TestDb::create().await?;
    let pool = worker_store::connect(&options(&db, PING_IF_IDLE_FOR)).await?;
    let first = backend(&pool).await?;
    sqlx::query("SELECT pg_terminate_backend($1)")
        .bind(first)
        .execute(&db.pool)
        .await?;
    tokio::time::sleep(PING_IF_IDLE_FOR + Duration::from_millis(200)).await;
    let second = backend(&pool)
        .await
        .expect("the dead connection was handed out");
    assert_ne!(first, second);
    Ok(())
}

#[tokio::test]
async fn a_connection_used_a_moment_ago_is_handed_out_without_a_ping() -> anyhow::Result<()> {
    let db = TestDb::create().await?;
    // A window no wait in this test reaches, however slow the machine.
    let pool = worker_store::connect(&options(&db, Duration::from_secs(600))).await?;
    let first = backend(&pool).await?;
    // Killed right after its use: within the window nothing checks it, so the next
    // statement meets the dead connection (and fails: a transient error its caller retries).
    sqlx::query("SELECT pg_terminate_backend($1)")
        .bind(first)
        .execute(&db.pool)
        .await?;
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(
        backend(&pool).await.is_err(),
        "a ping on every acquire would have replaced it"
    );
    assert_ne!(
        backend(&pool).await?,
        first,
        "the next acquire opens another"
    );
    Ok(())
}
