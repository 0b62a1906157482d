//! Operator accounts and their API tokens (`operator_accounts`, `operator_tokens`), which
//! every replica reads, so that one account signs in anywhere. Each change is recorded in the
//! audit trail in the same transaction. Hashing is the caller's: this module stores the
//! argon2id string of a password and the SHA-256 of a token, and compares nothing itself
//! except a token's digest.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use sqlx::PgPool;
use worker_core::Failure;

use crate::audit::{self, ActionKind, Actor, NewAction};
use crate::classify;

/// What an account may do. Each role may do everything the one before it may.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, Default,
)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Reads every page and API.
    #[default]
    Viewer,
    /// Also replays, purges, retries, pauses, resumes, triggers and cancels.
    Operator,
    /// Also manages accounts from the console.
    Admin,
}

impl Role {
    pub const ALL: [Self; 3] = [Self::Viewer, Self::Operator, Self::Admin];

    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Viewer => "viewer",
            Self::Operator => "operator",
            Self::Admin => "admin",
        }
    }
}

impl std::fmt::Display for Role {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for Role {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|role| role.as_str().eq_ignore_ascii_case(text.trim()))
            .ok_or_else(|| format!("expected viewer, operator or admin, found `{text}`"))
    }
}

/// The name kept for the account that `admin.operator_token` will sign in as: no command
/// makes, changes or removes it.
pub const BOOTSTRAP: &str = "bootstrap";

/// The longest account name.
pub const NAME_MAX_CHARS: usize = 80;

/// Why an account cannot be changed as asked.
#[derive(Debug, thiserror::Error)]
pub enum AccountError {
    #[error(
        "`{0}` is not an account name: 1 to 80 letters, digits and `._@+-`, starting with a letter or digit"
    )]
    BadName(String),
    #[error("an account called `{0}` exists already")]
    Exists(String),
    #[error("no account is called `{0}`")]
    NotFound(String),
    #[error("`{BOOTSTRAP}` comes from admin.operator_token: change or remove that setting instead")]
    Bootstrap,
    #[error(transparent)]
    Store(#[from] Failure),
}

/// Whether `name` may name an account (the database's CHECK, said before it is asked).
pub fn valid_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphanumeric())
        && name.chars().count() <= NAME_MAX_CHARS
        && chars.all(|c| c.is_ascii_alphanumeric() || "._@+-".contains(c))
}

/// One account as `operators list` and the console show it: never a hash.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, sqlx::FromRow)]
pub struct Account {
    pub name: String,
    #[sqlx(try_from = "String")]
    pub role: RoleText,
    pub origin: String,
    pub created_at: DateTime<Utc>,
    pub created_by: String,
    pub disabled_at: Option<DateTime<Utc>>,
    /// It can sign in with a password.
    pub has_password: bool,
    /// Its API tokens.
    pub tokens: i64,
    /// Its live sessions.
    pub sessions: i64,
}

/// A role as a column holds it, read back into [`Role`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(transparent)]
pub struct RoleText(pub Role);

impl TryFrom<String> for RoleText {
    type Error = String;

    fn try_from(text: String) -> Result<Self, Self::Error> {
        text.parse().map(Self)
    }
}

fn target(name: &str) -> serde_json::Value {
    serde_json::json!({ "account": name })
}

fn check_name(name: &str) -> Result<(), AccountError> {
    if valid_name(name) {
        Ok(())
    } else {
        Err(AccountError::BadName(name.to_string()))
    }
}

fn refuse_bootstrap(name: &str) -> Result<(), AccountError> {
    if name == BOOTSTRAP {
        Err(AccountError::Bootstrap)
    } else {
        Ok(())
    }
}

/// Makes account `name` with `role` and, if given, a password's argon2id string.
pub async fn add(
    pool: &PgPool,
    name: &str,
    role: Role,
    password_hash: Option<&str>,
    actor: &Actor,
) -> Result<(), AccountError> {
    check_name(name)?;
    refuse_bootstrap(name)?;
    let mut tx = pool.begin().await.map_err(classify)?;
    let made = sqlx::query(
        "INSERT INTO operator_accounts (name, role, password_hash, origin, created_by) \
         VALUES ($1, $2, $3, 'local', $4) ON CONFLICT (name) DO NOTHING",
    )
    .bind(name)
    .bind(role.as_str())
    .bind(password_hash)
    .bind(actor.label())
    .execute(&mut *tx)
    .await
    .map_err(classify)?;
    if made.rows_affected() == 0 {
        return Err(AccountError::Exists(name.to_string()));
    }
    let note = format!("role {role}");
    audit::record(
        &mut tx,
        &NewAction::new(ActionKind::OperatorAdd, actor, target(name)),
        1,
        0,
        Some(note),
    )
    .await?;
    tx.commit().await.map_err(classify)?;
    Ok(())
}

