//! The reply limit: at most `max` mails from one automation to one address within `window`,
//! so that a sender that forges its address cannot make an automation a mail cannon aimed at
//! someone else.

use std::time::Duration;

use sqlx::PgConnection;
use uuid::Uuid;
use worker_core::Failure;
use worker_store::classify;

use crate::loops;
use crate::render::RenderedEmail;

/// The most distinct recipients (`to` and `cc`) one mail may have by default.
pub const DEFAULT_RECIPIENTS_MAX: u32 = 50;

/// The default reply limit: one automation sends one address at most this many mails ...
pub const DEFAULT_REPLY_LIMIT: u32 = 10;
/// ... within this window.
pub const DEFAULT_REPLY_WINDOW: Duration = Duration::from_secs(3600);

/// The counts of mails an automation (`$1`) queued to each of the addresses `$3` (bare and
/// lower-case) within the last `$2` seconds, one row per address that has any: ranges of
/// `outbound_email_recipients_count`, so that it reads those addresses' mails only, however
/// many the automation sends. Public so that a test can read its plan.
pub const SENT_WITHIN: &str = "SELECT address, count(*) FROM outbound_email_recipients \
     WHERE automation_id = $1 AND address = ANY($3) \
       AND created_at > now() - make_interval(secs => $2) \
     GROUP BY address";

/// Takes the reply limit's lock of each address (`$1`, sorted, so that two mails to the same
/// addresses take them in the same order) until the transaction ends: every mail to an
/// address is counted after the last one's transaction committed.
const LOCK_ADDRESSES: &str = "SELECT count(pg_advisory_xact_lock(hashtextextended(a, 0))) \
     FROM (SELECT unnest($1::text[]) AS a ORDER BY 1) AS sorted";

/// At most `max` mails from one automation to one address within `window`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReplyLimit {
    pub max: u32,
    pub window: Duration,
}

impl Default for ReplyLimit {
    fn default() -> Self {
        Self {
            max: DEFAULT_REPLY_LIMIT,
            window: DEFAULT_REPLY_WINDOW,
        }
    }
}

impl ReplyLimit {
    /// Drops from `email` the recipients this automation has sent [`ReplyLimit::max`] mails
    /// to within the window; when no `to` is left, the reason to skip the execution. Each
    /// recipient's count is taken under a transaction-scoped advisory lock of (automation,
    /// address), so that parallel executions cannot all pass the same last slot.
    pub async fn apply(
        &self,
        tx: &mut PgConnection,
        automation_id: Uuid,
        email: &mut RenderedEmail,
    ) -> Result<Option<String>, Failure> {
        let addresses = recipients(email);
        let keys: Vec<String> = addresses
            .iter()
            .map(|address| format!("reply-limit {automation_id} {address}"))
            .collect();
        // The locks first, in a statement of their own: a count in the same statement would
        // read a snapshot taken before a lock it waited for.
        sqlx::query(LOCK_ADDRESSES)
            .bind(&keys)
            .execute(&mut *tx)
            .await
            .map_err(classify)?;
        let over: Vec<(String, i64)> = sent_to(tx, automation_id, &addresses, self.window)
            .await?
            .into_iter()
            .filter(|(_, sent)| *sent >= i64::from(self.max))
            .collect();
        if over.is_empty() {
            return Ok(None);
        }
        let listed: Vec<String> = over
            .iter()
            .map(|(address, sent)| format!("{address} ({sent})"))
            .collect();
        let reason = format!(
            "the reply limit: within {} this automation already mailed {}; at most {} mails \
             per address",
            humantime::format_duration(self.window),
            listed.join(", "),
            self.max
        );
        let kept = |list: &mut Vec<String>| {
            list.retain(|a| !over.iter().any(|(o, _)| *o == loops::bare_address(a)));
        };
        kept(&mut email.to);
        kept(&mut email.cc);
        if email.to.is_empty() {
            return Ok(Some(reason));
        }
        tracing::warn!(%reason, "recipients over the reply limit are left out of this mail");
        Ok(None)
    }
}

