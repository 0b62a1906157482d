//! The `bootstrap` account, kept in step with `admin.operator_token` at every start.

use sqlx::PgPool;
use worker_core::Failure;

use super::account::BOOTSTRAP;
use crate::classify;

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
