//! The audit trail of `dlq replay` and `dlq purge` holds: the host's own database role cannot
//! rewrite who did what, nor delete it. On a real database, as the host's role.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use job_dead_letter_archive::*;
use worker_testkit::TestDb;

fn actor() -> Actor {
    Actor::new("ops-test", "test-host")
}

/// The statement's error from PostgreSQL, or a panic naming the statement that went through.
async fn refused(pool: &sqlx::PgPool, sql: &str) -> String {
    match sqlx::query(sql).execute(pool).await {
        Ok(done) => panic!(
            "`{sql}` went through ({} rows): the audit trail can be rewritten",
            done.rows_affected()
        ),
        Err(err) => err.to_string(),
    }
}

#[tokio::test]
async fn a_recorded_purge_cannot_be_rewritten_or_deleted() -> anyhow::Result<()> {
    let db = TestDb::create().await?;
    let report = purge(&db.pool, &Filter::default(), &actor()).await?;
    let before = audit_entries(&db.pool, 10).await?;
    assert_eq!(before.len(), 1);

    for sql in [
        "UPDATE dead_letter_actions SET actor_user = 'someone-else'",
        "UPDATE dead_letter_actions SET matched = 0, note = 'nothing happened'",
        "UPDATE dead_letter_actions SET finished_at = NULL",
        "DELETE FROM dead_letter_actions",
        "TRUNCATE dead_letter_actions CASCADE",
    ] {
        let why = refused(&db.pool, sql).await;
        // The trigger's refusal, or the privilege the migration took away.
        assert!(
            why.contains("audit") || why.contains("permission denied"),
            "{sql}: {why}"
        );
    }
    assert_eq!(audit_entries(&db.pool, 10).await?, before);
    assert_eq!(before[0].id, report.action_id);
    Ok(())
}

#[tokio::test]
async fn an_unfinished_replay_cannot_change_who_ran_it() -> anyhow::Result<()> {
    let db = TestDb::create().await?;
    // A replay in progress: its counts and end are still to be written.
    sqlx::query(
        "INSERT INTO dead_letter_actions (action, actor_user, actor_host, filter) \
         VALUES ('replay', 'ops', 'host-1', '{}')",
    )
    .execute(&db.pool)
    .await?;
    sqlx::query("UPDATE dead_letter_actions SET matched = matched + 3, succeeded = succeeded + 3")
        .execute(&db.pool)
        .await?;
    for sql in [
        "UPDATE dead_letter_actions SET actor_user = 'someone-else'",
        "UPDATE dead_letter_actions SET filter = '{\"queue\": \"x\"}'",
        "UPDATE dead_letter_actions SET started_at = now() - interval '1 day'",
        "UPDATE dead_letter_actions SET matched = 1",
    ] {
        let why = refused(&db.pool, sql).await;
        assert!(why.contains("audit"), "{sql}: {why}");
    }
    sqlx::query("UPDATE dead_letter_actions SET finished_at = now()")
        .execute(&db.pool)
        .await?;
    let row = audit_entries(&db.pool, 1).await?.remove(0);
    assert_eq!((row.actor_user.as_str(), row.matched), ("ops", 3));
    Ok(())
}
