//! The `send_email` action, in the command's one transaction: the guard's mark, the mail
//! rendered from the event ([`crate::render`]), or the execution `skipped` when the mail must
//! not be answered ([`crate::loops`]) or is past a limit ([`crate::reply_limit`]); else the
//! `outbound_emails` row and its email-send command in the outbox, and the execution
//! `succeeded`. Committed together by the caller: exactly once.

use sqlx::PgConnection;
use uuid::Uuid;
use worker_core::{Failure, Handled, ProcessedGuard as _, truncate};
use worker_messages::{
    EMAIL_SEND, EmailSendCommand, Message, SCHEMA_VERSION_HEADER, SendEmailAction,
    outbound_email_id,
};
use worker_store::outbox::{self, OutboxMessage};
use worker_store::{ProcessedMessages, Tx, classify};

use crate::execution::Execution;
use crate::render::{RenderedEmail, render_email};
use crate::reply_limit::{self, DEFAULT_RECIPIENTS_MAX, ReplyLimit};
use crate::skips::SkipKind;
use crate::{GUARD_SCOPE, LAST_ERROR_MAX, MESSAGE_ID_DOMAIN, loops};

/// What one executor's mails go by: where their commands are queued, whose mail is not
/// answered, and the limits.
#[derive(Debug, Clone)]
pub(crate) struct SendEmail {
    pub(crate) guard: ProcessedMessages,
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
            guard: ProcessedMessages::new(),
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
        if !self
            .guard
            .try_mark_processed(tx, GUARD_SCOPE, &id.to_string())
            .await?
        {
            tracing::info!("duplicate command: the guard has seen this action execution");
            return Ok(Handled::Duplicate);
        }
        if let Some(reason) =
            loops::reason_not_to_answer(&execution.event.data, &self.own_addresses)
        {
            return skip(tx, id, SkipKind::LoopGuard, &reason).await;
        }
        let mut email = render_email(action, &execution.event.data)?;
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
        self.queue_email(tx, id, execution, &email).await?;
        sqlx::query(
            "UPDATE action_executions SET status = 'succeeded', attempts = attempts + 1, \
                 last_error = NULL, updated_at = now(), finished_at = now() \
             WHERE id = $1",
        )
        .bind(id)
        .execute(&mut **tx)
        .await
        .map_err(classify)?;
        tracing::info!(action = execution.action.kind(), "action done");
        Ok(Handled::Done)
    }

    async fn queue_email(
        &self,
        tx: &mut PgConnection,
        execution_id: Uuid,
        execution: &Execution,
        email: &RenderedEmail,
    ) -> Result<(), Failure> {
        let email_id = outbound_email_id(execution_id);
        sqlx::query(
            "INSERT INTO outbound_emails (id, action_execution_id, message_id, from_address, \
                 to_addresses, cc_addresses, subject, text_body, html_body, in_reply_to, \
                 reference_ids) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11) \
             ON CONFLICT (id) DO NOTHING",
        )
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
        .execute(&mut *tx)
        .await
        .map_err(classify)?;
        reply_limit::record(tx, email_id, execution.automation_id, email).await?;
        let command = EmailSendCommand {
            outbound_email_id: email_id,
        };
        let message = OutboxMessage::json(email_id.to_string(), EMAIL_SEND, &command)
            .map_err(|err| Failure::permanent("serialize", err))?
            .with_header(SCHEMA_VERSION_HEADER, EmailSendCommand::VERSION)
            .with_correlation_id(execution.event_id.to_string());
        outbox::enqueue(
            tx,
            &self.commands_exchange,
            &self.email_routing_key,
            &message,
        )
        .await?;
        tracing::info!(email_id = %email_id, to = ?email.to, "email queued");
        Ok(())
    }
}

/// Records the locked execution `skipped` with its `kind` and `reason`: done, without an
/// effect. The guard's mark is already taken in the same transaction.
async fn skip(
    tx: &mut PgConnection,
    id: Uuid,
    kind: SkipKind,
    reason: &str,
) -> Result<Handled, Failure> {
    tracing::warn!(%reason, skip = kind.as_str(), "send_email skipped: the mail is not answered");
    sqlx::query(
        "UPDATE action_executions SET status = 'skipped', skip_kind = $2, skip_reason = $3, \
             attempts = attempts + 1, last_error = NULL, updated_at = now(), finished_at = now() \
         WHERE id = $1",
    )
    .bind(id)
    .bind(kind.as_str())
    .bind(truncate(reason, LAST_ERROR_MAX))
    .execute(&mut *tx)
    .await
    .map_err(classify)?;
    Ok(Handled::Skipped(kind.as_str()))
}
