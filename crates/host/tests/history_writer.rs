//! The history's writer on the real database: two replicas' rounds for one minute add their
//! counts in one row; only the replica that takes the `history` lease writes the gauges and
//! the rollups.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::{Arc, RwLock};
use std::time::Duration;

use chrono::Utc;
use worker_host::history::{Round, Writer, round};
use worker_host::sampler::{QueueReading, Readings, TierReading};
use worker_store::AdvisoryLease;
use worker_store::history::{self, Resolution, Select, Tally};
use worker_testkit::TestDb;

fn readings() -> Readings {
    let mut readings = Readings::default();
    readings.queues.push(QueueReading {
        queue: "email.send".into(),
        ready: Some(12),
        tiers: vec![TierReading {
            queue: "email.send.retry.1".into(),
            delay: Duration::from_secs(30),
            parked: Some(2),
        }],
        dead_queue: "email.send.dead".into(),
        dead_waiting: Some(0),
    });
    readings.outbox_pending = 5;
    readings
}

fn writer(db: &TestDb) -> Writer {
    Writer {
        pool: db.pool.clone(),
        tally: Tally::default(),
        lease: Arc::new(AdvisoryLease::new(db.pool.clone())),
        readings: Arc::new(RwLock::new(readings())),
    }
}

#[tokio::test]
async fn two_replicas_add_up_and_only_the_lease_holder_writes_gauges_and_rollups()
-> anyhow::Result<()> {
    let db = TestDb::create().await?;
    let minute = Resolution::Minute.start_of(Utc::now());
    let since = minute - chrono::Duration::hours(1);
    let (one, two) = (writer(&db), writer(&db));
    for _ in 0..3 {
        one.tally
            .job("email-send")
            .record(Duration::from_millis(20), None);
    }
    two.tally
        .job("email-send")
        .record(Duration::from_millis(20), Some("parked:transient"));

    // Replica two's round while another session holds the lease: its counts only.
    let other = AdvisoryLease::new(db.pool.clone());
    let held = other.acquire(worker_host::history::LEASE).await?.unwrap();
    assert_eq!(round(&two, minute, since, since).await, Round::CountsOnly);
    let hours = history::read(
        &db.pool,
        Resolution::Hour,
        since,
        minute + chrono::Duration::hours(1),
        Select::default(),
    )
    .await?;
    assert!(hours.is_empty(), "no rollup without the lease: {hours:?}");
    held.release().await;

    // Replica one takes the lease: its counts, the gauges and the rollups.
    assert_eq!(round(&one, minute, since, since).await, Round::Leased);
    let minutes = history::read(
        &db.pool,
        Resolution::Minute,
        minute,
        minute + chrono::Duration::minutes(1),
        Select::default(),
    )
    .await?;
    let job = minutes.iter().find(|r| r.series == "job").unwrap();
    assert_eq!((job.units, job.failed()), (4, 1));
    let queue = minutes.iter().find(|r| r.series == "queue").unwrap();
    assert_eq!(queue.gauges["ready"].max, 12);
    assert_eq!(queue.gauges["retry:30s"].max, 2);
    let outbox = minutes.iter().find(|r| r.series == "outbox").unwrap();
    assert_eq!(outbox.gauges["backlog"].max, 5);

    let hour = Resolution::Hour.start_of(minute);
    let hours = history::read(
        &db.pool,
        Resolution::Hour,
        hour,
        hour + chrono::Duration::hours(1),
        Select {
            series: Some("job"),
            name: Some("email-send"),
        },
    )
    .await?;
    assert_eq!(hours.len(), 1);
    assert_eq!((hours[0].units, hours[0].failed()), (4, 1));
    let day = Resolution::Day.start_of(minute);
    let days = history::read(
        &db.pool,
        Resolution::Day,
        day,
        day + chrono::Duration::days(1),
        Select::default(),
    )
    .await?;
    assert_eq!(days.len(), 3, "the job, the queue and the outbox: {days:?}");
    Ok(())
}
