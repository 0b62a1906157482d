//! Retention with the real `worker-host` binary on the real services:
//!
//! - `the_host_sweeps_marks_and_attempts_past_retention_and_counts_them`: with default
//!   settings, processed-message marks older than `workers.dedup_retention` and attempt-log
//!   rows older than the attempt log's retention are deleted by the retention job, younger
//!   ones stay, and `worker_retention_swept_total{table}` counts what went.
//!
//! `RETENTION_SHOW_LOG=1` prints the whole log when the host stops.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

mod support;

use support::{Host, SERIAL, base_settings};
use worker_testkit::{TestDb, TestVhost};

async fn count(db: &TestDb, sql: &str) -> anyhow::Result<i64> {
    Ok(sqlx::query_scalar(sql).fetch_one(&db.pool).await?)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_host_sweeps_marks_and_attempts_past_retention_and_counts_them() -> anyhow::Result<()> {
    let _serial = SERIAL.lock().await;
    let db = TestDb::create().await?;
    let vhost = TestVhost::create().await?;
    // Past the defaults (7 days for marks, 14 for attempts), and within them.
    sqlx::query(
        "INSERT INTO processed_messages (scope, id, processed_at) \
         SELECT CASE WHEN i <= 300 THEN 'old' ELSE 'young' END, 'm-' || i, \
                CASE WHEN i <= 300 THEN now() - interval '8 days' ELSE now() - interval '6 days' END \
         FROM generate_series(1, 320) AS i",
    )
    .execute(&db.pool)
    .await?;
    sqlx::query(
        "INSERT INTO attempt_log (job, message_id, attempt, try_number, outcome, is_final, duration_ms, at) \
         SELECT CASE WHEN i <= 200 THEN 'old' ELSE 'young' END, 'm-' || i, 1, 1, 'failed', false, 1.0, \
                CASE WHEN i <= 200 THEN now() - interval '15 days' ELSE now() - interval '13 days' END \
         FROM generate_series(1, 230) AS i",
    )
    .execute(&db.pool)
    .await?;

    let host = Host::launch("RETENTION_SHOW_LOG", |_dir, port| {
        let mut settings = base_settings("retention-test", "[]", &db, &vhost, port);
        settings.push_str("\n[telemetry]\nlog_format = \"json\"\n");
        Ok(settings)
    })
    .await?;
    let (db_ref, host_ref) = (&db, &host);
    host.wait_for("the old marks and attempts to be swept", || async move {
        let marks = count(
            db_ref,
            "SELECT count(*) FROM processed_messages WHERE scope = 'old'",
        )
        .await?;
        let attempts = count(db_ref, "SELECT count(*) FROM attempt_log WHERE job = 'old'").await?;
        Ok((marks == 0 && attempts == 0).then_some(()))
    })
    .await;
    assert_eq!(
        count(
            &db,
            "SELECT count(*) FROM processed_messages WHERE scope = 'young'"
        )
        .await?,
        20
    );
    assert_eq!(
        count(&db, "SELECT count(*) FROM attempt_log WHERE job = 'young'").await?,
        30
    );
    let swept = host
        .wait_for("worker_retention_swept_total on /metrics", || async move {
            let scrape = host_ref.metrics().await?;
            let marks = scrape.sum(
                "worker_retention_swept_total",
                &[("table", "processed_messages")],
            );
            let attempts = scrape.sum("worker_retention_swept_total", &[("table", "attempt_log")]);
            Ok((marks > 0.0 && attempts > 0.0).then_some((marks, attempts)))
        })
        .await;
    assert_eq!(swept, (300.0, 200.0));
    host.stop_cleanly().await;
    Ok(())
}
