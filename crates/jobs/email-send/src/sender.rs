//! [`EmailSender`], the job: claim, send with no database connection held, record (see the
//! crate docs), and what it counts of unknown outcomes.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use worker_mail_auth::TokenSources;

use lettre::message::Mailbox;
use sqlx::PgPool;
use uuid::Uuid;
use worker_core::{ConsumerJob, Failure, Handled, WorkContext};
use worker_messages::{EmailSendCommand, Message as _};

use crate::config::{SmtpConfigError, SmtpSettings};
use worker_store::circuits::{Admission, Circuits};

use crate::error::{SendError, classify};
use crate::message::{build, response_text};
use crate::rate::quota::{QuotaAnswer, quota_of};
use crate::rate::{RateView, SendRate};
use crate::relay::{RELAY, RelayProbe, fault_of};
use crate::settings::EmailSendSettings;
use crate::smtp::SmtpPool;
use crate::store::{Claim, Email, EmailStore};
use crate::{CLAIM_MARGIN, DEFAULT_RECORD_BUDGET, EXPIRED, JOB_NAME};

/// The outbound email consumer. Input: an [`EmailSendCommand`].
#[derive(Clone)]
pub struct EmailSender {
    store: EmailStore,
    smtp: Arc<SmtpPool>,
    default_from: Mailbox,
    send_timeout: Duration,
    claim_stale_after: Option<Duration>,
    max_age: Option<Duration>,
    unknown_outcomes: Arc<AtomicU64>,
    on_unknown: Option<Arc<dyn Fn() + Send + Sync>>,
    circuits: Option<Circuits>,
    /// The account's sending rate, shared by every replica; none when no limit is set.
    rate: Option<SendRate>,
}

impl fmt::Debug for EmailSender {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EmailSender")
            .field("default_from", &self.default_from.to_string())
            .field("send_timeout", &self.send_timeout)
            .field("record_budget", &self.store.record_budget)
            .field("claim_stale_after", &self.claim_stale_after())
            .field("instance", &self.store.instance)
            .finish_non_exhaustive()
    }
}

impl EmailSender {
    /// A sender over a pool of `smtp.pool_size` connections to `smtp`, with `default_from`
    /// as the sender of rows that name none and every send bounded by `send_timeout` (the
    /// host passes `jobs.email_send.timeout`). Nothing connects until the first send.
    pub fn new(
        pool: PgPool,
        smtp: &SmtpSettings,
        default_from: &str,
        send_timeout: Duration,
    ) -> Result<Self, SmtpConfigError> {
        Self::signing_in_with(
            pool,
            smtp,
            default_from,
            send_timeout,
            &TokenSources::default(),
        )
    }

    /// [`Self::new`], with the token sources that `[smtp]`'s `oauth` may name.
    pub fn signing_in_with(
        pool: PgPool,
        smtp: &SmtpSettings,
        default_from: &str,
        send_timeout: Duration,
        oauth: &TokenSources,
    ) -> Result<Self, SmtpConfigError> {
        let default_from: Mailbox =
            default_from
                .parse()
                .map_err(
                    |err: lettre::address::AddressError| SmtpConfigError::BadFrom {
                        address: default_from.to_string(),
                        detail: err.to_string(),
                    },
                )?;
        let server = smtp.server(oauth)?;
        let connections = smtp.connections_with(oauth)?;
        let limits = smtp.rate_limits(oauth);
        let rate = limits
            .any()
            .then(|| SendRate::new(pool.clone(), smtp.rate_account(), limits));
        Ok(Self {
            store: EmailStore {
                pool,
                instance: Uuid::new_v4(),
                record_budget: DEFAULT_RECORD_BUDGET,
            },
            smtp: Arc::new(SmtpPool::new(server, connections)),
            default_from,
            send_timeout,
            claim_stale_after: None,
            max_age: None,
            unknown_outcomes: Arc::new(AtomicU64::new(0)),
            on_unknown: None,
            circuits: None,
            rate,
        })
    }

    /// A sender as its section describes it: each send bounded by `timeout`, and the stale
    /// claim age when the section sets one.
    pub fn from_settings(
        pool: PgPool,
        smtp: &SmtpSettings,
        default_from: &str,
        settings: &EmailSendSettings,
        oauth: &TokenSources,
    ) -> Result<Self, SmtpConfigError> {
        let sender = Self::signing_in_with(pool, smtp, default_from, settings.send.timeout, oauth)?
            .with_max_age(settings.max_age);
        Ok(match settings.claim_stale_after {
            Some(age) => sender.with_claim_stale_after(age),
            None => sender,
        })
    }

