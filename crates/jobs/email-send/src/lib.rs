//! # job-email-send: sends the stored outbound emails over SMTP
//!
//! A [`ConsumerJob`] on the `email.send` queue. Its input, an [`EmailSendCommand`], names an
//! `outbound_emails` row (written by the action executor, or anything else that queues mail);
//! this job sends it over a small pool of lettre SMTP connections and records the outcome on
//! the row.
//!
//! ## Claim, send, record: no database connection held across the send
//!
//! Every try is three steps, and only the first and the last touch the database, each in a
//! short transaction of its own:
//!
//! 1. **Claim.** Lock the row, read its status and the processed-message guard (scope
//!    [`GUARD_SCOPE`], `email.send`; read only — it is marked in step 3). `sent`, or a marked
//!    guard: [`Handled::Duplicate`], nothing is sent. A fresh `sending` claim: another try is
//!    at it, so this one backs off with a transient failure ("being sent by another
//!    worker"); the redelivery later finds the row `sent` and is a duplicate. Otherwise
//!    (`queued`, `unknown`, `failed` — a replayed dead letter — or a stale `sending` claim)
//!    the row becomes `sending` with `claimed_by` (this process, [`EmailSender::instance`])
//!    and `claimed_at`.
//! 2. **Send**, with no database connection held, under the send timeout.
//! 3. **Record.** Accepted: the row `sent` with the server's answer and the guard's mark, in
//!    one transaction, retried on *any* database error for the record budget
//!    ([`EmailSender::with_record_budget`], 30 s by default): a mail the server accepted is
//!    never recorded `failed`. Not accepted: the claim is released (below).
//!
//! ## The row
//!
//! ```text
//! queued ──claim──▶ sending ──accepted──────────────────────────▶ sent
//!   ▲                  │ ├──4xx, timeout or broken before the "."──▶ queued (attempts + 1)
//!   │                  │ ├──5xx, bad address, client refusal──────▶ failed
//!   │                  │ └──no answer after the final "."─────────▶ unknown
//!   │                  └──(the try died: crash, cancel, record failed) stays sending;
//!   │                     older than the stale age, a later try takes it over
//!   └── unknown and failed are claimed again only by a later delivery of the command
//! ```
//!
//! ## Exactly one mail, but for one window
//!
//! * A failure before the final "." of DATA (no connection, a 4xx or 5xx to MAIL, RCPT or
//!   DATA, a timeout while connecting or writing the body) is certain: the server does not
//!   have the mail, and the next try sends it.
//! * The server's answer to the final "." is certain too: `sent`, or released as above.
//! * **No answer after the final "."** (the send timeout, a broken connection) is an
//!   unknown outcome: the server may have taken the mail. The row becomes `unknown` with
//!   `last_error` saying so, the handler returns [`Failure::unknown`] (never tried again in
//!   process; the runner parks the message), and the unknown counter goes up
//!   ([`EmailSender::on_unknown`]; the host's `worker_email_unknown_outcomes_total`). The
//!   next delivery sends it again: **one possible duplicate per unknown outcome**, visible.
//! * **The try dies between the server's acceptance and the record** (the process killed,
//!   the handler cancelled by shutdown or its per-try timeout, the database unreachable for
//!   the whole record budget): the row stays `sending`. A redelivery within the stale age
//!   backs off; after it (the send timeout + the record budget + [`CLAIM_MARGIN`] by
//!   default, [`EmailSender::with_claim_stale_after`]) a later try takes the claim over,
//!   counts an unknown outcome, and sends again. This is the protocol's own window.
//!
//! Both duplicates carry the same Message-ID (`<email id@worker-host>`), so a receiving
//! client may fold them. A lost database session at any other moment costs nothing: the
//! claim's transaction rolls back before the send, and the record is retried after it.
//!
//! ## The SMTP pool
//!
//! At most `pool_size` connections, each used by one send at a time. A connection goes back
//! to the pool only after a whole mail transaction ended with the server's positive answer
//! read; any error, timeout or cancelled send closes it, so a late answer is never read as
//! another mail's (lettre's own pool hands such a connection back). An idle connection is
//! checked with NOOP before reuse and closed after a minute idle.
//!
//! ## Timeouts
//!
//! | bound | covers |
//! |---|---|
//! | `connect_timeout` ([`SmtpConfig`]) | TCP connect, greeting, STARTTLS and AUTH together; the NOOP on an idle connection |
//! | `send_timeout` (a constructor parameter, `jobs.email_send.timeout`) | the whole send: waiting for a connection, connecting, MAIL, RCPT, DATA and the answer to the final "." |
//! | the record budget | recording the outcome, retried on database errors |
//!
//! ## Classification ([`classify`], the one place)
//!
//! | the send ended with | class | row |
//! |---|---|---|
//! | the server's 2xx to the final "." | success | `sent`, `smtp_response` = its answer |
//! | a 4xx answer (`451 4.3.0 try later`) | transient | `queued`, `attempts + 1`, `last_error` |
//! | a 5xx answer (`550 5.1.1 no such user`) | permanent, `smtp-5xx`, detail the answer | `failed`, `last_error` = the answer |
//! | no connection, a broken one or a timeout before the final ".", another TLS failure | transient | `queued` |
//! | a timeout or a broken connection after the final "." | unknown ([`Failure::unknown`]) | `unknown` |
//! | lettre refused to go on (no STARTTLS offered, no usable AUTH mechanism, no SMTPUTF8) | permanent, `smtp-client` | `failed` |
//! | the server's certificate did not verify (unknown CA, another name, expired) | permanent, `smtp-tls` | `failed` |
//! | an address in the row that does not parse | permanent, `bad-address` | `failed` |
//!
//! One refused recipient fails the whole mail (SMTP has no partial send here).
//!
//! ## Headers
//!
//! `Message-ID: <{row.message_id}>`; `In-Reply-To` and `References` from the row (ids stored
//! without angle brackets); `Date`; and `Auto-Submitted: auto-replied` (a reply) or
//! `auto-generated` (RFC 3834), so that well-behaved auto-responders do not answer back.
//!
//! ## How the host runs it
//!
//! From its one line in the host's job list (`crates/host/src/jobs.rs`), built from its
//! settings section; ARCHITECTURE.md ("Adding a job") walks through that wiring.

