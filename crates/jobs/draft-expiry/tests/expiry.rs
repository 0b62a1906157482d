//! Draft expiry against the real PostgreSQL.

use std::time::Duration;

use job_draft_expiry::{DraftExpiry, DraftExpiryConfig};
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;
use worker_core::{NoLease, SkipIfBusy, TickOutcome, WorkContext, tick_once};
use worker_testkit::TestDb;

const TICK: Duration = Duration::from_secs(30);

fn ctx() -> WorkContext {
    WorkContext::new("draft-expiry", CancellationToken::new())
}

/// Inserts `n` drafts with `status`, expiring `expires_in` from now (negative: in the past).
async fn insert(
    pool: &PgPool,
    n: i64,
    status: &str,
    expires_in_secs: Option<i64>,
) -> anyhow::Result<()> {
    sqlx::query(
        "INSERT INTO email_drafts (status, recipients, subject, text_body, expires_at, expired_at, created_at, updated_at) \
         SELECT $2, ARRAY['to-' || i || '@example.com'], 'draft ' || i, 'body', \
                now() + make_interval(secs => $3::float8) - make_interval(secs => i % 600), \
                CASE WHEN $2 = 'expired' THEN now() END, \
                now() - interval '1 day', now() - interval '1 day' \
         FROM generate_series(1, $1) AS i",
    )
    .bind(n)
    .bind(status)
    .bind(expires_in_secs.map(|s| s as f64))
    .execute(pool)
    .await?;
    Ok(())
}

async fn count(pool: &PgPool, filter: &str) -> anyhow::Result<i64> {
    Ok(
        sqlx::query_scalar(&format!("SELECT count(*) FROM email_drafts WHERE {filter}"))
            .fetch_one(pool)
            .await?,
    )
}

#[tokio::test]
async fn a_backlog_of_20_000_is_worked_off_over_bounded_ticks() -> anyhow::Result<()> {
    let db = TestDb::create().await?;
    let pool = &db.pool;
    insert(pool, 20_000, "draft", Some(-60)).await?; // due
    insert(pool, 300, "draft", Some(3_600)).await?; // not yet due
    insert(pool, 200, "sent", Some(-60)).await?; // past expiry, but sent
    insert(pool, 100, "draft", None).await?; // never expires

    let job = DraftExpiry::new(
        pool.clone(),
        DraftExpiryConfig {
            batch_size: 1_000,
            max_batches_per_tick: 6,
        },
    );
    let mut per_tick = Vec::new();
    for _ in 0..10 {
        let report = job.run(&ctx()).await?;
        assert!(report.batches <= 6, "{report:?}");
        assert!(report.expired <= 6_000, "{report:?}");
        per_tick.push(report.expired);
        if report.expired == 0 {
            break;
        }
    }
    assert_eq!(per_tick, [6_000, 6_000, 6_000, 2_000, 0]);

    assert_eq!(count(pool, "status = 'expired'").await?, 20_000);
    assert_eq!(count(pool, "status = 'expired' AND expired_at IS NOT NULL AND updated_at > now() - interval '1 hour'").await?, 20_000);
    assert_eq!(
        count(pool, "status = 'draft' AND expires_at > now()").await?,
        300,
        "not yet due: untouched"
    );
    assert_eq!(
        count(pool, "status = 'draft' AND expires_at IS NULL").await?,
        100,
        "no expiry: untouched"
    );
    assert_eq!(
        count(
            pool,
            "status = 'sent' AND updated_at < now() - interval '1 hour'"
        )
        .await?,
        200,
        "sent: untouched"
    );

    // Each batch was its own transaction: the expired rows carry 20 distinct transaction ids.
    let transactions: i64 = sqlx::query_scalar(
        "SELECT count(DISTINCT xmin::text) FROM email_drafts WHERE status = 'expired'",
    )
    .fetch_one(pool)
    .await?;
    assert_eq!(transactions, 20);
    Ok(())
}

#[tokio::test]
async fn the_timer_entry_reports_and_stops_when_nothing_is_due() -> anyhow::Result<()> {
    let db = TestDb::create().await?;
    insert(&db.pool, 2_500, "draft", Some(-1)).await?;
    let job = DraftExpiry::new(
        db.pool.clone(),
        DraftExpiryConfig {
            batch_size: 1_000,
            max_batches_per_tick: 2,
        },
    );
    let busy = SkipIfBusy::new("draft-expiry");
    let first = tick_once(&job, &busy, None::<&NoLease>, TICK, &ctx()).await;
    match first {
        TickOutcome::Ran(report) => {
            assert_eq!(report.items, 2_000);
            assert_eq!(
                report.detail.as_deref(),
                Some("expired 2000 drafts in 2 batches; more are due")
            );
        }
        other => panic!("{other:?}"),
    }
    let second = tick_once(&job, &busy, None::<&NoLease>, TICK, &ctx()).await;
    assert!(
        matches!(&second, TickOutcome::Ran(r) if r.items == 500 && r.detail.as_deref() == Some("expired 500 drafts in 1 batches")),
        "{second:?}"
    );
    let third = tick_once(&job, &busy, None::<&NoLease>, TICK, &ctx()).await;
    assert!(
        matches!(&third, TickOutcome::Ran(r) if r.items == 0),
        "{third:?}"
    );
    Ok(())
}

#[tokio::test]
async fn a_draft_held_by_another_transaction_is_passed_over_then_expired_later()
-> anyhow::Result<()> {
    let db = TestDb::create().await?;
    insert(&db.pool, 10, "draft", Some(-5)).await?;
    let held: String =
        sqlx::query_scalar("SELECT id::text FROM email_drafts ORDER BY expires_at LIMIT 1")
            .fetch_one(&db.pool)
            .await?;
    let mut holder = db.pool.begin().await?;
    sqlx::query("SELECT 1 FROM email_drafts WHERE id = $1::uuid FOR UPDATE")
        .bind(&held)
        .execute(&mut *holder)
        .await?;

    let job = DraftExpiry::new(db.pool.clone(), DraftExpiryConfig::default());
    let report = tokio::time::timeout(Duration::from_secs(10), job.run(&ctx())).await??;
    assert_eq!(
        report.expired, 9,
        "the locked draft is skipped, not waited for"
    );
    holder.rollback().await?;
    let report = job.run(&ctx()).await?;
    assert_eq!(report.expired, 1);
    let status: String = sqlx::query_scalar("SELECT status FROM email_drafts WHERE id = $1::uuid")
        .bind(&held)
        .fetch_one(&db.pool)
        .await?;
    assert_eq!(status, "expired");
    Ok(())
}

#[tokio::test]
async fn a_fired_token_stops_the_tick_between_batches() -> anyhow::Result<()> {
    let db = TestDb::create().await?;
    insert(&db.pool, 50, "draft", Some(-5)).await?;
    let job = DraftExpiry::new(
        db.pool.clone(),
        DraftExpiryConfig {
            batch_size: 10,
            max_batches_per_tick: 100,
        },
    );
    let cancel = CancellationToken::new();
    cancel.cancel();
    let report = job.run(&WorkContext::new("draft-expiry", cancel)).await?;
    assert!(report.cancelled);
    assert_eq!((report.expired, report.batches), (0, 0));
    assert_eq!(count(&db.pool, "status = 'draft'").await?, 50);
    Ok(())
}
