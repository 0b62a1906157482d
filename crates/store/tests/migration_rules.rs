//! The schema's contract, checked on the migration files (ARCHITECTURE.md, "Schema
//! contract"); no database needed. Above [`SHIPPED`]:
//! - no `DROP`, `RENAME`, `SET NOT NULL`, nor a column added `NOT NULL` without a `DEFAULT`,
//!   unless the file is a contract step (`-- contract: <what the previous release stopped
//!   using>` in its opening comment lines);
//! - an index on a growing table is built `CONCURRENTLY`, alone in a `-- no-transaction`
//!   migration (PostgreSQL runs several statements sent at once in one implicit transaction,
//!   where `CONCURRENTLY` is refused);
//! - no constraint is added to a growing table in a way that checks every row under its lock
//!   (`NOT VALID` first, `VALIDATE CONSTRAINT` in a later migration), nor a column's type
//!   changed on one (a rewrite under the lock).
//!
//! The scan is lexical: comments, string literals and dollar-quoted bodies (functions, `DO`
//! blocks) are skipped, so SQL built at run time inside a function is not checked.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

use std::fmt;
use std::path::{Path, PathBuf};

use worker_store::migration_rules::check_sql as check_file;

/// The highest migration version that shipped in a release before these rules: files at or
/// below it are exempt (an applied migration's file never changes, so they cannot be mended).
const SHIPPED: i64 = 20261205000100;

/// The shipped files that break the rules, as the checker sees them without the exemption:
/// the exemption must cover each of them, and a checker that stopped seeing them would be
/// blind.
const BREAKING_WHEN_SHIPPED: &[&str] = &[
    "20261201000100_outbound_email_claims.sql",
    "20261201000200_action_execution_claims.sql",
    "20261201000300_reconciler.sql",
    "20261201000700_action_execution_skips.sql",
    "20261202000100_operator_console.sql",
    "20261202000300_dead_letter_age_index.sql",
    "20261202000400_attempt_log_job_index.sql",
    "20261204000100_operator_accounts.sql",
];

fn migrations_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../migrations")
}

/// One broken rule: the file, the line, the rule.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Violation {
    file: String,
    line: usize,
    rule: String,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}: {}", self.file, self.line, self.rule)
    }
}

fn report(violations: &[Violation]) -> String {
    violations
        .iter()
        .map(|v| format!("  {v}"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Every `.sql` file in `dir` whose version is above `shipped`, checked.
fn check_dir(dir: &Path, shipped: i64) -> Vec<Violation> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()))
        .map(|entry| entry.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "sql"))
        .collect();
    files.sort();
    let mut violations = Vec::new();
    for path in files {
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        let version = name
            .split_once('_')
            .and_then(|(v, _)| v.parse::<i64>().ok());
        let Some(version) = version else {
            violations.push(Violation {
                file: name,
                line: 1,
                rule: "the name does not start with a version (`<digits>_<description>.sql`)"
                    .into(),
            });
            continue;
        };
        if version <= shipped {
            continue;
        }
        let sql = std::fs::read_to_string(&path).unwrap();
        violations.extend(check_file(&sql).into_iter().map(|(line, rule)| Violation {
            file: name.clone(),
            line,
            rule,
        }));
    }
    violations
}

// ---------------------------------------------------------------------------------------------

#[test]
fn the_migrations_keep_the_schema_contract() {
    let violations = check_dir(&migrations_dir(), SHIPPED);
    assert!(
        violations.is_empty(),
        "migrations that break the schema contract (ARCHITECTURE.md, \"Schema contract\"):\n{}",
        report(&violations)
    );
}

#[test]
fn the_exemption_covers_exactly_the_shipped_files_that_break_the_rules() {
    let violations = check_dir(&migrations_dir(), i64::MIN);
    let mut files: Vec<&str> = violations.iter().map(|v| v.file.as_str()).collect();
    files.dedup();
    assert_eq!(
        files,
        BREAKING_WHEN_SHIPPED,
        "without the exemption:\n{}",
        report(&violations)
    );
    let newest = files
        .iter()
        .filter_map(|f| f.split_once('_')?.0.parse::<i64>().ok())
        .max()
        .unwrap();
    assert!(newest <= SHIPPED);
    // The newest shipped migration exists: SHIPPED names a real file, not a guess.
    let names: Vec<String> = std::fs::read_dir(migrations_dir())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(
        names.iter().any(|n| n.starts_with(&format!("{SHIPPED}_"))),
        "no migration {SHIPPED}"
    );
}

fn fixture(files: &[(&str, &str)]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for (name, sql) in files {
        std::fs::write(dir.path().join(name), sql).unwrap();
    }
    dir
}

