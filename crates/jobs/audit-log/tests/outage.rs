//! A database outage while entries arrive: none is lost or dead-lettered, each is stored
//! once when PostgreSQL is back. The consumer reaches PostgreSQL through a fault proxy.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::{Harness, entry, eventually, outgoing, stored};
use sqlx::postgres::PgPoolOptions;
use worker_testkit::{FaultProxy, TestDb};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn entries_that_arrive_during_a_database_outage_are_stored_once_when_it_ends()
-> anyhow::Result<()> {
    let db = TestDb::create().await?;
    let mut url = reqwest::Url::parse(&db.url)?;
    let upstream = format!("{}:{}", url.host_str().unwrap(), url.port().unwrap_or(5432));
    let proxy = FaultProxy::start(upstream).await?;
    url.set_host(Some("127.0.0.1"))?;
    url.set_port(Some(proxy.port())).unwrap();
    let proxied = PgPoolOptions::new()
        .max_connections(4)
        .acquire_timeout(Duration::from_secs(1))
        .connect(url.as_str())
        .await?;
    let mut h = Harness::start().await?;
    h.consume(&proxied);
    let before: Vec<_> = (0..5).map(entry).collect();
    for entry in &before {
        h.publish(&outgoing(entry)).await?;
    }
    eventually(Duration::from_secs(20), "the first 5 stored", || async {
        stored(&db.pool).await == 5
    })
    .await;

    // PostgreSQL goes away: open connections reset, new ones refused.
    proxy.refuse();
    proxy.reset();
    let during: Vec<_> = (5..15).map(entry).collect();
    for entry in &during {
        h.publish(&outgoing(entry)).await?;
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        stored(&db.pool).await,
        5,
        "nothing is stored while it is down"
    );
    proxy.heal();

    eventually(Duration::from_secs(30), "every entry stored", || async {
        stored(&db.pool).await == 15
    })
    .await;
    assert_eq!(h.take_dead(&h.audit_queue.dead_queue).await?, None);
    let distinct: i64 = sqlx::query_scalar("SELECT count(DISTINCT id) FROM audit_log_entries")
        .fetch_one(&db.pool)
        .await?;
    assert_eq!(distinct, 15);
    h.stop().await
}
