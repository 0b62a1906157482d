//! Reading a settings file, for the host's and the fleet view's: the file's syntax checked
//! before figment reads it, so that an error names its line; figment's errors turned into
//! [`SettingsError`]s that name the file (or the variable) and the key, never a secret.

use std::fmt;

/// A settings file, or the environment, that cannot be used; names where and what.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SettingsError {
    /// The file the offending value came from, when it came from one.
    pub source: Option<String>,
    /// The dotted key (`database.port`), empty for the file as a whole.
    pub key: String,
    /// What was wrong and what was expected.
    pub problem: String,
}

impl fmt::Display for SettingsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(source) = &self.source {
            write!(f, "{source}: ")?;
        }
        if !self.key.is_empty() {
            write!(f, "key `{}`: ", self.key)?;
        }
        f.write_str(&self.problem)
    }
}

impl std::error::Error for SettingsError {}

/// The dotted path of the value a figment error is about, without figment's `default` profile.
pub fn error_path(error: &figment::Error) -> String {
    error
        .path
        .iter()
        .filter(|p| p.as_str() != "default")
        .cloned()
        .collect::<Vec<_>>()
        .join(".")
}

/// The dotted key a figment error is about: its path, which for an unknown table already
/// ends in the table's own name (`workers.timeouts`), else with the unknown field added.
fn error_key(path: &str, kind: &figment::error::Kind) -> String {
    match kind {
        figment::error::Kind::UnknownField(field, _)
            if path != field && !path.ends_with(&format!(".{field}")) =>
        {
            if path.is_empty() {
                field.clone()
            } else {
                format!("{path}.{field}")
            }
        }
        _ => path.to_string(),
    }
}

/// Figment's errors as [`SettingsError`]s: each names the file and line, or the environment
/// variable (`env_var_for` names it from the key) when the key was in `overridden`.
pub fn from_figment(
    errors: Vec<figment::Error>,
    file: &str,
    file_text: Option<&str>,
    overridden: &[String],
    env_var_for: &dyn Fn(&str) -> String,
) -> Vec<SettingsError> {
    errors
        .into_iter()
        .map(|e| {
            let key = error_path(&e);
            let from_env = overridden
                .iter()
                .any(|o| *o == key || key.starts_with(&format!("{o}.")));
            let source = match e.metadata.as_ref().and_then(|m| m.source.as_ref()) {
                Some(figment::Source::File(path)) => path.display().to_string(),
                _ if from_env => format!("environment variable {}", env_var_for(&key)),
                _ => {
                    match file_text.and_then(|text| line_of_key(text, &error_key(&key, &e.kind))) {
                        Some(line) => format!("{file}, line {line}"),
                        None => file.to_string(),
                    }
                }
            };
            let source = Some(source);
            let problem = if is_secret_key(&key) {
                describe_secret_kind(&e.kind)
            } else {
                describe_kind(&e.kind, &key)
            };
            let key = error_key(&key, &e.kind);
            SettingsError {
                source,
                key,
                problem,
            }
        })
        .collect()
}

/// True for a key that holds a secret (`database.password`, `imap.accounts.0.password`,
/// `admin.operator_token`, `admin.scrape_token`, a fleet view's `installations.0.token`):
/// its value is never parsed as anything but text and never quoted in an error.
pub fn is_secret_key(key: &str) -> bool {
    matches!(
        key.rsplit('.').next(),
        Some("password" | "operator_token" | "scrape_token" | "privacy_key" | "token")
    )
}

/// What is wrong with a secret's value, by its shape only: never the value itself.
fn describe_secret_kind(kind: &figment::error::Kind) -> String {
    use figment::error::{Actual, Kind};
    let shape = |actual: &Actual| match actual {
        Actual::Seq => "a list",
        Actual::Map | Actual::StructVariant => "a table",
        _ => "a value of another kind",
    };
    match kind {
        Kind::InvalidType(actual, _) | Kind::InvalidValue(actual, _) => format!(
            "expected the secret as text (a string), found {}; its value is not shown",
            shape(actual)
        ),
        _ => "expected the secret as text (a string); its value is not shown".into(),
    }
}

