//! The schema's contract (ARCHITECTURE.md, "Schema contract"): which release migrated the
//! database, and whether this binary may run on a database that a newer release migrated.
//!
//! A migration is an expand step unless its file's opening comment lines say
//! `-- contract: <what the previous release stopped using>`. Every [`migrate`] records in
//! `schema_releases` the highest migration it leaves applied, the release that applied it and
//! the contract steps among what it applied. An older binary never has a newer migration's
//! file, so that record is how it tells a schema it still runs on (only expand steps it does
//! not know) from one it must refuse (a contract step it does not know): [`check`].

use std::collections::BTreeSet;

use sqlx::PgPool;
use sqlx::migrate::{MigrateError, Migrator};

/// The marker of a contract step, at the start of one of the file's opening comment lines.
pub const CONTRACT_MARKER: &str = "-- contract:";

/// What a migration does to the release before it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StepKind {
    /// Adds only what the previous release ignores: that release keeps running on it.
    Expand,
    /// Removes or changes what the previous release stopped using: releases before that one
    /// no longer run on it.
    Contract,
}

impl StepKind {
    /// The kind a migration's SQL declares.
    pub fn of(sql: &str) -> Self {
        if contract_note(sql).is_some() {
            Self::Contract
        } else {
            Self::Expand
        }
    }
}

/// The text after [`CONTRACT_MARKER`] in the file's opening comment lines (the lines before the
/// first one that is not a comment), trimmed; `None` for an expand step. An empty note still
/// makes the file a contract step (the safe reading); the migration rules refuse it.
pub fn contract_note(sql: &str) -> Option<&str> {
    sql.lines()
        .map(str::trim)
        .take_while(|line| line.starts_with("--"))
        .find_map(|line| line.strip_prefix(CONTRACT_MARKER))
        .map(str::trim)
}

/// The highest migration applied, and the release that recorded it (`None` when no release
/// recorded it: applied before `schema_releases` existed, or by hand).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct SchemaVersion {
    pub version: i64,
    pub release: Option<String>,
}

/// What [`check`] found: this binary may run on the database.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Compatibility {
    /// Every applied migration is one of this binary's; `pending` are those it has and the
    /// database has not applied yet (what [`migrate`] would apply).
    Known { pending: Vec<i64> },
    /// The database has migrations this binary does not know (`unknown`), all of them expand
    /// steps, the newest recorded by `release`: this binary runs on it and must not migrate
    /// (sqlx refuses a database with migrations it does not have).
    Ahead { unknown: Vec<i64>, release: String },
}

/// Why this binary must not run on the database.
#[derive(Debug, thiserror::Error)]
pub enum SchemaError {
    /// A release newer than this one ran a contract step this binary does not know: the schema
    /// no longer has what this release uses.
    #[error(
        "release {newer} ran contract step(s) {steps:?} on this database, which release {ours} does not know: release {ours} no longer runs on this schema; run release {newer} or later"
    )]
    Contracted {
        ours: String,
        newer: String,
        steps: Vec<i64>,
    },
    /// The database has migrations this binary does not know and no release recorded whether
    /// they were expand steps (applied by hand, or the newer release stopped between applying
    /// and recording them; its next start records them).
    #[error(
        "the database has migration(s) {unknown:?} that release {ours} does not know, and no release recorded whether they only expand the schema (newest recorded release: {}): release {ours} does not start on it; start the release that applied them, which records them",
        .newest.as_deref().unwrap_or("none")
    )]
    Unrecorded {
        ours: String,
        newest: Option<String>,
        unknown: Vec<i64>,
    },
    /// The server reached is a standby: it takes no writes, so the schema cannot be migrated
    /// there, and what it shows may lag the primary's.
    #[error(
        "the database server at {server} is a standby (read-only, in recovery): the schema is checked and migrated only on the primary; point database.host at the primary, or list every member in database.hosts so the host finds the one that takes writes"
    )]
    Standby { server: String },
    #[error("reading the database's migrations: {0}")]
    Database(#[from] sqlx::Error),
}