pub mod settings;
mod smtp;

pub use settings::{EmailSendSettings, runner_timeout};

use std::fmt;
use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use chrono::{DateTime, Utc};
use lettre::Message;
use lettre::message::header::{ContentType, HeaderName, HeaderValue};
use lettre::message::{Mailbox, MultiPart, SinglePart};
use lettre::transport::smtp::authentication::Credentials;
use lettre::transport::smtp::client::{Certificate, TlsParameters};
use lettre::transport::smtp::response::Response;
use secrecy::{ExposeSecret, SecretString};
use sqlx::PgPool;
use uuid::Uuid;
use worker_core::{ConsumerJob, Failure, Handled, RetryPolicy, TlsMode, WorkContext, error_chain};
use worker_messages::{EmailSendCommand, Message as _};
use worker_store::{ProcessedMessages, classify as classify_db};

use crate::smtp::{Security, Server, SmtpPool};
use worker_core::truncate;

/// The job's name, in logs, metrics and the attempt log.
pub const JOB_NAME: &str = "email-send";

/// What the host needs to know of this job (its name, kind and lease).
pub const JOB: worker_core::JobSpec = worker_core::catalog::JobSpec::consumer(JOB_NAME);

/// The processed-message scope of the guard.
pub const GUARD_SCOPE: &str = "email.send";

/// The longest `last_error` or `smtp_response` kept on a row, in bytes.
pub const LAST_ERROR_MAX: usize = 2048;

/// How long recording a claim's outcome is retried on database errors, by default.
pub const DEFAULT_RECORD_BUDGET: Duration = Duration::from_secs(30);

