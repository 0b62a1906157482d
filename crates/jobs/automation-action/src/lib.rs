//! # job-automation-action: runs one action of one automation for one event
//!
//! A [`ConsumerJob`] on the `automation.action` queue. Its input, an [`ActionCommand`],
//! names an action execution that the trigger consumer wrote; the execution row holds the
//! action and the event as they were when the event matched. The executor runs the action
//! and records the execution's outcome.
//!
//! ## The guard, and when it commits
//!
//! Every command is guarded on its action execution id (processed-message scope
//! [`GUARD_SCOPE`], `automation.action`): one transaction takes the guard's mark, locks the
//! execution row, makes the effect and records the outcome, and commits them together. A
//! duplicate command (a redelivery, or the trigger's deliberately undeduplicated re-emission)
//! finds the mark and is acknowledged as [`Handled::Duplicate`] without doing anything. While
//! the first is still running, a concurrent duplicate waits on the mark's row, then finds it.
//!
//! * **`send_email`**: renders the email from the event's fields ([`render`]), writes the
//!   `outbound_emails` row (id [`worker_messages::email_message_id`] of the execution id) and
//!   an outbox row for the [`EmailSendCommand`] (routing key `email.send`), in the same
//!   transaction as the mark: exactly once. A template that does not render is a permanent
//!   failure.
//! * **`webhook`**: POSTs `{"event": …, "action": …}` ([`webhook`]), with its own timeout,
//!   while the transaction waits; the mark commits only after a 2xx. The call is outside the
//!   database, so this is **at least once**: a crash, a lost connection or a timeout after
//!   the receiver acted but before the commit sends it again on the next try, rather than
//!   never. The `Idempotency-Key` header (the execution id) lets a receiver deduplicate.
//!
//! ## Outcomes
//!
//! | ends | execution row | the command |
//! |---|---|---|
//! | done | `succeeded`, `attempts + 1`, `finished_at` | acked |
//! | transient or throttled | still `pending`; `attempts + 1`, `last_error` | retried in process, then parked in the broker's retry tiers |
//! | permanent | `failed`, `attempts + 1`, `last_error`, `finished_at` | dead-lettered (`rejected`) |
//!
//! A failure's outcome is written after the transaction rolled back, so that the guard's
//! mark is not taken: a dead-lettered command replayed after a fix runs again. When the broker
//! gives up on a command after its last retry tier, its execution stays `pending` with the
//! last error; the dead letter says `gave-up`.
//!
//! ## What the host wires
//!
//! ```text
//! let executor = ActionExecutor::new(
//!     pool.clone(),
//!     topology.commands_exchange.clone(),
//!     settings.workers.timeouts.webhook,      // each webhook call's own timeout
//! )?;
//! let runner = ConsumerRunner::new(executor, automation_action_queue, consumer_settings);
//! ```
//!
//! The unit's timeout (`workers.timeouts.automation`) should exceed the webhook timeout.

pub mod render;
pub mod webhook;

use std::time::Duration;

use serde_json::{Value, json};
use sqlx::{PgConnection, PgPool};
use uuid::Uuid;
use worker_core::{ConsumerJob, Failure, Handled, WorkContext};
use worker_messages::{
    ActionCommand, AutomationAction, DomainEvent, EMAIL_SEND, EmailSendCommand, SendEmailAction,
    email_message_id,
};
use worker_store::outbox::{self, OutboxMessage};
use worker_store::{ProcessedMessages, classify};

pub use render::{RenderedEmail, render_email};
pub use webhook::WebhookClient;

/// The job's name, in logs, metrics and the attempt log.
pub const JOB_NAME: &str = "automation-action";

/// The processed-message scope of the guard.
pub const GUARD_SCOPE: &str = "automation.action";

/// The domain of the Message-ID headers of the emails it queues (`<email id>@worker-host`).
pub const MESSAGE_ID_DOMAIN: &str = "worker-host";

/// The longest `last_error` kept on an execution row, in bytes.
pub const LAST_ERROR_MAX: usize = 2048;

/// Why an executor could not be built.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    #[error("building the webhook HTTP client: {0}")]
    Http(#[from] reqwest::Error),
}

/// The automation action executor. Input: an [`ActionCommand`].
#[derive(Debug, Clone)]
pub struct ActionExecutor {
    pool: PgPool,
    guard: ProcessedMessages,
    webhook: WebhookClient,
    commands_exchange: String,
    email_routing_key: String,
}

/// The execution row, locked.
struct Execution {
    event_id: Uuid,
    action: AutomationAction,
    event: DomainEvent,
    status: String,
}

impl ActionExecutor {
    /// An executor that queues email-send commands to `commands_exchange` with the routing
    /// key `email.send` (see [`Self::with_email_routing_key`]) and gives each webhook call
    /// `webhook_timeout` (the host passes `workers.timeouts.webhook`).
    pub fn new(
        pool: PgPool,
        commands_exchange: impl Into<String>,
        webhook_timeout: Duration,
    ) -> Result<Self, BuildError> {
        Ok(Self {
            pool,
            guard: ProcessedMessages::new(),
            webhook: WebhookClient::new(webhook_timeout)?,
            commands_exchange: commands_exchange.into(),
            email_routing_key: EMAIL_SEND.to_string(),
        })
    }

    /// Routes the email-send commands with `routing_key` instead (when the email queue was
    /// renamed in the settings).
    #[must_use]
    pub fn with_email_routing_key(mut self, routing_key: impl Into<String>) -> Self {
        self.email_routing_key = routing_key.into();
        self
    }

