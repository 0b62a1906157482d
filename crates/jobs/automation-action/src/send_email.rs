//! The `send_email` action, in the command's one transaction: the mail rendered from the
//! event ([`crate::render`]), then one statement that writes the guard's mark with its
//! effect: the execution `skipped` when the mail must not be answered ([`crate::loops`]) or is
//! past a limit ([`crate::reply_limit`]); else the `outbound_emails` row, its recipients, its
//! email-send command in the outbox, and the execution `succeeded`. The effect's parts are
//! written only if the mark is new. Committed together by the caller: exactly once.

use std::sync::LazyLock;

use sqlx::PgConnection;
use uuid::Uuid;
use worker_core::{Failure, Handled, truncate};
use worker_messages::{
    EMAIL_SEND, EmailSendCommand, Message, SCHEMA_VERSION_HEADER, SendEmailAction,
    outbound_email_id,
};
use worker_store::outbox::{self, OutboxMessage};
use worker_store::{ProcessedMessages, Tx, classify};

/// The mail's statement: the guard's mark (`$1`, `$2`) and, if it is new, the
/// `outbound_emails` row (`$3`..`$13`, and `$25`: the action's `max_age` in seconds, which
/// makes its `expires_at`; null: none, the job's setting applies), its recipients (`$14`, `$15`), its command in the
/// outbox (`$16`..`$23`) and the execution (`$24`) `succeeded`. Returns whether the mark was
/// new.
static QUEUE_EMAIL_SQL: LazyLock<String> = LazyLock::new(|| {
    format!(
        "WITH mark AS ({mark}), \
         email AS ( \
             INSERT INTO outbound_emails (id, action_execution_id, message_id, from_address, \
                 to_addresses, cc_addresses, subject, text_body, html_body, in_reply_to, \
                 reference_ids, expires_at) \
             SELECT $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, \
                 now() + make_interval(secs => $25) WHERE EXISTS (SELECT FROM mark) \
             ON CONFLICT (id) DO NOTHING), \
         recipients AS ( \
             INSERT INTO outbound_email_recipients (outbound_email_id, automation_id, address, created_at) \
             SELECT $3, $14, unnest($15::text[]), now() WHERE EXISTS (SELECT FROM mark) \
             ON CONFLICT DO NOTHING), \
         queued AS ( \
             {outbox} SELECT $16, $17, $18, $19, $20, $21, $22, $23 WHERE EXISTS (SELECT FROM mark)), \
         done AS ( \
             UPDATE action_executions SET status = 'succeeded', attempts = attempts + 1, \
                 last_error = NULL, updated_at = now(), finished_at = now() \
             WHERE id = $24 AND EXISTS (SELECT FROM mark)) \
         SELECT EXISTS (SELECT FROM mark)",
        mark = ProcessedMessages::mark_sql("$1", "$2"),
        outbox = outbox::INSERT_INTO,
    )
});

/// A skip's statement: the guard's mark (`$1`, `$2`) and, if it is new, the execution (`$3`)
/// `skipped` with its kind (`$4`) and reason (`$5`). Returns whether the mark was new.
static SKIP_SQL: LazyLock<String> = LazyLock::new(|| {
    format!(
        "WITH mark AS ({mark}), \
         done AS ( \
             UPDATE action_executions SET status = 'skipped', skip_kind = $4, skip_reason = $5, \
                 attempts = attempts + 1, last_error = NULL, updated_at = now(), \
                 finished_at = now() \
             WHERE id = $3 AND EXISTS (SELECT FROM mark)) \
         SELECT EXISTS (SELECT FROM mark)",
        mark = ProcessedMessages::mark_sql("$1", "$2"),
    )
});

use crate::execution::Execution;
use crate::render::{RenderedEmail, render_email};
use crate::reply_limit::{self, DEFAULT_RECIPIENTS_MAX, ReplyLimit};
use crate::skips::SkipKind;
use crate::{GUARD_SCOPE, LAST_ERROR_MAX, MESSAGE_ID_DOMAIN, loops};

/// What one executor's mails go by: where their commands are queued, whose mail is not
/// answered, and the limits.
#[derive(Debug, Clone)]
pub(crate) struct SendEmail {
    pub(crate) commands_exchange: String,
    pub(crate) email_routing_key: String,
    /// The host's own sender addresses, bare and lower-case: mail from them is not answered.
    pub(crate) own_addresses: Vec<String>,
    pub(crate) reply_limit: ReplyLimit,
    pub(crate) recipients_max: u32,
}

impl SendEmail {
    /// Where the commands go, with no own addresses and the default limits.
    pub(crate) fn new(commands_exchange: String) -> Self {
        Self {
            commands_exchange,
            email_routing_key: EMAIL_SEND.to_string(),
            own_addresses: Vec::new(),
            reply_limit: ReplyLimit::default(),
            recipients_max: DEFAULT_RECIPIENTS_MAX,
        }
    }

