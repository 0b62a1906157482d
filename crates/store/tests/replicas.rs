//! The replicas that report in: which count as live, which went silent, and that a clean stop
//! or a forget takes one out of the count.

use std::time::Duration;

use chrono::Utc;
use worker_store::replicas::{self, Census, Replica};
use worker_testkit::TestDb;

fn replica(name: &str) -> Replica {
    Replica {
        name: name.to_string(),
        installation: "test".into(),
        host: "machine".into(),
        pid: 1,
        version: "0.1.0".into(),
        started_at: Utc::now(),
        last_seen: Utc::now(),
    }
}

async fn age(db: &TestDb, name: &str, seconds: i64) -> anyhow::Result<()> {
    sqlx::query(
        "UPDATE replicas SET last_seen = now() - make_interval(secs => $2) WHERE name = $1",
    )
    .bind(name)
    .bind(seconds as f64)
    .execute(&db.pool)
    .await?;
    Ok(())
}

#[tokio::test]
async fn a_replica_that_stops_reporting_is_silent_unless_it_stopped_cleanly() -> anyhow::Result<()>
{
    let db = TestDb::create().await?;
    for name in ["r0", "r1", "r2"] {
        replicas::report(&db.pool, &replica(name)).await?;
    }
    let window = Duration::from_secs(60);
    assert_eq!(
        replicas::census(&db.pool, window).await?,
        Census { live: 3, silent: 0 }
    );
    // r1 was killed; r2 stopped cleanly before it went quiet.
    age(&db, "r1", 120).await?;
    replicas::stopped(&db.pool, "r2").await?;
    age(&db, "r2", 120).await?;
    assert_eq!(
        replicas::census(&db.pool, window).await?,
        Census { live: 1, silent: 1 }
    );
    // r2 comes back under its name: its report clears the stop.
    replicas::report(&db.pool, &replica("r2")).await?;
    assert_eq!(
        replicas::census(&db.pool, window).await?,
        Census { live: 2, silent: 1 }
    );
    // r1 is gone for good: the operator forgets it.
    assert!(replicas::forget(&db.pool, "r1").await?);
    assert!(!replicas::forget(&db.pool, "r1").await?, "forgotten once");
    assert_eq!(
        replicas::census(&db.pool, window).await?,
        Census { live: 2, silent: 0 }
    );
    Ok(())
}
