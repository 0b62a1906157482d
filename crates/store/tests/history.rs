//! The history's statements on the real database: replicas' flushes add up in one minute
//! row, the rollups write the hour and the day their minutes add up to, and the sweep takes
//! only rows past their age.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::time::Duration;

use chrono::{DurationRound, Utc};
use worker_store::history::{
    self, Gauge, HistoryRow, Resolution, Select, Tally, buckets::bucket_of,
};
use worker_testkit::TestDb;

fn job_rows(rows: &[HistoryRow]) -> Vec<&HistoryRow> {
    rows.iter().filter(|r| r.series == "job").collect()
}

#[tokio::test]
async fn two_replicas_flushes_add_up_and_roll_into_the_hour_and_the_day() -> anyhow::Result<()> {
    let db = TestDb::create().await?;
    let pool = &db.pool;
    let minute = Utc::now().duration_trunc(chrono::Duration::minutes(1))?;

    // Two replicas, each with its own tally, finish work for the same job in the same minute.
    let (one, two) = (Tally::default(), Tally::default());
    let mailer = one.job("email-send");
    for _ in 0..3 {
        mailer.record(Duration::from_millis(40), None);
    }
    mailer.record(Duration::from_millis(40), Some("parked:transient"));
    two.job("email-send")
        .record(Duration::from_secs(3), Some("dead-lettered:gave-up"));
    two.job("email-send")
        .record(Duration::from_millis(40), Some("parked:transient"));
    history::flush(pool, minute, &one.drain()).await?;
    history::flush(pool, minute, &two.drain()).await?;

    let minutes = history::read(
        pool,
        Resolution::Minute,
        minute,
        minute + chrono::Duration::minutes(1),
        Select::default(),
    )
    .await?;
    let rows = job_rows(&minutes);
    assert_eq!(rows.len(), 1, "{minutes:?}");
    let row = rows[0];
    assert_eq!(row.units, 6);
    assert_eq!(
        row.failures,
        BTreeMap::from([
            ("dead-lettered:gave-up".to_string(), 1),
            ("parked:transient".to_string(), 2)
        ])
    );
    assert_eq!(row.durations[bucket_of(Duration::from_millis(40))], 5);
    assert_eq!(row.durations[bucket_of(Duration::from_secs(3))], 1);

    // The lease holder's gauges for the same minute, and the rollups.
    let queue = HistoryRow {
        series: "queue".into(),
        name: "email.send".into(),
        at: minute,
        samples: 1,
        gauges: BTreeMap::from([("depth".to_string(), Gauge { sum: 7, max: 7 })]),
        ..HistoryRow::default()
    };
    history::write(pool, Resolution::Minute, &[queue]).await?;
    let since = minute - chrono::Duration::hours(1);
    history::roll_up_since(pool, Resolution::Hour, since).await?;
    history::roll_up_since(pool, Resolution::Day, since).await?;
    // A second run replaces, it does not add.
    history::roll_up_since(pool, Resolution::Hour, since).await?;
    history::roll_up_since(pool, Resolution::Day, since).await?;

    for resolution in [Resolution::Hour, Resolution::Day] {
        let at = resolution.start_of(minute);
        let rows = history::read(
            pool,
            resolution,
            at,
            at + resolution.span(),
            Select::default(),
        )
        .await?;
        assert_eq!(rows.len(), 2, "{resolution:?}: {rows:?}");
        let job = job_rows(&rows)[0];
        assert_eq!(
            (job.at, job.units, job.failed()),
            (at, 6, 3),
            "{resolution:?}"
        );
        assert_eq!(job.durations, row.durations);
        let queue = rows.iter().find(|r| r.series == "queue").unwrap();
        assert_eq!(queue.mean("depth"), Some(7.0));
    }
    Ok(())
}

#[tokio::test]
async fn the_sweep_takes_only_rows_past_their_age() -> anyhow::Result<()> {
    let db = TestDb::create().await?;
    let pool = &db.pool;
    sqlx::query(
        "INSERT INTO history_minutes (series, name, at, units) \
         SELECT 'job', 'email-send', now() - make_interval(mins => m), 1 \
         FROM generate_series(0, 59) AS m",
    )
    .execute(pool)
    .await?;
    // Rows older than 30 minutes go, ten at a time.
    let retention = Duration::from_secs(30 * 60 + 30);
    let first = history::sweep_batch(pool, Resolution::Minute, retention, 10).await?;
    assert_eq!(first, 10);
    let mut total = first;
    loop {
        let n = history::sweep_batch(pool, Resolution::Minute, retention, 10).await?;
        total += n;
        if n < 10 {
            break;
        }
    }
    assert_eq!(total, 29);
    let left: i64 = sqlx::query_scalar("SELECT count(*) FROM history_minutes")
        .fetch_one(pool)
        .await?;
    assert_eq!(left, 31);
    Ok(())
}
