//! Other teams' audit entries age out only when `jobs.retention.audit_log` is set, against the
//! real PostgreSQL.

// Test support: a failed expectation should fail the test loudly.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use job_retention::{Retention, RetentionConfig, RetentionSettings};
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;
use worker_core::{Section, WorkContext};
use worker_testkit::TestDb;

const DAY: Duration = Duration::from_secs(24 * 3600);

/// An entry that occurred `age_days` ago; its id.
async fn entry(pool: &PgPool, age_days: i32) -> Uuid {
    let id = Uuid::new_v4();
    sqlx::query(
        "INSERT INTO audit_log_entries \
             (id, occurred_at, actor, action, entity_type, entity_id, data) \
         VALUES ($1, now() - make_interval(days => $2), 'someone', 'did', 'thing', '1', '{}')",
    )
    .bind(id)
    .bind(age_days)
    .execute(pool)
    .await
    .unwrap();
    id
}

async fn left(pool: &PgPool) -> Vec<Uuid> {
    sqlx::query_scalar("SELECT id FROM audit_log_entries")
        .fetch_all(pool)
        .await
        .unwrap()
}

fn ctx() -> WorkContext {
    WorkContext::new(job_retention::JOB_NAME, CancellationToken::new())
}

#[tokio::test]
async fn audit_entries_are_kept_for_good_when_audit_log_is_unset() -> anyhow::Result<()> {
    let db = TestDb::create().await?;
    entry(&db.pool, 4000).await;
    let job = Retention::new(db.pool.clone(), RetentionConfig::default());
    let report = job.run(&ctx()).await?;
    assert_eq!(report.audit_log.swept, 0);
    assert_eq!(left(&db.pool).await.len(), 1);
    Ok(())
}

#[tokio::test]
async fn audit_entries_older_than_audit_log_are_deleted_and_younger_ones_kept() -> anyhow::Result<()>
{
    let db = TestDb::create().await?;
    entry(&db.pool, 40).await;
    entry(&db.pool, 31).await;
    let young = entry(&db.pool, 29).await;
    let job = Retention::new(
        db.pool.clone(),
        RetentionConfig {
            audit_log: Some(30 * DAY),
            ..RetentionConfig::default()
        },
    );
    let report = job.run(&ctx()).await?;
    assert_eq!(report.audit_log.swept, 2, "{report:?}");
    assert_eq!(left(&db.pool).await, vec![young]);
    Ok(())
}

#[test]
fn the_audit_log_key_is_read_as_an_age_and_unset_by_default() {
    assert_eq!(RetentionSettings::default().audit_log, None);
    let set: RetentionSettings = toml::from_str("audit_log = \"365days\"").unwrap();
    assert_eq!(set.config().audit_log, Some(365 * DAY));
    let zero: RetentionSettings = toml::from_str("audit_log = \"0s\"").unwrap();
    assert_eq!(zero.validate().len(), 1);
}