/// Compares the migrations the database has applied with this binary's ([`crate::MIGRATOR`]);
/// `release` is this binary's release, for the errors. Reads only; refuses a standby
/// ([`SchemaError::Standby`]), where a migration would fail on the first statement.
pub async fn check(pool: &PgPool, release: &str) -> Result<Compatibility, SchemaError> {
    check_against(pool, &crate::MIGRATOR, release).await
}

/// [`check`] against another set of migrations.
pub async fn check_against(
    pool: &PgPool,
    migrator: &Migrator,
    release: &str,
) -> Result<Compatibility, SchemaError> {
    let standby: bool = sqlx::query_scalar("SELECT pg_is_in_recovery()")
        .fetch_one(pool)
        .await?;
    if standby {
        let options = pool.connect_options();
        return Err(SchemaError::Standby {
            server: format!("{}:{}", options.get_host(), options.get_port()),
        });
    }
    let known: BTreeSet<i64> = migrator.iter().map(|m| m.version).collect();
    let applied: BTreeSet<i64> = if table_exists(pool, "_sqlx_migrations").await? {
        // Every row, as sqlx reads them: a failed one is sqlx's to report (`Dirty`).
        sqlx::query_scalar("SELECT version FROM _sqlx_migrations")
            .fetch_all(pool)
            .await?
            .into_iter()
            .collect()
    } else {
        BTreeSet::new()
    };
    let unknown: Vec<i64> = applied.difference(&known).copied().collect();
    if unknown.is_empty() {
        return Ok(Compatibility::Known {
            pending: known.difference(&applied).copied().collect(),
        });
    }
    let records: Vec<(i64, String, Vec<i64>)> = if table_exists(pool, "schema_releases").await? {
        sqlx::query_as(
            "SELECT version, release, contract_steps FROM schema_releases ORDER BY version",
        )
        .fetch_all(pool)
        .await?
    } else {
        Vec::new()
    };
    let newest = records.last().map(|(_, release, _)| release.clone());
    // A row covers every migration up to its version, so migrations above the last row's are
    // the ones nobody recorded.
    let covered = records.last().map_or(i64::MIN, |(version, _, _)| *version);
    let unrecorded: Vec<i64> = unknown.iter().copied().filter(|v| *v > covered).collect();
    if !unrecorded.is_empty() {
        return Err(SchemaError::Unrecorded {
            ours: release.to_string(),
            newest,
            unknown: unrecorded,
        });
    }
    // A contract step this binary has is one its own release or an older one ran: the
    // previous release had stopped using what it removed, so it is no concern here.
    let contracted = records.iter().find_map(|(_, newer, steps)| {
        let theirs: Vec<i64> = steps
            .iter()
            .copied()
            .filter(|s| !known.contains(s))
            .collect();
        (!theirs.is_empty()).then(|| (newer.clone(), theirs))
    });
    if let Some((newer, steps)) = contracted {
        return Err(SchemaError::Contracted {
            ours: release.to_string(),
            newer,
            steps,
        });
    }
    Ok(Compatibility::Ahead {
        unknown,
        release: newest.unwrap_or_default(),
    })
}

/// Applies the embedded migrations that have not been applied yet, then records that
/// `release` (the host's version) did, with the contract steps among them. Call [`check`]
/// first: on a database that a newer release migrated, sqlx refuses (`VersionMissing`).
pub async fn migrate(pool: &PgPool, release: &str) -> Result<(), MigrateError> {
    migrate_with(pool, &crate::MIGRATOR, release).await
}

/// [`migrate`] with another set of migrations (a test's "newer release").
pub async fn migrate_with(
    pool: &PgPool,
    migrator: &Migrator,
    release: &str,
) -> Result<(), MigrateError> {
    migrator.run(pool).await?;
    record(pool, migrator, release)
        .await
        .map_err(MigrateError::Execute)
}

