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

/// The count of mails an automation (`$1`) queued to an address (`$3`, bare and lower-case)
/// within the last `$2` seconds: a range of `outbound_email_recipients_count`, so that it reads
/// that address's mails only, however many the automation sends. Public so that a test can
/// read its plan.
pub const SENT_WITHIN: &str = "SELECT count(*) FROM outbound_email_recipients \
     WHERE automation_id = $1 AND address = $3 \
       AND created_at > now() - make_interval(secs => $2)";

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
        let mut over = Vec::new();
        for address in recipients(email) {
            sqlx::query("SELECT pg_advisory_xact_lock(hashtextextended($1, 0))")
                .bind(format!("reply-limit {automation_id} {address}"))
                .execute(&mut *tx)
                .await
                .map_err(classify)?;
            let sent = sent_within(tx, automation_id, &address, self.window).await?;
            if sent >= i64::from(self.max) {
                over.push((address, sent));
            }
        }
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

/// Records the recipients of the mail `email_id` that `automation_id` queues, in its
/// transaction, for [`SENT_WITHIN`] to count.
pub async fn record(
    tx: &mut PgConnection,
    email_id: Uuid,
    automation_id: Uuid,
    email: &RenderedEmail,
) -> Result<(), Failure> {
    sqlx::query(
        "INSERT INTO outbound_email_recipients (outbound_email_id, automation_id, address, created_at) \
         SELECT $1, $2, unnest($3::text[]), now() ON CONFLICT DO NOTHING",
    )
    .bind(email_id)
    .bind(automation_id)
    .bind(recipients(email))
    .execute(tx)
    .await
    .map_err(classify)?;
    Ok(())
}

/// How many mails `automation_id` queued to `address` within `window` ([`SENT_WITHIN`]).
pub async fn sent_within(
    conn: &mut PgConnection,
    automation_id: Uuid,
    address: &str,
    window: Duration,
) -> Result<i64, Failure> {
    sqlx::query_scalar(SENT_WITHIN)
        .bind(automation_id)
        .bind(window.as_secs_f64())
        .bind(address)
        .fetch_one(conn)
        .await
        .map_err(classify)
}
