//! Operators' changes to accounts, each recorded in the audit trail in its transaction: made,
//! listed, given a password, a role or a token, disabled, enabled, removed.

use sqlx::PgPool;
use worker_core::Failure;

use super::account::{Account, AccountError, Role, check_name, refuse_bootstrap, target};
use crate::audit::{self, Actor, EntryKind, NewEntry};
use crate::classify;

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
        &NewEntry::new(EntryKind::OperatorAdd, actor, target(name)),
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
                  WHERE s.account = a.name AND s.expires_at > now()) AS sessions, \
                a.reveals_personal_data \
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
    kind: EntryKind,
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
    if matches!(kind, EntryKind::OperatorDisable | EntryKind::OperatorChange) {
        // A disabled account, or one whose password changed, is signed out everywhere.
        sqlx::query("DELETE FROM operator_sessions WHERE account = $1")
            .bind(name)
            .execute(&mut *tx)
            .await
            .map_err(classify)?;
    }
    audit::record(
        &mut tx,
        &NewEntry::new(kind, actor, target(name)),
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
        EntryKind::OperatorChange,
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
        EntryKind::OperatorChange,
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
        EntryKind::OperatorDisable,
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
        EntryKind::OperatorChange,
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
        EntryKind::OperatorRemove,
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
        &NewEntry::new(EntryKind::OperatorToken, actor, target(name)),
        1,
        0,
        Some(format!("token {id} `{label}`")),
    )
    .await?;
    tx.commit().await.map_err(classify)?;
    Ok(id)
}
