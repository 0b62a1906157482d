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

/// The migrations of "a newer release": this binary's files and `extra`, from a folder of
/// their own.
async fn newer_release(
    extra: &[(&str, &str)],
) -> anyhow::Result<(tempfile::TempDir, sqlx::migrate::Migrator)> {
    let dir = tempfile::tempdir()?;
    let ours = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../migrations");
    for entry in std::fs::read_dir(ours)? {
        let path = entry?.path();
        std::fs::copy(&path, dir.path().join(path.file_name().unwrap()))?;
    }
    for (name, sql) in extra {
        std::fs::write(dir.path().join(name), sql)?;
    }
    let migrator = sqlx::migrate::Migrator::new(dir.path()).await?;
    Ok((dir, migrator))
}

const INDEX: (&str, &str) = (
    "20991231000100_outbox_created.sql",
    "-- no-transaction\n-- An index on a growing table, as the migration rules have it built.\n\
     CREATE INDEX CONCURRENTLY outbox_created ON outbox (created_at);\n",
);
const DROP: (&str, &str) = (
    "20991231000200_outbox_created_gone.sql",
    "-- contract: release 9.9.0 stopped using outbox_created\nDROP INDEX outbox_created;\n",
);

#[tokio::test]
async fn newer_releases_record_their_steps_from_their_files_and_an_older_binary_reads_them()
-> anyhow::Result<()> {
    let db = TestDb::create().await?;
    // 9.9.0 expands: a concurrent index in a no-transaction migration, which sqlx applies.
    let (_dir, expand) = newer_release(&[INDEX]).await?;
    schema::migrate_with(&db.pool, &expand, "9.9.0").await?;
    let valid: bool = sqlx::query_scalar(
        "SELECT indisvalid FROM pg_index WHERE indexrelid = 'outbox_created'::regclass",
    )
    .fetch_one(&db.pool)
    .await?;
    assert!(valid);
    assert_eq!(
        schema::check(&db.pool, "0.1.0").await?,
        Compatibility::Ahead {
            unknown: vec![20991231000100],
            release: "9.9.0".into()
        }
    );
    // 10.0.0 contracts: this binary and 9.9.0's are refused, 10.0.0's is not.
    let (_dir, contract) = newer_release(&[INDEX, DROP]).await?;
    schema::migrate_with(&db.pool, &contract, "10.0.0").await?;
    let rows: Vec<(i64, String, String, Vec<i64>)> = sqlx::query_as(
        "SELECT version, release, kind, contract_steps FROM schema_releases \
         WHERE version > $1 ORDER BY version",
    )
    .bind(newest_known())
    .fetch_all(&db.pool)
    .await?;
    assert_eq!(
        rows,
        [
            (20991231000100, "9.9.0".into(), "expand".into(), vec![]),
            (
                20991231000200,
                "10.0.0".into(),
                "contract".into(),
                vec![20991231000200]
            ),
        ]
    );
    let ours = schema::check(&db.pool, "0.1.0").await.unwrap_err();
    assert!(
        matches!(&ours, SchemaError::Contracted { newer, steps, .. } if newer == "10.0.0" && steps == &[20991231000200]),
        "{ours:?}"
    );
    let theirs = schema::check_against(&db.pool, &expand, "9.9.0")
        .await
        .unwrap_err();
    assert!(
        theirs
            .to_string()
            .starts_with("release 10.0.0 ran contract step(s) [20991231000200] on this database, which release 9.9.0 does not know"),
        "{theirs}"
    );
    assert_eq!(
        schema::check_against(&db.pool, &contract, "10.0.0").await?,
        Compatibility::Known { pending: vec![] }
    );
    Ok(())
}
