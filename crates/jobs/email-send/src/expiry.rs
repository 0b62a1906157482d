//! What a replay would meet: of the outbound mails named by some commands' message ids (an
//! `email.send` command's message id is its mail's id), how many are past their age limit
//! now, and so would be recorded `expired` rather than sent (see "Stale replies are not
//! sent" in the crate docs). A dry run of a replay says so.

use std::time::Duration;

use sqlx::PgPool;
use worker_core::Failure;

/// How many of the mails whose ids are among `message_ids` are past their limit now: their
/// own `expires_at`, else `created_at` + `max_age` (`jobs.email_send.max_age`; `None`: no
/// limit). Mails sent, expired already or replaced by an operator's edit are not counted:
/// their commands send nothing either way. Ids that name no mail are left out.
pub async fn would_expire(
    pool: &PgPool,
    message_ids: &[String],
    max_age: Option<Duration>,
) -> Result<u64, Failure> {
    if message_ids.is_empty() {
        return Ok(0);
    }
    let count: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM outbound_emails \
         WHERE id::text = ANY($1) AND status NOT IN ('sent', 'expired', 'bounced') \
           AND superseded_by IS NULL \
           AND coalesce(expires_at, created_at + make_interval(secs => $2)) < now()",
    )
    .bind(message_ids)
    .bind(max_age.map(|age| age.as_secs_f64()))
    .fetch_one(pool)
    .await
    .map_err(worker_store::classify)?;
    Ok(u64::try_from(count).unwrap_or_default())
}
