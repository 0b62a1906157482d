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

use worker_store::schema::contract_note;

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

/// Tables that grow with traffic: building an index on one without `CONCURRENTLY` blocks its
/// writers for as long as the build takes.
const GROWING: &[&str] = &[
    "dead_letters",
    "attempt_log",
    "outbox",
    "processed_messages",
    "outbound_emails",
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

/// A word or a punctuation mark of the SQL, with its line.
#[derive(Debug, Clone)]
struct Token {
    /// Upper-cased, quotes removed from a quoted identifier.
    text: String,
    line: usize,
}

/// The file's tokens, without comments, string literals and dollar-quoted bodies.
fn tokens(sql: &str) -> Vec<Token> {
    let chars: Vec<char> = sql.chars().collect();
    let mut out = Vec::new();
    let mut line = 1;
    let mut i = 0;
    let count_lines =
        |from: usize, to: usize| chars[from..to].iter().filter(|c| **c == '\n').count();
    while i < chars.len() {
        let c = chars[i];
        let next = chars.get(i + 1).copied();
        if c == '\n' {
            line += 1;
            i += 1;
        } else if c.is_whitespace() {
            i += 1;
        } else if c == '-' && next == Some('-') {
            while i < chars.len() && chars[i] != '\n' {
                i += 1;
            }
        } else if c == '/' && next == Some('*') {
            let start = i;
            i += 2;
            while i < chars.len() && !(chars[i] == '*' && chars.get(i + 1) == Some(&'/')) {
                i += 1;
            }
            i = (i + 2).min(chars.len());
            line += count_lines(start, i);
        } else if c == '\'' {
            let start = i;
            i += 1;
            while i < chars.len() {
                if chars[i] == '\'' {
                    if chars.get(i + 1) == Some(&'\'') {
                        i += 2;
                        continue;
                    }
                    break;
                }
                i += 1;
            }
            i = (i + 1).min(chars.len());
            line += count_lines(start, i);
        } else if c == '$' && dollar_tag(&chars[i..]).is_some() {
            let tag = dollar_tag(&chars[i..]).unwrap_or_default();
            let start = i;
            i += tag.len();
            while i < chars.len() && !chars[i..].starts_with(&tag) {
                i += 1;
            }
            i = (i + tag.len()).min(chars.len());
            line += count_lines(start, i);
        } else if c == '"' {
            let start = i;
            i += 1;
            while i < chars.len() && chars[i] != '"' {
                i += 1;
            }
            let text: String = chars[start + 1..i.min(chars.len())].iter().collect();
            out.push(Token {
                text: text.to_uppercase(),
                line,
            });
            i = (i + 1).min(chars.len());
            line += count_lines(start, i);
        } else if c.is_alphanumeric() || c == '_' {
            let start = i;
            while i < chars.len()
                && (chars[i].is_alphanumeric() || chars[i] == '_' || chars[i] == '.')
            {
                i += 1;
            }
            out.push(Token {
                text: chars[start..i].iter().collect::<String>().to_uppercase(),
                line,
            });
        } else {
            out.push(Token {
                text: c.to_string(),
                line,
            });
            i += 1;
        }
    }
    out
}

/// `$$` or `$tag$` at the start of `chars`, as characters.
fn dollar_tag(chars: &[char]) -> Option<Vec<char>> {
    let end = chars
        .iter()
        .skip(1)
        .position(|c| !(c.is_alphanumeric() || *c == '_'))?
        + 1;
    (chars.get(end) == Some(&'$')).then(|| chars[..=end].to_vec())
}

fn is(token: Option<&Token>, word: &str) -> bool {
    token.is_some_and(|t| t.text == word)
}

fn has_seq(tokens: &[Token], seq: &[&str]) -> Option<usize> {
    tokens
        .windows(seq.len())
        .position(|w| w.iter().zip(seq).all(|(t, s)| t.text == *s))
}

/// A name as PostgreSQL compares it: without its schema, lower-case.
fn table_name(token: &Token) -> String {
    let name = token.text.rsplit('.').next().unwrap_or_default();
    name.to_lowercase()
}

/// The file's broken rules, by line.
fn check_file(sql: &str) -> Vec<(usize, String)> {
    let mut found = Vec::new();
    let note = contract_note(sql);
    let contract = note.is_some();
    if note == Some("") {
        found.push((
            1,
            "a contract step's marker says what the previous release stopped using (`-- contract: <what>`)".to_string(),
        ));
    }
    let no_transaction = sql.starts_with("-- no-transaction");
    let all = tokens(sql);
    let statements: Vec<&[Token]> = all
        .split(|t| t.text == ";")
        .filter(|s| !s.is_empty())
        .collect();
    let contract_only = |found: &mut Vec<(usize, String)>, line: usize, what: &str| {
        if !contract {
            found.push((
                line,
                format!("{what} breaks the release before: only in a contract step (`-- contract: <what the previous release stopped using>`)"),
            ));
        }
    };
    // A table this file creates is empty while it runs: its indexes need no care.
    let created: Vec<String> = statements
        .iter()
        .filter(|s| is(s.first(), "CREATE") && is(s.get(1), "TABLE"))
        .filter_map(|s| {
            let at = if is(s.get(2), "IF") { 5 } else { 2 };
            s.get(at).map(table_name)
        })
        .collect();
    for statement in &statements {
        for (i, token) in statement.iter().enumerate() {
            match token.text.as_str() {
                "DROP" => contract_only(&mut found, token.line, "DROP"),
                "RENAME" => contract_only(&mut found, token.line, "RENAME"),
                "SET" if is(statement.get(i + 1), "NOT") && is(statement.get(i + 2), "NULL") => {
                    contract_only(&mut found, token.line, "SET NOT NULL")
                }
                _ => {}
            }
        }
        if is(statement.first(), "ALTER") && is(statement.get(1), "TABLE") {
            check_alter_table(statement, contract, &mut found);
        }
        if is(statement.first(), "CREATE") {
            let at = if is(statement.get(1), "UNIQUE") { 2 } else { 1 };
            if is(statement.get(at), "INDEX") {
                check_create_index(
                    statement,
                    at,
                    no_transaction,
                    statements.len(),
                    &created,
                    &mut found,
                );
            }
        }
    }
    found
}

/// `ALTER TABLE [IF EXISTS] [ONLY] name clause, clause, …`: each clause apart.
fn check_alter_table(statement: &[Token], contract: bool, found: &mut Vec<(usize, String)>) {
    let mut at = 2;
    for skip in ["IF", "EXISTS", "ONLY"] {
        if is(statement.get(at), skip) {
            at += 1;
        }
    }
    let Some(table) = statement.get(at) else {
        return;
    };
    let growing = GROWING.contains(&table_name(table).as_str());
    let mut depth = 0;
    let mut clauses: Vec<&[Token]> = Vec::new();
    let mut start = at + 1;
    for (i, token) in statement.iter().enumerate().skip(at + 1) {
        match token.text.as_str() {
            "(" => depth += 1,
            ")" => depth -= 1,
            "," if depth == 0 => {
                clauses.push(&statement[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    clauses.push(&statement[start..]);
    for clause in clauses {
        let Some(first) = clause.first() else {
            continue;
        };
        let line = first.line;
        let adds_constraint = first.text == "ADD"
            && clause.get(1).is_some_and(|t| {
                [
                    "CONSTRAINT",
                    "PRIMARY",
                    "UNIQUE",
                    "CHECK",
                    "FOREIGN",
                    "EXCLUDE",
                ]
                .contains(&t.text.as_str())
            });
        if first.text == "ADD"
            && !adds_constraint
            && has_seq(clause, &["NOT", "NULL"]).is_some()
            && !clause.iter().any(|t| t.text == "DEFAULT")
            && !contract
        {
            found.push((
                line,
                "ADD COLUMN … NOT NULL without a DEFAULT fails the release before's inserts: give it a DEFAULT, or add it nullable and SET NOT NULL in a contract step".to_string(),
            ));
        }
        if !growing {
            continue;
        }
        let table = table_name(&statement[at]);
        if adds_constraint
            && has_seq(clause, &["NOT", "VALID"]).is_none()
            && has_seq(clause, &["USING", "INDEX"]).is_none()
        {
            found.push((
                line,
                format!("ADD CONSTRAINT on the growing table {table} checks every row under its lock: add it NOT VALID and VALIDATE CONSTRAINT in a later migration (a unique one USING INDEX built CONCURRENTLY)"),
            ));
        }
        if first.text == "ALTER" && clause.iter().any(|t| t.text == "TYPE") {
            found.push((
                line,
                format!("a column's type changed on the growing table {table} rewrites it under its lock: add a new column instead"),
            ));
        }
    }
}

/// `CREATE [UNIQUE] INDEX [CONCURRENTLY] [IF NOT EXISTS] [name] ON [ONLY] table …`.
fn check_create_index(
    statement: &[Token],
    index_at: usize,
    no_transaction: bool,
    statements_in_file: usize,
    created: &[String],
    found: &mut Vec<(usize, String)>,
) {
    let concurrently = is(statement.get(index_at + 1), "CONCURRENTLY");
    let Some(on) = statement.iter().position(|t| t.text == "ON") else {
        return;
    };
    let table_at = if is(statement.get(on + 1), "ONLY") {
        on + 2
    } else {
        on + 1
    };
    let Some(table) = statement.get(table_at) else {
        return;
    };
    let table = table_name(table);
    let line = statement[0].line;
    if GROWING.contains(&table.as_str())
        && !created.contains(&table)
        && !(concurrently && no_transaction)
    {
        found.push((
            line,
            format!("an index on the growing table {table} must be built by CREATE INDEX CONCURRENTLY in a migration whose first line is `-- no-transaction` (else its writers wait for the whole build)"),
        ));
    }
    if concurrently && statements_in_file > 1 {
        found.push((
            line,
            "CREATE INDEX CONCURRENTLY must be the migration's only statement (several statements sent at once run in one implicit transaction, where PostgreSQL refuses it)".to_string(),
        ));
    }
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
