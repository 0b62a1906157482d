//! Who sees customers' personal data: a viewer only once an operator or admin gave its
//! account the right to reveal it (`reveals_personal_data`), and then one page at a time,
//! each reveal an audit entry. Operators and admins see it always; their role is the right.

use std::time::Duration;

use sqlx::PgPool;

use super::account::{AccountError, check_name, refuse_bootstrap, target};
use crate::audit::{self, Actor, EntryKind, NewEntry};
use crate::classify;
use worker_core::Failure;

/// Gives account `name` the right to reveal personal data (`allowed`), or takes it back.
pub async fn set_reveal_right(
    pool: &PgPool,
    name: &str,
    allowed: bool,
    actor: &Actor,
) -> Result<(), AccountError> {
    check_name(name)?;
    refuse_bootstrap(name)?;
    let mut tx = pool.begin().await.map_err(classify)?;
    let changed =
        sqlx::query("UPDATE operator_accounts SET reveals_personal_data = $2 WHERE name = $1")
            .bind(name)
            .bind(allowed)
            .execute(&mut *tx)
            .await
            .map_err(classify)?;
    if changed.rows_affected() == 0 {
        return Err(AccountError::NotFound(name.to_string()));
    }
    let note = if allowed {
        "may reveal personal data"
    } else {
        "may no longer reveal personal data"
    };
    audit::record(
        &mut tx,
        &NewEntry::new(EntryKind::OperatorChange, actor, target(name)),
        1,
        0,
        Some(note.to_string()),
    )
    .await?;
    tx.commit().await.map_err(classify)?;
    Ok(())
}

/// What a viewer's account may see of `page`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ViewerSight {
    /// The account may reveal personal data.
    pub may_reveal: bool,
    /// It revealed this page within the window.
    pub revealed: bool,
}

/// Whether `account` may reveal personal data, and whether it revealed `page` in the last
/// `window`. An account that is gone may do neither.
pub async fn viewer_sight(
    pool: &PgPool,
    account: &str,
    page: &str,
    window: Duration,
) -> Result<ViewerSight, Failure> {
    let found: Option<(bool, bool)> = sqlx::query_as(
        "SELECT a.reveals_personal_data, \
                a.reveals_personal_data AND EXISTS ( \
                  SELECT 1 FROM dead_letter_actions r \
                   WHERE r.action = 'reveal' AND r.account = a.name \
                     AND r.filter ->> 'page' = $2 \
                     AND r.started_at > now() - make_interval(secs => $3)) \
         FROM operator_accounts a WHERE a.name = $1 AND a.disabled_at IS NULL",
    )
    .bind(account)
    .bind(page)
    .bind(window.as_secs_f64())
    .fetch_optional(pool)
    .await
    .map_err(classify)?;
    let (may_reveal, revealed) = found.unwrap_or((false, false));
    Ok(ViewerSight {
        may_reveal,
        revealed,
    })
}

/// Records that `actor` revealed the personal data on `page` (a console path), if its account
/// may; `Ok(false)` when it may not, and nothing is recorded.
pub async fn reveal(pool: &PgPool, actor: &Actor, page: &str) -> Result<bool, Failure> {
    let Some(account) = actor.account.as_deref() else {
        return Ok(false);
    };
    let mut tx = pool.begin().await.map_err(classify)?;
    let may: Option<bool> = sqlx::query_scalar(
        "SELECT reveals_personal_data FROM operator_accounts \
         WHERE name = $1 AND disabled_at IS NULL FOR SHARE",
    )
    .bind(account)
    .fetch_optional(&mut *tx)
    .await
    .map_err(classify)?;
    if may != Some(true) {
        return Ok(false);
    }
    audit::record(
        &mut tx,
        &NewEntry::new(
            EntryKind::Reveal,
            actor,
            serde_json::json!({ "page": page }),
        ),
        1,
        0,
        None,
    )
    .await?;
    tx.commit().await.map_err(classify)?;
    Ok(true)
}