    /// The age past which a reply is recorded `expired` instead of sent, counted from when it
    /// was queued (`jobs.email_send.max_age`); a row's own `expires_at` wins. `None` (the
    /// default): no limit.
    /// Sends only while the relay's circuit is closed, and counts the relay's own failures
    /// toward opening it (see `relay.rs`).
    #[must_use]
    pub fn with_circuits(mut self, circuits: Circuits) -> Self {
        self.circuits = Some(circuits);
        self
    }

    /// The sending rate in force and what it has used, as this replica last read it (`/status`
    /// and the job's page); none when no limit is set.
    pub fn sending_rate(&self) -> Option<RateView> {
        self.rate.as_ref().map(SendRate::view)
    }

    /// The relay's probe, for the host to run while its circuit is open.
    pub fn relay_probe(&self) -> RelayProbe {
        RelayProbe {
            pool: self.smtp.clone(),
        }
    }

    #[must_use]
    pub fn with_max_age(mut self, max_age: Option<Duration>) -> Self {
        self.max_age = max_age;
        self
    }

    /// How long recording a try's outcome is retried on database errors (default
    /// [`DEFAULT_RECORD_BUDGET`]).
    #[must_use]
    pub fn with_record_budget(mut self, budget: Duration) -> Self {
        self.store.record_budget = budget;
        self
    }

    /// The age after which another try may take over a `sending` claim (default: the send
    /// timeout plus the record budget plus [`CLAIM_MARGIN`]). It must exceed the longest a
    /// try can still be sending or recording, or two tries could send at once.
    #[must_use]
    pub fn with_claim_stale_after(mut self, age: Duration) -> Self {
        self.claim_stale_after = Some(age);
        self
    }

    /// Called once for each unknown outcome: a send whose answer to the end of DATA was
    /// lost, or a stale claim taken over. The host counts them in
    /// `worker_email_unknown_outcomes_total`.
    #[must_use]
    pub fn on_unknown(mut self, hook: impl Fn() + Send + Sync + 'static) -> Self {
        self.on_unknown = Some(Arc::new(hook));
        self
    }

    /// Unknown outcomes met by this sender (and its clones) so far.
    pub fn unknown_outcomes(&self) -> u64 {
        self.unknown_outcomes.load(Ordering::Relaxed)
    }

    /// This process's claim owner, written in `claimed_by`.
    pub fn instance(&self) -> Uuid {
        self.store.instance
    }

    /// The age after which a `sending` claim is stale.
    pub fn claim_stale_after(&self) -> Duration {
        self.claim_stale_after
            .unwrap_or(self.send_timeout + self.store.record_budget + CLAIM_MARGIN)
    }

    fn count_unknown(&self) {
        self.unknown_outcomes.fetch_add(1, Ordering::Relaxed);
        if let Some(hook) = &self.on_unknown {
            hook();
        }
    }

    /// Whether the relay may be called: a reply met while its circuit is open goes back to
    /// its queue uncharged, before anything is claimed.
    async fn admit(&self) -> Result<Admission, Failure> {
        let Some(circuits) = &self.circuits else {
            return Ok(Admission::Go);
        };
        match circuits.admit(RELAY).await {
            Admission::Wait { reason, .. } => Err(Failure::unavailable(
                RELAY,
                format!("its circuit is open: {reason}"),
                None,
            )),
            admission => Ok(admission),
        }
    }

    /// The failure a failed send ends with: the relay's own, once it opened the circuit (or
    /// found it open), charges the reply nothing.
    async fn judge(&self, err: &SendError, admission: &Admission) -> Failure {
        if let Some(quota) = quota_of(err) {
            return self.quota_reached(quota).await;
        }
        let failure = classify(err);
        let (Some(circuits), Some(fault)) = (&self.circuits, fault_of(err)) else {
            return failure;
        };
        let detail = failure.detail().to_string();
        match circuits.failed(RELAY, fault, &detail, admission).await {
            Some(_) => Failure::unavailable(RELAY, detail, None),
            None => failure,
        }
    }

    /// The provider said the account's sending limit is reached: the account's failure, not the
    /// mail's. The relay's circuit opens until the window rolls over (the consumers stop on
    /// every replica) and the mail goes back to its queue charged no try; without circuits it
    /// is parked for that long, charged no try.
    async fn quota_reached(&self, quota: QuotaAnswer) -> Failure {
        let until = match &self.rate {
            Some(rate) => rate.rolls_over(quota.window).await,
            None => crate::rate::fallback_until(quota.window, chrono::Utc::now()),
        };
        let detail = format!("the provider's sending limit is reached: {}", quota.answer);
        let opened = match &self.circuits {
            Some(circuits) => circuits.open_until(RELAY, &quota.answer, until).await,
            None => None,
        };
        let wait = (until - chrono::Utc::now()).to_std().unwrap_or_default();
        tracing::warn!(answer = %quota.answer, rolls_over = %until, "the provider's sending limit is reached: no mail goes until its window rolls over");
        match opened {
            Some(_) => Failure::unavailable(RELAY, detail, None),
            None => Failure::unavailable(RELAY, detail, Some(wait.max(Duration::from_secs(1)))),
        }
    }

