//! The migrated template database [`crate::TestDb::create`] copies: running the migrations
//! once per server and copying the result (`CREATE DATABASE … TEMPLATE`) costs a test a
//! fraction of migrating a database of its own.
//!
//! The template's name carries a digest of the migrations (versions and checksums), so a
//! changed migration gets a template of its own. It is built under another name and renamed
//! when complete, under an advisory lock, so a run that was killed half-way never leaves a
//! half-migrated template to copy.

use anyhow::Context;
use sqlx::PgConnection;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

/// The advisory lock that serialises building templates on a server.
const BUILD_LOCK: i64 = 0x0077_685f_746d_706c;

/// The name of the template for the project's current migrations.
pub(crate) fn name() -> String {
    let mut digest = String::new();
    for m in worker_store::MIGRATOR.iter() {
        digest.push_str(&format!("{}:{};", m.version, hex(&m.checksum)));
    }
    let id = uuid::Uuid::new_v5(&uuid::Uuid::NAMESPACE_OID, digest.as_bytes());
    format!("wh_template_{}", &id.simple().to_string()[..16])
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Makes sure the template for the current migrations exists on the server `admin` is
/// connected to; returns its name.
pub(crate) async fn ensure(
    admin: &mut PgConnection,
    admin_options: &PgConnectOptions,
) -> anyhow::Result<String> {
    let name = name();
    if exists(admin, &name).await? {
        return Ok(name);
    }
    sqlx::query("SELECT pg_advisory_lock($1)")
        .bind(BUILD_LOCK)
        .execute(&mut *admin)
        .await?;
    let built = build(admin, admin_options, &name).await;
    let _ = sqlx::query("SELECT pg_advisory_unlock($1)")
        .bind(BUILD_LOCK)
        .execute(&mut *admin)
        .await;
    built.map(|()| name)
}

async fn exists(admin: &mut PgConnection, name: &str) -> anyhow::Result<bool> {
    Ok(
        sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)")
            .bind(name)
            .fetch_one(&mut *admin)
            .await?,
    )
}

async fn build(
    admin: &mut PgConnection,
    admin_options: &PgConnectOptions,
    name: &str,
) -> anyhow::Result<()> {
    if exists(admin, name).await? {
        return Ok(()); // another test built it while this one waited for the lock
    }
    let building = format!("{name}_building");
    sqlx::query(&format!(
        r#"DROP DATABASE IF EXISTS "{building}" WITH (FORCE)"#
    ))
    .execute(&mut *admin)
    .await?;
    sqlx::query(&format!(r#"CREATE DATABASE "{building}""#))
        .execute(&mut *admin)
        .await
        .with_context(|| format!("creating template database {building}"))?;
    let pool = PgPoolOptions::new()
        .max_connections(1)
        .connect_with(admin_options.clone().database(&building))
        .await?;
    let migrated = worker_store::migrate(&pool, "testkit").await;
    pool.close().await;
    migrated.context("migrating the template database")?;
    // The server ends a closed connection's backend a moment later; the rename waits for it.
    // (Autovacuum workers on the fresh tables do not count: the rename ends them itself.)
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let sessions: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_stat_activity \
                 WHERE datname = $1 AND backend_type = 'client backend'",
        )
        .bind(&building)
        .fetch_one(&mut *admin)
        .await?;
        if sessions == 0 {
            break;
        }
        anyhow::ensure!(
            tokio::time::Instant::now() < deadline,
            "the migration's session on {building} did not end"
        );
        tokio::time::sleep(crate::wait::POLL).await;
    }
    sqlx::query(&format!(
        r#"ALTER DATABASE "{building}" RENAME TO "{name}""#
    ))
    .execute(&mut *admin)
    .await
    .with_context(|| format!("renaming {building} to {name}"))?;
    Ok(())
}
