//! `worker-host automations import FILE`: loads automations from a TOML or JSON file,
//! validates them, and upserts them by id or name in one transaction.
//!
//! # The file
//!
//! A list named `automations`; each entry has a `name` (unique), the `event_type` it listens
//! to, optional `conditions` (all must hold; see [`crate::condition`]), and at least one
//! action (see [`worker_messages::AutomationAction`]). `enabled` defaults to `true`; `id` is
//! optional: with one, the automation with that id is created or updated (its name may
//! change); without one, the automation with that name is (created with a fresh id).
//!
//! ```toml
//! [[automations]]
//! name = "reply-to-ping"
//! event_type = "email.received"
//! conditions = [{ path = "subject", op = "contains", value = "ping", ignore_case = true }]
//!
//! [[automations.actions]]
//! type = "send_email"
//! to = ["{{ from }}"]
//! subject = "Re: {{ subject }}"
//! text = "pong: we got your mail of {{ subject }}."
//! ```
//!
//! The same in JSON: `{"automations": [{"name": "reply-to-ping", "event_type": …,
//! "conditions": [...], "actions": [{"type": "send_email", …}]}]}`.
//!
//! # Validation
//!
//! Before anything is written: names present and unique within the file, event types
//! present, every condition's path well formed and every `matches` pattern a valid regular
//! expression, at least one action each, every `send_email` template valid MiniJinja syntax
//! with at least one recipient and a body, every webhook URL `http(s)://`. Every problem is
//! reported at once, each with the automation it belongs to. An import that fails writes
//! nothing.
//!
//! Re-importing an unchanged file changes nothing (not even `updated_at`), so a host may
//! import its demo automations at every start, on every replica.

use std::collections::HashSet;
use std::fmt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use sqlx::PgPool;
use uuid::Uuid;
use worker_core::Failure;
use worker_messages::{AutomationAction, SendEmailAction, WebhookAction};
use worker_store::classify;

use crate::condition::{ConditionSpec, compile_all};

/// One automation as written in an import file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AutomationDefinition {
    /// Upsert by this id when given, otherwise by `name`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<Uuid>,
    pub name: String,
    #[serde(default = "yes")]
    pub enabled: bool,
    /// The domain event type it listens to (`email.received`).
    pub event_type: String,
    #[serde(default)]
    pub conditions: Vec<ConditionSpec>,
    pub actions: Vec<AutomationAction>,
}

const fn yes() -> bool {
    true
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ImportFile {
    #[serde(default)]
    automations: Vec<AutomationDefinition>,
}

/// The two file formats, chosen by the file's extension.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Toml,
    Json,
}

impl Format {
    /// `.toml` or `.json` (any case); anything else is `None`.
    pub fn from_path(path: &Path) -> Option<Self> {
        let ext = path.extension()?.to_str()?.to_ascii_lowercase();
        match ext.as_str() {
            "toml" => Some(Self::Toml),
            "json" => Some(Self::Json),
            _ => None,
        }
    }
}

/// Why an import did not happen. Nothing was written in any case.
#[derive(Debug, thiserror::Error)]
pub enum ImportError {
    #[error("cannot read {}: {source}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{}: unknown format: name the file *.toml or *.json", path.display())]
    UnknownFormat { path: PathBuf },
    #[error("{origin}: {detail}")]
    Parse { origin: String, detail: String },
    #[error("{origin}: {} problem(s):\n  - {}", problems.len(), problems.join("\n  - "))]
    Invalid {
        origin: String,
        problems: Vec<String>,
    },
    #[error("automation `{name}`: that name already belongs to another automation (id {owner})")]
    NameTaken { name: String, owner: Uuid },
    #[error("writing the automations: {0}")]
    Database(#[from] Failure),
}

/// What happened to one automation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Change {
    Created,
    Updated,
    Unchanged,
}

impl Change {
    pub const fn as_str(&self) -> &'static str {
        match self {
            Self::Created => "created",
            Self::Updated => "updated",
            Self::Unchanged => "unchanged",
        }
    }
}

/// One line of the report.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Imported {
    pub id: Uuid,
    pub name: String,
    pub change: Change,
}

/// What an import did, automation by automation, in file order.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize)]
pub struct ImportReport {
    pub automations: Vec<Imported>,
}

impl ImportReport {
    pub fn count(&self, change: Change) -> usize {
        self.automations
            .iter()
            .filter(|a| a.change == change)
            .count()
    }
}

impl fmt::Display for ImportReport {
    /// One line per automation (`created   reply-to-ping  3f0c…`), then the totals.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for a in &self.automations {
            writeln!(f, "{:<9} {}  {}", a.change.as_str(), a.name, a.id)?;
        }
        write!(
            f,
            "{} created, {} updated, {} unchanged",
            self.count(Change::Created),
            self.count(Change::Updated),
            self.count(Change::Unchanged)
        )
    }
}

