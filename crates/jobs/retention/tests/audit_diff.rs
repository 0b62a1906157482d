//! An edit's diff in the audit trail ages out (`jobs.retention.audit_diff`), against the real
//! PostgreSQL: the diff is redacted, the entry and the rule that no audit row is deleted stay.

// Test support: a failed expectation should fail the test loudly.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use job_retention::{Retention, RetentionConfig};
use serde_json::{Value, json};
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;
use worker_core::WorkContext;
use worker_store::audit::{self, Actor, EntryKind, NewEntry, Via};
use worker_testkit::TestDb;

const DAY: Duration = Duration::from_secs(24 * 3600);

/// An edit of a failed mail, as the console records it, started `age_days` ago.
async fn edit(pool: &PgPool, age_days: i32) -> anyhow::Result<i64> {
    let actor = Actor::account("alice", "10.0.0.5", Via::Console);
    let target = json!({
        "outbound_email_id": "5b0c1b44-4f6e-4a43-9b1f-6d0e0d1f6a01",
        "edit_key": format!("key-{age_days}"),
        "dead_letters": [7],
        "diff": {
            "to": {"before": ["Ann <ann@example.com>"], "after": ["ann@example.org"]},
            "text": {"before": "Dear Ann, your parcel", "after": "Dear Ann, the parcel"},
        },
    });
    let mut conn = pool.acquire().await?;
    let id = audit::record(
        &mut conn,
        &NewEntry::new(EntryKind::Edit, &actor, target),
        1,
        0,
        Some("mail edited (to, text)".into()),
    )
    .await?;
    // The database dates every row itself: only with its rule switched off can a test write
    // an old one.
    sqlx::query("ALTER TABLE dead_letter_actions DISABLE TRIGGER dead_letter_actions_audit")
        .execute(&mut *conn)
        .await?;
    sqlx::query(
        "UPDATE dead_letter_actions SET started_at = now() - make_interval(days => $2), \
                finished_at = now() - make_interval(days => $2) WHERE id = $1",
    )
    .bind(id)
    .bind(age_days)
    .execute(&mut *conn)
    .await?;
    sqlx::query("ALTER TABLE dead_letter_actions ENABLE TRIGGER dead_letter_actions_audit")
        .execute(&mut *conn)
        .await?;
    Ok(id)
}

async fn target(pool: &PgPool, id: i64) -> anyhow::Result<Value> {
    Ok(
        sqlx::query_scalar("SELECT filter FROM dead_letter_actions WHERE id = $1")
            .bind(id)
            .fetch_one(pool)
            .await?,
    )
}

#[tokio::test]
async fn an_edits_diff_older_than_its_retention_is_redacted_and_a_younger_one_kept()
-> anyhow::Result<()> {
    let db = TestDb::create().await?;
    let pool = &db.pool;
    let old = edit(pool, 31).await?;
    let young = edit(pool, 29).await?;
    let before_old = audit::get(pool, old).await?.unwrap();
    let kept = target(pool, young).await?;

    let job = Retention::new(
        pool.clone(),
        RetentionConfig {
            audit_diff: 30 * DAY,
            ..RetentionConfig::default()
        },
    );
    let ctx = WorkContext::new(job_retention::JOB_NAME, CancellationToken::new());
    let report = job.run(&ctx).await?;
    assert_eq!(report.audit_diff.swept, 1, "{report:?}");

    let aged = audit::get(pool, old).await?.unwrap();
    assert_eq!(
        aged.filter["diff"],
        json!({"to": "[redacted]", "text": "[redacted]"}),
        "the kind of change stays: which fields changed"
    );
    assert!(aged.filter["redacted"]["diff_aged_at"].is_string());
    assert_eq!(aged.filter["edit_key"], before_old.filter["edit_key"]);
    assert!(!aged.filter.to_string().contains("ann@"), "{}", aged.filter);
    // Who, what and when are as written.
    assert_eq!(
        (
            &aged.action,
            &aged.account,
            &aged.via,
            aged.started_at,
            aged.finished_at
        ),
        (
            &before_old.action,
            &before_old.account,
            &before_old.via,
            before_old.started_at,
            before_old.finished_at
        )
    );
    assert_eq!(target(pool, young).await?, kept, "a younger diff is kept");

    // A second run finds nothing more to do.
    assert_eq!(job.run(&ctx).await?.audit_diff.swept, 0);
    Ok(())
}

#[tokio::test]
async fn audit_rows_still_cannot_be_deleted_nor_changed_beyond_a_redaction() -> anyhow::Result<()> {
    let db = TestDb::create().await?;
    let pool = &db.pool;
    let id = edit(pool, 40).await?;

    let deleted = sqlx::query("DELETE FROM dead_letter_actions WHERE id = $1")
        .bind(id)
        .execute(pool)
        .await;
    assert!(deleted.is_err(), "a delete of an audit row must fail");

    // A change of who acted is no redaction.
    let moved = sqlx::query(
        "UPDATE dead_letter_actions SET account = 'mallory', \
                             filter = filter || '{\"redacted\": {}}' WHERE id = $1",
    )
    .bind(id)
    .execute(pool)
    .await;
    assert!(moved.is_err(), "only a redaction may change a finished row");
    // Nor is a diff rewritten with other text.
    let rewritten = sqlx::query(
        "UPDATE dead_letter_actions SET filter = jsonb_set(filter, '{diff,text,after}', \
                '\"Dear Ann, no parcel\"') || '{\"redacted\": {}}' WHERE id = $1",
    )
    .bind(id)
    .execute(pool)
    .await;
    assert!(rewritten.is_err(), "a diff is redacted, never rewritten");
    // Text cut around a marker is a redaction; text added with it is not.
    let cut = sqlx::query(
        "UPDATE dead_letter_actions SET filter = jsonb_set(filter, '{diff,text,before}', \
                '\"Dear [erased], your parcel\"') || '{\"redacted\": {}}' WHERE id = $1",
    )
    .bind(id)
    .execute(pool)
    .await;
    assert!(cut.is_ok(), "{cut:?}");
    let added = sqlx::query(
        "UPDATE dead_letter_actions SET filter = jsonb_set(filter, '{diff,text,before}', \
                '\"Dear [erased], your parcel is lost\"') || '{\"redacted\": {}}' WHERE id = $1",
    )
    .bind(id)
    .execute(pool)
    .await;
    assert!(added.is_err(), "text added beside a marker is no redaction");

    Retention::new(pool.clone(), RetentionConfig::default())
        .run(&WorkContext::new(
            job_retention::JOB_NAME,
            CancellationToken::new(),
        ))
        .await?;
    assert_eq!(
        target(pool, id).await?["diff"],
        json!({"to": "[redacted]", "text": "[redacted]"})
    );
    let deleted = sqlx::query("DELETE FROM dead_letter_actions")
        .execute(pool)
        .await;
    assert!(deleted.is_err(), "a redacted row is still never deleted");
    Ok(())
}
