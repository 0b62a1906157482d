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
//! [`GUARD_SCOPE`], `automation.action`). The mark is taken in the transaction that records
//! the success, never before: a duplicate command (a redelivery, or the trigger's deliberately
//! undeduplicated re-emission) that finds the mark, or finds the execution `succeeded` (the
//! mark swept by retention), is acknowledged as [`Handled::Duplicate`] without doing anything.
//!
//! * **`send_email`** touches only the database, so it stays **one transaction**: the guard
//!   is checked, the execution row locked, the email rendered from the event's fields
//!   ([`render`]), the `outbound_emails` row (id [`worker_messages::email_message_id`] of the
//!   execution id) and an outbox row for the [`EmailSendCommand`] (routing key `email.send`)
//!   written, the mark taken and the row set `succeeded`, all committed together: exactly
//!   once. A concurrent duplicate waits on the row's lock, then finds it `succeeded`. A
//!   template that does not render is a permanent failure. Mail that must not be answered
//!   ([`loops`], RFC 3834), and recipients past the reply limit ([`ReplyLimit`]; the
//!   execution when no `to` is left) are not mailed: the execution is recorded `skipped`
//!   with its `skip_reason`, the mark taken, in the same transaction.
//! * **`webhook`** POSTs `{"event": …, "action": {"type": "webhook"}}` ([`webhook::body`]:
//!   never the webhook's own URL or headers) with its own timeout, and
//!   **holds no database connection while it calls**:
//!   1. *claim*, in a short transaction: the guard is checked and the row locked; a `pending`
//!      (or `failed`, replayed) row becomes `running` with `claimed_by` (this executor's
//!      process uuid, [`ActionExecutor::owner`]) and `claimed_at`. A fresh `running` claim
//!      means another try is calling right now: this one **backs off** with a transient
//!      failure and leaves the row alone. A claim older than the stale limit
//!      ([`ActionExecutor::with_stale_claim_after`]; by default the webhook timeout, the
//!      record budget and [`STALE_CLAIM_MARGIN`]) was left by a process that died: it is
//!      taken over. So is a claim of this very process that no try in it holds any more
//!      (its try was cancelled, or could not record its failure).
//!   2. *call*, with no connection held: one slow receiver cannot starve the pool.
//!   3. *record*, in a second short transaction: after a 2xx, the mark and `succeeded`;
//!      after a failure, `failed` (permanent) or back to `pending` (transient, throttled),
//!      only while the claim is still this try's.
//!
//!   Recording a success is retried on any database error for [`DEFAULT_RECORD_BUDGET`]
//!   ([`ActionExecutor::with_record_budget`]): a receiver that acted is never recorded as
//!   failed. Should the database stay away longer, the try ends as an unknown outcome
//!   ([`Failure::unknown`]: parked, not retried in process) and the row stays `running` until
//!   a later delivery takes the claim over and calls again.
//!
//!   The call may not reach inside the installation (loopback, private ranges, link-local
//!   metadata addresses, …) unless [`ActionExecutor::with_webhook_allow`] names the place:
//!   see [`address`]. A refused call is a permanent failure (`webhook-refused`), with nothing
//!   sent.
//!
//!   The call is outside the database, so a webhook is **at least once**: a crash, a
//!   cancelled try or a database outage longer than the record budget, after the receiver
//!   acted but before the success was recorded, calls it again on a later try, rather than
//!   never. The `Idempotency-Key` header (the execution id) lets a receiver deduplicate.
//!
//! ## Outcomes
//!
//! | ends | execution row | the command |
//! |---|---|---|
//! | done | `succeeded`, `attempts + 1`, `finished_at`; the guard's mark | acked |
//! | skipped (a `send_email` not to answer) | `skipped`, `skip_reason`, `finished_at`; the guard's mark | acked |
//! | duplicate (the mark, or a `succeeded` row) | unchanged | acked |
//! | backed off: a fresh `running` claim of another try | unchanged | retried in process, then parked |
//! | transient or throttled | back to (or still) `pending`; `attempts + 1`, `last_error` | retried in process, then parked in the broker's retry tiers |
//! | permanent | `failed`, `attempts + 1`, `last_error`, `finished_at` | dead-lettered (`rejected`) |
//! | a 2xx whose success could not be recorded within the budget | still `running` | parked as an unknown outcome |
//!
//! A failure is recorded without the guard's mark: a dead-lettered command replayed after a
//! fix runs again. When the broker gives up on a command after its last retry tier, its
//! execution stays `pending` with the last error; the dead letter says `gave-up`. Database
//! errors are classified once, by [`worker_store::classify_sqlx`].
//!
//! ## How the host runs it
//!
//! From its one line in the host's job list (`crates/host/src/jobs.rs`), built from its
//! settings section; ARCHITECTURE.md ("Adding a job") walks through that wiring.
//!
//! The unit's `timeout` should exceed `webhook_timeout` plus the record budget, so that the
//! unit is not cancelled while it records a success.