/// Records the applied migrations above the last recorded row as `release`'s. Also catches up
/// after a start that stopped between applying and recording.
async fn record(pool: &PgPool, migrator: &Migrator, release: &str) -> Result<(), sqlx::Error> {
    let mut tx = pool.begin().await?;
    let recorded: Option<i64> = sqlx::query_scalar("SELECT max(version) FROM schema_releases")
        .fetch_one(&mut *tx)
        .await?;
    let applied: Vec<i64> = sqlx::query_scalar(
        "SELECT version FROM _sqlx_migrations WHERE version > $1 ORDER BY version",
    )
    .bind(recorded.unwrap_or(i64::MIN))
    .fetch_all(&mut *tx)
    .await?;
    let Some(&highest) = applied.last() else {
        return Ok(());
    };
    let contract_steps: Vec<i64> = migrator
        .iter()
        .filter(|m| applied.contains(&m.version) && StepKind::of(&m.sql) == StepKind::Contract)
        .map(|m| m.version)
        .collect();
    let kind = if contract_steps.is_empty() {
        "expand"
    } else {
        "contract"
    };
    // Two replicas of one release starting at once record the same row: the second is a no-op.
    sqlx::query(
        "INSERT INTO schema_releases (version, release, kind, contract_steps) \
         VALUES ($1, $2, $3, $4) ON CONFLICT (version) DO NOTHING",
    )
    .bind(highest)
    .bind(release)
    .bind(kind)
    .bind(&contract_steps)
    .execute(&mut *tx)
    .await?;
    tx.commit().await
}

/// The highest applied migration and the release that recorded it; `None` on a database no
/// migration has touched.
pub async fn version(pool: &PgPool) -> Result<Option<SchemaVersion>, sqlx::Error> {
    if !table_exists(pool, "_sqlx_migrations").await? {
        return Ok(None);
    }
    let highest: Option<i64> = sqlx::query_scalar("SELECT max(version) FROM _sqlx_migrations")
        .fetch_one(pool)
        .await?;
    let Some(version) = highest else {
        return Ok(None);
    };
    let release = if table_exists(pool, "schema_releases").await? {
        // The row that covers it: the first at or above it.
        sqlx::query_scalar(
            "SELECT release FROM schema_releases WHERE version >= $1 ORDER BY version LIMIT 1",
        )
        .bind(version)
        .fetch_optional(pool)
        .await?
    } else {
        None
    };
    Ok(Some(SchemaVersion { version, release }))
}

async fn table_exists(pool: &PgPool, table: &str) -> Result<bool, sqlx::Error> {
    sqlx::query_scalar("SELECT to_regclass($1) IS NOT NULL")
        .bind(table)
        .fetch_one(pool)
        .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_contract_step_is_marked_in_its_opening_comment_lines() {
        let marked = "-- contract: release 0.3 stopped reading replicas.host\nALTER TABLE replicas DROP COLUMN host;\n";
        assert_eq!(
            contract_note(marked),
            Some("release 0.3 stopped reading replicas.host")
        );
        assert_eq!(StepKind::of(marked), StepKind::Contract);
        let after_no_tx =
            "-- no-transaction\n-- contract: 0.3 stopped using it\nDROP INDEX CONCURRENTLY x;\n";
        assert_eq!(StepKind::of(after_no_tx), StepKind::Contract);
        let empty_note = "-- contract:\nDROP TABLE x;\n";
        assert_eq!(contract_note(empty_note), Some(""));
        assert_eq!(StepKind::of(empty_note), StepKind::Contract);
    }

    #[test]
    fn a_marker_below_the_first_statement_does_not_count() {
        let sql = "-- adds a column\nALTER TABLE t ADD COLUMN c text;\n-- contract: no\n";
        assert_eq!(StepKind::of(sql), StepKind::Expand);
        assert_eq!(StepKind::of(""), StepKind::Expand);
    }
}
