//! Stale replies are not sent (issue 39): a reply past `max_age`, or past its own
//! `expires_at`, when its turn comes is recorded `expired`, acked as a skip and never reaches
//! the SMTP server; a fresh one is sent, and with no limit set an old one is sent as before. On
//! a private SMTP sink, the real database and, for the whole delivery, the real consumer
//! runner on RabbitMQ.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use sqlx::PgPool;
use uuid::Uuid;
use worker_core::{ConsumerJob, Handled};
use worker_testkit::{SmtpSink, TestDb};

use common::{Delivery, command, ctx, eventually, queue, row, sender_for};

const DAY: Duration = Duration::from_secs(86_400);

/// Queues a mail to alice, as if queued `ago` seconds before now.
async fn queue_aged(pool: &PgPool, ago_secs: f64) -> Uuid {
    let id = queue(pool, "alice@localhost", &format!("aged {}", Uuid::new_v4())).await;
    sqlx::query(
        "UPDATE outbound_emails SET created_at = now() - make_interval(secs => $2) WHERE id = $1",
    )
    .bind(id)
    .bind(ago_secs)
    .execute(pool)
    .await
    .unwrap();
    id
}

async fn expires_at_is_set(pool: &PgPool, id: Uuid) -> bool {
    sqlx::query_scalar("SELECT expires_at IS NOT NULL FROM outbound_emails WHERE id = $1")
        .bind(id)
        .fetch_one(pool)
        .await
        .unwrap()
}

#[tokio::test]
async fn a_reply_older_than_max_age_is_expired_and_never_reaches_the_server() -> anyhow::Result<()>
{
    let db = TestDb::create().await?;
    let sink = SmtpSink::start()?;
    let job = sender_for(&db.pool, &sink, 1, Duration::from_secs(10)).with_max_age(Some(DAY));
    let id = queue_aged(&db.pool, 2.0 * 86_400.0).await;

    let first = job.handle(&ctx(), &command(id)).await;
    assert_eq!(first.ok(), Some(Handled::Skipped("expired")));
    let (status, attempts, limit, response) = row(&db.pool, id).await;
    assert_eq!(
        (status.as_str(), attempts, limit.as_deref(), response),
        ("expired", 0, Some("jobs.email_send.max_age"), None)
    );
    assert!(
        expires_at_is_set(&db.pool, id).await,
        "the limit it passed is kept for its story"
    );

    // A redelivery (a replay, a late duplicate) finds it expired and sends nothing either.
    let again = job.handle(&ctx(), &command(id)).await;
    assert_eq!(again.ok(), Some(Handled::Duplicate));
    assert!(sink.delivered("alice").is_empty(), "{}", sink.log());
    assert!(!sink.log().contains(&id.to_string()), "{}", sink.log());
    Ok(())
}

#[tokio::test]
async fn a_reply_younger_than_max_age_is_sent() -> anyhow::Result<()> {
    let db = TestDb::create().await?;
    let sink = SmtpSink::start()?;
    let job = sender_for(&db.pool, &sink, 1, Duration::from_secs(10)).with_max_age(Some(DAY));
    let id = queue_aged(&db.pool, 3_600.0).await;

    let handled = job.handle(&ctx(), &command(id)).await;
    assert_eq!(handled.ok(), Some(Handled::Done));
    assert_eq!(row(&db.pool, id).await.0, "sent");
    assert_eq!(sink.delivered("alice").len(), 1);
    Ok(())
}

#[tokio::test]
async fn with_no_limit_set_an_old_reply_is_sent_as_before() -> anyhow::Result<()> {
    let db = TestDb::create().await?;
    let sink = SmtpSink::start()?;
    let job = sender_for(&db.pool, &sink, 1, Duration::from_secs(10));
    let id = queue_aged(&db.pool, 30.0 * 86_400.0).await;

    let handled = job.handle(&ctx(), &command(id)).await;
    assert_eq!(handled.ok(), Some(Handled::Done));
    assert_eq!(row(&db.pool, id).await.0, "sent");
    assert!(!expires_at_is_set(&db.pool, id).await);
    Ok(())
}

#[tokio::test]
async fn a_rows_own_expires_at_wins_over_the_jobs_max_age() -> anyhow::Result<()> {
    let db = TestDb::create().await?;
    let sink = SmtpSink::start()?;
    // The job allows a day; the row (an automation's own max_age) allowed ten minutes.
    let job = sender_for(&db.pool, &sink, 1, Duration::from_secs(10)).with_max_age(Some(DAY));
    let id = queue_aged(&db.pool, 3_600.0).await;
    sqlx::query(
        "UPDATE outbound_emails SET expires_at = created_at + interval '10 minutes' WHERE id = $1",
    )
    .bind(id)
    .execute(&db.pool)
    .await?;
    // And a row whose own limit is later than the job's is sent.
    let lenient = queue_aged(&db.pool, 2.0 * 86_400.0).await;
    sqlx::query("UPDATE outbound_emails SET expires_at = now() + interval '1 hour' WHERE id = $1")
        .bind(lenient)
        .execute(&db.pool)
        .await?;

    let strict = job.handle(&ctx(), &command(id)).await;
    assert_eq!(strict.ok(), Some(Handled::Skipped("expired")));
    let (status, _, limit, _) = row(&db.pool, id).await;
    assert_eq!(
        (status.as_str(), limit.as_deref()),
        ("expired", Some("the max_age of its automation"))
    );
    let sent = job.handle(&ctx(), &command(lenient)).await;
    assert_eq!(sent.ok(), Some(Handled::Done));
    assert_eq!(sink.delivered("alice").len(), 1, "only the lenient one");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_reply_is_acked_not_parked_nor_dead_lettered() -> anyhow::Result<()> {
    let db = TestDb::create().await?;
    let sink = SmtpSink::start()?;
    let job = sender_for(&db.pool, &sink, 1, Duration::from_secs(10)).with_max_age(Some(DAY));
    let delivery =
        Delivery::start(job, 1, Duration::from_millis(500), Duration::from_secs(20)).await?;
    let stale = queue_aged(&db.pool, 2.0 * 86_400.0).await;
    delivery.publish(stale).await?;

    let pool = db.pool.clone();
    eventually(Duration::from_secs(15), "the stale reply expired", || {
        let pool = pool.clone();
        async move { row(&pool, stale).await.0 == "expired" }
    })
    .await;
    let queue = delivery.queue.name.clone();
    eventually(Duration::from_secs(15), "the message was acked", || async {
        delivery.vhost.queue_depth(&queue).await.unwrap_or(1) == 0
    })
    .await;
    assert_eq!(delivery.parked().await?, 0);
    assert!(
        delivery.take_dead().await?.is_none(),
        "nothing dead-lettered"
    );
    assert!(sink.delivered("alice").is_empty(), "{}", sink.log());
    delivery.stop().await
}
