//! The schema's contract on the real binary (ARCHITECTURE.md, "Schema contract"): the release
//! that migrated the database is recorded and shown on `/readyz`; a database a newer release
//! migrated with expand steps only is run on without migrating; one where a newer release ran
//! a contract step this binary does not know is refused at start, naming both releases, with
//! exit 64 (and so is `worker-host migrate`, where sqlx would say `VersionMissing`).

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

mod support;

use std::path::Path;

use support::{Host, SERIAL, base_settings};
use worker_testkit::{TestDb, TestVhost};

const RELEASE: &str = env!("CARGO_PKG_VERSION");
/// A migration of "a newer release", above every one this binary has.
const FUTURE: i64 = 20991231000100;
const NEWER: &str = "9.9.0";
const SHOW_LOG: &str = "WH_SCHEMA_CONTRACT_LOG";

/// What a newer release leaves: its migration applied and recorded as `kind`.
async fn newer_release_migrated(db: &TestDb, kind: &str) -> anyhow::Result<()> {
    sqlx::query(
        "INSERT INTO _sqlx_migrations (version, description, success, checksum, execution_time) \
         VALUES ($1, 'a newer release''s', true, '\\x00'::bytea, 0)",
    )
    .bind(FUTURE)
    .execute(&db.pool)
    .await?;
    let steps: Vec<i64> = if kind == "contract" {
        vec![FUTURE]
    } else {
        vec![]
    };
    sqlx::query(
        "INSERT INTO schema_releases (version, release, kind, contract_steps) \
         VALUES ($1, $2, $3, $4)",
    )
    .bind(FUTURE)
    .bind(NEWER)
    .bind(kind)
    .bind(&steps)
    .execute(&db.pool)
    .await?;
    Ok(())
}

async fn readyz_body(host: &Host) -> anyhow::Result<serde_json::Value> {
    Ok(serde_json::from_str(&host.get_text("/readyz").await?)?)
}

/// The test's settings: its own database, vhost and admin port.
fn settings<'a>(
    db: &'a TestDb,
    vhost: &'a TestVhost,
) -> impl FnOnce(&Path, u16) -> anyhow::Result<String> + 'a {
    move |_, port| Ok(base_settings("schema-contract", "[]", db, vhost, port))
}

#[tokio::test]
async fn a_fresh_database_records_this_release_and_readyz_shows_it() -> anyhow::Result<()> {
    let _serial = SERIAL.lock().await;
    let db = TestDb::create_empty().await?;
    let vhost = TestVhost::create().await?;
    let host = Host::launch(SHOW_LOG, settings(&db, &vhost)).await?;
    let newest = worker_store::MIGRATOR
        .iter()
        .map(|m| m.version)
        .max()
        .unwrap();
    let recorded: Vec<(i64, String, String)> =
        sqlx::query_as("SELECT version, release, kind FROM schema_releases")
            .fetch_all(&db.pool)
            .await?;
    assert_eq!(
        recorded,
        [(newest, RELEASE.to_string(), "expand".to_string())]
    );
    let body = readyz_body(&host).await?;
    assert_eq!(body["ready"], true, "{body}");
    assert_eq!(body["checks"]["database"]["status"], "up", "{body}");
    assert_eq!(body["schema"]["version"], newest, "{body}");
    assert_eq!(body["schema"]["release"], RELEASE, "{body}");
    // `migrate` again: nothing to apply, nothing recorded.
    let (code, _, stderr) = host.cli(&["migrate"]).await?;
    assert_eq!(code, Some(0), "{stderr}");
    let count: i64 = sqlx::query_scalar("SELECT count(*) FROM schema_releases")
        .fetch_one(&db.pool)
        .await?;
    assert_eq!(count, 1);
    host.stop_cleanly().await;
    Ok(())
}

#[tokio::test]
async fn a_newer_release_s_expand_only_schema_is_run_on_without_migrating() -> anyhow::Result<()> {
    let _serial = SERIAL.lock().await;
    let db = TestDb::create().await?;
    let vhost = TestVhost::create().await?;
    newer_release_migrated(&db, "expand").await?;
    let host = Host::launch(SHOW_LOG, settings(&db, &vhost)).await?;
    let body = readyz_body(&host).await?;
    assert_eq!(body["schema"]["version"], FUTURE, "{body}");
    assert_eq!(body["schema"]["release"], NEWER, "{body}");
    let log = host.log_text();
    assert!(
        log.contains(&format!(
            "the database was migrated by release {NEWER}, newer than this release ({RELEASE})"
        )),
        "no warning naming both releases:\n{}",
        host.log_tail()
    );
    // `migrate` leaves it alone, where sqlx would have failed with VersionMissing.
    let (code, _, stderr) = host.cli(&["migrate"]).await?;
    assert_eq!(code, Some(0), "{stderr}");
    let future: i64 = sqlx::query_scalar("SELECT max(version) FROM _sqlx_migrations")
        .fetch_one(&db.pool)
        .await?;
    assert_eq!(future, FUTURE);
    host.stop_cleanly().await;
    Ok(())
}

#[tokio::test]
async fn a_newer_release_s_contract_step_stops_the_start_naming_both_releases() -> anyhow::Result<()>
{
    let _serial = SERIAL.lock().await;
    let db = TestDb::create().await?;
    let vhost = TestVhost::create().await?;
    newer_release_migrated(&db, "contract").await?;
    let expected = format!(
        "release {NEWER} ran contract step(s) [{FUTURE}] on this database, which release {RELEASE} does not know"
    );
    // With migrate_on_start (the default) and without: the check runs either way.
    for env in [
        &[][..],
        &[("WORKER_HOST__DATABASE__MIGRATE_ON_START", "false")][..],
    ] {
        let mut host = Host::spawn(
            Path::new(env!("CARGO_BIN_EXE_worker-host")),
            SHOW_LOG,
            env,
            settings(&db, &vhost),
        )?;
        let started = host.wait_ready().await;
        assert!(started.is_err(), "the host started on a contracted schema");
        assert_eq!(host.stop().await, Some(64), "{}", host.log_tail());
        assert!(
            host.log_text().contains(&expected),
            "{env:?}: no error naming both releases:\n{}",
            host.log_tail()
        );
        // `migrate` too, where sqlx would have said VersionMissing.
        let (code, _, stderr) = host.cli(&["migrate"]).await?;
        assert_eq!(code, Some(64), "{stderr}");
        assert!(stderr.contains(&expected), "{stderr}");
    }
    Ok(())
}