/// Added to the send timeout and the record budget to make the default stale-claim age.
pub const CLAIM_MARGIN: Duration = Duration::from_secs(60);

/// Where and how to reach the SMTP server.
#[derive(Debug, Clone)]
pub struct SmtpConfig {
    pub host: String,
    pub port: u16,
    pub security: TlsMode,
    /// Leave `None` for a server that takes mail without logging in.
    pub username: Option<String>,
    /// Required with a username. Redacted in `Debug`.
    pub password: Option<SecretString>,
    /// CA certificates (PEM) trusted for STARTTLS and TLS besides the public web PKI's roots:
    /// a private CA. The server's certificate must also name `host`.
    pub ca_file: Option<PathBuf>,
    /// Connections open to the server at most (each used by one send at a time).
    pub pool_size: u32,
    /// Bounds connecting: TCP, the greeting, STARTTLS and AUTH together.
    pub connect_timeout: Duration,
}

impl Default for SmtpConfig {
    /// The local SMTP sink of `scripts/services.sh`: 127.0.0.1:2525, plain.
    fn default() -> Self {
        Self {
            host: "127.0.0.1".into(),
            port: 2525,
            security: TlsMode::Plain,
            username: None,
            password: None,
            ca_file: None,
            pool_size: 4,
            connect_timeout: Duration::from_secs(10),
        }
    }
}

/// Why an [`EmailSender`] could not be built.
#[derive(Debug, thiserror::Error)]
pub enum SmtpConfigError {
    #[error("smtp: a username needs a password")]
    MissingPassword,
    #[error("smtp: `{address}` is not a sender address: {detail}")]
    BadFrom { address: String, detail: String },
    #[error("smtp: cannot use host `{host}` with TLS: {detail}")]
    Tls { host: String, detail: String },
    #[error("smtp: the CA file {}: {detail}", path.display())]
    CaFile { path: PathBuf, detail: String },
    #[error("smtp: pool_size must be at least 1")]
    EmptyPool,
}

/// How one send ended badly, before classification.
#[derive(Debug)]
pub enum SendError {
    /// lettre's error before the mail was accepted: the server's negative answer (to any
    /// command, the end of DATA included), or a connection, TLS or client error met before
    /// the final "." of DATA.
    Smtp(lettre::transport::smtp::Error),
    /// The send did not finish within the send timeout, before the final "." of DATA.
    TimedOut(Duration),
    /// No connection could be had (the connect timeout).
    Connection(String),
    /// lettre's client refused to go on (the server lacks an extension the mail needs).
    Client(String),
    /// The final "." of DATA was sent and no answer came: a timeout or a broken connection.
    /// The server may have taken the mail.
    AnswerLost(String),
    /// The server's certificate did not verify (an unknown CA, another name, expired): it will
    /// not until an operator changes the server or `ca_file`.
    Certificate(String),
}

impl fmt::Display for SendError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Smtp(err) => f.write_str(&error_chain(err)),
            Self::TimedOut(after) => write!(
                f,
                "the SMTP send did not finish within {}",
                humantime::format_duration(*after)
            ),
            Self::Connection(detail)
            | Self::Client(detail)
            | Self::AnswerLost(detail)
            | Self::Certificate(detail) => f.write_str(detail),
        }
    }
}

/// The server's answer in an SMTP error (`550 5.1.1 no such user`), when it gave one.
pub fn server_answer(err: &lettre::transport::smtp::Error) -> Option<String> {
    let code = err.status()?;
    let text = std::error::Error::source(err)
        .map(|s| s.to_string())
        .unwrap_or_default();
    Some(format!("{code} {text}").trim().to_string())
}