pub mod address;
pub mod loops;
pub mod render;
pub mod reply_limit;
pub mod settings;
pub mod webhook;

use std::collections::HashSet;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde_json::Value;
use sqlx::{PgConnection, PgPool};
use uuid::Uuid;
use worker_core::truncate;
use worker_core::{ConsumerJob, Failure, Handled, RetryPolicy, WorkContext};
use worker_messages::{
    ActionCommand, AutomationAction, DomainEvent, EMAIL_SEND, EmailSendCommand, Message,
    SCHEMA_VERSION_HEADER, WebhookAction, email_message_id,
};
use worker_store::outbox::{self, OutboxMessage};
use worker_store::{ProcessedMessages, classify};

pub use address::WebhookAllow;
pub use render::{RenderedEmail, render_email};
pub use reply_limit::{
    DEFAULT_RECIPIENTS_MAX, DEFAULT_REPLY_LIMIT, DEFAULT_REPLY_WINDOW, ReplyLimit,
};
pub use settings::{AutoReplySettings, AutomationActionSettings};
pub use webhook::WebhookClient;

/// The job's name, in logs, metrics and the attempt log.
pub const JOB_NAME: &str = "automation-action";

/// What the host needs to know of this job (its name, kind and lease).
pub const JOB: worker_core::JobSpec = worker_core::catalog::JobSpec::consumer(JOB_NAME);

/// The processed-message scope of the guard.
pub const GUARD_SCOPE: &str = "automation.action";

/// The domain of the Message-ID headers of the emails it queues (`<email id>@worker-host`).
pub const MESSAGE_ID_DOMAIN: &str = "worker-host";

/// The longest `last_error` kept on an execution row, in bytes.
pub const LAST_ERROR_MAX: usize = 2048;

/// How long recording a webhook's success is retried on database errors.
pub const DEFAULT_RECORD_BUDGET: Duration = Duration::from_secs(10);

/// Added to the webhook timeout and the record budget to make the stale limit of a claim.
pub const STALE_CLAIM_MARGIN: Duration = Duration::from_secs(30);

/// Why an executor could not be built.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    #[error("building the webhook HTTP client: {0}")]
    Http(#[from] reqwest::Error),
    /// An entry of `webhook_allow` that does not read (validation names it before this).
    #[error("webhook_allow: {0}")]
    WebhookAllow(String),
}

/// The automation action executor. Input: an [`ActionCommand`].
#[derive(Debug, Clone)]
pub struct ActionExecutor {
    pool: PgPool,
    guard: ProcessedMessages,
    webhook: WebhookClient,
    commands_exchange: String,
    email_routing_key: String,
    /// This process's claims carry it (`claimed_by`); drawn once per executor, shared by
    /// its clones.
    owner: Uuid,
    /// The executions a webhook try of this process has claimed and not yet recorded.
    in_flight: Arc<Mutex<HashSet<Uuid>>>,
    stale_after: Duration,
    record_budget: Duration,
    record_backoff: RetryPolicy,
    /// The host's own sender addresses, bare and lower-case: mail from them is not answered.
    own_addresses: Vec<String>,
    reply_limit: ReplyLimit,
    recipients_max: u32,
}

