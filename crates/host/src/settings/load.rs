//! Reading the settings: figment over the defaults, the TOML file and the environment; the
//! file's syntax checked first so that an error names its line; figment's errors turned into
//! [`SettingsError`]s that name the file (or the variable) and the key, never a secret.

use std::fmt;
use std::path::{Path, PathBuf};

use figment::Figment;
use figment::providers::{Format, Serialized, Toml};

use super::Settings;
use super::job_sections::refine_flattened;
use super::renames;

/// The settings file used when neither `--config` nor `WORKER_HOST_CONFIG` names one.
pub const DEFAULT_PATH: &str = "config/worker-host.toml";
/// The prefix of environment overrides; levels are separated by a double underscore.
pub const ENV_PREFIX: &str = "WORKER_HOST__";

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

/// Where the settings come from.
#[derive(Debug, Clone)]
pub struct SettingsSource {
    pub path: PathBuf,
    /// True when the path was asked for (by flag or variable): a missing file is then an
    /// error, where a missing default file only means "defaults and environment".
    pub explicit: bool,
}

impl Settings {
    /// Loads, resolves secrets and validates. `env` is the environment to read overrides
    /// from (the process's in production, a fixed list in tests).
    pub fn load(
        source: &SettingsSource,
        env: &[(String, String)],
    ) -> Result<Self, Vec<SettingsError>> {
        let path_text = source.path.display().to_string();
        let mut figment = Figment::from(Serialized::defaults(Settings::default()));
        let mut deprecations = Vec::new();
        let mut file_text = None;
        if source.path.exists() {
            // Read once: parsed here, and kept to name the line of a later error.
            let read = std::fs::read_to_string(&source.path).map_err(|e| {
                vec![SettingsError {
                    source: Some(path_text.clone()),
                    key: String::new(),
                    problem: format!("cannot be read: {e}"),
                }]
            })?;
            let mut table = parse_table(&read, &path_text).map_err(|error| vec![error])?;
            match renames::apply(&mut table, &path_text) {
                Ok(moved) => deprecations.extend(moved),
                Err(both) => return Err(set_both_ways(&path_text, both)),
            }
            let text = toml::to_string(&table).map_err(|e| {
                vec![SettingsError {
                    source: Some(path_text.clone()),
                    key: String::new(),
                    problem: format!("cannot be read again after renaming its old keys: {e}"),
                }]
            })?;
            file_text = Some(read);
            figment = figment.merge(Toml::string(&text));
        } else if source.explicit {
            return Err(vec![SettingsError {
                source: Some(path_text),
                key: String::new(),
                problem: "no such settings file".into(),
            }]);
        }
        // The environment is handed in rather than read here, so that tests need no
        // `set_var`; values are parsed as figment parses environment variables.
        let mut overridden = Vec::new();
        for (var, value) in env {
            if let Some(key) = env_key(var) {
                // A secret is text as given: parsed, `007` would become the number 7.
                let value: figment::value::Value = if is_secret_key(&key) {
                    value.clone().into()
                } else {
                    value.parse().unwrap_or_else(|_| value.clone().into())
                };
                let keys: Vec<String> = match renames::env_key(&key) {
                    Some(rename) => {
                        deprecations.push(renames::env_deprecation(rename, var));
                        rename.new.iter().map(|k| (*k).to_string()).collect()
                    }
                    None => vec![key],
                };
                for key in keys {
                    figment = figment.merge(Serialized::default(&key, value.clone()));
                    overridden.push(key);
                }
            }
        }
        let mut settings: Settings = figment.extract().map_err(|e| {
            from_figment(
                refine_flattened(&figment, e),
                &path_text,
                file_text.as_deref(),
                &overridden,
            )
        })?;
        settings.deprecations = deprecations;
        // Files named in the settings file are found beside it, wherever the host is started.
        if let Some(folder) = source.path.parent().filter(|_| source.path.exists()) {
            for file in &mut settings.automations_files {
                if file.is_relative() {
                    *file = folder.join(&*file);
                }
            }
        }
        let mut errors = Vec::new();
        settings.resolve_secrets(&path_text, &mut errors);
        settings.validate(&path_text, &mut errors);
        if errors.is_empty() {
            Ok(settings)
        } else {
            Err(errors)
        }
    }
}

/// `WORKER_HOST__JOBS__OUTBOX_DRAIN__BATCH_SIZE` → `jobs.outbox_drain.batch_size`.
fn env_key(var: &str) -> Option<String> {
    let rest = var.strip_prefix(ENV_PREFIX)?;
    (!rest.is_empty()).then(|| {
        rest.split("__")
            .map(str::to_ascii_lowercase)
            .collect::<Vec<_>>()
            .join(".")
    })
}

/// The environment variable that overrides a dotted key.
pub(super) fn env_var_for(key: &str) -> String {
    format!(
        "{ENV_PREFIX}{}",
        key.replace('.', "__").to_ascii_uppercase()
    )
}

/// The keys a file set both by an old name and by its new one.
fn set_both_ways(file: &str, both: Vec<(String, String)>) -> Vec<SettingsError> {
    both.into_iter()
        .map(|(old, new)| SettingsError {
            source: Some(file.to_string()),
            problem: format!(
                "set either `{old}` (its name before a release renamed it) or `{new}`, not both"
            ),
            key: old,
        })
        .collect()
}

/// The dotted path of the value a figment error is about, without figment's `default` profile.
pub(super) fn error_path(error: &figment::Error) -> String {
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

pub(crate) fn from_figment(
    errors: Vec<figment::Error>,
    file: &str,
    file_text: Option<&str>,
    overridden: &[String],
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
fn is_secret_key(key: &str) -> bool {
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
pub(crate) fn parse_table(text: &str, path_text: &str) -> Result<toml::Table, SettingsError> {
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

/// The settings path from `--config` (or `WORKER_HOST_CONFIG`, which clap folds into the
/// flag), else the default.
pub fn source_from(flag: Option<&Path>) -> SettingsSource {
    match flag {
        Some(path) => SettingsSource {
            path: path.to_path_buf(),
            explicit: true,
        },
        None => SettingsSource {
            path: PathBuf::from(DEFAULT_PATH),
            explicit: false,
        },
    }
}