/// The one classification of a failed send (see the table in the crate docs).
pub fn classify(err: &SendError) -> Failure {
    match err {
        SendError::TimedOut(_) | SendError::Connection(_) => Failure::transient(err),
        SendError::Client(_) => Failure::permanent("smtp-client", err),
        SendError::Certificate(_) => Failure::permanent("smtp-tls", err),
        SendError::AnswerLost(_) => Failure::unknown(format!(
            "{err}: the server may have accepted the mail, so it is not sent again in process"
        )),
        SendError::Smtp(smtp) => match (smtp.status(), server_answer(smtp)) {
            (Some(_), Some(answer)) if smtp.is_permanent() => {
                Failure::permanent("smtp-5xx", answer)
            }
            (Some(_), Some(answer)) => {
                Failure::transient(format!("the SMTP server answered {answer}"))
            }
            _ if smtp.is_client() => Failure::permanent("smtp-client", err),
            _ => Failure::transient(err),
        },
    }
}

/// The CA certificates of a PEM file, refused when it holds none (lettre would take an empty
/// file as no extra CA at all, and the operator would never learn why the server is refused).
fn read_ca_file(path: &std::path::Path) -> Result<Certificate, SmtpConfigError> {
    use tokio_rustls::rustls::pki_types::CertificateDer;
    use tokio_rustls::rustls::pki_types::pem::PemObject as _;
    let fail = |detail: String| SmtpConfigError::CaFile {
        path: path.to_path_buf(),
        detail,
    };
    let pem = std::fs::read(path).map_err(|err| fail(format!("cannot be read: {err}")))?;
    let count = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|err| fail(format!("is not PEM: {err}")))?
        .len();
    if count == 0 {
        return Err(fail("holds no PEM certificate".into()));
    }
    Certificate::from_pem(&pem).map_err(|err| fail(error_chain(&err)))
}

/// The outbound email consumer. Input: an [`EmailSendCommand`].
#[derive(Clone)]
pub struct EmailSender {
    pool: PgPool,
    guard: ProcessedMessages,
    smtp: Arc<SmtpPool>,
    default_from: Mailbox,
    send_timeout: Duration,
    record_budget: Duration,
    claim_stale_after: Option<Duration>,
    instance: Uuid,
    unknown_outcomes: Arc<AtomicU64>,
    on_unknown: Option<Arc<dyn Fn() + Send + Sync>>,
}

impl fmt::Debug for EmailSender {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EmailSender")
            .field("default_from", &self.default_from.to_string())
            .field("send_timeout", &self.send_timeout)
            .field("record_budget", &self.record_budget)
            .field("claim_stale_after", &self.claim_stale_after())
            .field("instance", &self.instance)
            .finish_non_exhaustive()
    }
}

/// The row, as claimed.
#[derive(sqlx::FromRow)]
struct Email {
    message_id: String,
    from_address: Option<String>,
    to_addresses: Vec<String>,
    cc_addresses: Vec<String>,
    subject: String,
    text_body: Option<String>,
    html_body: Option<String>,
    in_reply_to: Option<String>,
    reference_ids: Vec<String>,
}

/// What the claim found about the row.
#[derive(sqlx::FromRow)]
struct ClaimRow {
    status: String,
    claimed_by: Option<Uuid>,
    claimed_at: Option<DateTime<Utc>>,
    stale: bool,
    marked: bool,
}