#[test]
fn a_bad_migration_fails_naming_its_file_and_line() {
    let bad = "20991231000100_bad.sql";
    let dir = fixture(&[(
        bad,
        "-- Everything the rules forbid outside a contract step.\n\
         ALTER TABLE outbox DROP COLUMN last_error;\n\
         ALTER TABLE replicas RENAME COLUMN host TO machine;\n\
         ALTER TABLE replicas ALTER COLUMN host SET NOT NULL;\n\
         ALTER TABLE replicas\n    ADD COLUMN note text,\n    ADD COLUMN zone text NOT NULL;\n\
         CREATE INDEX outbox_created ON outbox (created_at);\n\
         ALTER TABLE attempt_log ADD CONSTRAINT attempt_log_positive CHECK (attempt > 0);\n\
         ALTER TABLE dead_letters ALTER COLUMN reason TYPE varchar(200);\n",
    )]);
    let violations = check_dir(dir.path(), SHIPPED);
    let lines: Vec<(usize, &str)> = violations
        .iter()
        .map(|v| (v.line, v.rule.split_whitespace().next().unwrap_or_default()))
        .collect();
    assert_eq!(
        lines,
        [
            (2, "DROP"),
            (3, "RENAME"),
            (4, "SET"),
            (7, "ADD"),
            (8, "an"),
            (9, "ADD"),
            (10, "a"),
        ],
        "{}",
        report(&violations)
    );
    assert!(violations.iter().all(|v| v.file == bad));
    let text = report(&violations);
    assert!(text.contains("20991231000100_bad.sql:2: DROP"), "{text}");
    assert!(
        text.contains("20991231000100_bad.sql:8: an index on the growing table outbox"),
        "{text}"
    );

    // The same file at or below the shipped version is exempt.
    let old = fixture(&[(
        "20261201000000_bad.sql",
        "ALTER TABLE outbox DROP COLUMN last_error;\n",
    )]);
    assert_eq!(check_dir(old.path(), SHIPPED), []);
}

#[test]
fn a_contract_step_may_drop_and_an_index_may_be_built_concurrently_alone() {
    let dir = fixture(&[
        (
            "20991231000100_drop.sql",
            "-- contract: release 0.3 stopped reading replicas.host\n\
             ALTER TABLE replicas DROP COLUMN host;\n\
             ALTER TABLE replicas ALTER COLUMN version SET NOT NULL;\n",
        ),
        (
            "20991231000200_index.sql",
            "-- no-transaction\n-- contract: 0.3 stopped using outbox_failed\n\
             DROP INDEX CONCURRENTLY outbox_failed;\n",
        ),
        (
            "20991231000300_index.sql",
            "-- no-transaction\n-- The console's search by creation time.\n\
             CREATE INDEX CONCURRENTLY IF NOT EXISTS outbox_created ON public.outbox (created_at);\n",
        ),
        (
            "20991231000400_columns.sql",
            "ALTER TABLE replicas ADD COLUMN zone text NOT NULL DEFAULT '';\n\
             -- A DROP in a comment, 'DROP' in a string and in a function body are not statements.\n\
             COMMENT ON TABLE replicas IS 'DROP nothing';\n\
             CREATE FUNCTION f() RETURNS void LANGUAGE sql AS $$ SELECT 1 $$;\n\
             CREATE INDEX replicas_zone ON replicas (zone);\n\
             ALTER TABLE attempt_log ADD CONSTRAINT positive CHECK (attempt > 0) NOT VALID;\n",
        ),
    ]);
    let violations = check_dir(dir.path(), SHIPPED);
    assert_eq!(violations, [], "{}", report(&violations));

    let dir = fixture(&[
        (
            "20991231000100_empty_note.sql",
            "-- contract:\nDROP TABLE x;\n",
        ),
        (
            "20991231000200_in_tx.sql",
            "-- contract: even a contract step builds its index concurrently\n\
             CREATE INDEX CONCURRENTLY attempt_log_x ON attempt_log (job);\n",
        ),
        (
            "20991231000300_two.sql",
            "-- no-transaction\nCREATE INDEX CONCURRENTLY a ON outbox (id);\n\
             CREATE INDEX CONCURRENTLY b ON outbox (id);\n",
        ),
    ]);
    let violations = check_dir(dir.path(), SHIPPED);
    let at: Vec<(&str, usize)> = violations
        .iter()
        .map(|v| (v.file.as_str(), v.line))
        .collect();
    assert_eq!(
        at,
        [
            ("20991231000100_empty_note.sql", 1),
            ("20991231000200_in_tx.sql", 2),
            ("20991231000300_two.sql", 2),
            ("20991231000300_two.sql", 3),
        ],
        "{}",
        report(&violations)
    );
}