    /// Runs the action of the locked `execution` (`id`) inside `tx`; a duplicate when the
    /// guard's mark is there already.
    pub(crate) async fn run(
        &self,
        tx: &mut Tx,
        id: Uuid,
        execution: &Execution,
        action: &SendEmailAction,
    ) -> Result<Handled, Failure> {
        if let Some(reason) =
            loops::reason_not_to_answer(&execution.event.data, &self.own_addresses)
        {
            return skip(tx, id, SkipKind::LoopGuard, &reason).await;
        }
        let mut email = render_email(action, &execution.event.data)?;
        let max_age = action.max_age;
        // The action's own sender is the host's too, for this mail.
        let sender = email.from.as_deref().map(loops::bare_address);
        if let Some(reason) =
            sender.and_then(|sender| loops::reason_not_to_answer(&execution.event.data, &[sender]))
        {
            return skip(tx, id, SkipKind::LoopGuard, &reason).await;
        }
        // Before the reply limit, which takes a lock per recipient.
        if let Some(reason) = reply_limit::over_recipients_max(&email, self.recipients_max) {
            return skip(tx, id, SkipKind::RecipientCap, &reason).await;
        }
        if let Some(reason) = self
            .reply_limit
            .apply(tx, execution.automation_id, &mut email)
            .await?
        {
            return skip(tx, id, SkipKind::ReplyLimit, &reason).await;
        }
        if !self.queue_email(tx, id, execution, &email, max_age).await? {
            return Ok(duplicate());
        }
        // Debug, not info: the mail's "email sent" is its one line at info.
        tracing::debug!(action = execution.action.kind(), "action done");
        Ok(Handled::Done)
    }

    /// The mail's statement ([`QUEUE_EMAIL_SQL`]); `false` when the guard's mark was there
    /// already and nothing was written.
    async fn queue_email(
        &self,
        tx: &mut PgConnection,
        execution_id: Uuid,
        execution: &Execution,
        email: &RenderedEmail,
        max_age: Option<std::time::Duration>,
    ) -> Result<bool, Failure> {
        let email_id = outbound_email_id(execution_id);
        let command = EmailSendCommand {
            outbound_email_id: email_id,
        };
        let message = OutboxMessage::json(email_id.to_string(), EMAIL_SEND, &command)
            .map_err(|err| Failure::permanent("serialize", err))?
            .with_header(SCHEMA_VERSION_HEADER, EmailSendCommand::VERSION)
            .with_correlation_id(execution.event_id.to_string());
        let new: bool = sqlx::query_scalar(QUEUE_EMAIL_SQL.as_str())
            .bind(GUARD_SCOPE)
            .bind(execution_id.to_string())
            .bind(email_id)
            .bind(execution_id)
            .bind(format!("{email_id}@{MESSAGE_ID_DOMAIN}"))
            .bind(&email.from)
            .bind(&email.to)
            .bind(&email.cc)
            .bind(&email.subject)
            .bind(&email.text)
            .bind(&email.html)
            .bind(&email.in_reply_to)
            .bind(&email.references)
            .bind(execution.automation_id)
            .bind(reply_limit::counted_recipients(email))
            .bind(&message.message_id)
            .bind(&message.message_type)
            .bind(&message.content_type)
            .bind(&message.correlation_id)
            .bind(&self.commands_exchange)
            .bind(&self.email_routing_key)
            .bind(message.stored_headers())
            .bind(&message.body)
            .bind(execution_id)
            .bind(max_age.map(|age| age.as_secs_f64()))
            .fetch_one(&mut *tx)
            .await
            .map_err(classify)?;
        if new {
            tracing::debug!(email_id = %email_id, to = ?email.to, "email queued");
        }
        Ok(new)
    }
}

/// A command whose guard's mark was there already.
fn duplicate() -> Handled {
    tracing::info!("duplicate command: the guard has seen this action execution");
    Handled::Duplicate
}

/// Records the locked execution `skipped` with its `kind` and `reason`, with the guard's
/// mark, in one statement ([`SKIP_SQL`]): done, without an effect.
async fn skip(
    tx: &mut PgConnection,
    id: Uuid,
    kind: SkipKind,
    reason: &str,
) -> Result<Handled, Failure> {
    let new: bool = sqlx::query_scalar(SKIP_SQL.as_str())
        .bind(GUARD_SCOPE)
        .bind(id.to_string())
        .bind(id)
        .bind(kind.as_str())
        .bind(truncate(reason, LAST_ERROR_MAX))
        .fetch_one(&mut *tx)
        .await
        .map_err(classify)?;
    if !new {
        return Ok(duplicate());
    }
    tracing::warn!(%reason, skip = kind.as_str(), "send_email skipped: the mail is not answered");
    Ok(Handled::Skipped(kind.as_str()))
}