/// What the first short transaction decided.
enum Claim {
    /// Sent already: the guard is marked or the row is `sent`.
    Duplicate(&'static str),
    /// Another try holds a fresh claim.
    Busy {
        owner: Option<Uuid>,
        since: Option<DateTime<Utc>>,
    },
    /// Ours to send, claimed at this time; `took_over` names a stale claim we replaced.
    Mine {
        email: Box<Email>,
        claimed_at: DateTime<Utc>,
        took_over: Option<(Option<Uuid>, Option<DateTime<Utc>>)>,
    },
}

impl EmailSender {
    /// A sender over a pool of `smtp.pool_size` connections to `smtp`, with `default_from`
    /// as the sender of rows that name none and every send bounded by `send_timeout` (the
    /// host passes `jobs.email_send.timeout`). Nothing connects until the first send.
    pub fn new(
        pool: PgPool,
        smtp: &SmtpConfig,
        default_from: &str,
        send_timeout: Duration,
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
        if smtp.pool_size == 0 {
            return Err(SmtpConfigError::EmptyPool);
        }
        let roots = match &smtp.ca_file {
            Some(path) => Some(read_ca_file(path)?),
            None => None,
        };
        let tls = || {
            let mut builder = TlsParameters::builder(smtp.host.clone());
            if let Some(roots) = &roots {
                builder = builder.add_root_certificate(roots.clone());
            }
            builder.build().map_err(|err| SmtpConfigError::Tls {
                host: smtp.host.clone(),
                detail: error_chain(&err),
            })
        };
        let security = match smtp.security {
            TlsMode::Plain => Security::Plain,
            TlsMode::Starttls => Security::Starttls(tls()?),
            TlsMode::Tls => Security::Tls(tls()?),
        };
        let credentials = match (&smtp.username, &smtp.password) {
            (Some(user), Some(password)) => Some(Credentials::new(
                user.clone(),
                password.expose_secret().to_string(),
            )),
            (Some(_), None) => return Err(SmtpConfigError::MissingPassword),
            (None, _) => None,
        };
        let server = Server {
            host: smtp.host.clone(),
            port: smtp.port,
            security,
            credentials,
            connect_timeout: smtp.connect_timeout,
        };
        let pool_size = usize::try_from(smtp.pool_size).unwrap_or(usize::MAX);
        Ok(Self {
            pool,
            guard: ProcessedMessages::new(),
            smtp: Arc::new(SmtpPool::new(server, pool_size)),
            default_from,
            send_timeout,
            record_budget: DEFAULT_RECORD_BUDGET,
            claim_stale_after: None,
            instance: Uuid::new_v4(),
            unknown_outcomes: Arc::new(AtomicU64::new(0)),
            on_unknown: None,
        })
    }

    /// A sender as its section describes it: each send bounded by `timeout`, and the stale
    /// claim age when the section sets one.
    pub fn from_settings(
        pool: PgPool,
        smtp: &SmtpConfig,
        default_from: &str,
        settings: &EmailSendSettings,
    ) -> Result<Self, SmtpConfigError> {
        let sender = Self::new(pool, smtp, default_from, settings.send.timeout)?;
        Ok(match settings.claim_stale_after {
            Some(age) => sender.with_claim_stale_after(age),
            None => sender,
        })
    }

    /// How long recording a try's outcome is retried on database errors (default
    /// [`DEFAULT_RECORD_BUDGET`]).
    #[must_use]
    pub fn with_record_budget(mut self, budget: Duration) -> Self {
        self.record_budget = budget;
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
        self.instance
    }

    /// The age after which a `sending` claim is stale.
    pub fn claim_stale_after(&self) -> Duration {
        self.claim_stale_after
            .unwrap_or(self.send_timeout + self.record_budget + CLAIM_MARGIN)
    }

    fn count_unknown(&self) {
        self.unknown_outcomes.fetch_add(1, Ordering::Relaxed);
        if let Some(hook) = &self.on_unknown {
            hook();
        }
    }

