//! Console sessions (`operator_sessions`), shared by every replica: a session made on one is
//! valid on all, and ending it on one ends it on all. The caller keeps the cookie's id; this
//! module only sees its SHA-256.
//!
//! A session the auth proxy's header makes for a request without a cookie is *unclaimed*
//! until its cookie comes back ([`create_unclaimed`]): each account has at most one, so that
//! requests that never bring a cookie back (another site's `<img>` in a signed-in browser,
//! whose `SameSite=Strict` cookie stays home; a script through the proxy) do not each leave a
//! row until its lifetime ends.

use std::time::Duration;

use sqlx::PgPool;
use worker_core::Failure;

use crate::classify;
use crate::operators::Role;

/// A session's use counts towards its idle limit at most this often, so that a busy page does
/// not write a row per request. The idle limit is therefore exact to within this much.
pub const TOUCH_EVERY: Duration = Duration::from_secs(15);

/// A live session, read back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Live {
    pub account: String,
    pub role: Role,
    /// The token its forms carry.
    pub csrf: String,
    /// Where it was made from.
    pub origin: String,
    /// The name its operator gave at sign-in (the bootstrap account's sessions only).
    pub given_name: Option<String>,
}

/// A session about to be made.
#[derive(Debug, Clone, Copy)]
pub struct NewSession<'a> {
    /// The SHA-256 of the cookie's id.
    pub id_sha256: &'a [u8],
    pub account: &'a str,
    pub csrf: &'a str,
    /// Where it is made from.
    pub origin: &'a str,
    pub given_name: Option<&'a str>,
    /// Its absolute lifetime.
    pub lifetime: Duration,
}

fn seconds(duration: Duration) -> f64 {
    duration.as_secs_f64()
}

/// Makes a session, valid for its lifetime at most; sweeps ended ones.
pub async fn create(pool: &PgPool, session: &NewSession<'_>) -> Result<(), Failure> {
    sqlx::query("DELETE FROM operator_sessions WHERE expires_at < now()")
        .execute(pool)
        .await
        .map_err(classify)?;
    sqlx::query(
        "INSERT INTO operator_sessions (id_sha256, account, csrf, origin, given_name, expires_at) \
         VALUES ($1, $2, $3, $4, $5, now() + make_interval(secs => $6))",
    )
    .bind(session.id_sha256)
    .bind(session.account)
    .bind(session.csrf)
    .bind(session.origin)
    .bind(session.given_name)
    .bind(seconds(session.lifetime))
    .execute(pool)
    .await
    .map_err(classify)?;
    Ok(())
}

/// Makes a session for the auth proxy's user, unclaimed until its cookie is seen
/// ([`live`]), in place of the account's other unclaimed ones. The account's row is locked
/// meanwhile, so that requests at once still leave one.
pub async fn create_unclaimed(pool: &PgPool, session: &NewSession<'_>) -> Result<(), Failure> {
    let mut tx = pool.begin().await.map_err(classify)?;
    sqlx::query("SELECT 1 FROM operator_accounts WHERE name = $1 FOR UPDATE")
        .bind(session.account)
        .execute(&mut *tx)
        .await
        .map_err(classify)?;
    sqlx::query(
        "DELETE FROM operator_sessions \
         WHERE (account = $1 AND unclaimed) OR expires_at < now()",
    )
    .bind(session.account)
    .execute(&mut *tx)
    .await
    .map_err(classify)?;
    sqlx::query(
        "INSERT INTO operator_sessions \
           (id_sha256, account, csrf, origin, given_name, expires_at, unclaimed) \
         VALUES ($1, $2, $3, $4, $5, now() + make_interval(secs => $6), true)",
    )
    .bind(session.id_sha256)
    .bind(session.account)
    .bind(session.csrf)
    .bind(session.origin)
    .bind(session.given_name)
    .bind(seconds(session.lifetime))
    .execute(&mut *tx)
    .await
    .map_err(classify)?;
    tx.commit().await.map_err(classify)?;
    Ok(())
}

/// The session with this id, if it is live: within its lifetime, used within `idle`, and its
/// account enabled. With `touch`, this use counts (a page that refreshes itself passes
/// `false`, so that an open tab does not keep a session alive). An unclaimed session is
/// claimed: its cookie came back.
pub async fn live(
    pool: &PgPool,
    id_sha256: &[u8],
    idle: Duration,
    touch: bool,
) -> Result<Option<Live>, Failure> {
    let row: Option<(String, String, String, String, Option<String>, bool)> = sqlx::query_as(
        "SELECT s.account, a.role, s.csrf, s.origin, s.given_name, s.unclaimed \
         FROM operator_sessions s JOIN operator_accounts a ON a.name = s.account \
         WHERE s.id_sha256 = $1 AND s.expires_at > now() \
           AND s.last_seen_at > now() - make_interval(secs => $2) AND a.disabled_at IS NULL",
    )
    .bind(id_sha256)
    .bind(seconds(idle))
    .fetch_optional(pool)
    .await
    .map_err(classify)?;
    let Some((account, role, csrf, origin, given_name, unclaimed)) = row else {
        return Ok(None);
    };
    if unclaimed {
        sqlx::query("UPDATE operator_sessions SET unclaimed = false WHERE id_sha256 = $1")
            .bind(id_sha256)
            .execute(pool)
            .await
            .map_err(classify)?;
    }
    if touch {
        sqlx::query(
            "UPDATE operator_sessions SET last_seen_at = now() \
             WHERE id_sha256 = $1 AND last_seen_at < now() - make_interval(secs => $2)",
        )
        .bind(id_sha256)
        .bind(seconds(TOUCH_EVERY))
        .execute(pool)
        .await
        .map_err(classify)?;
    }
    let Ok(role) = role.parse() else {
        return Ok(None);
    };
    Ok(Some(Live {
        account,
        role,
        csrf,
        origin,
        given_name,
    }))
}

/// Ends the session with this id, on every replica.
pub async fn end(pool: &PgPool, id_sha256: &[u8]) -> Result<(), Failure> {
    sqlx::query("DELETE FROM operator_sessions WHERE id_sha256 = $1")
        .bind(id_sha256)
        .execute(pool)
        .await
        .map_err(classify)?;
    Ok(())
}
