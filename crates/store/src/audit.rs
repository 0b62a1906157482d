//! The operators' audit trail (`dead_letter_actions`, a table name kept for compatibility):
//! one entry per operator action (a replay, a purge, a retry, a pause, a resume, a run now),
//! from the command line or the console, dry runs included. An entry records who (the
//! operating-system user or `console`, the host, the name they gave, the database role, set
//! by the database itself), what (its kind and its target or filter, the rate, what the
//! operator was shown before confirming), when, and how it went; the database lets a row
//! only record progress while it runs and never change once finished, and refuses to delete
//! any (migrations `20261201000500_dead_letter_audit` and `20261202000100_operator_console`).

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use sqlx::{PgConnection, PgPool};
use worker_core::Failure;

use crate::classify;

/// How an operator acted: the command line (with the database's authority), or an account
/// through the console's pages or its JSON API.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Via {
    #[default]
    Cli,
    Console,
    Api,
}

impl Via {
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Cli => "cli",
            Self::Console => "console",
            Self::Api => "api",
        }
    }

    /// The way in a row records (`None` in rows older than accounts: the command line).
    pub fn parse(text: Option<&str>) -> Self {
        match text {
            Some("console") => Self::Console,
            Some("api") => Self::Api,
            _ => Self::Cli,
        }
    }
}

/// Who takes an operator action. From the command line: the operating-system user and the
/// host name as it found them, and the name the operator gave. From the console or the API:
/// the account, and the client's address as `host` (`user` is `console`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Actor {
    pub user: String,
    pub host: String,
    /// The name the operator gave for themselves (a person behind a shared account, a
    /// ticket); recorded beside `user`, never instead of it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// The operator account that acted (the console and the API only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub account: Option<String>,
    #[serde(default)]
    pub via: Via,
}

impl Actor {
    /// The command line's actor: `user` on `host`.
    pub fn new(user: impl Into<String>, host: impl Into<String>) -> Self {
        Self {
            user: user.into(),
            host: host.into(),
            name: None,
            account: None,
            via: Via::Cli,
        }
    }

    /// An account acting through the console or the API from `from` (the client's address).
    pub fn account(account: impl Into<String>, from: impl Into<String>, via: Via) -> Self {
        Self {
            user: via.as_str().to_string(),
            host: from.into(),
            name: None,
            account: Some(account.into()),
            via,
        }
    }

    /// The same actor, with the name the operator gave.
    #[must_use]
    pub fn with_name(mut self, name: Option<String>) -> Self {
        self.name = name.filter(|n| !n.trim().is_empty());
        self
    }

    /// How the trail shows it: `alice (console from 10.0.0.5)` for an account (with the name
    /// its operator gave, `bootstrap (carol, console from 10.0.0.5)`), else `name (user@host)`
    /// or `user@host`.
    pub fn label(&self) -> String {
        match (&self.account, &self.name) {
            (Some(account), Some(name)) => {
                format!(
                    "{account} ({name}, {} from {})",
                    self.via.as_str(),
                    self.host
                )
            }
            (Some(account), None) => {
                format!("{account} ({} from {})", self.via.as_str(), self.host)
            }
            (None, Some(name)) => format!("{name} ({}@{})", self.user, self.host),
            (None, None) => format!("{}@{}", self.user, self.host),
        }
    }
}

/// What an operator did: the kind of an audit entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum EntryKind {
    /// Dead letters published to their queues again.
    Replay,
    /// Dead letters marked purged.
    Purge,
    /// Failed outbox rows made pending again.
    OutboxRetry,
    /// An operator account made, changed (role, password), disabled or removed, or given an
    /// API token.
    OperatorAdd,
    OperatorChange,
    OperatorDisable,
    OperatorRemove,
    OperatorToken,
    /// A replica that is gone forgotten.
    ReplicaForget,
    /// A timer job's scheduled ticks held back on every replica.
    Pause,
    Resume,
    /// A timer job's tick run now. Stored (and serialized) as `trigger`, its name before
    /// "run now": rows already written and operators' filters on the column use that word.
    #[serde(rename = "trigger")]
    RunNow,
    /// A failed outbound mail or a malformed dead letter edited and sent again in its place;
    /// the entry's target holds the diff.
    Edit,
    /// One person's data erased (`worker-host privacy erase`, or the console's page); the
    /// target names the address only by its keyed hash, with the rows per table.
    PrivacyErase,
    /// Everything held about one person read out (`worker-host privacy export`); the target
    /// names the address only by its keyed hash.
    PrivacyExport,
    /// A viewer revealed the personal data of one console page (its target names the page).
    Reveal,
    /// What waited in a queue's retry tiers moved back to its work queue now; the target
    /// names the queue and the operator's reason.
    SendNow,
    /// A dependency's open circuit closed by an operator; the target names the dependency
    /// and the operator's reason.
    CircuitClose,
}