    /// Claim, send with no database connection held, record.
    async fn run(&self, id: Uuid) -> Result<Handled, Failure> {
        let (email, claimed_at) = match self.claim(id).await? {
            Claim::Duplicate(why) => {
                tracing::info!("duplicate command: {why}");
                return Ok(Handled::Duplicate);
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
        let message = match self.build(&email) {
            Ok(message) => message,
            Err(failure) => {
                self.release(id, claimed_at, &failure).await;
                return Err(failure);
            }
        };
        match self.smtp.send(&message, self.send_timeout).await {
            Ok(response) => {
                let answer = response_text(&response);
                self.record_sent(id, claimed_at, &answer).await?;
                tracing::info!(smtp_response = %answer, to = ?email.to_addresses, "email sent");
                Ok(Handled::Done)
            }
            Err(err) => {
                let failure = classify(&err);
                if failure.is_unknown() {
                    self.count_unknown();
                    tracing::error!(
                        error = %failure,
                        "the outcome of the send is unknown: the row is marked `unknown` and not sent again in process"
                    );
                }
                self.release(id, claimed_at, &failure).await;
                Err(failure)
            }
        }
    }

    /// The first short transaction: reads the row and the guard, and claims the row when it
    /// is ours to send.
    async fn claim(&self, id: Uuid) -> Result<Claim, Failure> {
        let mut tx = self.pool.begin().await.map_err(classify_db)?;
        let found: Option<ClaimRow> = sqlx::query_as(
            "SELECT status, claimed_by, claimed_at, \
                    coalesce(claimed_at < now() - make_interval(secs => $2), true) AS stale, \
                    EXISTS (SELECT 1 FROM processed_messages WHERE scope = $3 AND id = $4) AS marked \
             FROM outbound_emails WHERE id = $1 FOR UPDATE",
        )
        .bind(id)
        .bind(self.claim_stale_after().as_secs_f64())
        .bind(GUARD_SCOPE)
        .bind(id.to_string())
        .fetch_optional(&mut *tx)
        .await
        .map_err(classify_db)?;
        let Some(found) = found else {
            return Err(Failure::permanent(
                "unknown-email",
                format!("no outbound email {id}"),
            ));
        };
        if found.marked {
            return Ok(Claim::Duplicate("the guard has seen this email"));
        }
        if found.status == "sent" {
            return Ok(Claim::Duplicate("the email was sent already"));
        }
        let took_over = if found.status == "sending" {
            if !found.stale {
                return Ok(Claim::Busy {
                    owner: found.claimed_by,
                    since: found.claimed_at,
                });
            }
            Some((found.claimed_by, found.claimed_at))
        } else {
            None
        };
        let claimed_at: DateTime<Utc> = sqlx::query_scalar(
            "UPDATE outbound_emails SET status = 'sending', claimed_by = $2, claimed_at = now(), \
                 updated_at = now() \
             WHERE id = $1 RETURNING claimed_at",
        )
        .bind(id)
        .bind(self.instance)
        .fetch_one(&mut *tx)
        .await
        .map_err(classify_db)?;
        let email: Email = sqlx::query_as(
            "SELECT message_id, from_address, to_addresses, cc_addresses, subject, text_body, \
                    html_body, in_reply_to, reference_ids \
             FROM outbound_emails WHERE id = $1",
        )
        .bind(id)
        .fetch_one(&mut *tx)
        .await
        .map_err(classify_db)?;
        tx.commit().await.map_err(classify_db)?;
        Ok(Claim::Mine {
            email: Box::new(email),
            claimed_at,
            took_over,
        })
    }

    /// The second short transaction after an accepted mail: the row `sent` with the server's
    /// answer and the guard's mark, together. Retried on any database error for the record
    /// budget: a mail the server accepted is never recorded `failed`. If it still cannot be
    /// recorded, the row stays `sending` and its claim goes stale.
    async fn record_sent(
        &self,
        id: Uuid,
        claimed_at: DateTime<Utc>,
        answer: &str,
    ) -> Result<(), Failure> {
        let recorded = self
            .with_db_retries("recording the sent mail", || async {
                let mut tx = self.pool.begin().await.map_err(classify_db)?;
                // Whoever holds the claim now, the server took this mail: the row is `sent`.
                let ours: Option<bool> = sqlx::query_scalar(
                    "SELECT coalesce(claimed_by = $2 AND claimed_at = $3, false) \
                     FROM outbound_emails WHERE id = $1 FOR UPDATE",
                )
                .bind(id)
                .bind(self.instance)
                .bind(claimed_at)
                .fetch_optional(&mut *tx)
                .await
                .map_err(classify_db)?;
                sqlx::query(
                    "UPDATE outbound_emails SET status = 'sent', attempts = attempts + 1, \
                         smtp_response = $2, last_error = NULL, sent_at = now(), \
                         claimed_by = NULL, claimed_at = NULL, updated_at = now() \
                     WHERE id = $1",
                )
                .bind(id)
                .bind(truncate(answer, LAST_ERROR_MAX))
                .execute(&mut *tx)
                .await
                .map_err(classify_db)?;
                self.guard
                    .mark(&mut tx, GUARD_SCOPE, &id.to_string())
                    .await?;
                tx.commit().await.map_err(classify_db)?;
                Ok(ours)
            })
            .await;
        match recorded {
            Ok(Some(true)) => Ok(()),
            Ok(Some(false)) => {
                tracing::warn!(
                    "our claim had been taken over before the sent mail was recorded: the mail may go out twice"
                );
                Ok(())
            }
            Ok(None) => {
                tracing::warn!("the outbound email row is gone; the guard is marked");
                Ok(())
            }
            Err(failure) => {
                tracing::error!(
                    error = %failure,
                    smtp_response = %answer,
                    "the server accepted the mail but recording it failed: the row stays `sending`, and a try after its claim goes stale sends it again"
                );
                Err(Failure::transient(format!(
                    "the SMTP server accepted the mail ({answer}) but recording it failed for {}: {}",
                    humantime::format_duration(self.record_budget),
                    failure.detail()
                )))
            }
        }
    }

    /// Releases our claim after a failed try: `failed` for a permanent failure, `unknown`
    /// for an unknown outcome, back to `queued` otherwise; counts the try and keeps the
    /// error. Retried like the record; if it cannot be written the claim goes stale.
    async fn release(&self, id: Uuid, claimed_at: DateTime<Utc>, failure: &Failure) {
        let status = if failure.is_unknown() {
            "unknown"
        } else if failure.is_permanent() {
            "failed"
        } else {
            "queued"
        };
        // A 5xx keeps the server's answer as is; anything else keeps the whole failure.
        let error = if failure.reason() == "smtp-5xx" {
            failure.detail().to_string()
        } else {
            failure.to_string()
        };
        let released = self
            .with_db_retries("releasing the claim", || async {
                sqlx::query(
                    "UPDATE outbound_emails SET status = $3, attempts = attempts + 1, \
                         last_error = $4, claimed_by = NULL, claimed_at = NULL, updated_at = now() \
                     WHERE id = $1 AND status = 'sending' AND claimed_by = $2 AND claimed_at = $5",
                )
                .bind(id)
                .bind(self.instance)
                .bind(status)
                .bind(truncate(&error, LAST_ERROR_MAX))
                .bind(claimed_at)
                .execute(&self.pool)
                .await
                .map_err(classify_db)
            })
            .await;
        match released {
            Ok(done) if done.rows_affected() == 1 => {}
            Ok(_) => tracing::warn!("the claim was taken over before the failed try was recorded"),
            Err(err) => tracing::warn!(
                error = %err,
                "could not record the failed try: the claim stays until it goes stale"
            ),
        }
    }

    /// Runs `op` until it succeeds or the record budget is spent ([`worker_core::persist`]):
    /// every database error is retried, whatever its class, since the outcome it records is
    /// already decided.
    async fn with_db_retries<T, F, Fut>(&self, what: &str, op: F) -> Result<T, Failure>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, Failure>> + Send,
        T: Send,
    {
        let backoff = RetryPolicy {
            base_delay: Duration::from_millis(100),
            max_delay: Duration::from_secs(2),
            ..RetryPolicy::default()
        };
        worker_core::persist(JOB_NAME, self.record_budget, &backoff, op)
            .await
            .map_err(|failure| failure.context(what))
    }

    fn build(&self, email: &Email) -> Result<Message, Failure> {
        let mailbox = |field: &str, address: &str| -> Result<Mailbox, Failure> {
            address
                .parse()
                .map_err(|err: lettre::address::AddressError| {
                    Failure::permanent("bad-address", format!("{field} `{address}`: {err}"))
                })
        };
        let from = match &email.from_address {
            Some(address) => mailbox("from", address)?,
            None => self.default_from.clone(),
        };
        let mut builder = Message::builder()
            .from(from)
            .subject(email.subject.clone())
            .date_now()
            .message_id(Some(format!("<{}>", email.message_id)));
        for address in &email.to_addresses {
            builder = builder.to(mailbox("to", address)?);
        }
        for address in &email.cc_addresses {
            builder = builder.cc(mailbox("cc", address)?);
        }
        if let Some(parent) = &email.in_reply_to {
            builder = builder.in_reply_to(format!("<{parent}>"));
        }
        if !email.reference_ids.is_empty() {
            let chain: Vec<String> = email
                .reference_ids
                .iter()
                .map(|r| format!("<{r}>"))
                .collect();
            builder = builder.references(chain.join(" "));
        }
        let auto = if email.in_reply_to.is_some() {
            "auto-replied"
        } else {
            "auto-generated"
        };
        builder = builder.raw_header(HeaderValue::new(
            HeaderName::new_from_ascii_str("Auto-Submitted"),
            auto.to_string(),
        ));
        let built = match (&email.text_body, &email.html_body) {
            (Some(text), Some(html)) => builder.multipart(MultiPart::alternative_plain_html(
                text.clone(),
                html.clone(),
            )),
            (None, Some(html)) => builder.singlepart(SinglePart::html(html.clone())),
            (text, None) => builder.singlepart(
                SinglePart::builder()
                    .header(ContentType::TEXT_PLAIN)
                    .body(text.clone().unwrap_or_default()),
            ),
        };
        built.map_err(|err| Failure::permanent("bad-email", err))
    }
}

/// `250 2.0.0 Ok: queued as 1234`.
fn response_text(response: &Response) -> String {
    let lines: Vec<&str> = response.message().collect();
    format!("{} {}", response.code(), lines.join(" "))
        .trim()
        .to_string()
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
        fields(email_id = %command.email_message_id, attempt = ctx.attempt)
    )]
    async fn handle(
        &self,
        ctx: &WorkContext,
        command: &EmailSendCommand,
    ) -> Result<Handled, Failure> {
        self.run(command.email_message_id).await
    }
}

#[cfg(test)]
mod tests {
    use serde::Deserialize;