/// Every account, by name.
pub async fn list(pool: &PgPool) -> Result<Vec<Account>, Failure> {
    sqlx::query_as(
        "SELECT a.name, a.role, a.origin, a.created_at, a.created_by, a.disabled_at, \
                a.password_hash IS NOT NULL AS has_password, \
                (SELECT count(*) FROM operator_tokens t WHERE t.account = a.name) AS tokens, \
                (SELECT count(*) FROM operator_sessions s \
                  WHERE s.account = a.name AND s.expires_at > now()) AS sessions \
         FROM operator_accounts a ORDER BY a.name",
    )
    .fetch_all(pool)
    .await
    .map_err(classify)
}

/// Applies `change` (one statement on the account's row, `$1` its name) and records `kind`.
async fn change(
    pool: &PgPool,
    name: &str,
    statement: &str,
    bind: Option<&str>,
    kind: ActionKind,
    note: String,
    actor: &Actor,
) -> Result<(), AccountError> {
    refuse_bootstrap(name)?;
    let mut tx = pool.begin().await.map_err(classify)?;
    let mut query = sqlx::query(statement).bind(name);
    if let Some(value) = bind {
        query = query.bind(value);
    }
    let changed = query.execute(&mut *tx).await.map_err(classify)?;
    if changed.rows_affected() == 0 {
        return Err(AccountError::NotFound(name.to_string()));
    }
    if matches!(
        kind,
        ActionKind::OperatorDisable | ActionKind::OperatorChange
    ) {
        // A disabled account, or one whose password changed, is signed out everywhere.
        sqlx::query("DELETE FROM operator_sessions WHERE account = $1")
            .bind(name)
            .execute(&mut *tx)
            .await
            .map_err(classify)?;
    }
    audit::record(
        &mut tx,
        &NewAction::new(kind, actor, target(name)),
        1,
        0,
        Some(note),
    )
    .await?;
    tx.commit().await.map_err(classify)?;
    Ok(())
}

/// Sets `name`'s password (its argon2id string) and ends its sessions.
pub async fn set_password(
    pool: &PgPool,
    name: &str,
    password_hash: &str,
    actor: &Actor,
) -> Result<(), AccountError> {
    change(
        pool,
        name,
        "UPDATE operator_accounts SET password_hash = $2 WHERE name = $1",
        Some(password_hash),
        ActionKind::OperatorChange,
        "password set".into(),
        actor,
    )
    .await
}

/// Gives `name` another role and ends its sessions (they carried the old one).
pub async fn set_role(
    pool: &PgPool,
    name: &str,
    role: Role,
    actor: &Actor,
) -> Result<(), AccountError> {
    change(
        pool,
        name,
        "UPDATE operator_accounts SET role = $2 WHERE name = $1",
        Some(role.as_str()),
        ActionKind::OperatorChange,
        format!("role {role}"),
        actor,
    )
    .await
}

/// Disables `name`: its sessions end at once and its tokens stop working; `enable` undoes it.
pub async fn disable(pool: &PgPool, name: &str, actor: &Actor) -> Result<(), AccountError> {
    change(
        pool,
        name,
        "UPDATE operator_accounts SET disabled_at = coalesce(disabled_at, now()) WHERE name = $1",
        None,
        ActionKind::OperatorDisable,
        "disabled".into(),
        actor,
    )
    .await
}

/// Enables a disabled account again.
pub async fn enable(pool: &PgPool, name: &str, actor: &Actor) -> Result<(), AccountError> {
    change(
        pool,
        name,
        "UPDATE operator_accounts SET disabled_at = NULL WHERE name = $1",
        None,
        ActionKind::OperatorChange,
        "enabled".into(),
        actor,
    )
    .await
}