    /// Waits for the mail's turn within the account's sending rate (see `rate`); a long wait
    /// is the relay's `Unavailable` with that wait.
    async fn wait_for_turn(&self, email: &Email) -> Result<(), Failure> {
        let Some(rate) = &self.rate else {
            return Ok(());
        };
        let recipients = email.to_addresses.len() + email.cc_addresses.len();
        rate.wait_for_turn(u32::try_from(recipients).unwrap_or(u32::MAX))
            .await
    }

    /// Claim, send with no database connection held, record.
    async fn run(&self, id: Uuid) -> Result<Handled, Failure> {
        let admission = self.admit().await?;
        let claim = self
            .store
            .claim(id, self.claim_stale_after(), self.max_age)
            .await?;
        let (email, claimed_at) = match claim {
            Claim::Duplicate(why) => {
                tracing::info!("duplicate command: {why}");
                return Ok(Handled::Duplicate);
            }
            Claim::Superseded(by) => {
                tracing::info!(superseded_by = %by, "not sent: an operator edited this mail and sent the copy in its place");
                return Ok(Handled::Duplicate);
            }
            Claim::Expired { age, limit } => {
                let limit = limit.map(|l| humantime::format_duration(l).to_string());
                tracing::info!(
                    age = %humantime::format_duration(age),
                    limit = limit.as_deref().unwrap_or_default(),
                    "not sent: the reply was past its age limit when its turn came; recorded `expired`"
                );
                return Ok(Handled::Skipped(EXPIRED));
            }
            Claim::Busy { owner, since } => {
                let owner = owner.map(|o| o.to_string()).unwrap_or_default();
                let since = since.map(|s| s.to_rfc3339()).unwrap_or_default();
                return Err(Failure::transient(format!(
                    "outbound email {id} is being sent by another worker ({owner}, since {since}); backing off"
                )));
            }
            Claim::Mine {
                email,
                claimed_at,
                took_over,
            } => {
                if let Some((owner, since)) = took_over {
                    // The earlier try died between its claim and its record: it may have sent.
                    self.count_unknown();
                    tracing::warn!(
                        previous_owner = ?owner,
                        claimed_at = ?since,
                        "took over a stale claim: the mail may have gone out already and is sent again"
                    );
                }
                (email, claimed_at)
            }
        };
        let message = match build(&email, &self.default_from) {
            Ok(message) => message,
            Err(failure) => {
                self.store.release(id, claimed_at, &failure).await;
                return Err(failure);
            }
        };
        // After the claim, so that only a mail that will go is counted; a mail over the rate
        // is released charged no try.
        if let Err(failure) = self.wait_for_turn(&email).await {
            self.store.release(id, claimed_at, &failure).await;
            return Err(failure);
        }
        match self.smtp.send(&message, self.send_timeout).await {
            Ok(response) => {
                if let Some(circuits) = &self.circuits {
                    circuits.succeeded(RELAY, &admission).await;
                }
                let answer = response_text(&response);
                self.store.record_sent(id, claimed_at, &answer).await?;
                tracing::info!(smtp_response = %answer, to = ?email.to_addresses, "email sent");
                Ok(Handled::Done)
            }
            Err(err) => {
                let failure = self.judge(&err, &admission).await;
                if failure.is_unknown() {
                    self.count_unknown();
                    tracing::error!(
                        error = %failure,
                        "the outcome of the send is unknown: the row is marked `unknown` and not sent again in process"
                    );
                }
                self.store.release(id, claimed_at, &failure).await;
                Err(failure)
            }
        }
    }
}

impl ConsumerJob for EmailSender {
    type Input = EmailSendCommand;

    fn name(&self) -> &str {
        JOB_NAME
    }

    fn reads_version(&self, _message_type: &str) -> u32 {
        EmailSendCommand::VERSION
    }

    #[tracing::instrument(
        name = "email_send",
        skip_all,
        fields(email_id = %command.outbound_email_id, attempt = ctx.attempt)
    )]
    async fn handle(
        &self,
        ctx: &WorkContext,
        command: &EmailSendCommand,
    ) -> Result<Handled, Failure> {
        self.run(command.outbound_email_id).await
    }
}
