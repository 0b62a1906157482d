//! [`ActionExecutor`], the job: how it is built, and the dispatcher that runs a command's
//! first transaction and hands the action to its kind ([`crate::send_email`],
//! [`crate::claim`] for a webhook).

use std::time::Duration;

use sqlx::PgPool;
use uuid::Uuid;
use worker_core::{ConsumerJob, Failure, Handled, WorkContext};
use worker_messages::{ActionCommand, AutomationAction, Message};
use worker_store::{Tx, classify};

use crate::address::WebhookAllow;
use crate::claim::{Claim, Refused, WebhookClaims};
use crate::execution::{Loaded, load, record_unclaimed_failure};
use crate::reply_limit::ReplyLimit;
use crate::send_email::SendEmail;
use crate::settings::AutomationActionSettings;
use crate::webhook::WebhookClient;
use crate::{JOB_NAME, loops};

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
    send_email: SendEmail,
    webhooks: WebhookClaims,
}

/// How the first transaction ended.
enum Started {
    /// Nothing more to do: the email was queued, or it was a duplicate.
    Finished(Handled),
    /// A webhook execution claimed by this try: call, then record.
    Claimed(Claim),
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
            send_email: SendEmail::new(commands_exchange.into()),
            webhooks: WebhookClaims::new(pool.clone(), webhook_timeout)?,
            pool,
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
        self.send_email.own_addresses = addresses.into_iter().map(loops::bare_address).collect();
        self
    }

    /// At most `max` mails from one automation to one address within `window` (by default
    /// [`DEFAULT_REPLY_LIMIT`](crate::DEFAULT_REPLY_LIMIT) in [`DEFAULT_REPLY_WINDOW`](crate::DEFAULT_REPLY_WINDOW)).
    #[must_use]
    pub fn with_reply_limit(mut self, max: u32, window: Duration) -> Self {
        self.send_email.reply_limit = ReplyLimit { max, window };
        self
    }

    /// At most `max` distinct recipients (`to` and `cc`) in one mail (by default
    /// [`DEFAULT_RECIPIENTS_MAX`](crate::DEFAULT_RECIPIENTS_MAX)); a mail with more is not sent, its execution `skipped`.
    #[must_use]
    pub fn with_recipients_max(mut self, max: u32) -> Self {
        self.send_email.recipients_max = max;
        self
    }

    /// Lets its webhooks reach what `allow` names inside the installation (by default
    /// nothing: see [`address`](crate::address)); the host passes `jobs.automation_action.webhook_allow`.
    pub fn with_webhook_allow(mut self, allow: WebhookAllow) -> Result<Self, BuildError> {
        self.webhooks.client = WebhookClient::with_allow(self.webhooks.client.timeout(), allow)?;
        Ok(self)
    }

    /// Routes the email-send commands with `routing_key` instead (when the email queue was
    /// renamed in the settings).
    #[must_use]
    pub fn with_email_routing_key(mut self, routing_key: impl Into<String>) -> Self {
        self.send_email.email_routing_key = routing_key.into();
        self
    }

    /// Takes over another process's `running` claim only once it is older than `after`
    /// (by default the webhook timeout + [`DEFAULT_RECORD_BUDGET`](crate::DEFAULT_RECORD_BUDGET) + [`STALE_CLAIM_MARGIN`](crate::STALE_CLAIM_MARGIN)).
    /// It must exceed the longest a live try can hold a claim, or a slow call is doubled.
    #[must_use]
    pub fn with_stale_claim_after(mut self, after: Duration) -> Self {
        self.webhooks.stale_after = after;
        self
    }

    /// Retries recording a webhook's success on database errors for `budget` (by default
    /// [`DEFAULT_RECORD_BUDGET`](crate::DEFAULT_RECORD_BUDGET)). The stale limit is not changed.
    #[must_use]
    pub fn with_record_budget(mut self, budget: Duration) -> Self {
        self.webhooks.record_budget = budget;
        self
    }

    /// Calls a webhook host only while its circuit is closed (or for its probe), and counts
    /// the host's own failures toward opening it (see [`crate::circuit`]).
    #[must_use]
    pub fn with_circuits(mut self, circuits: worker_store::circuits::Circuits) -> Self {
        self.webhooks.circuits = Some(circuits);
        self
    }

    /// The uuid this executor's claims carry in `claimed_by`.
    pub fn owner(&self) -> Uuid {
        self.webhooks.owner
    }

    /// The first transaction, then for a webhook the call and the second (see the crate
    /// docs). Every failure is recorded on the row before it is returned, except a back-off.
    async fn run(&self, command: &ActionCommand) -> Result<Handled, Failure> {
        let id = command.action_execution_id;
        match self.start(command).await {
            Ok(Started::Finished(handled)) => Ok(handled),
            Ok(Started::Claimed(claim)) => self.webhooks.call_and_record(claim).await,
            Err(Refused::BackOff(failure)) => Err(failure),
            Err(Refused::Failed(failure)) => {
                record_unclaimed_failure(&self.pool, id, &failure).await;
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

    async fn apply(&self, tx: &mut Tx, command: &ActionCommand) -> Result<Started, Refused> {
        let id = command.action_execution_id;
        let execution = match load(tx, command, self.webhooks.stale_after).await? {
            Loaded::Marked => {
                tracing::info!("duplicate command: the guard has seen this action execution");
                return Ok(Started::Finished(Handled::Duplicate));
            }
            Loaded::Found(execution) => execution,
        };
        if execution.status == "succeeded" || execution.status == "skipped" {
            // The mark was swept by retention but the row remembers: still a duplicate.
            tracing::info!("duplicate command: the action execution is already done");
            return Ok(Started::Finished(Handled::Duplicate));
        }
        match &execution.action {
            AutomationAction::SendEmail(action) => {
                let handled = self.send_email.run(tx, id, &execution, action).await?;
                Ok(Started::Finished(handled))
            }
            AutomationAction::Webhook(action) => {
                let claim = self.webhooks.claim(tx, id, &execution, action).await?;
                Ok(Started::Claimed(claim))
            }
        }
    }
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