    use super::*;

    #[test]
    fn security_reads_from_settings_words() {
        #[derive(Deserialize)]
        struct S {
            security: TlsMode,
        }
        let read = |w: &str| {
            serde_json::from_str::<S>(&format!(r#"{{"security": "{w}"}}"#))
                .map(|s| s.security)
                .ok()
        };
        assert_eq!(read("plain"), Some(TlsMode::Plain));
        assert_eq!(read("starttls"), Some(TlsMode::Starttls));
        assert_eq!(read("tls"), Some(TlsMode::Tls));
        assert_eq!(read("ssl"), None);
    }

    #[test]
    fn a_timeout_is_transient() {
        let f = classify(&SendError::TimedOut(Duration::from_secs(60)));
        assert_eq!(f.class(), worker_core::FailureClass::Transient);
        assert_eq!(f.detail(), "the SMTP send did not finish within 1m");
    }

    #[test]
    fn no_answer_after_the_final_dot_is_unknown_and_no_connection_is_transient() {
        let f = classify(&SendError::AnswerLost(
            "no answer to the end of DATA".into(),
        ));
        assert!(f.is_unknown(), "{f}");
        assert!(!f.retries_in_process());
        let f = classify(&SendError::Connection("could not connect".into()));
        assert_eq!(f.class(), worker_core::FailureClass::Transient);
        assert!(f.retries_in_process());
        let f = classify(&SendError::Client("no 8BITMIME".into()));
        assert_eq!(f.reason(), "smtp-client");
    }

    #[test]
    fn truncation_keeps_whole_characters() {
        assert_eq!(truncate("aé", 2), "a");
        assert_eq!(truncate("abc", 5), "abc");
    }
}