/// Reads, parses and validates `path` (TOML or JSON by its extension), then upserts its
/// automations in one transaction. The function behind `worker-host automations import FILE`.
pub async fn import_file(pool: &PgPool, path: &Path) -> Result<ImportReport, ImportError> {
    let definitions = load_file(path)?;
    import(pool, &definitions).await
}

/// Reads, parses and validates `path` without touching the database (for a dry run or a
/// settings check).
pub fn load_file(path: &Path) -> Result<Vec<AutomationDefinition>, ImportError> {
    let format = Format::from_path(path).ok_or_else(|| ImportError::UnknownFormat {
        path: path.to_path_buf(),
    })?;
    let text = std::fs::read_to_string(path).map_err(|source| ImportError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    parse(&text, format, &path.display().to_string())
}

/// Parses and validates the text of an import file; `origin` names it in errors.
pub fn parse(
    text: &str,
    format: Format,
    origin: &str,
) -> Result<Vec<AutomationDefinition>, ImportError> {
    let parse_error = |detail: String| ImportError::Parse {
        origin: origin.to_string(),
        detail,
    };
    let file: ImportFile = match format {
        Format::Json => {
            let mut de = serde_json::Deserializer::from_str(text);
            let file = serde_path_to_error::deserialize(&mut de)
                .map_err(|err| parse_error(format!("at `{}`: {}", err.path(), err.inner())))?;
            de.end().map_err(|err| parse_error(err.to_string()))?;
            file
        }
        Format::Toml => {
            let de = toml::Deserializer::new(text);
            serde_path_to_error::deserialize(de)
                .map_err(|err| parse_error(format!("at `{}`: {}", err.path(), err.inner())))?
        }
    };
    let problems = validate(&file.automations);
    if problems.is_empty() {
        Ok(file.automations)
    } else {
        Err(ImportError::Invalid {
            origin: origin.to_string(),
            problems,
        })
    }
}

/// Every problem with `definitions`, each prefixed with the automation it belongs to; empty
/// when they can be imported.
pub fn validate(definitions: &[AutomationDefinition]) -> Vec<String> {
    let mut problems = Vec::new();
    let mut names = HashSet::new();
    let mut ids = HashSet::new();
    for (at, def) in definitions.iter().enumerate() {
        let who = if def.name.trim().is_empty() {
            format!("automations[{at}]")
        } else {
            format!("automation `{}`", def.name)
        };
        let mut problem = |what: String| problems.push(format!("{who}: {what}"));
        if def.name.trim().is_empty() {
            problem("`name` is empty".into());
        } else if !names.insert(def.name.as_str()) {
            problem("the name appears more than once in the file".into());
        }
        if let Some(id) = def.id
            && !ids.insert(id)
        {
            problem(format!("the id {id} appears more than once in the file"));
        }
        if def.event_type.trim().is_empty() {
            problem("`event_type` is empty".into());
        }
        if let Err((index, err)) = compile_all(&def.conditions) {
            problem(format!("conditions[{index}]: {err}"));
        }
        if def.actions.is_empty() {
            problem("`actions` is empty: an automation needs at least one action".into());
        }
        for (index, action) in def.actions.iter().enumerate() {
            let result = match action {
                AutomationAction::SendEmail(email) => check_send_email(email),
                AutomationAction::Webhook(hook) => check_webhook(hook),
            };
            if let Err(what) = result {
                problem(format!("actions[{index}] ({}): {what}", action.kind()));
            }
        }
    }
    problems
}

/// Template syntax, recipients and a body. Rendering errors (a field the event lacks) can only
/// show at run time, in the action executor.
fn check_send_email(email: &SendEmailAction) -> Result<(), String> {
    if email.to.iter().all(|t| t.trim().is_empty()) {
        return Err("`to` needs at least one recipient".into());
    }
    if email.subject.trim().is_empty() {
        return Err("`subject` is empty".into());
    }
    if email.text.is_none() && email.html.is_none() {
        return Err("give a `text` or an `html` body (or both)".into());
    }
    if email.max_age.is_some_and(|age| age.is_zero()) {
        return Err("`max_age` is 0: give a duration longer than zero (like `1day`), or leave it out for the job's `jobs.email_send.max_age`".into());
    }
    let env = minijinja::Environment::new();
    let fields = email
        .to
        .iter()
        .enumerate()
        .map(|(i, t)| (format!("to[{i}]"), t))
        .chain(
            email
                .cc
                .iter()
                .enumerate()
                .map(|(i, t)| (format!("cc[{i}]"), t)),
        )
        .chain(email.from.iter().map(|t| ("from".to_string(), t)))
        .chain(std::iter::once(("subject".to_string(), &email.subject)))
        .chain(email.text.iter().map(|t| ("text".to_string(), t)))
        .chain(email.html.iter().map(|t| ("html".to_string(), t)));
    for (field, source) in fields {
        if let Err(err) = env.template_from_str(source) {
            return Err(format!("`{field}` is not a valid template: {err}"));
        }
    }
    Ok(())
}

fn check_webhook(hook: &WebhookAction) -> Result<(), String> {
    let rest = hook
        .url
        .strip_prefix("https://")
        .or_else(|| hook.url.strip_prefix("http://"));
    match rest {
        Some(rest)
            if !rest.is_empty()
                && !rest.starts_with('/')
                && !hook.url.contains(char::is_whitespace) => {}
        _ => {
            // Redacted: a mistyped URL may still carry a token.
            return Err(format!(
                "`url` must be an http:// or https:// URL, not `{}`",
                hook.redacted_url()
            ));
        }
    }
    for name in hook.headers.keys() {
        let token = !name.is_empty()
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b));
        if !token {
            return Err(format!("`{name}` is not a valid header name"));
        }
    }
    Ok(())
}