impl EntryKind {
    pub const fn as_str(&self) -> &'static str {
        match self {
            Self::Replay => "replay",
            Self::Purge => "purge",
            Self::OutboxRetry => "outbox-retry",
            Self::OperatorAdd => "operator-add",
            Self::OperatorChange => "operator-change",
            Self::OperatorDisable => "operator-disable",
            Self::OperatorRemove => "operator-remove",
            Self::OperatorToken => "operator-token",
            Self::ReplicaForget => "replica-forget",
            Self::Pause => "pause",
            Self::Resume => "resume",
            Self::RunNow => "trigger",
            Self::Edit => "edit",
            Self::PrivacyErase => "privacy-erase",
            Self::PrivacyExport => "privacy-export",
            Self::Reveal => "reveal",
            Self::SendNow => "send-now",
            Self::CircuitClose => "circuit-close",
        }
    }

    /// The kind stored as `text` (`None` for a word this release does not know).
    pub fn parse(text: &str) -> Option<Self> {
        ALL_KINDS.into_iter().find(|kind| kind.as_str() == text)
    }

    /// How the console and the command line show it: its stored word, but "run now" for
    /// what the column still calls `trigger`.
    pub const fn shown(&self) -> &'static str {
        match self {
            Self::RunNow => "run now",
            _ => self.as_str(),
        }
    }
}

const ALL_KINDS: [EntryKind; 18] = [
    EntryKind::Replay,
    EntryKind::Purge,
    EntryKind::OutboxRetry,
    EntryKind::OperatorAdd,
    EntryKind::OperatorChange,
    EntryKind::OperatorDisable,
    EntryKind::OperatorRemove,
    EntryKind::OperatorToken,
    EntryKind::ReplicaForget,
    EntryKind::Pause,
    EntryKind::Resume,
    EntryKind::RunNow,
    EntryKind::Edit,
    EntryKind::PrivacyErase,
    EntryKind::PrivacyExport,
    EntryKind::Reveal,
    EntryKind::SendNow,
    EntryKind::CircuitClose,
];

/// How the console and the command line show a stored kind: [`EntryKind::shown`], or the
/// stored word itself when this release does not know it.
pub fn shown(stored: &str) -> &str {
    EntryKind::parse(stored).map_or(stored, |kind| kind.shown())
}

/// An operator action about to start: its audit entry to write.
#[derive(Debug, Clone)]
pub struct NewEntry<'a> {
    pub kind: EntryKind,
    pub actor: &'a Actor,
    /// The filter it acts on (dead letters), or its target (`{"job": …}`, `{"outbox_id": …}`).
    pub target: Value,
    /// Messages per second asked for.
    pub rate: Option<u32>,
    /// Moves nothing; `matched` says what it would have moved.
    pub dry_run: bool,
    /// What the operator was shown before confirming (the dry run's count).
    pub planned: Option<u64>,
}

impl<'a> NewEntry<'a> {
    pub fn new(kind: EntryKind, actor: &'a Actor, target: Value) -> Self {
        Self {
            kind,
            actor,
            target,
            rate: None,
            dry_run: false,
            planned: None,
        }
    }
}