/// The execution row, locked.
struct Execution {
    automation_id: Uuid,
    event_id: Uuid,
    action: AutomationAction,
    event: DomainEvent,
    status: String,
    claimed_by: Option<Uuid>,
    claimed_at: Option<DateTime<Utc>>,
    /// Whether its claim, if any, is older than the stale limit.
    stale: bool,
}

/// How the first transaction ended.
enum Started {
    /// Nothing more to do: the email was queued, or it was a duplicate.
    Finished(Handled),
    /// A webhook execution claimed by this try: call, then record.
    Claimed(Claim),
}

/// Why the first transaction did not go on.
enum Refused {
    /// Another try holds a fresh claim: leave its row alone and try later.
    BackOff(Failure),
    /// A failure of this try, recorded on the row (unless it is `running` or `succeeded`).
    Failed(Failure),
}

impl From<Failure> for Refused {
    fn from(failure: Failure) -> Self {
        Self::Failed(failure)
    }
}

/// A webhook execution this try claimed, with what the call needs.
struct Claim {
    id: Uuid,
    claimed_at: DateTime<Utc>,
    action: WebhookAction,
    body: Value,
    _slot: InFlight,
}

/// This process's hold on one execution, from its claim until its outcome is recorded:
/// a second try in this process backs off while it lives, and may take the claim over once
/// it is dropped.
struct InFlight {
    id: Uuid,
    set: Arc<Mutex<HashSet<Uuid>>>,
}

impl InFlight {
    fn take(set: &Arc<Mutex<HashSet<Uuid>>>, id: Uuid) -> Option<Self> {
        // A poisoned set only means a panic elsewhere while it was held; its contents are
        // still right (every change is a single insert or remove).
        let fresh = set
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(id);
        fresh.then(|| Self {
            id,
            set: Arc::clone(set),
        })
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.set
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&self.id);
    }
}

