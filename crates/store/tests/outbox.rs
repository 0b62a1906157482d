//! The outbox table on the real database: enqueue inside the caller's transaction, NOTIFY on
//! commit only, claims that skip each other's rows, a published row deleted with its
//! publication kept, attempts and backoff, operator replay, status, and the sweep of the rows
//! earlier releases marked processed.

// Helpers outside #[test] functions assert too: a failed expectation fails the test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use sqlx::postgres::PgListener;
use worker_store::OutboxMessage;
use worker_store::outbox::{self, PublishFailure, RetryResult};
use worker_testkit::TestDb;

/// message id, type, content type, correlation id, exchange, routing key, headers, body,
/// status, attempts.
type StoredRow = (
    String,
    Option<String>,
    Option<String>,
    Option<String>,
    String,
    String,
    serde_json::Value,
    Vec<u8>,
    String,
    i32,
);

fn message(n: usize) -> OutboxMessage {
    OutboxMessage::json(
        format!("m-{n}"),
        "test.event",
        &serde_json::json!({ "n": n }),
    )
    .expect("json")
    .with_correlation_id("c-1")
    .with_header("tenant", "acme")
    .with_header("n", n as i64)
}

async fn count(db: &TestDb, status: &str) -> anyhow::Result<i64> {
    Ok(
        sqlx::query_scalar("SELECT count(*) FROM outbox WHERE status = $1")
            .bind(status)
            .fetch_one(&db.pool)
            .await?,
    )
}