/// The file's text as a TOML table, parsed before figment does, to report a syntax error by
/// file, line and key. The parser's own report quotes the offending line, which may hold a
/// password: only its message (what was expected) is kept, never the line's text.
pub fn parse_table(text: &str, path_text: &str) -> Result<toml::Table, SettingsError> {
    let error = match toml::from_str::<toml::Table>(text) {
        Ok(table) => return Ok(table),
        Err(error) => error,
    };
    let offset = error.span().map_or(text.len(), |span| span.start);
    let before = text.get(..offset).unwrap_or(text);
    let line = before.matches('\n').count() + 1;
    let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    let key = key_at_line(text, line);
    let message = error.message().trim().replace('\n', "; ");
    Err(SettingsError {
        source: Some(path_text.to_string()),
        key,
        problem: format!("not valid TOML at line {line}, column {column}: {message}"),
    })
}

/// The dotted key a TOML line sets (`imap.accounts[1].password`), from the table headers
/// above it and the key at the start of the line; empty when the line sets none (a header).
fn key_at_line(text: &str, line: usize) -> String {
    let mut table = String::new();
    let mut arrays: std::collections::HashMap<String, usize> = std::collections::HashMap::new();
    let mut key = String::new();
    for (index, current) in text.lines().take(line).enumerate() {
        let current = current.trim();
        let is_last = index + 1 == line;
        if let Some(name) = current
            .strip_prefix("[[")
            .and_then(|r| r.split("]]").next())
        {
            let name = name.trim().to_string();
            let n = arrays.entry(name.clone()).or_insert(0);
            table = format!("{name}[{n}]");
            *n += 1;
        } else if let Some(name) = current.strip_prefix('[').and_then(|r| r.split(']').next()) {
            table = name.trim().to_string();
        } else if is_last && let Some((name, _)) = current.split_once('=') {
            let name = name.trim().trim_matches(|c| c == '"' || c == '\'');
            key = if table.is_empty() {
                name.to_string()
            } else {
                format!("{table}.{name}")
            };
        }
        if is_last && key.is_empty() {
            key = table.clone();
        }
    }
    key
}

/// The line of `text` that writes `key` (`[workers.timeouts]`, or `email_send = ...` under
/// it), counting from 1.
fn line_of_key(text: &str, key: &str) -> Option<usize> {
    let mut table = String::new();
    for (index, line) in text.lines().enumerate() {
        let line = line.trim();
        let header = line
            .strip_prefix("[[")
            .and_then(|r| r.split("]]").next())
            .or_else(|| line.strip_prefix('[').and_then(|r| r.split(']').next()));
        let written = if let Some(name) = header {
            table = name.trim().to_string();
            table.clone()
        } else if let Some((name, _)) = line.split_once('=') {
            let name = name.trim().trim_matches(|c| c == '"' || c == '\'');
            if table.is_empty() {
                name.to_string()
            } else {
                format!("{table}.{name}")
            }
        } else {
            continue;
        };
        if written == key {
            return Some(index + 1);
        }
    }
    None
}

fn describe_kind(kind: &figment::error::Kind, key: &str) -> String {
    use figment::error::Kind;
    match kind {
        Kind::UnknownField(_, expected) => {
            let full = error_key(key, kind);
            if expected.is_empty() {
                format!("unknown key `{full}`")
            } else {
                format!(
                    "unknown key `{full}`; expected one of: {}",
                    expected.join(", ")
                )
            }
        }
        Kind::MissingField(field) => format!("missing key `{field}`"),
        Kind::InvalidType(actual, expected) => format!("expected {expected}, found {actual}"),
        Kind::InvalidValue(actual, expected) => format!("expected {expected}, found {actual}"),
        Kind::InvalidLength(len, expected) => format!("expected {expected}, found {len} elements"),
        Kind::UnknownVariant(found, expected) => {
            format!("expected one of {}, found `{found}`", expected.join(", "))
        }
        Kind::Message(message) => message.clone(),
        other => other.to_string(),
    }
}
