//! The schema's contract on the real database: the release that migrated it is recorded, and
//! an older binary's check accepts a newer schema that only expanded and refuses one a contract
//! step it does not know changed, or one nobody recorded, naming both releases.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

use worker_store::schema::{self, Compatibility, SchemaError, SchemaVersion};
use worker_testkit::TestDb;

/// A migration of "a newer release": above every one this binary has.
const FUTURE: i64 = 20991231000100;

fn newest_known() -> i64 {
    worker_store::MIGRATOR
        .iter()
        .map(|m| m.version)
        .max()
        .unwrap()
}

/// What a newer release leaves: its migration applied, and (when `kind` is given) recorded.
async fn newer_release_migrated(db: &TestDb, kind: Option<&str>) -> anyhow::Result<()> {
    sqlx::query(
        "INSERT INTO _sqlx_migrations (version, description, success, checksum, execution_time) \
         VALUES ($1, 'a newer release''s', true, '\\x00'::bytea, 0)",
    )
    .bind(FUTURE)
    .execute(&db.pool)
    .await?;
    if let Some(kind) = kind {
        let steps: Vec<i64> = if kind == "contract" {
            vec![FUTURE]
        } else {
            vec![]
        };
        sqlx::query(
            "INSERT INTO schema_releases (version, release, kind, contract_steps) \
             VALUES ($1, '9.9.0', $2, $3)",
        )
        .bind(FUTURE)
        .bind(kind)
        .bind(&steps)
        .execute(&db.pool)
        .await?;
    }
    Ok(())
}

#[tokio::test]
async fn migrate_records_the_release_once_per_move_of_the_schema() -> anyhow::Result<()> {
    let db = TestDb::create_empty().await?;
    assert_eq!(
        schema::check(&db.pool, "1.2.3").await?,
        Compatibility::Known {
            pending: worker_store::MIGRATOR.iter().map(|m| m.version).collect()
        }
    );
    worker_store::migrate(&db.pool, "1.2.3").await?;
    let rows: Vec<(i64, String, String, Vec<i64>)> = sqlx::query_as(
        "SELECT version, release, kind, contract_steps FROM schema_releases ORDER BY version",
    )
    .fetch_all(&db.pool)
    .await?;
    assert_eq!(
        rows,
        [(
            newest_known(),
            "1.2.3".to_string(),
            "expand".to_string(),
            vec![]
        )]
    );
    // Nothing new applied: nothing new recorded, whoever runs it.
    worker_store::migrate(&db.pool, "1.2.4").await?;
    let count: i64 = sqlx::query_scalar("SELECT count(*) FROM schema_releases")
        .fetch_one(&db.pool)
        .await?;
    assert_eq!(count, 1);
    assert_eq!(
        schema::version(&db.pool).await?,
        Some(SchemaVersion {
            version: newest_known(),
            release: Some("1.2.3".into())
        })
    );
    assert_eq!(
        schema::check(&db.pool, "1.2.4").await?,
        Compatibility::Known { pending: vec![] }
    );
    Ok(())
}

#[tokio::test]
async fn a_newer_schema_with_expand_steps_only_is_accepted_without_migrating() -> anyhow::Result<()>
{
    let db = TestDb::create().await?;
    newer_release_migrated(&db, Some("expand")).await?;
    assert_eq!(
        schema::check(&db.pool, "0.1.0").await?,
        Compatibility::Ahead {
            unknown: vec![FUTURE],
            release: "9.9.0".into()
        }
    );
    assert_eq!(
        schema::version(&db.pool).await?,
        Some(SchemaVersion {
            version: FUTURE,
            release: Some("9.9.0".into())
        })
    );
    Ok(())
}

#[tokio::test]
async fn a_newer_schema_with_a_contract_step_is_refused_naming_both_releases() -> anyhow::Result<()>
{
    let db = TestDb::create().await?;
    newer_release_migrated(&db, Some("contract")).await?;
    let err = schema::check(&db.pool, "0.1.0").await.unwrap_err();
    assert!(
        matches!(&err, SchemaError::Contracted { steps, .. } if steps == &[FUTURE]),
        "{err:?}"
    );
    let text = err.to_string();
    assert!(
        text.contains("release 9.9.0") && text.contains("release 0.1.0"),
        "{text}"
    );
    Ok(())
}

#[tokio::test]
async fn a_newer_migration_nobody_recorded_is_refused() -> anyhow::Result<()> {
    let db = TestDb::create().await?;
    newer_release_migrated(&db, None).await?;
    let err = schema::check(&db.pool, "0.1.0").await.unwrap_err();
    assert!(
        matches!(&err, SchemaError::Unrecorded { unknown, .. } if unknown == &[FUTURE]),
        "{err:?}"
    );
    // sqlx's own answer, which the check comes before.
    let sqlx = worker_store::migrate(&db.pool, "0.1.0").await.unwrap_err();
    assert!(
        matches!(sqlx, sqlx::migrate::MigrateError::VersionMissing(FUTURE)),
        "{sqlx:?}"
    );
    Ok(())
}
