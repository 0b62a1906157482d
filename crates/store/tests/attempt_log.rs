//! The attempt log on the real database: the observer in a real retry loop, batching by size
//! and by time, the final flush on shutdown, timer ticks, the summary and retention.

// Helpers outside #[test] functions assert too: a failed expectation fails the test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use worker_core::{Failure, Retry, RetryOutcome, RetryPolicy, TickOutcome, WorkContext};
use worker_store::attempt_log::{self, AttemptLog, AttemptLogSettings, AttemptRecord};
use worker_testkit::TestDb;

fn settings(log_successes: bool) -> AttemptLogSettings {
    AttemptLogSettings {
        log_successes,
        batch_size: 50,
        flush_interval: Duration::from_millis(50),
        ..AttemptLogSettings::default()
    }
}

async fn rows(db: &TestDb) -> anyhow::Result<i64> {
    Ok(sqlx::query_scalar("SELECT count(*) FROM attempt_log")
        .fetch_one(&db.pool)
        .await?)
}

async fn wait_rows(db: &TestDb, n: i64) -> anyhow::Result<()> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let got = rows(db).await?;
        if got >= n {
            return Ok(());
        }
        anyhow::ensure!(
            tokio::time::Instant::now() < deadline,
            "only {got} of {n} attempt-log rows"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Runs a retry loop whose op fails `fails` times, then succeeds, under the log.
async fn run_flaky(log: &AttemptLog, message_id: &str, fails: u32) -> RetryOutcome<()> {
    let token = CancellationToken::new();
    let ctx = WorkContext::new("mailer", token.clone())
        .with_message_id(message_id)
        .with_attempt(2);
    let observer = log.for_unit(&ctx);
    let policy = RetryPolicy {
        max_tries: 5,
        base_delay: Duration::from_millis(1),
        factor: 1.0,
        max_delay: Duration::from_millis(1),
        jitter: false,
    };
    let calls = Arc::new(AtomicU32::new(0));
    Retry::new("mailer", &policy, Duration::from_secs(5), &token)
        .observer(&observer)
        .run(&ctx, |_| {
            let calls = calls.clone();
            async move {
                if calls.fetch_add(1, Ordering::SeqCst) < fails {
                    Err(Failure::transient("smtp 421 try later"))
                } else {
                    Ok(())
                }
            }
        })
        .await
}

#[tokio::test]
async fn failed_tries_and_final_outcomes_are_written_successes_only_on_request()
-> anyhow::Result<()> {
    let db = TestDb::create().await?;
    let shutdown = CancellationToken::new();
    let (log, writer) = AttemptLog::new(db.pool.clone(), &settings(false));
    let task = tokio::spawn(writer.run(shutdown.clone()));

    let outcome = run_flaky(&log, "m-1", 2).await;
    assert!(matches!(outcome, RetryOutcome::Succeeded { tries: 3, .. }));
    log.record_outcome(
        "mailer",
        Some("m-1"),
        2,
        3,
        "succeeded",
        None,
        None,
        Duration::from_millis(9),
    );
    // A first-try success: nothing at all.
    run_flaky(&log, "m-2", 0).await;
    log.record_outcome(
        "mailer",
        Some("m-2"),
        1,
        1,
        "succeeded",
        None,
        None,
        Duration::ZERO,
    );
    let ended = chrono::Utc::now() - chrono::Duration::minutes(1);
    log.record_tick(
        "draft-expiry",
        41,
        &TickOutcome::Failed(Failure::transient("deadline")),
        Duration::from_millis(30),
        ended,
    );
    log.record_tick(
        "draft-expiry",
        42,
        &TickOutcome::Ran(Default::default()),
        Duration::ZERO,
        chrono::Utc::now(),
    );

    wait_rows(&db, 4).await?;
    shutdown.cancel();
    tokio::time::timeout(Duration::from_secs(5), task).await??;
    assert_eq!(rows(&db).await?, 4);

    let story = attempt_log::for_message(&db.pool, "mailer", "m-1").await?;
    let outcomes: Vec<(&str, i32, i32, bool)> = story
        .iter()
        .map(|r| (r.outcome.as_str(), r.attempt, r.try_number, r.is_final))
        .collect();
    assert_eq!(
        outcomes,
        vec![
            ("failed", 2, 1, false),
            ("failed", 2, 2, false),
            ("succeeded", 2, 0, true)
        ]
    );
    assert_eq!(story[0].failure_class.as_deref(), Some("transient"));
    assert_eq!(story[0].error.as_deref(), Some("smtp 421 try later"));
    assert!(
        attempt_log::for_message(&db.pool, "mailer", "m-2")
            .await?
            .is_empty()
    );

    let (tick, outcome, error, at): (
        Option<i64>,
        String,
        Option<String>,
        chrono::DateTime<chrono::Utc>,
    ) = sqlx::query_as(
        "SELECT tick, outcome, error, at FROM attempt_log WHERE job = 'draft-expiry'",
    )
    .fetch_one(&db.pool)
    .await?;
    assert_eq!(
        (tick, outcome.as_str(), error.as_deref()),
        (Some(41), "failed", Some("deadline"))
    );
    // A tick's row is stamped with its work's end, not the moment it was recorded or written.
    assert!(
        (at - ended).num_milliseconds().abs() < 1,
        "at {at}, ended {ended}"
    );

    let summary = attempt_log::summary(&db.pool, Duration::from_secs(3600)).await?;
    let failed_tries = summary
        .iter()
        .find(|s| s.job == "mailer" && s.outcome == "failed" && !s.is_final)
        .expect("a group for the failed tries");
    assert_eq!(failed_tries.count, 2);
    assert_eq!(
        failed_tries.last_error.as_deref(),
        Some("smtp 421 try later")
    );
    assert_eq!(log.dropped(), 0);
    Ok(())
}

#[tokio::test]
async fn successes_are_written_when_asked_and_the_writer_flushes_what_is_left_on_shutdown()
-> anyhow::Result<()> {
    let db = TestDb::create().await?;
    let shutdown = CancellationToken::new();
    let slow = AttemptLogSettings {
        log_successes: true,
        batch_size: 10_000,
        // Only the shutdown can flush these.
        flush_interval: Duration::from_secs(3600),
        ..AttemptLogSettings::default()
    };
    let (log, writer) = AttemptLog::new(db.pool.clone(), &slow);
    let task = tokio::spawn(writer.run(shutdown.clone()));
    for n in 0..300 {
        run_flaky(&log, &format!("m-{n}"), 0).await;
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(
        rows(&db).await?,
        0,
        "nothing flushed before the interval or a full batch"
    );
    shutdown.cancel();
    tokio::time::timeout(Duration::from_secs(10), task).await??;
    assert_eq!(rows(&db).await?, 300);
    Ok(())
}

#[tokio::test]
async fn full_batches_are_written_without_waiting_for_the_interval() -> anyhow::Result<()> {
    let db = TestDb::create().await?;
    let shutdown = CancellationToken::new();
    let (log, writer) = AttemptLog::new(
        db.pool.clone(),
        &AttemptLogSettings {
            log_successes: true,
            batch_size: 100,
            flush_interval: Duration::from_secs(3600),
            ..AttemptLogSettings::default()
        },
    );
    let task = tokio::spawn(writer.run(shutdown.clone()));
    for n in 0..250 {
        log.record_tick(
            "health",
            n,
            &TickOutcome::SkippedBusy,
            Duration::ZERO,
            chrono::Utc::now(),
        );
    }
    wait_rows(&db, 200).await?;
    shutdown.cancel();
    tokio::time::timeout(Duration::from_secs(5), task).await??;
    assert_eq!(rows(&db).await?, 250);
    Ok(())
}

#[tokio::test]
async fn retention_deletes_old_rows() -> anyhow::Result<()> {
    let db = TestDb::create().await?;
    let old = AttemptRecord {
        job: "health".into(),
        message_id: None,
        tick: Some(1),
        attempt: 1,
        try_number: 1,
        outcome: "failed".into(),
        is_final: true,
        failure_class: Some("transient".into()),
        error: Some("probe timed out".into()),
        duration: Duration::from_millis(3),
        at: chrono::Utc::now() - chrono::Duration::days(30),
    };
    let recent = AttemptRecord {
        at: chrono::Utc::now(),
        tick: Some(2),
        ..old.clone()
    };
    let mut conn = db.pool.acquire().await?;
    for _ in 0..7 {
        attempt_log::record(&mut conn, &old).await?;
    }
    attempt_log::record(&mut conn, &recent).await?;
    drop(conn);
    let gone = attempt_log::sweep(&db.pool, Duration::from_secs(14 * 24 * 3600), 3).await?;
    assert_eq!(gone, 7);
    assert_eq!(rows(&db).await?, 1);
    Ok(())
}

#[tokio::test]
async fn a_jobs_latest_rows_are_read_without_the_other_jobs_rows() -> anyhow::Result<()> {
    let db = TestDb::create().await?;
    // A consumer that writes a lot, and a timer that failed three ticks long ago.
    sqlx::query(
        "INSERT INTO attempt_log (job, message_id, attempt, try_number, outcome, is_final, \
                                  duration_ms, at) \
         SELECT CASE WHEN g <= 3 THEN 'retention' ELSE 'email-send' END, 'm-' || g, 1, 1, \
                'failed', true, 1.0, now() - make_interval(secs => 10000 - g) \
         FROM generate_series(1, 5000) g",
    )
    .execute(&db.pool)
    .await?;
    sqlx::query("ANALYZE attempt_log").execute(&db.pool).await?;

    let latest = attempt_log::recent(&db.pool, "retention", 20).await?;
    assert_eq!(latest.len(), 3);
    let plan: serde_json::Value = sqlx::query_scalar(&format!(
        "EXPLAIN (ANALYZE, FORMAT JSON) SELECT * {}",
        attempt_log::RECENT
    ))
    .bind("retention")
    .bind(20_i64)
    .fetch_one(&db.pool)
    .await?;
    let read = worker_testkit::plan::rows_read(&plan[0]["Plan"]);
    // The console's job page reads it: it must not walk the other jobs' rows.
    assert!(
        read <= 25.0,
        "a job's latest rows read {read} rows:\n{plan:#}"
    );
    Ok(())
}
