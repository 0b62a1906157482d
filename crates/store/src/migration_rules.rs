//! The schema's contract, checked on a migration's SQL (ARCHITECTURE.md, "Schema contract"),
//! by the rule test over `migrations/` and by `worker-host upgrade check` over the migrations
//! a release would apply:
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

use crate::schema::contract_note;

/// Tables that grow with traffic: building an index on one without `CONCURRENTLY` blocks its
/// writers for as long as the build takes.
pub const GROWING: &[&str] = &[
    "dead_letters",
    "attempt_log",
    "outbox",
    "processed_messages",
    "outbound_emails",
];

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
pub fn check_sql(sql: &str) -> Vec<(usize, String)> {
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
