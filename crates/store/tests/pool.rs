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
        members: Vec::new(),
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