/// The reason to skip a mail with more than `max` distinct recipients (to and cc). The reply
/// limit counts per address, so without a cap one mail whose template copies the addresses
/// of the mail it answers (chosen by whoever wrote it) reaches any number of them.
pub fn over_recipients_max(email: &RenderedEmail, max: u32) -> Option<String> {
    let count = recipients(email).len();
    (count > usize::try_from(max).unwrap_or(usize::MAX)).then(|| {
        format!(
            "the recipient cap: the mail has {count} recipients (to and cc); at most {max} per mail"
        )
    })
}

/// The mail's distinct recipients (to and cc), bare and lower-case, sorted: one lock order
/// for every transaction, so that no two of them deadlock.
fn recipients(email: &RenderedEmail) -> Vec<String> {
    let mut recipients: Vec<String> = email
        .to
        .iter()
        .chain(&email.cc)
        .map(|a| loops::bare_address(a))
        .collect();
    recipients.sort();
    recipients.dedup();
    recipients
}

/// The recipients of `email` as the reply limit counts them, bare, lower-case and once
/// each: what the mail's statement records for [`SENT_WITHIN`] to count (and an operator's
/// edited copy too).
pub fn counted_recipients(email: &RenderedEmail) -> Vec<String> {
    recipients(email)
}

/// The copy's recipient rows, as the automation's own mails have them (the reply limit counts
/// them, a search by recipient finds them): `$2`, the addresses as the reply limit counts
/// them, for the automation the original answered for. That is the original's execution's, or,
/// for a copy of a copy (which has no execution), the original's own recipient rows'.
const EDITED_COPY: &str = "INSERT INTO outbound_email_recipients \
         (outbound_email_id, automation_id, address, created_at) \
     SELECT $1, a.automation_id, unnest($2::text[]), now() \
     FROM (SELECT coalesce( \
               (SELECT x.automation_id FROM outbound_emails e \
                JOIN action_executions x ON x.id = e.action_execution_id WHERE e.id = $3), \
               (SELECT r.automation_id FROM outbound_email_recipients r \
                WHERE r.outbound_email_id = $3 LIMIT 1)) AS automation_id) a \
     WHERE a.automation_id IS NOT NULL \
     ON CONFLICT DO NOTHING";

/// In the caller's transaction, once an operator's edited copy `copy` of mail `original` is
/// written: its recipient rows (`recipients`, as [`counted_recipients`] gives them), so that
/// the reply limit counts the copy and a search by recipient finds it.
pub async fn record_edited_copy(
    conn: &mut PgConnection,
    copy: Uuid,
    original: Uuid,
    recipients: &[String],
) -> Result<(), Failure> {
    sqlx::query(EDITED_COPY)
        .bind(copy)
        .bind(recipients)
        .bind(original)
        .execute(conn)
        .await
        .map_err(classify)?;
    Ok(())
}

/// How many mails `automation_id` queued to each of `addresses` within `window`
/// ([`SENT_WITHIN`]): the addresses with any, in one statement.
pub async fn sent_to(
    conn: &mut PgConnection,
    automation_id: Uuid,
    addresses: &[String],
    window: Duration,
) -> Result<Vec<(String, i64)>, Failure> {
    sqlx::query_as(SENT_WITHIN)
        .bind(automation_id)
        .bind(window.as_secs_f64())
        .bind(addresses)
        .fetch_all(conn)
        .await
        .map_err(classify)
}

/// How many mails `automation_id` queued to `address` within `window` ([`SENT_WITHIN`]).
pub async fn sent_within(
    conn: &mut PgConnection,
    automation_id: Uuid,
    address: &str,
    window: Duration,
) -> Result<i64, Failure> {
    let counts = sent_to(conn, automation_id, &[address.to_string()], window).await?;
    Ok(counts.first().map_or(0, |(_, sent)| *sent))
}