    /// Marks, runs, records in one transaction, which commits only on success (see the
    /// crate docs) and is rolled back before a failure is recorded.
    async fn run(&self, command: &ActionCommand) -> Result<Handled, Failure> {
        let mut tx = self.pool.begin().await.map_err(classify)?;
        match self.apply(&mut tx, command).await {
            Ok(handled) => {
                tx.commit().await.map_err(classify)?;
                Ok(handled)
            }
            Err(failure) => {
                if let Err(err) = tx.rollback().await {
                    tracing::debug!(error = %err, "rollback failed; the connection is dropped");
                }
                Err(failure)
            }
        }
    }

    async fn apply(
        &self,
        tx: &mut PgConnection,
        command: &ActionCommand,
    ) -> Result<Handled, Failure> {
        let id = command.action_execution_id;
        if !self.guard.mark(tx, GUARD_SCOPE, &id.to_string()).await? {
            tracing::info!("duplicate command: the guard has seen this action execution");
            return Ok(Handled::Duplicate);
        }
        let execution = load(tx, command).await?;
        if execution.status == "succeeded" {
            // The mark was swept by retention but the row remembers: still a duplicate.
            tracing::info!("duplicate command: the action execution already succeeded");
            return Ok(Handled::Duplicate);
        }
        match &execution.action {
            AutomationAction::SendEmail(action) => {
                self.queue_email(tx, id, &execution, action).await?;
            }
            AutomationAction::Webhook(action) => {
                let body = json!({ "event": execution.event, "action": execution.action });
                self.webhook.call(action, &body, &id.to_string()).await?;
            }
        }
        sqlx::query(
            "UPDATE action_executions SET status = 'succeeded', attempts = attempts + 1, \
                 last_error = NULL, updated_at = now(), finished_at = now() \
             WHERE id = $1",
        )
        .bind(id)
        .execute(&mut *tx)
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
        action: &SendEmailAction,
    ) -> Result<(), Failure> {
        let email = render_email(action, &execution.event.data)?;
        let email_id = email_message_id(execution_id);
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
        let command = EmailSendCommand {
            email_message_id: email_id,
        };
        let message = OutboxMessage::json(email_id.to_string(), EMAIL_SEND, &command)
            .map_err(|err| Failure::permanent("serialize", err))?
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

    /// Adds the failed try to the execution row: `failed` for a permanent failure, still
    /// `pending` otherwise. Best effort: the failure itself is what the caller returns.
    async fn record_failure(&self, id: Uuid, failure: &Failure) {
        let permanent = failure.is_permanent();
        let error = truncate(&failure.to_string(), LAST_ERROR_MAX).to_string();
        let recorded = sqlx::query(
            "UPDATE action_executions SET attempts = attempts + 1, last_error = $2, \
                 status = CASE WHEN $3 THEN 'failed' ELSE status END, \
                 finished_at = CASE WHEN $3 THEN now() ELSE finished_at END, \
                 updated_at = now() \
             WHERE id = $1 AND status <> 'succeeded'",
        )
        .bind(id)
        .bind(&error)
        .bind(permanent)
        .execute(&self.pool)
        .await;
        if let Err(err) = recorded {
            tracing::warn!(
                error = %worker_core::error_chain(&err),
                "could not record the failed try on the action execution"
            );
        }
    }
}

/// Locks and decodes the execution row; checks it is the one the command names.
async fn load(tx: &mut PgConnection, command: &ActionCommand) -> Result<Execution, Failure> {
    let row: Option<(Uuid, Uuid, i32, Value, Value, String)> = sqlx::query_as(
        "SELECT automation_id, event_id, action_index, action, event, status \
         FROM action_executions WHERE id = $1 FOR UPDATE",
    )
    .bind(command.action_execution_id)
    .fetch_optional(&mut *tx)
    .await
    .map_err(classify)?;
    let Some((automation_id, event_id, action_index, action, event, status)) = row else {
        return Err(Failure::permanent(
            "unknown-execution",
            format!(
                "no action execution {} (its automation may have been deleted)",
                command.action_execution_id
            ),
        ));
    };
    if (automation_id, event_id, i64::from(action_index))
        != (
            command.automation_id,
            command.event_id,
            i64::from(command.action_index),
        )
    {
        return Err(Failure::permanent(
            "mismatched-command",
            format!(
                "the command names automation {} event {} action {}, the execution row \
                 automation {automation_id} event {event_id} action {action_index}",
                command.automation_id, command.event_id, command.action_index
            ),
        ));
    }
    let action = serde_json::from_value(action)
        .map_err(|err| Failure::permanent("bad-action", format!("the stored action: {err}")))?;
    let event = serde_json::from_value(event)
        .map_err(|err| Failure::permanent("bad-event", format!("the stored event: {err}")))?;
    Ok(Execution {
        event_id,
        action,
        event,
        status,
    })
}

fn truncate(text: &str, max: usize) -> &str {
    if text.len() <= max {
        return text;
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

impl ConsumerJob for ActionExecutor {
    type Input = ActionCommand;

    fn name(&self) -> &str {
        JOB_NAME
    }

    #[tracing::instrument(
        name = "automation_action",
        skip_all,
        fields(
            execution_id = %command.action_execution_id,
            automation_id = %command.automation_id,
            event_id = %command.event_id,
            action_index = command.action_index,
            attempt = ctx.attempt,
        )
    )]
    async fn handle(&self, ctx: &WorkContext, command: &ActionCommand) -> Result<Handled, Failure> {
        match self.run(command).await {
            Ok(handled) => Ok(handled),
            Err(failure) => {
                self.record_failure(command.action_execution_id, &failure)
                    .await;
                Err(failure)
            }
        }
    }
}