/// Removes `name`, its tokens and its sessions. Its audit rows stay, naming it.
pub async fn remove(pool: &PgPool, name: &str, actor: &Actor) -> Result<(), AccountError> {
    change(
        pool,
        name,
        "DELETE FROM operator_accounts WHERE name = $1",
        None,
        ActionKind::OperatorRemove,
        "removed".into(),
        actor,
    )
    .await
}

/// Gives `name` an API token, kept as `token_sha256`; returns its id.
pub async fn add_token(
    pool: &PgPool,
    name: &str,
    label: &str,
    token_sha256: &[u8],
    actor: &Actor,
) -> Result<i64, AccountError> {
    refuse_bootstrap(name)?;
    let mut tx = pool.begin().await.map_err(classify)?;
    let id: Option<i64> = sqlx::query_scalar(
        "INSERT INTO operator_tokens (account, label, token_sha256) \
         SELECT name, $2, $3 FROM operator_accounts WHERE name = $1 RETURNING id",
    )
    .bind(name)
    .bind(label)
    .bind(token_sha256)
    .fetch_optional(&mut *tx)
    .await
    .map_err(classify)?;
    let id = id.ok_or_else(|| AccountError::NotFound(name.to_string()))?;
    audit::record(
        &mut tx,
        &NewAction::new(ActionKind::OperatorToken, actor, target(name)),
        1,
        0,
        Some(format!("token {id} `{label}`")),
    )
    .await?;
    tx.commit().await.map_err(classify)?;
    Ok(id)
}

/// The enabled account and role whose token has this SHA-256, its use noted.
pub async fn by_token(
    pool: &PgPool,
    token_sha256: &[u8],
) -> Result<Option<(String, Role)>, Failure> {
    let row: Option<(String, String)> = sqlx::query_as(
        "UPDATE operator_tokens t SET last_used_at = now() \
         FROM operator_accounts a \
         WHERE t.token_sha256 = $1 AND a.name = t.account AND a.disabled_at IS NULL \
         RETURNING a.name, a.role",
    )
    .bind(token_sha256)
    .fetch_optional(pool)
    .await
    .map_err(classify)?;
    Ok(row.and_then(|(name, role)| Some((name, role.parse().ok()?))))
}

/// Deletes the bootstrap account's rows of `table` (its tokens or its sessions).
async fn clear_bootstrap(
    conn: &mut sqlx::PgConnection,
    table: &'static str,
) -> Result<(), Failure> {
    sqlx::query(&format!("DELETE FROM {table} WHERE account = $1"))
        .bind(BOOTSTRAP)
        .execute(conn)
        .await
        .map_err(classify)?;
    Ok(())
}

/// What [`sync_bootstrap`] changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BootstrapSync {
    /// The account and its token were as the settings say.
    Unchanged,
    /// The account was made, or enabled again, with the token.
    Enabled,
    /// The token is another one: the sessions made with the old one ended.
    Rotated,
    /// The token is gone: the account is disabled, its token and sessions ended.
    Disabled,
}

/// Keeps the `bootstrap` account in step with `admin.operator_token`, whose SHA-256 is
/// `token_sha256`: an enabled admin with that token (as an API token of the account, so that
/// every replica checks it in one place), or disabled without it. A changed token ends the
/// sessions made with the old one, on every replica.
pub async fn sync_bootstrap(
    pool: &PgPool,
    token_sha256: Option<&[u8]>,
) -> Result<BootstrapSync, Failure> {
    let mut tx = pool.begin().await.map_err(classify)?;
    let held: Vec<Vec<u8>> =
        sqlx::query_scalar("SELECT token_sha256 FROM operator_tokens WHERE account = $1")
            .bind(BOOTSTRAP)
            .fetch_all(&mut *tx)
            .await
            .map_err(classify)?;
    let outcome = match token_sha256 {
        Some(digest) => {
            let enabled = sqlx::query(
                "INSERT INTO operator_accounts (name, role, origin, created_by) \
                 VALUES ($1, 'admin', 'bootstrap', 'admin.operator_token') \
                 ON CONFLICT (name) DO UPDATE SET role = 'admin', disabled_at = NULL \
                 WHERE operator_accounts.role <> 'admin' OR operator_accounts.disabled_at IS NOT NULL",
            )
            .bind(BOOTSTRAP)
            .execute(&mut *tx)
            .await
            .map_err(classify)?
            .rows_affected()
                > 0;
            if held == [digest.to_vec()] {
                if enabled {
                    BootstrapSync::Enabled
                } else {
                    BootstrapSync::Unchanged
                }
            } else {
                clear_bootstrap(&mut tx, "operator_tokens").await?;
                sqlx::query(
                    "INSERT INTO operator_tokens (account, label, token_sha256) \
                     VALUES ($1, 'admin.operator_token', $2)",
                )
                .bind(BOOTSTRAP)
                .bind(digest)
                .execute(&mut *tx)
                .await
                .map_err(classify)?;
                clear_bootstrap(&mut tx, "operator_sessions").await?;
                if held.is_empty() {
                    BootstrapSync::Enabled
                } else {
                    BootstrapSync::Rotated
                }
            }
        }
        None => {
            let disabled = sqlx::query(
                "UPDATE operator_accounts SET disabled_at = now() \
                 WHERE name = $1 AND disabled_at IS NULL",
            )
            .bind(BOOTSTRAP)
            .execute(&mut *tx)
            .await
            .map_err(classify)?
            .rows_affected()
                > 0;
            clear_bootstrap(&mut tx, "operator_tokens").await?;
            clear_bootstrap(&mut tx, "operator_sessions").await?;
            if disabled || !held.is_empty() {
                BootstrapSync::Disabled
            } else {
                BootstrapSync::Unchanged
            }
        }
    };
    tx.commit().await.map_err(classify)?;
    Ok(outcome)
}