/// Upserts validated `definitions` in one transaction: by id when given, otherwise by name.
pub async fn import(
    pool: &PgPool,
    definitions: &[AutomationDefinition],
) -> Result<ImportReport, ImportError> {
    let problems = validate(definitions);
    if !problems.is_empty() {
        return Err(ImportError::Invalid {
            origin: "automations".into(),
            problems,
        });
    }
    let mut tx = pool.begin().await.map_err(classify)?;
    let mut report = ImportReport::default();
    for def in definitions {
        let conditions = serde_json::to_value(&def.conditions)
            .map_err(|err| Failure::permanent("serialize", err))?;
        let actions = serde_json::to_value(&def.actions)
            .map_err(|err| Failure::permanent("serialize", err))?;
        let conflict = if def.id.is_some() { "id" } else { "name" };
        let sql = format!(
            "INSERT INTO automations (id, name, enabled, event_type, conditions, actions) \
             VALUES ($1, $2, $3, $4, $5, $6) \
             ON CONFLICT ({conflict}) DO UPDATE SET name = EXCLUDED.name, \
                 enabled = EXCLUDED.enabled, event_type = EXCLUDED.event_type, \
                 conditions = EXCLUDED.conditions, actions = EXCLUDED.actions, \
                 updated_at = now() \
             WHERE (automations.name, automations.enabled, automations.event_type, \
                    automations.conditions, automations.actions) \
                   IS DISTINCT FROM (EXCLUDED.name, EXCLUDED.enabled, EXCLUDED.event_type, \
                    EXCLUDED.conditions, EXCLUDED.actions) \
             RETURNING id, (xmax = 0) AS inserted"
        );
        let written: Result<Option<(Uuid, bool)>, sqlx::Error> = sqlx::query_as(&sql)
            .bind(def.id.unwrap_or_else(Uuid::new_v4))
            .bind(&def.name)
            .bind(def.enabled)
            .bind(&def.event_type)
            .bind(&conditions)
            .bind(&actions)
            .fetch_optional(&mut *tx)
            .await;
        let (id, change) = match written {
            Ok(Some((id, true))) => (id, Change::Created),
            Ok(Some((id, false))) => (id, Change::Updated),
            Ok(None) => {
                let id = match def.id {
                    Some(id) => id,
                    None => sqlx::query_scalar("SELECT id FROM automations WHERE name = $1")
                        .bind(&def.name)
                        .fetch_one(&mut *tx)
                        .await
                        .map_err(classify)?,
                };
                (id, Change::Unchanged)
            }
            Err(sqlx::Error::Database(db)) if db.constraint() == Some("automations_name_key") => {
                drop(tx);
                let owner = sqlx::query_scalar("SELECT id FROM automations WHERE name = $1")
                    .bind(&def.name)
                    .fetch_one(pool)
                    .await
                    .map_err(classify)?;
                return Err(ImportError::NameTaken {
                    name: def.name.clone(),
                    owner,
                });
            }
            Err(err) => return Err(classify(err).into()),
        };
        report.automations.push(Imported {
            id,
            name: def.name.clone(),
            change,
        });
    }
    tx.commit().await.map_err(classify)?;
    tracing::info!(
        created = report.count(Change::Created),
        updated = report.count(Change::Updated),
        unchanged = report.count(Change::Unchanged),
        "automations imported"
    );
    Ok(report)
}
