//! The processed-message guard on the real database.

use worker_store::ProcessedMessages;
use worker_testkit::TestDb;

#[tokio::test]
async fn fifty_concurrent_marks_of_one_id_make_exactly_one_true() -> anyhow::Result<()> {
    let db = TestDb::create().await?;
    let guard = ProcessedMessages::new();
    let attempts = (0..50).map(|_| {
        let pool = db.pool.clone();
        let guard = guard.clone();
        tokio::spawn(async move {
            let mut tx = pool.begin().await?;
            let fresh = guard.mark(&mut tx, "email.send", "message-1").await?;
            tx.commit().await?;
            anyhow::Ok(fresh)
        })
    });
    let results = futures::future::try_join_all(attempts).await?;
    let fresh = results.into_iter().collect::<anyhow::Result<Vec<bool>>>()?;
    assert_eq!(fresh.iter().filter(|f| **f).count(), 1, "{fresh:?}");
    Ok(())
}

#[tokio::test]
async fn a_mark_inside_a_rolled_back_transaction_leaves_no_mark() -> anyhow::Result<()> {
    let db = TestDb::create().await?;
    let guard = ProcessedMessages::new();
    let mut tx = db.pool.begin().await?;
    assert!(guard.mark(&mut tx, "scope", "id-1").await?);
    tx.rollback().await?;

    let mut tx = db.pool.begin().await?;
    assert!(
        guard.mark(&mut tx, "scope", "id-1").await?,
        "the rolled-back mark must not count"
    );
    tx.commit().await?;
    let mut tx = db.pool.begin().await?;
    assert!(
        !guard.mark(&mut tx, "scope", "id-1").await?,
        "a committed mark makes the next one a duplicate"
    );
    Ok(())
}

#[tokio::test]
async fn scopes_are_independent_and_the_batched_path_reports_each_id() -> anyhow::Result<()> {
    let db = TestDb::create().await?;
    let guard = ProcessedMessages::new();
    let mut tx = db.pool.begin().await?;
    assert!(guard.mark(&mut tx, "a", "x").await?);
    assert!(guard.mark(&mut tx, "b", "x").await?);
    let ids: Vec<String> = ["x", "y", "y", "z"].iter().map(|s| s.to_string()).collect();
    assert_eq!(
        guard.mark_many(&mut tx, "a", &ids).await?,
        vec![false, true, false, true]
    );
    tx.commit().await?;
    Ok(())
}

#[tokio::test]
async fn a_look_sees_only_committed_or_own_marks_and_marks_nothing() -> anyhow::Result<()> {
    let db = TestDb::create().await?;
    let guard = ProcessedMessages::new();
    let mut tx = db.pool.begin().await?;
    assert!(!guard.is_marked(&mut tx, "scope", "id-1").await?);
    assert!(
        !guard.is_marked(&mut tx, "scope", "id-1").await?,
        "a look takes no mark"
    );
    assert!(guard.mark(&mut tx, "scope", "id-1").await?);
    assert!(guard.is_marked(&mut tx, "scope", "id-1").await?);
    assert!(!guard.is_marked(&mut tx, "other", "id-1").await?);
    tx.commit().await?;
    Ok(())
}

#[tokio::test]
async fn the_sweep_removes_only_marks_past_their_retention() -> anyhow::Result<()> {
    let db = TestDb::create().await?;
    let guard = ProcessedMessages::new();
    sqlx::query("INSERT INTO processed_messages (scope, id, processed_at) VALUES ('s', 'old', now() - interval '8 days'), ('s', 'new', now())")
        .execute(&db.pool)
        .await?;
    let removed = guard
        .sweep(&db.pool, std::time::Duration::from_secs(7 * 24 * 3600))
        .await?;
    assert_eq!(removed, 1);
    let left: Vec<String> = sqlx::query_scalar("SELECT id FROM processed_messages")
        .fetch_all(&db.pool)
        .await?;
    assert_eq!(left, vec!["new".to_string()]);
    Ok(())
}
