//! What signing in reads: an API token's account, a password's account, an auth proxy's user
//! (made at its first sign-in when the settings say so); and each account's sign-in budget,
//! shared by every replica ([`take_sign_in_turn`]).

use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::PgPool;
use worker_core::Failure;

use super::account::{AccountError, BOOTSTRAP, Role, check_name, target};
use crate::audit::{self, Actor, EntryKind, NewEntry};
use crate::classify;

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
///
/// The [`BOOTSTRAP`] account, in any case of its letters, is refused
/// ([`AccountError::Bootstrap`]): it is whoever holds `admin.operator_token`, and an identity
/// provider's user who happens to be called `bootstrap` (a login name chosen by the user, a
/// line of an htpasswd file) does not hold it.
pub async fn from_proxy(
    pool: &PgPool,
    name: &str,
    new_role: Option<Role>,
    actor: &Actor,
) -> Result<Option<Role>, AccountError> {
    if name.eq_ignore_ascii_case(BOOTSTRAP) {
        return Err(AccountError::Bootstrap);
    }
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
                    &NewEntry::new(EntryKind::OperatorAdd, actor, target(name)),
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

/// An account's sign-in budget: `burst` tries at once, then one every `period`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SignInBudget {
    pub burst: u32,
    pub period: Duration,
}

/// Takes one try from the budget of the account named `key` (the caller lower-cases it), in
/// one statement under the row's lock, so that every replica counts against the same budget.
/// `None`: go on; `Some(wait)`: refused, the budget has a try again after `wait`. Never waits
/// itself.
pub async fn take_sign_in_turn(
    pool: &PgPool,
    key: &str,
    budget: SignInBudget,
) -> Result<Option<Duration>, Failure> {
    let period = budget.period.as_secs_f64();
    let window = period * f64::from(budget.burst.max(1));
    // Full budgets need no row: a row whose time has passed says nothing a missing one does
    // not. Rows another sign-in holds are left for a later sweep, so that sweeps at once
    // neither wait for each other nor deadlock.
    sqlx::query(
        "DELETE FROM operator_sign_in_budget WHERE account IN \
         (SELECT account FROM operator_sign_in_budget WHERE full_at < now() \
          FOR UPDATE SKIP LOCKED)",
    )
    .execute(pool)
    .await
    .map_err(classify)?;
    let taken: Option<(DateTime<Utc>,)> = sqlx::query_as(
        "INSERT INTO operator_sign_in_budget AS b (account, full_at) \
         VALUES ($1, now() + make_interval(secs => $2)) \
         ON CONFLICT (account) DO UPDATE \
           SET full_at = greatest(b.full_at, now()) + make_interval(secs => $2) \
           WHERE greatest(b.full_at, now()) + make_interval(secs => $2) \
                 <= now() + make_interval(secs => $3) \
         RETURNING full_at",
    )
    .bind(key)
    .bind(period)
    .bind(window)
    .fetch_optional(pool)
    .await
    .map_err(classify)?;
    if taken.is_some() {
        return Ok(None);
    }
    // Refused: the next try fits once the budget's time is within a burst's worth of now.
    let wait: Option<f64> = sqlx::query_scalar(
        "SELECT extract(epoch FROM greatest(full_at, now()) + make_interval(secs => $2) \
                - make_interval(secs => $3) - now())::float8 \
         FROM operator_sign_in_budget WHERE account = $1",
    )
    .bind(key)
    .bind(period)
    .bind(window)
    .fetch_optional(pool)
    .await
    .map_err(classify)?;
    let wait = wait.unwrap_or(period).clamp(0.0, window.max(period));
    Ok(Some(Duration::from_secs_f64(wait)))
}