impl ActionExecutor {
    /// An executor that queues email-send commands to `commands_exchange` with the routing
    /// key `email.send` (see [`Self::with_email_routing_key`]) and gives each webhook call
    /// `webhook_timeout` (`jobs.automation_action.webhook_timeout`).
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
            owner: Uuid::new_v4(),
            in_flight: Arc::default(),
            stale_after: webhook_timeout + DEFAULT_RECORD_BUDGET + STALE_CLAIM_MARGIN,
            record_budget: DEFAULT_RECORD_BUDGET,
            record_backoff: RetryPolicy {
                max_tries: u32::MAX,
                base_delay: Duration::from_millis(100),
                factor: 2.0,
                max_delay: Duration::from_secs(2),
                jitter: true,
            },
            own_addresses: Vec::new(),
            reply_limit: ReplyLimit::default(),
            recipients_max: DEFAULT_RECIPIENTS_MAX,
        })
    }

    /// An executor as its section describes it: the webhook timeout, the inside addresses
    /// webhooks may reach, the reply limit and the recipient cap.
    pub fn from_settings(
        pool: PgPool,
        commands_exchange: impl Into<String>,
        settings: &AutomationActionSettings,
    ) -> Result<Self, BuildError> {
        let allow = WebhookAllow::parse(&settings.webhook_allow)
            .map_err(|e| BuildError::WebhookAllow(e.to_string()))?;
        let limit = &settings.auto_replies;
        Ok(
            Self::new(pool, commands_exchange, settings.webhook_timeout)?
                .with_webhook_allow(allow)?
                .with_reply_limit(limit.per_recipient, limit.window)
                .with_recipients_max(limit.recipients_max),
        )
    }

    /// The host's own sender addresses (`Name <a@b>` or `a@b`; the host passes `smtp.from`):
    /// mail from them is never answered, or the host would answer itself.
    #[must_use]
    pub fn with_own_addresses<'a>(mut self, addresses: impl IntoIterator<Item = &'a str>) -> Self {
        self.own_addresses = addresses.into_iter().map(loops::bare_address).collect();
        self
    }

    /// At most `max` mails from one automation to one address within `window` (by default
    /// [`DEFAULT_REPLY_LIMIT`] in [`DEFAULT_REPLY_WINDOW`]).
    #[must_use]
    pub fn with_reply_limit(mut self, max: u32, window: Duration) -> Self {
        self.reply_limit = ReplyLimit { max, window };
        self
    }

    /// At most `max` distinct recipients (`to` and `cc`) in one mail (by default
    /// [`DEFAULT_RECIPIENTS_MAX`]); a mail with more is not sent, its execution `skipped`.
    #[must_use]
    pub fn with_recipients_max(mut self, max: u32) -> Self {
        self.recipients_max = max;
        self
    }

    /// Lets its webhooks reach what `allow` names inside the installation (by default
    /// nothing: see [`address`]); the host passes `jobs.automation_action.webhook_allow`.
    pub fn with_webhook_allow(mut self, allow: WebhookAllow) -> Result<Self, BuildError> {
        self.webhook = WebhookClient::with_allow(self.webhook.timeout(), allow)?;
        Ok(self)
    }

    /// Routes the email-send commands with `routing_key` instead (when the email queue was
    /// renamed in the settings).
    #[must_use]
    pub fn with_email_routing_key(mut self, routing_key: impl Into<String>) -> Self {
        self.email_routing_key = routing_key.into();
        self
    }

    /// Takes over another process's `running` claim only once it is older than `after`
    /// (by default the webhook timeout + [`DEFAULT_RECORD_BUDGET`] + [`STALE_CLAIM_MARGIN`]).
    /// It must exceed the longest a live try can hold a claim, or a slow call is doubled.
    #[must_use]
    pub fn with_stale_claim_after(mut self, after: Duration) -> Self {
        self.stale_after = after;
        self
    }

    /// Retries recording a webhook's success on database errors for `budget` (by default
    /// [`DEFAULT_RECORD_BUDGET`]). The stale limit is not changed.
    #[must_use]
    pub fn with_record_budget(mut self, budget: Duration) -> Self {
        self.record_budget = budget;
        self
    }

    /// The uuid this executor's claims carry in `claimed_by`.
    pub fn owner(&self) -> Uuid {
        self.owner
    }

    /// The first transaction, then for a webhook the call and the second (see the crate
    /// docs). Every failure is recorded on the row before it is returned, except a back-off.
    async fn run(&self, command: &ActionCommand) -> Result<Handled, Failure> {
        let id = command.action_execution_id;
        match self.start(command).await {
            Ok(Started::Finished(handled)) => Ok(handled),
            Ok(Started::Claimed(claim)) => self.call_and_record(claim).await,
            Err(Refused::BackOff(failure)) => Err(failure),
            Err(Refused::Failed(failure)) => {
                self.record_unclaimed_failure(id, &failure).await;
                Err(failure)
            }
        }
    }

    /// The first transaction: commits the queued email or the claim, rolls back otherwise.
    async fn start(&self, command: &ActionCommand) -> Result<Started, Refused> {
        let mut tx = self.pool.begin().await.map_err(classify)?;
        match self.apply(&mut tx, command).await {
            Ok(started) => {
                tx.commit().await.map_err(classify)?;
                Ok(started)
            }
            Err(refused) => {
                if let Err(err) = tx.rollback().await {
                    tracing::debug!(error = %err, "rollback failed; the connection is dropped");
                }
                Err(refused)
            }
        }
    }

    async fn apply(
        &self,
        tx: &mut PgConnection,
        command: &ActionCommand,
    ) -> Result<Started, Refused> {
        let id = command.action_execution_id;
        if self.is_marked(tx, id).await? {
            tracing::info!("duplicate command: the guard has seen this action execution");
            return Ok(Started::Finished(Handled::Duplicate));
        }
        let execution = load(tx, command, self.stale_after).await?;
        if execution.status == "succeeded" || execution.status == "skipped" {
            // The mark was swept by retention but the row remembers: still a duplicate.
            tracing::info!("duplicate command: the action execution is already done");
            return Ok(Started::Finished(Handled::Duplicate));
        }
        match &execution.action {
            AutomationAction::SendEmail(action) => {
                if !self.guard.mark(tx, GUARD_SCOPE, &id.to_string()).await? {
                    tracing::info!("duplicate command: the guard has seen this action execution");
                    return Ok(Started::Finished(Handled::Duplicate));
                }
                if let Some(reason) =
                    loops::reason_not_to_answer(&execution.event.data, &self.own_addresses)
                {
                    skip(tx, id, &reason).await?;
                    return Ok(Started::Finished(Handled::Done));
                }
                let mut email = render_email(action, &execution.event.data)?;
                // The action's own sender is the host's too, for this mail.
                let sender = email.from.as_deref().map(loops::bare_address);
                if let Some(reason) = sender.and_then(|sender| {
                    loops::reason_not_to_answer(&execution.event.data, &[sender])
                }) {
                    skip(tx, id, &reason).await?;
                    return Ok(Started::Finished(Handled::Done));
                }
                // Before the reply limit, which takes a lock per recipient.
                if let Some(reason) = reply_limit::over_recipients_max(&email, self.recipients_max)
                {
                    skip(tx, id, &reason).await?;
                    return Ok(Started::Finished(Handled::Done));
                }
                if let Some(reason) = self
                    .reply_limit
                    .apply(tx, execution.automation_id, &mut email)
                    .await?
                {
                    skip(tx, id, &reason).await?;
                    return Ok(Started::Finished(Handled::Done));
                }
                self.queue_email(tx, id, &execution, &email).await?;
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
                Ok(Started::Finished(Handled::Done))
            }
            AutomationAction::Webhook(action) => {
                let claim = self.claim(tx, id, &execution, action).await?;
                Ok(Started::Claimed(claim))
            }
        }
    }

    /// Whether the guard has a mark for `id`. Only a look: the mark itself is taken with the
    /// success.
    async fn is_marked(&self, tx: &mut PgConnection, id: Uuid) -> Result<bool, Failure> {
        sqlx::query_scalar(
            "SELECT EXISTS (SELECT 1 FROM processed_messages WHERE scope = $1 AND id = $2)",
        )
        .bind(GUARD_SCOPE)
        .bind(id.to_string())
        .fetch_one(&mut *tx)
        .await
        .map_err(classify)
    }

    /// Sets the locked row `running` for this try, unless another try holds a fresh claim.
    async fn claim(
        &self,
        tx: &mut PgConnection,
        id: Uuid,
        execution: &Execution,
        action: &WebhookAction,
    ) -> Result<Claim, Refused> {
        // Taken under the row's lock, so that two tries of this process cannot both see
        // the other's claim as left behind.
        let Some(slot) = InFlight::take(&self.in_flight, id) else {
            return Err(Refused::BackOff(Failure::transient(format!(
                "action execution {id} is running in this process; backing off"
            ))));
        };
        if execution.status == "running" {
            let claimed = format!(
                "claimed by {} at {}",
                execution
                    .claimed_by
                    .map_or_else(|| "nobody".to_string(), |o| o.to_string()),
                execution
                    .claimed_at
                    .map_or_else(|| "an unknown time".to_string(), |t| t.to_rfc3339()),
            );
            if execution.claimed_by == Some(self.owner) {
                tracing::info!(claim = %claimed, "taking over a claim no try of this process holds any more");
            } else if execution.stale {
                tracing::warn!(claim = %claimed, "taking over a stale claim; its process most likely died");
            } else {
                return Err(Refused::BackOff(Failure::transient(format!(
                    "action execution {id} is running elsewhere ({claimed}); backing off"
                ))));
            }
        }
        let claimed_at: DateTime<Utc> = sqlx::query_scalar(
            "UPDATE action_executions SET status = 'running', claimed_by = $2, \
                 claimed_at = now(), updated_at = now() \
             WHERE id = $1 RETURNING claimed_at",
        )
        .bind(id)
        .bind(self.owner)
        .fetch_one(&mut *tx)
        .await
        .map_err(classify)?;
        Ok(Claim {
            id,
            claimed_at,
            action: action.clone(),
            body: webhook::body(&execution.event),
            _slot: slot,
        })
    }

    /// Calls the webhook with no connection held, then records how it ended.
    async fn call_and_record(&self, claim: Claim) -> Result<Handled, Failure> {
        let called = self
            .webhook
            .call(&claim.action, &claim.body, &claim.id.to_string())
            .await;
        match called {
            Ok(()) => self.record_success(&claim).await,
            Err(failure) => {
                self.record_claimed_failure(&claim, &failure).await;
                Err(failure)
            }
        }
    }

    /// The mark and `succeeded`, retried on any database error within the record budget:
    /// the receiver acted, so this try must not end as a failure of the action.
    async fn record_success(&self, claim: &Claim) -> Result<Handled, Failure> {
        let id = claim.id;
        let recorded =
            worker_core::persist(JOB_NAME, self.record_budget, &self.record_backoff, || {
                self.try_record_success(id)
            })
            .await;
        match recorded {
            Ok(()) => {
                tracing::info!(action = "webhook", "action done");
                Ok(Handled::Done)
            }
            Err(err) => {
                tracing::error!(
                    error = %err,
                    "the webhook answered 2xx but its success could not be recorded; \
                     the execution stays running until a later try takes it over"
                );
                Err(Failure::unknown(format!(
                    "the webhook answered 2xx but recording its success failed for {}: {err}",
                    humantime::format_duration(self.record_budget)
                )))
            }
        }
    }

    async fn try_record_success(&self, id: Uuid) -> Result<(), Failure> {
        let mut tx = self.pool.begin().await.map_err(classify)?;
        // Already there only when a takeover of this claim succeeded too: no harm.
        self.guard
            .mark(&mut tx, GUARD_SCOPE, &id.to_string())
            .await?;
        // Whoever holds the claim now, the receiver has acted: a success is a fact.
        sqlx::query(
            "UPDATE action_executions SET status = 'succeeded', attempts = attempts + 1, \
                 last_error = NULL, updated_at = now(), finished_at = now() \
             WHERE id = $1 AND status <> 'succeeded'",
        )
        .bind(id)
        .execute(&mut *tx)
        .await
        .map_err(classify)?;
        tx.commit().await.map_err(classify)
    }

    async fn queue_email(
        &self,
        tx: &mut PgConnection,
        execution_id: Uuid,
        execution: &Execution,
        email: &RenderedEmail,
    ) -> Result<(), Failure> {
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
        reply_limit::record(tx, email_id, execution.automation_id, email).await?;
        let command = EmailSendCommand {
            email_message_id: email_id,
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

    /// Adds a failed try that claimed nothing (a `send_email`, or a webhook before its
    /// claim) to the row: `failed` for a permanent failure, unchanged status otherwise. A
    /// `running` row belongs to another try and a `succeeded` one is done: both are left
    /// alone. Best effort: the failure itself is what the caller returns.
    async fn record_unclaimed_failure(&self, id: Uuid, failure: &Failure) {
        let recorded = sqlx::query(
            "UPDATE action_executions SET attempts = attempts + 1, last_error = $2, \
                 status = CASE WHEN $3 THEN 'failed' ELSE status END, \
                 finished_at = CASE WHEN $3 THEN now() ELSE finished_at END, \
                 updated_at = now() \
             WHERE id = $1 AND status IN ('pending', 'failed')",
        )
        .bind(id)
        .bind(last_error(failure))
        .bind(failure.is_permanent())
        .execute(&self.pool)
        .await;
        if let Err(err) = recorded {
            tracing::warn!(
                error = %worker_core::error_chain(&err),
                "could not record the failed try on the action execution"
            );
        }
    }

    /// Ends this try's claim with its failure: `failed` for a permanent one, back to
    /// `pending` otherwise, only while the claim is still this try's. Best effort: a row left
    /// `running` is taken over by this process's next try, or by any once it is stale.
    async fn record_claimed_failure(&self, claim: &Claim, failure: &Failure) {
        let recorded = sqlx::query(
            "UPDATE action_executions SET attempts = attempts + 1, last_error = $4, \
                 status = CASE WHEN $5 THEN 'failed' ELSE 'pending' END, \
                 finished_at = CASE WHEN $5 THEN now() ELSE finished_at END, \
                 claimed_by = CASE WHEN $5 THEN claimed_by END, \
                 claimed_at = CASE WHEN $5 THEN claimed_at END, \
                 updated_at = now() \
             WHERE id = $1 AND status = 'running' AND claimed_by = $2 AND claimed_at = $3",
        )
        .bind(claim.id)
        .bind(self.owner)
        .bind(claim.claimed_at)
        .bind(last_error(failure))
        .bind(failure.is_permanent())
        .execute(&self.pool)
        .await;
        match recorded {
            Ok(done) if done.rows_affected() == 0 => tracing::warn!(
                "the claim was taken over before this try's failure was recorded; left as is"
            ),
            Ok(_) => {}
            Err(err) => tracing::warn!(
                error = %worker_core::error_chain(&err),
                "could not record the failed try on the action execution"
            ),
        }
    }
}

/// Records the locked execution `skipped` with `reason`: done, without an effect. The guard's
/// mark is already taken in the same transaction.
async fn skip(tx: &mut PgConnection, id: Uuid, reason: &str) -> Result<(), Failure> {
    tracing::warn!(%reason, "send_email skipped: the mail is not answered");
    sqlx::query(
        "UPDATE action_executions SET status = 'skipped', skip_reason = $2, \
             attempts = attempts + 1, last_error = NULL, updated_at = now(), finished_at = now() \
         WHERE id = $1",
    )
    .bind(id)
    .bind(truncate(reason, LAST_ERROR_MAX))
    .execute(&mut *tx)
    .await
    .map_err(classify)?;
    Ok(())
}

fn last_error(failure: &Failure) -> String {
    truncate(&failure.to_string(), LAST_ERROR_MAX).to_string()
}

/// The execution row as stored.
#[derive(sqlx::FromRow)]
struct ExecutionRow {
    automation_id: Uuid,
    event_id: Uuid,
    action_index: i32,
    action: Value,
    event: Value,
    status: String,
    claimed_by: Option<Uuid>,
    claimed_at: Option<DateTime<Utc>>,
    stale: bool,
}

/// Locks and decodes the execution row; checks it is the one the command names.
async fn load(
    tx: &mut PgConnection,
    command: &ActionCommand,
    stale_after: Duration,
) -> Result<Execution, Failure> {
    let row: Option<ExecutionRow> = sqlx::query_as(
        "SELECT automation_id, event_id, action_index, action, event, status, claimed_by, \
                claimed_at, coalesce(claimed_at < now() - make_interval(secs => $2), true) AS stale \
         FROM action_executions WHERE id = $1 FOR UPDATE",
    )
    .bind(command.action_execution_id)
    .bind(stale_after.as_secs_f64())
    .fetch_optional(&mut *tx)
    .await
    .map_err(classify)?;
    let Some(ExecutionRow {
        automation_id,
        event_id,
        action_index,
        action,
        event,
        status,
        claimed_by,
        claimed_at,
        stale,
    }) = row
    else {
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
        automation_id,
        event_id,
        action,
        event,
        status,
        claimed_by,
        claimed_at,
        stale,
    })
}

impl ConsumerJob for ActionExecutor {
    type Input = ActionCommand;

    fn name(&self) -> &str {
        JOB_NAME
    }

    fn reads_version(&self, _message_type: &str) -> u32 {
        ActionCommand::VERSION
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
        self.run(command).await
    }
}
