//! The retention job against the real PostgreSQL, through `tick_once` as the host runs it.

// Test support: a failed expectation should fail the test loudly.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use job_retention::{Retention, RetentionConfig, RetentionEvents, Table};
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;
use worker_core::{NoLease, SkipIfBusy, TickOutcome, WorkContext, tick_once};
use worker_store::AdvisoryLease;
use worker_testkit::TestDb;

const TICK: Duration = Duration::from_secs(60);
const DAY: Duration = Duration::from_secs(24 * 3600);

fn ctx() -> WorkContext {
    WorkContext::new(job_retention::JOB_NAME, CancellationToken::new())
}

fn config(batch_size: u32, max_batches_per_tick: u32) -> RetentionConfig {
    RetentionConfig {
        processed_messages: 7 * DAY,
        attempt_log: 14 * DAY,
        batch_size,
        max_batches_per_tick,
        ..RetentionConfig::default()
    }
}

/// What the job told its events, summed per table.
#[derive(Debug, Default)]
struct Swept(Mutex<HashMap<&'static str, u64>>);

impl RetentionEvents for Swept {
    fn on_swept(&self, table: Table, rows: u64) {
        *self.0.lock().unwrap().entry(table.as_str()).or_default() += rows;
    }
}

impl Swept {
    fn of(&self, table: Table) -> u64 {
        self.0
            .lock()
            .unwrap()
            .get(table.as_str())
            .copied()
            .unwrap_or(0)
    }
}

/// `n` marks processed `age_days` ago, in scope `scope`.
async fn marks(pool: &PgPool, scope: &str, n: i64, age_days: i32) -> anyhow::Result<()> {
    sqlx::query(
        "INSERT INTO processed_messages (scope, id, processed_at) \
         SELECT $1, 'm-' || i, now() - make_interval(days => $3) \
         FROM generate_series(1, $2) AS i",
    )
    .bind(scope)
    .bind(n)
    .bind(age_days)
    .execute(pool)
    .await?;
    Ok(())
}

/// `n` attempt-log rows written `age_days` ago by job `job`.
async fn attempts(pool: &PgPool, job: &str, n: i64, age_days: i32) -> anyhow::Result<()> {
    sqlx::query(
        "INSERT INTO attempt_log (job, message_id, attempt, try_number, outcome, is_final, duration_ms, at) \
         SELECT $1, 'm-' || i, 1, 1, 'failed', false, 1.0, now() - make_interval(days => $3) \
         FROM generate_series(1, $2) AS i",
    )
    .bind(job)
    .bind(n)
    .bind(age_days)
    .execute(pool)
    .await?;
    Ok(())
}

async fn count(pool: &PgPool, sql: &str) -> anyhow::Result<i64> {
    Ok(sqlx::query_scalar(sql).fetch_one(pool).await?)
}

async fn left(pool: &PgPool) -> anyhow::Result<(i64, i64, i64, i64)> {
    Ok((
        count(
            pool,
            "SELECT count(*) FROM processed_messages WHERE scope = 'old'",
        )
        .await?,
        count(
            pool,
            "SELECT count(*) FROM processed_messages WHERE scope = 'new'",
        )
        .await?,
        count(pool, "SELECT count(*) FROM attempt_log WHERE job = 'old'").await?,
        count(pool, "SELECT count(*) FROM attempt_log WHERE job = 'new'").await?,
    ))
}

/// Rows past their table's retention go; rows within it stay, on both tables, and what went
/// is reported per table.
#[tokio::test]
async fn rows_past_retention_go_and_rows_within_it_stay() -> anyhow::Result<()> {
    let db = TestDb::create().await?;
    let pool = &db.pool;
    marks(pool, "old", 250, 8).await?; // past 7 days
    marks(pool, "new", 40, 6).await?; // within
    attempts(pool, "old", 130, 15).await?; // past 14 days
    attempts(pool, "new", 60, 8).await?; // within (older than the marks' retention)

    let events = Arc::new(Swept::default());
    let job = Retention::observed(pool.clone(), config(100, 10), events.clone());
    let busy = SkipIfBusy::new(job_retention::JOB_NAME);
    let out = tick_once(&job, &busy, None::<&NoLease>, TICK, &ctx()).await;
    let TickOutcome::Ran(report) = out else {
        panic!("expected a tick that ran, got {out:?}");
    };
    assert_eq!(report.items, 250 + 130, "{report:?}");
    assert_eq!(left(pool).await?, (0, 40, 0, 60));
    assert_eq!(events.of(Table::ProcessedMessages), 250);
    assert_eq!(events.of(Table::AttemptLog), 130);

    let out = tick_once(&job, &busy, None::<&NoLease>, TICK, &ctx()).await;
    assert!(
        matches!(&out, TickOutcome::Ran(r) if r.items == 0),
        "nothing more is due: {out:?}"
    );
    assert_eq!(left(pool).await?, (0, 40, 0, 60));
    Ok(())
}

/// A tick deletes at most `batch_size × max_batches_per_tick` rows of each table; a backlog is
/// worked off over the following ticks.
#[tokio::test]
async fn a_tick_removes_at_most_batch_times_max_batches() -> anyhow::Result<()> {
    let db = TestDb::create().await?;
    let pool = &db.pool;
    marks(pool, "old", 1_000, 30).await?;
    attempts(pool, "old", 700, 30).await?;
    marks(pool, "new", 10, 0).await?;

    let job = Retention::new(pool.clone(), config(100, 3));
    let c = ctx();
    let first = job.run(&c).await?;
    assert_eq!(first.processed_messages.swept, 300);
    assert_eq!(first.attempt_log.swept, 300);
    assert!(first.processed_messages.backlog_remains && first.attempt_log.backlog_remains);
    assert_eq!(left(pool).await?, (700, 10, 400, 0));

    let second = job.run(&c).await?;
    assert_eq!(
        (second.processed_messages.swept, second.attempt_log.swept),
        (300, 300)
    );
    let third = job.run(&c).await?;
    assert_eq!(
        (third.processed_messages.swept, third.attempt_log.swept),
        (300, 100)
    );
    assert!(!third.attempt_log.backlog_remains);
    let fourth = job.run(&c).await?;
    assert_eq!(
        (fourth.processed_messages.swept, fourth.attempt_log.swept),
        (100, 0)
    );
    assert!(!fourth.processed_messages.backlog_remains);
    assert_eq!(left(pool).await?, (0, 10, 0, 0));
    Ok(())
}

/// The host runs the job under its lease: while another replica holds it, a tick is skipped
/// and deletes nothing; once it is free, the tick runs, and gives the lease back after.
#[tokio::test]
async fn the_job_runs_under_its_lease() -> anyhow::Result<()> {
    let db = TestDb::create().await?;
    let pool = &db.pool;
    marks(pool, "old", 20, 30).await?;
    let lease = AdvisoryLease::new(db.another_pool(2).await?);
    let other_replica = AdvisoryLease::new(db.another_pool(1).await?);
    let job = Retention::new(pool.clone(), config(100, 10));
    let busy = SkipIfBusy::new(job_retention::JOB_NAME);

    let held = other_replica
        .acquire(job_retention::JOB_NAME)
        .await?
        .expect("a free lease");
    let out = tick_once(&job, &busy, Some(&lease), TICK, &ctx()).await;
    assert_eq!(out, TickOutcome::SkippedLease);
    assert_eq!(left(pool).await?.0, 20, "nothing deleted without the lease");

    held.release().await;
    let out = tick_once(&job, &busy, Some(&lease), TICK, &ctx()).await;
    assert!(
        matches!(&out, TickOutcome::Ran(r) if r.items == 20),
        "{out:?}"
    );
    assert_eq!(left(pool).await?.0, 0);
    assert!(
        other_replica
            .acquire(job_retention::JOB_NAME)
            .await?
            .is_some(),
        "the lease is given back after the tick"
    );
    Ok(())
}

/// A tick cancelled between batches stops there, reports what it deleted, and the rest is
/// left for the next tick.
#[tokio::test]
async fn a_cancelled_tick_stops_and_keeps_what_it_did() -> anyhow::Result<()> {
    let db = TestDb::create().await?;
    let pool = &db.pool;
    marks(pool, "old", 50, 30).await?;
    let job = Retention::new(pool.clone(), config(10, 10));
    let c = ctx();
    c.cancel.cancel();
    let report = job.run(&c).await?;
    assert!(report.cancelled);
    assert_eq!(report.swept(), 0);
    assert_eq!(left(pool).await?.0, 50);
    Ok(())
}

/// The history's rows of `table`, `age_hours` old, one per name.
async fn history_rows(pool: &PgPool, table: &str, n: i64, age_hours: i64) -> anyhow::Result<()> {
    sqlx::query(&format!(
        "INSERT INTO {table} (series, name, at, units) \
         SELECT 'job', 'job-' || i, now() - make_interval(hours => $2::int), 1 \
         FROM generate_series(1, $1) AS i"
    ))
    .bind(n)
    .bind(age_hours)
    .execute(pool)
    .await?;
    Ok(())
}

#[tokio::test]
async fn the_history_keeps_minutes_two_days_hours_thirty_and_days_a_year() -> anyhow::Result<()> {
    let db = TestDb::create().await?;
    let pool = &db.pool;
    history_rows(pool, "history_minutes", 5, 49).await?; // past 2 days
    history_rows(pool, "history_minutes", 3, 47).await?;
    history_rows(pool, "history_hours", 4, 31 * 24).await?; // past 30 days
    history_rows(pool, "history_hours", 2, 29 * 24).await?;
    history_rows(pool, "history_days", 6, 366 * 24).await?; // past a year
    history_rows(pool, "history_days", 1, 364 * 24).await?;

    let events = Arc::new(Swept::default());
    let job = Retention::observed(pool.clone(), config(100, 10), events.clone());
    let busy = SkipIfBusy::new(job_retention::JOB_NAME);
    let out = tick_once(&job, &busy, None::<&NoLease>, TICK, &ctx()).await;
    assert!(
        matches!(&out, TickOutcome::Ran(r) if r.items == 15),
        "{out:?}"
    );
    assert_eq!(events.of(Table::HistoryMinutes), 5);
    assert_eq!(events.of(Table::HistoryHours), 4);
    assert_eq!(events.of(Table::HistoryDays), 6);
    for (table, left) in [
        ("history_minutes", 3),
        ("history_hours", 2),
        ("history_days", 1),
    ] {
        let n: i64 = sqlx::query_scalar(&format!("SELECT count(*) FROM {table}"))
            .fetch_one(pool)
            .await?;
        assert_eq!(n, left, "{table}");
    }
    Ok(())
}

/// `n` outbox rows as an earlier release left them: marked processed `age_minutes` ago.
async fn processed_outbox(pool: &PgPool, n: i64, age_minutes: i64) -> anyhow::Result<()> {
    sqlx::query(
        "INSERT INTO outbox (message_id, exchange, routing_key, body, status, processed_at, created_at) \
         SELECT 'p-' || $2 || '-' || i, 'events', 'k', '\\x00', 'processed', \
                now() - make_interval(mins => $2::int), now() - interval '30 days' \
         FROM generate_series(1, $1) AS i",
    )
    .bind(n)
    .bind(age_minutes)
    .execute(pool)
    .await?;
    Ok(())
}

/// Rows an earlier release marked processed go whatever their age, in batches of
/// `batch_size` (a statement each), at most `max_batches_per_tick` a tick; pending and failed
/// rows stay, however old.
#[tokio::test]
async fn processed_outbox_rows_of_an_earlier_release_go_in_batches_of_any_age() -> anyhow::Result<()>
{
    let db = TestDb::create().await?;
    let pool = &db.pool;
    processed_outbox(pool, 20, 60 * 24 * 20).await?;
    processed_outbox(pool, 5, 1).await?;
    sqlx::query(
        "INSERT INTO outbox (message_id, exchange, routing_key, body, status, created_at) \
         VALUES ('waits', 'events', 'k', '\\x00', 'pending', now() - interval '30 days'), \
                ('gave-up', 'events', 'k', '\\x00', 'failed', now() - interval '30 days')",
    )
    .execute(pool)
    .await?;

    let events = Arc::new(Swept::default());
    let job = Retention::observed(pool.clone(), config(10, 2), events.clone());
    let first = job.run(&ctx()).await?;
    assert_eq!(
        (
            first.processed_outbox.swept,
            first.processed_outbox.batches,
            first.processed_outbox.backlog_remains
        ),
        (20, 2, true)
    );
    let second = job.run(&ctx()).await?;
    assert_eq!(
        (
            second.processed_outbox.swept,
            second.processed_outbox.backlog_remains
        ),
        (5, false)
    );
    assert_eq!(events.of(Table::ProcessedOutbox), 25);
    assert_eq!(Table::ProcessedOutbox.as_str(), "outbox");
    let left: Vec<String> = sqlx::query_scalar("SELECT status FROM outbox ORDER BY status")
        .fetch_all(pool)
        .await?;
    assert_eq!(left, ["failed", "pending"]);
    Ok(())
}