#[tokio::test]
async fn a_rolled_back_enqueue_leaves_no_row_and_no_notification() -> anyhow::Result<()> {
    let db = TestDb::create().await?;
    let mut listener = PgListener::connect(&db.url).await?;
    listener.listen(outbox::CHANNEL).await?;

    let mut tx = db.pool.begin().await?;
    outbox::enqueue(&mut tx, "events", "test.event", &message(1)).await?;
    tx.rollback().await?;
    let total: i64 = sqlx::query_scalar("SELECT count(*) FROM outbox")
        .fetch_one(&db.pool)
        .await?;
    assert_eq!(total, 0);
    let heard = tokio::time::timeout(Duration::from_millis(300), listener.recv()).await;
    assert!(heard.is_err(), "a rollback must not notify: {heard:?}");

    let mut tx = db.pool.begin().await?;
    let id = outbox::enqueue(&mut tx, "events", "test.event", &message(2)).await?;
    // Not before the commit...
    let early = tokio::time::timeout(Duration::from_millis(200), listener.recv()).await;
    assert!(early.is_err(), "notified before the commit");
    tx.commit().await?;
    // ...but right after it.
    let heard = tokio::time::timeout(Duration::from_secs(5), listener.recv()).await??;
    assert_eq!(heard.channel(), outbox::CHANNEL);

    let row: StoredRow = sqlx::query_as(
        "SELECT message_id, message_type, content_type, correlation_id, exchange, routing_key, \
                    headers, body, status, attempts FROM outbox WHERE id = $1",
    )
    .bind(id)
    .fetch_one(&db.pool)
    .await?;
    assert_eq!(row.0, "m-2");
    assert_eq!(row.1.as_deref(), Some("test.event"));
    assert_eq!(row.2.as_deref(), Some("application/json"));
    assert_eq!(row.3.as_deref(), Some("c-1"));
    assert_eq!((row.4.as_str(), row.5.as_str()), ("events", "test.event"));
    assert_eq!(row.6["tenant"], "acme");
    assert_eq!(row.6["n"], 2);
    assert_eq!(row.7, br#"{"n":2}"#);
    assert_eq!((row.8.as_str(), row.9), ("pending", 0));
    Ok(())
}

#[tokio::test]
async fn many_rows_in_one_transaction_keep_their_order_and_notify_once() -> anyhow::Result<()> {
    let db = TestDb::create().await?;
    let mut listener = PgListener::connect(&db.url).await?;
    listener.listen(outbox::CHANNEL).await?;
    let messages: Vec<OutboxMessage> = (0..100).map(message).collect();
    let mut tx = db.pool.begin().await?;
    let ids = outbox::enqueue_many(&mut tx, "events", "k", &messages).await?;
    outbox::enqueue(&mut tx, "events", "k", &message(100)).await?;
    tx.commit().await?;
    assert_eq!(ids.len(), 100);
    let in_order: Vec<String> =
        sqlx::query_scalar("SELECT message_id FROM outbox WHERE id = ANY($1) ORDER BY id")
            .bind(&ids)
            .fetch_all(&db.pool)
            .await?;
    let expected: Vec<String> = (0..100).map(|n| format!("m-{n}")).collect();
    assert_eq!(in_order, expected);

    tokio::time::timeout(Duration::from_secs(5), listener.recv()).await??;
    let again = tokio::time::timeout(Duration::from_millis(300), listener.recv()).await;
    assert!(again.is_err(), "one transaction, one notification");
    Ok(())
}

#[tokio::test]
async fn concurrent_claims_take_disjoint_rows_in_id_order() -> anyhow::Result<()> {
    let db = TestDb::create().await?;
    let mut tx = db.pool.begin().await?;
    let messages: Vec<OutboxMessage> = (0..30).map(message).collect();
    let ids = outbox::enqueue_many(&mut tx, "events", "k", &messages).await?;
    tx.commit().await?;

    let mut first = db.pool.begin().await?;
    let mut second = db.pool.begin().await?;
    let a = outbox::claim(&mut first, 10).await?;
    let b = outbox::claim(&mut second, 10).await?;
    let a_ids: Vec<i64> = a.iter().map(|r| r.id).collect();
    let b_ids: Vec<i64> = b.iter().map(|r| r.id).collect();
    assert_eq!(a_ids, ids[..10].to_vec());
    assert_eq!(b_ids, ids[10..20].to_vec());
    assert_eq!(a[0].message_id, "m-0");
    assert_eq!(a[0].headers["tenant"], "acme");

    assert_eq!(outbox::delete_published(&mut first, &a_ids).await?, 10);
    first.commit().await?;
    // The second claim rolls back: its rows are free again, and come first.
    second.rollback().await?;
    let mut third = db.pool.begin().await?;
    let c = outbox::claim(&mut third, 100).await?;
    assert_eq!(c.first().map(|r| r.id), Some(ids[10]));
    assert_eq!(c.len(), 20);
    third.rollback().await?;
    assert_eq!(count(&db, "pending").await?, 20);
    let total: i64 = sqlx::query_scalar("SELECT count(*) FROM outbox")
        .fetch_one(&db.pool)
        .await?;
    assert_eq!(total, 20, "the ten published rows are gone");
    Ok(())
}

#[tokio::test]
async fn a_confirmed_row_is_deleted_and_its_publication_kept_with_its_trace_id()
-> anyhow::Result<()> {
    let db = TestDb::create().await?;
    let mut tx = db.pool.begin().await?;
    let traced = message(1).with_header(
        "traceparent",
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
    );
    let ids =
        outbox::enqueue_many(&mut tx, "events", "mail.received", &[traced, message(2)]).await?;
    tx.commit().await?;
    let mut tx = db.pool.begin().await?;
    outbox::claim(&mut tx, 10).await?;
    assert_eq!(outbox::delete_published(&mut tx, &ids).await?, 2);
    // Deleted again (a second drain's late confirm): no second publication.
    assert_eq!(outbox::delete_published(&mut tx, &ids).await?, 0);
    tx.commit().await?;
    let left: i64 = sqlx::query_scalar("SELECT count(*) FROM outbox WHERE id = ANY($1)")
        .bind(&ids)
        .fetch_one(&db.pool)
        .await?;
    assert_eq!(left, 0, "a confirmed row is deleted, not kept marked");
    let rows: Vec<(String, String, Option<String>)> = sqlx::query_as(
        "SELECT message_id, routing_key, trace_id FROM publications ORDER BY message_id",
    )
    .fetch_all(&db.pool)
    .await?;
    assert_eq!(
        rows,
        vec![
            (
                "m-1".into(),
                "mail.received".into(),
                Some("4bf92f3577b34da6a3ce929d0e0e4736".into())
            ),
            ("m-2".into(), "mail.received".into(), None),
        ]
    );
    Ok(())
}

#[tokio::test]
async fn failures_back_off_then_give_up_and_operators_can_replay() -> anyhow::Result<()> {
    let db = TestDb::create().await?;
    let mut tx = db.pool.begin().await?;
    let id = outbox::enqueue(&mut tx, "nowhere", "k", &message(1)).await?;
    let other = outbox::enqueue(&mut tx, "events", "k", &message(2)).await?;
    tx.commit().await?;

    let fail = |retry_in| PublishFailure {
        id,
        error: "unroutable: no queue".into(),
        retry_in,
    };
    // First failure: pending again, but not due for an hour.
    let mut tx = db.pool.begin().await?;
    assert_eq!(outbox::claim(&mut tx, 10).await?.len(), 2);
    let counts = outbox::record_failures(&mut tx, &[fail(Duration::from_secs(3600))], 2).await?;
    assert_eq!((counts.retrying, counts.failed), (1, 0));
    tx.commit().await?;
    let mut tx = db.pool.begin().await?;
    let due: Vec<i64> = outbox::claim(&mut tx, 10)
        .await?
        .iter()
        .map(|r| r.id)
        .collect();
    assert_eq!(due, vec![other], "a row backing off is not claimed");
    tx.rollback().await?;
    let status = outbox::status(&db.pool).await?;
    assert_eq!((status.pending, status.retrying, status.failed), (2, 1, 0));
    assert!(status.oldest_pending_age.is_some());

    // Second failure, the last of two attempts: failed, with its error.
    let mut tx = db.pool.begin().await?;
    let counts = outbox::record_failures(&mut tx, &[fail(Duration::ZERO)], 2).await?;
    assert_eq!((counts.retrying, counts.failed), (0, 1));
    tx.commit().await?;
    let failed = outbox::failed(&db.pool, 10).await?;
    assert_eq!(failed.len(), 1);
    assert_eq!(failed[0].id, id);
    assert_eq!(failed[0].attempts, 2);
    assert_eq!(
        failed[0].last_error.as_deref(),
        Some("unroutable: no queue")
    );
    let status = outbox::status(&db.pool).await?;
    assert_eq!((status.pending, status.failed), (1, 1));

    // Replay: pending, due now, attempts reset; the drain is woken.
    let mut listener = PgListener::connect(&db.url).await?;
    listener.listen(outbox::CHANNEL).await?;
    assert_eq!(
        outbox::retry(
            &db.pool,
            id,
            &worker_store::audit::Actor::new("test", "test-host")
        )
        .await?,
        RetryResult::Requeued
    );
    tokio::time::timeout(Duration::from_secs(5), listener.recv()).await??;
    let (status, attempts): (String, i32) =
        sqlx::query_as("SELECT status, attempts FROM outbox WHERE id = $1")
            .bind(id)
            .fetch_one(&db.pool)
            .await?;
    assert_eq!((status.as_str(), attempts), ("pending", 0));
    assert_eq!(
        outbox::retry(
            &db.pool,
            999_999,
            &worker_store::audit::Actor::new("test", "test-host")
        )
        .await?,
        RetryResult::Gone
    );

    let mut tx = db.pool.begin().await?;
    outbox::delete_published(&mut tx, &[other]).await?;
    outbox::record_failures(&mut tx, &[fail(Duration::ZERO)], 1).await?;
    tx.commit().await?;
    assert_eq!(
        outbox::retry(
            &db.pool,
            other,
            &worker_store::audit::Actor::new("test", "test-host")
        )
        .await?,
        RetryResult::Gone,
        "a published row is gone: its retry says so"
    );
    assert_eq!(
        outbox::retry_all_failed(
            &db.pool,
            &worker_store::audit::Actor::new("test", "test-host")
        )
        .await?,
        1
    );
    assert_eq!(
        outbox::retry_all_failed(
            &db.pool,
            &worker_store::audit::Actor::new("test", "test-host")
        )
        .await?,
        0
    );
    assert_eq!(count(&db, "failed").await?, 0);
    Ok(())
}

/// `n` rows that gave up, oldest first; their ids.
async fn failed_rows(db: &TestDb, n: usize, from: usize) -> anyhow::Result<Vec<i64>> {
    let messages: Vec<OutboxMessage> = (from..from + n).map(message).collect();
    let mut tx = db.pool.begin().await?;
    let ids = outbox::enqueue_many(&mut tx, "events", "k", &messages).await?;
    let failures: Vec<PublishFailure> = ids
        .iter()
        .map(|&id| PublishFailure {
            id,
            error: "unroutable".into(),
            retry_in: Duration::ZERO,
        })
        .collect();
    outbox::record_failures(&mut tx, &failures, 1).await?;
    tx.commit().await?;
    Ok(ids)
}

#[tokio::test]
async fn a_retry_of_every_failed_row_has_a_recorded_dry_run_and_keeps_to_what_was_confirmed()
-> anyhow::Result<()> {
    let db = TestDb::create().await?;
    let actor = worker_store::audit::Actor::new("test", "test-host");
    let first = failed_rows(&db, 3, 0).await?;

    let plan = outbox::retry_all_failed_dry_run(&db.pool, &actor, 2).await?;
    assert!(plan.dry_run);
    assert_eq!((plan.matched, plan.requeued), (3, 0));
    let shown: Vec<i64> = plan.rows.iter().map(|r| r.id).collect();
    assert_eq!(shown, first[..2], "the first rows, oldest first");
    assert_eq!(count(&db, "failed").await?, 3, "a dry run moves nothing");
    let recorded = worker_store::audit::get(&db.pool, plan.action_id)
        .await?
        .unwrap();
    assert_eq!(
        (
            recorded.action.as_str(),
            recorded.dry_run,
            recorded.matched,
            recorded.succeeded
        ),
        ("outbox-retry", true, 3, 0)
    );

    // Two more give up before the operator confirms the three shown.
    let later = failed_rows(&db, 2, 3).await?;
    let done = outbox::retry_failed(&db.pool, &actor, Some(plan.matched)).await?;
    assert_eq!(
        (done.dry_run, done.requeued, done.beyond_planned),
        (false, 3, Some(2))
    );
    let still_failed: Vec<i64> =
        sqlx::query_scalar("SELECT id FROM outbox WHERE status = 'failed' ORDER BY id")
            .fetch_all(&db.pool)
            .await?;
    assert_eq!(still_failed, later, "the oldest three went back");
    let recorded = worker_store::audit::get(&db.pool, done.action_id)
        .await?
        .unwrap();
    assert_eq!((recorded.planned, recorded.succeeded), (Some(3), 3));
    let note = recorded.note.unwrap_or_default();
    assert!(
        note.contains("3 confirmed") && note.contains("2 more"),
        "{note}"
    );

    // Without a cap, every failed row goes back.
    let rest = outbox::retry_failed(&db.pool, &actor, None).await?;
    assert_eq!((rest.requeued, rest.beyond_planned), (2, None));
    assert_eq!(count(&db, "failed").await?, 0);
    Ok(())
}

/// One batch's transaction with a confirmed row and a failed one: the confirmed row goes, the
/// failed one stays pending with its attempt and error, and a rollback keeps both.
#[tokio::test]
async fn a_failed_row_stays_with_its_attempt_beside_a_deleted_one() -> anyhow::Result<()> {
    let db = TestDb::create().await?;
    let mut tx = db.pool.begin().await?;
    let ids = outbox::enqueue_many(&mut tx, "events", "k", &[message(1), message(2)]).await?;
    tx.commit().await?;
    let failure = PublishFailure {
        id: ids[1],
        error: "nacked".into(),
        retry_in: Duration::ZERO,
    };

    // A crash before the commit: nothing changes.
    let mut tx = db.pool.begin().await?;
    assert_eq!(outbox::claim(&mut tx, 10).await?.len(), 2);
    outbox::delete_published(&mut tx, &ids[..1]).await?;
    outbox::record_failures(&mut tx, std::slice::from_ref(&failure), 5).await?;
    drop(tx);
    assert_eq!(count(&db, "pending").await?, 2, "rolled back: both wait");

    let mut tx = db.pool.begin().await?;
    assert_eq!(outbox::claim(&mut tx, 10).await?.len(), 2);
    assert_eq!(outbox::delete_published(&mut tx, &ids[..1]).await?, 1);
    outbox::record_failures(&mut tx, &[failure], 5).await?;
    tx.commit().await?;
    let rows: Vec<(i64, String, i32, Option<String>)> =
        sqlx::query_as("SELECT id, status, attempts, last_error FROM outbox ORDER BY id")
            .fetch_all(&db.pool)
            .await?;
    assert_eq!(
        rows,
        vec![(ids[1], "pending".into(), 1, Some("nacked".into()))]
    );
    Ok(())
}

/// Rows an earlier release marked processed (any age) go in batches; pending and failed rows
/// stay, whatever their age.
#[tokio::test]
async fn rows_an_earlier_release_marked_processed_are_swept_in_batches() -> anyhow::Result<()> {
    let db = TestDb::create().await?;
    let messages: Vec<OutboxMessage> = (0..25).map(message).collect();
    let mut tx = db.pool.begin().await?;
    let ids = outbox::enqueue_many(&mut tx, "events", "k", &messages).await?;
    tx.commit().await?;
    // 12 as an earlier release left them, one a minute old; 3 failed; 10 pending and old.
    sqlx::query(
        "UPDATE outbox SET status = 'processed', \
                processed_at = now() - make_interval(days => (id % 3)::int) \
         WHERE id = ANY($1)",
    )
    .bind(&ids[..12])
    .execute(&db.pool)
    .await?;
    sqlx::query("UPDATE outbox SET status = 'failed', attempts = 10 WHERE id = ANY($1)")
        .bind(&ids[12..15])
        .execute(&db.pool)
        .await?;
    sqlx::query("UPDATE outbox SET created_at = now() - interval '9 days' WHERE id = ANY($1)")
        .bind(&ids[15..])
        .execute(&db.pool)
        .await?;
    let mut batches = Vec::new();
    loop {
        let gone = outbox::sweep_processed_batch(&db.pool, 5).await?;
        batches.push(gone);
        if gone < 5 {
            break;
        }
    }
    assert_eq!(batches, [5, 5, 2]);
    assert_eq!(count(&db, "processed").await?, 0);
    assert_eq!(count(&db, "failed").await?, 3);
    assert_eq!(count(&db, "pending").await?, 10);
    let status = outbox::status(&db.pool).await?;
    let age = status.oldest_pending_age.expect("pending rows");
    assert!(age >= Duration::from_secs(8 * 24 * 3600), "{age:?}");
    Ok(())
}