fn count(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// Writes the entry's row, unfinished; returns its id.
pub async fn begin(conn: &mut PgConnection, action: &NewEntry<'_>) -> Result<i64, Failure> {
    sqlx::query_scalar(
        "INSERT INTO dead_letter_actions (action, actor_user, actor_host, actor, dry_run, \
                                          filter, rate, planned, account, via) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10) RETURNING id",
    )
    .bind(action.kind.as_str())
    .bind(&action.actor.user)
    .bind(&action.actor.host)
    .bind(&action.actor.name)
    .bind(action.dry_run)
    .bind(&action.target)
    .bind(action.rate.map(|r| i32::try_from(r).unwrap_or(i32::MAX)))
    .bind(action.planned.map(count))
    .bind(&action.actor.account)
    .bind(action.actor.via.as_str())
    .fetch_one(conn)
    .await
    .map_err(classify)
}

/// Counts a step of a running operator action: `matched` looked at, `succeeded` done,
/// `failed` not.
pub async fn progress(
    conn: &mut PgConnection,
    id: i64,
    matched: u64,
    succeeded: u64,
    failed: u64,
) -> Result<(), Failure> {
    sqlx::query(
        "UPDATE dead_letter_actions SET matched = matched + $2, succeeded = succeeded + $3, \
                failed = failed + $4 WHERE id = $1",
    )
    .bind(id)
    .bind(count(matched))
    .bind(count(succeeded))
    .bind(count(failed))
    .execute(conn)
    .await
    .map_err(classify)?;
    Ok(())
}

/// Ends an entry's row (after which the database lets nothing change it), with a note and,
/// for a dry run, which counts only at its end, what it matched.
pub async fn finish(
    conn: &mut PgConnection,
    id: i64,
    note: Option<String>,
    matched: Option<u64>,
) -> Result<(), Failure> {
    sqlx::query(
        "UPDATE dead_letter_actions SET finished_at = now(), note = $2, \
                matched = coalesce($3, matched) \
         WHERE id = $1",
    )
    .bind(id)
    .bind(note)
    .bind(matched.map(count))
    .execute(conn)
    .await
    .map_err(classify)?;
    Ok(())
}

/// An operator action done at once (a pause, a run now, one outbox row): its row written and
/// finished with its counts, in the caller's transaction.
pub async fn record(
    conn: &mut PgConnection,
    action: &NewEntry<'_>,
    succeeded: u64,
    failed: u64,
    note: Option<String>,
) -> Result<i64, Failure> {
    let id = begin(conn, action).await?;
    progress(conn, id, succeeded + failed, succeeded, failed).await?;
    finish(conn, id, note, None).await?;
    Ok(id)
}

/// One audit entry: an operator action as recorded. `action` is the column's name and the
/// API's field, and holds the stored kind ([`EntryKind::as_str`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, sqlx::FromRow)]
pub struct Entry {
    pub id: i64,
    pub action: String,
    pub actor_user: String,
    pub actor_host: String,
    /// The name the operator gave (`--actor`, or at the console's sign-in), if any.
    pub actor: Option<String>,
    /// The database role the command connected as, as the database recorded it.
    pub db_user: String,
    /// A dry run: it moved nothing, `matched` says what it would have moved.
    pub dry_run: bool,
    pub started_at: DateTime<Utc>,
    pub finished_at: Option<DateTime<Utc>>,
    pub filter: Value,
    pub rate: Option<i32>,
    /// What the operator was shown before confirming.
    pub planned: Option<i64>,
    pub matched: i64,
    pub succeeded: i64,
    pub failed: i64,
    pub note: Option<String>,
    /// The account that acted (the console and the API; older rows have none).
    pub account: Option<String>,
    /// `cli`, `console` or `api` (older rows have none).
    pub via: Option<String>,
}

impl Entry {
    /// Still running (or died on the way: its counts say how far it got).
    pub fn running(&self) -> bool {
        self.finished_at.is_none()
    }

    /// How the trail shows what was done ([`shown`]).
    pub fn kind_shown(&self) -> &str {
        shown(&self.action)
    }

    /// How the trail shows who took it.
    pub fn actor_label(&self) -> String {
        Actor {
            user: self.actor_user.clone(),
            host: self.actor_host.clone(),
            name: self.actor.clone(),
            account: self.account.clone(),
            via: Via::parse(self.via.as_deref()),
        }
        .label()
    }
}

const COLUMNS: &str = "id, action, actor_user, actor_host, actor, db_user, dry_run, started_at, \
                       finished_at, filter, rate, planned, matched, succeeded, failed, note, \
                       account, via";

/// The audit entries, newest first, at most `limit`.
pub async fn recent(pool: &PgPool, limit: u32) -> Result<Vec<Entry>, Failure> {
    sqlx::query_as(&format!(
        "SELECT {COLUMNS} FROM dead_letter_actions ORDER BY id DESC LIMIT $1"
    ))
    .bind(i64::from(limit.max(1)))
    .fetch_all(pool)
    .await
    .map_err(classify)
}

/// One audit entry, by id.
pub async fn get(pool: &PgPool, id: i64) -> Result<Option<Entry>, Failure> {
    sqlx::query_as(&format!(
        "SELECT {COLUMNS} FROM dead_letter_actions WHERE id = $1"
    ))
    .bind(id)
    .fetch_optional(pool)
    .await
    .map_err(classify)
}

/// The newest audit entry whose target holds `target` (`{"edit_key": …}`), read in the
/// caller's transaction.
pub async fn latest_on_target_in(
    conn: &mut PgConnection,
    target: &Value,
) -> Result<Option<Entry>, Failure> {
    sqlx::query_as(&format!(
        "SELECT {COLUMNS} FROM dead_letter_actions WHERE filter @> $1 ORDER BY id DESC LIMIT 1"
    ))
    .bind(target)
    .fetch_optional(conn)
    .await
    .map_err(classify)
}

/// The audit entries on one target (`{"job": "draft_expiry"}`, say), newest first.
pub async fn on_target(pool: &PgPool, target: &Value, limit: u32) -> Result<Vec<Entry>, Failure> {
    sqlx::query_as(&format!(
        "SELECT {COLUMNS} FROM dead_letter_actions WHERE filter @> $1 ORDER BY id DESC LIMIT $2"
    ))
    .bind(target)
    .bind(i64::from(limit.max(1)))
    .fetch_all(pool)
    .await
    .map_err(classify)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_actor_is_labelled_by_the_name_they_gave_and_where_they_were() {
        let plain = Actor::new("ops", "host-1");
        assert_eq!(plain.label(), "ops@host-1");
        let named = plain.with_name(Some("alice".into()));
        assert_eq!(named.label(), "alice (ops@host-1)");
        let blank = Actor::new("ops", "host-1").with_name(Some("  ".into()));
        assert_eq!(blank.name, None, "a blank name is no name");
        let account = Actor::account("alice", "10.0.0.5", Via::Api);
        assert_eq!(account.label(), "alice (api from 10.0.0.5)");
        let shared =
            Actor::account("bootstrap", "10.0.0.5", Via::Console).with_name(Some("carol".into()));
        assert_eq!(shared.label(), "bootstrap (carol, console from 10.0.0.5)");
    }

    #[test]
    fn entry_kinds_are_written_as_the_database_allows() {
        let all = ALL_KINDS;
        let migration = include_str!("../../../migrations/20261204000100_operator_accounts.sql");
        // The kinds added since, by the migration that widens the CHECK with each.
        let later = include_str!("../../../migrations/20261207000300_mail_edits.sql");
        let privacy = include_str!("../../../migrations/20261210000600_audit_redaction.sql");
        let sight = include_str!("../../../migrations/20261210000500_personal_data_sight.sql");
        let send_now = include_str!("../../../migrations/20261211000200_send_parked_now.sql");
        let circuits = include_str!("../../../migrations/20261211000300_dependency_circuits.sql");
        for kind in all {
            let word = format!("'{}'", kind.as_str());
            assert!(
                migration.contains(&word)
                    || later.contains(&format!("ARRAY[{word}]"))
                    || sight.contains(&format!("ARRAY[{word}]"))
                    || send_now.contains(&format!("ARRAY[{word}]"))
                    || circuits.contains(&format!("ARRAY[{word}]"))
                    || privacy.contains("ARRAY['privacy-erase', 'privacy-export']")
                        && word.starts_with("'privacy-"),
                "{kind:?} is in the CHECK"
            );
            let json = serde_json::to_value(kind).unwrap();
            assert_eq!(json, kind.as_str());
            assert_eq!(EntryKind::parse(kind.as_str()), Some(kind));
        }
    }

    #[test]
    fn a_run_now_is_stored_as_trigger_and_shown_as_run_now() {
        assert_eq!(EntryKind::RunNow.as_str(), "trigger");
        assert_eq!(shown("trigger"), "run now");
        assert_eq!(shown("replay"), "replay");
        assert_eq!(shown("from-a-newer-release"), "from-a-newer-release");
    }
}