/// What signing in as an account checks: its role and its password's argon2id string, for an
/// enabled account that has a password.
pub async fn credentials(pool: &PgPool, name: &str) -> Result<Option<(Role, String)>, Failure> {
    let row: Option<(String, String)> = sqlx::query_as(
        "SELECT role, password_hash FROM operator_accounts \
         WHERE name = $1 AND disabled_at IS NULL AND password_hash IS NOT NULL",
    )
    .bind(name)
    .fetch_optional(pool)
    .await
    .map_err(classify)?;
    Ok(row.and_then(|(role, hash)| Some((role.parse().ok()?, hash))))
}

/// How an auth proxy's user is signed in: the account of that name, if it exists and is
/// enabled, else one made with `new_role` (origin `proxy`, recorded in the audit trail), else
/// nobody. A disabled account stays disabled.
pub async fn from_proxy(
    pool: &PgPool,
    name: &str,
    new_role: Option<Role>,
    actor: &Actor,
) -> Result<Option<Role>, AccountError> {
    check_name(name)?;
    let row: Option<(String, Option<DateTime<Utc>>)> =
        sqlx::query_as("SELECT role, disabled_at FROM operator_accounts WHERE name = $1")
            .bind(name)
            .fetch_optional(pool)
            .await
            .map_err(classify)?;
    match (row, new_role) {
        (Some((role, None)), _) => Ok(role.parse().ok()),
        (Some((_, Some(_))), _) | (None, None) => Ok(None),
        (None, Some(role)) => {
            let mut tx = pool.begin().await.map_err(classify)?;
            let made = sqlx::query(
                "INSERT INTO operator_accounts (name, role, origin, created_by) \
                 VALUES ($1, $2, 'proxy', $3) ON CONFLICT (name) DO NOTHING",
            )
            .bind(name)
            .bind(role.as_str())
            .bind(actor.label())
            .execute(&mut *tx)
            .await
            .map_err(classify)?;
            if made.rows_affected() > 0 {
                audit::record(
                    &mut tx,
                    &NewAction::new(ActionKind::OperatorAdd, actor, target(name)),
                    1,
                    0,
                    Some(format!(
                        "role {role}, at its first sign-in through the auth proxy"
                    )),
                )
                .await?;
            }
            tx.commit().await.map_err(classify)?;
            Ok(Some(role))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roles_read_back_as_written_and_rank_in_order() {
        for role in Role::ALL {
            assert_eq!(role.as_str().parse::<Role>(), Ok(role));
        }
        assert!(Role::Viewer < Role::Operator && Role::Operator < Role::Admin);
        assert!("root".parse::<Role>().unwrap_err().contains("viewer"));
    }

    #[test]
    fn account_names_are_what_the_database_allows() {
        assert!(valid_name("alice"));
        assert!(valid_name("alice@example.com"));
        assert!(!valid_name(""));
        assert!(!valid_name("-alice"));
        assert!(!valid_name("alice smith"));
        assert!(!valid_name(&"a".repeat(NAME_MAX_CHARS + 1)));
    }
}
