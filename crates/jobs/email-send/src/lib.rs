//! # job-email-send: sends the stored outbound emails over SMTP
//!
//! A [`ConsumerJob`] on the `email.send` queue. Its input, an [`EmailSendCommand`], names an
//! `outbound_emails` row (written by the action executor, or anything else that queues mail);
//! this job sends it with lettre's pooled [`AsyncSmtpTransport`] and marks the row `sent`
//! (with the server's answer) or `failed`.
//!
//! ## Exactly one mail, but for one window
//!
//! Every command is guarded on the email id (processed-message scope [`GUARD_SCOPE`],
//! `email.send`). One transaction takes the guard's mark and locks the row, the mail is sent
//! while it waits, and the mark and the row's `sent` commit together **only after the server
//! accepted the mail**. So:
//!
//! * a crash, timeout or refusal before the acceptance rolls the mark back: the next try
//!   sends the mail (at least once, never "never");
//! * a duplicate command after the commit finds the mark (or the row `sent`) and is
//!   acknowledged as [`Handled::Duplicate`] without sending;
//! * a duplicate arriving while the first is sending waits on the mark's row, then finds it;
//! * **the one window for a duplicate mail** is a crash (or a lost database connection)
//!   between the server's acceptance and the commit: the row is still `queued`, the command
//!   is redelivered, and the mail goes out a second time. Its Message-ID is the same
//!   (`<email id@worker-host>`), so a receiving client may fold the two.
//!
//! ## Timeouts
//!
//! lettre's own timeout bounds connecting only (lettre/lettre#1027), so every send runs under
//! a tokio timeout of its own (`send_timeout`, a constructor parameter); a send that overruns
//! is dropped, its pooled connection with it, and the failure is transient.
//!
//! ## Classification ([`classify`], the one place)
//!
//! | the send ended with | class |
//! |---|---|
//! | the server's 2xx | success: row `sent`, `smtp_response` = its answer |
//! | a 4xx answer (`451 4.3.0 try later`) | transient: row stays `queued`, `attempts + 1`, `last_error` |
//! | a 5xx answer (`550 5.1.1 no such user`) | permanent, reason `smtp-5xx`, detail the server's answer: row `failed`, `last_error` = the answer |
//! | no connection, a broken one, TLS failure, the send timeout | transient |
//! | lettre refused to go on (no STARTTLS offered, no usable AUTH mechanism) | permanent, `smtp-client` |
//! | an address in the row that does not parse | permanent, `bad-address` |
//!
//! One refused recipient fails the whole mail (SMTP has no partial send here).
//!
//! ## Headers
//!
//! `Message-ID: <{row.message_id}>`; `In-Reply-To` and `References` from the row (ids stored
//! without angle brackets); `Date`; and `Auto-Submitted: auto-replied` (a reply) or
//! `auto-generated` (RFC 3834), so that well-behaved auto-responders do not answer back.
//!
//! ## What the host wires
//!
//! ```text
//! let smtp = SmtpConfig {
//!     host: s.smtp.host, port: s.smtp.port, security: SmtpSecurity::Plain /* from s.smtp.security */,
//!     username: s.smtp.username, password: /* SecretString from s.smtp.password */,
//!     pool_size: s.smtp.pool_size, connect_timeout: Duration::from_secs(10),
//! };
//! let sender = EmailSender::new(pool.clone(), &smtp, &s.smtp.from, s.workers.timeouts.email_send)?;
//! let runner = ConsumerRunner::new(sender, email_send_queue, consumer_settings);
//! ```

use std::fmt;
use std::time::Duration;

use lettre::message::header::{ContentType, HeaderName, HeaderValue};
use lettre::message::{Mailbox, MultiPart, SinglePart};
use lettre::transport::smtp::authentication::Credentials;
use lettre::transport::smtp::{PoolConfig, response::Response};
use lettre::{AsyncSmtpTransport, AsyncTransport, Message, Tokio1Executor};
use secrecy::{ExposeSecret, SecretString};
use serde::{Deserialize, Serialize};
use sqlx::{PgConnection, PgPool};
use uuid::Uuid;
use worker_core::{ConsumerJob, Failure, Handled, WorkContext, error_chain};
use worker_messages::EmailSendCommand;
use worker_store::{ProcessedMessages, classify as classify_db};

/// The job's name, in logs, metrics and the attempt log.
pub const JOB_NAME: &str = "email-send";

/// The processed-message scope of the guard.
pub const GUARD_SCOPE: &str = "email.send";

/// The longest `last_error` or `smtp_response` kept on a row, in bytes.
pub const LAST_ERROR_MAX: usize = 2048;

/// How the connection to the SMTP server is protected.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SmtpSecurity {
    /// No encryption: for a server on loopback only.
    #[default]
    Plain,
    /// Plain connect, then STARTTLS, which is required (no fallback to plain).
    Starttls,
    /// TLS from the first byte (port 465, typically).
    Tls,
}

/// Where and how to reach the SMTP server.
#[derive(Debug, Clone)]
pub struct SmtpConfig {
    pub host: String,
    pub port: u16,
    pub security: SmtpSecurity,
    /// Leave `None` for a server that takes mail without logging in.
    pub username: Option<String>,
    /// Required with a username. Redacted in `Debug`.
    pub password: Option<SecretString>,
    /// Connections kept open to the server.
    pub pool_size: u32,
    /// lettre's timeout: connecting, and each command's answer.
    pub connect_timeout: Duration,
}

impl Default for SmtpConfig {
    /// The local SMTP sink of `scripts/services.sh`: 127.0.0.1:2525, plain.
    fn default() -> Self {
        Self {
            host: "127.0.0.1".into(),
            port: 2525,
            security: SmtpSecurity::Plain,
            username: None,
            password: None,
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
    #[error("smtp: pool_size must be at least 1")]
    EmptyPool,
}

/// How one send ended badly, before classification.
#[derive(Debug)]
pub enum SendError {
    /// lettre's error: the server's negative answer, or a connection, TLS or client error.
    Smtp(lettre::transport::smtp::Error),
    /// The send did not finish within the send timeout.
    TimedOut(Duration),
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
        SendError::TimedOut(_) => Failure::transient(err),
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

/// The outbound email consumer. Input: an [`EmailSendCommand`].
#[derive(Clone)]
pub struct EmailSender {
    pool: PgPool,
    guard: ProcessedMessages,
    transport: AsyncSmtpTransport<Tokio1Executor>,
    default_from: Mailbox,
    send_timeout: Duration,
}

impl fmt::Debug for EmailSender {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EmailSender")
            .field("default_from", &self.default_from.to_string())
            .field("send_timeout", &self.send_timeout)
            .finish_non_exhaustive()
    }
}

/// The row, locked.
struct Email {
    message_id: String,
    from: Option<String>,
    to: Vec<String>,
    cc: Vec<String>,
    subject: String,
    text: Option<String>,
    html: Option<String>,
    in_reply_to: Option<String>,
    references: Vec<String>,
    status: String,
}

impl EmailSender {
    /// A sender over a pooled transport to `smtp`, with `default_from` as the sender of rows
    /// that name none and every send bounded by `send_timeout` (the host passes
    /// `workers.timeouts.email_send`). Nothing connects until the first send.
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
        let tls_error = |err: lettre::transport::smtp::Error| SmtpConfigError::Tls {
            host: smtp.host.clone(),
            detail: error_chain(&err),
        };
        let builder = match smtp.security {
            SmtpSecurity::Plain => {
                AsyncSmtpTransport::<Tokio1Executor>::builder_dangerous(&smtp.host)
            }
            SmtpSecurity::Starttls => {
                AsyncSmtpTransport::<Tokio1Executor>::starttls_relay(&smtp.host)
                    .map_err(tls_error)?
            }
            SmtpSecurity::Tls => {
                AsyncSmtpTransport::<Tokio1Executor>::relay(&smtp.host).map_err(tls_error)?
            }
        };
        let mut builder = builder
            .port(smtp.port)
            .timeout(Some(smtp.connect_timeout))
            .pool_config(PoolConfig::new().max_size(smtp.pool_size));
        match (&smtp.username, &smtp.password) {
            (Some(user), Some(password)) => {
                builder = builder.credentials(Credentials::new(
                    user.clone(),
                    password.expose_secret().to_string(),
                ));
            }
            (Some(_), None) => return Err(SmtpConfigError::MissingPassword),
            (None, _) => {}
        }
        Ok(Self {
            pool,
            guard: ProcessedMessages::new(),
            transport: builder.build(),
            default_from,
            send_timeout,
        })
    }

    /// Marks, sends, records in one transaction, which commits only once the server has
    /// accepted the mail, and is rolled back before a failure is recorded.
    async fn run(&self, id: Uuid) -> Result<Handled, Failure> {
        let mut tx = self.pool.begin().await.map_err(classify_db)?;
        match self.apply(&mut tx, id).await {
            Ok(handled) => {
                tx.commit().await.map_err(|err| {
                    tracing::error!(
                        error = %error_chain(&err),
                        "the server accepted the mail but marking it sent failed: it will be sent again"
                    );
                    classify_db(err)
                })?;
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

    async fn apply(&self, tx: &mut PgConnection, id: Uuid) -> Result<Handled, Failure> {
        if !self.guard.mark(tx, GUARD_SCOPE, &id.to_string()).await? {
            tracing::info!("duplicate command: the guard has seen this email");
            return Ok(Handled::Duplicate);
        }
        let email = load(tx, id).await?;
        if email.status == "sent" {
            tracing::info!("duplicate command: the email was sent already");
            return Ok(Handled::Duplicate);
        }
        let message = self.build(&email)?;
        let sent = tokio::time::timeout(self.send_timeout, self.transport.send(message)).await;
        let response = match sent {
            Ok(Ok(response)) => response,
            Ok(Err(err)) => return Err(classify(&SendError::Smtp(err))),
            Err(_elapsed) => return Err(classify(&SendError::TimedOut(self.send_timeout))),
        };
        let answer = response_text(&response);
        sqlx::query(
            "UPDATE outbound_emails SET status = 'sent', attempts = attempts + 1, \
                 smtp_response = $2, last_error = NULL, sent_at = now(), updated_at = now() \
             WHERE id = $1",
        )
        .bind(id)
        .bind(truncate(&answer, LAST_ERROR_MAX))
        .execute(&mut *tx)
        .await
        .map_err(classify_db)?;
        tracing::info!(smtp_response = %answer, to = ?email.to, "email sent");
        Ok(Handled::Done)
    }

    fn build(&self, email: &Email) -> Result<Message, Failure> {
        let mailbox = |field: &str, address: &str| -> Result<Mailbox, Failure> {
            address
                .parse()
                .map_err(|err: lettre::address::AddressError| {
                    Failure::permanent("bad-address", format!("{field} `{address}`: {err}"))
                })
        };
        let from = match &email.from {
            Some(address) => mailbox("from", address)?,
            None => self.default_from.clone(),
        };
        let mut builder = Message::builder()
            .from(from)
            .subject(email.subject.clone())
            .date_now()
            .message_id(Some(format!("<{}>", email.message_id)));
        for address in &email.to {
            builder = builder.to(mailbox("to", address)?);
        }
        for address in &email.cc {
            builder = builder.cc(mailbox("cc", address)?);
        }
        if let Some(parent) = &email.in_reply_to {
            builder = builder.in_reply_to(format!("<{parent}>"));
        }
        if !email.references.is_empty() {
            let chain: Vec<String> = email.references.iter().map(|r| format!("<{r}>")).collect();
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
        let built = match (&email.text, &email.html) {
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

    /// Adds the failed try to the row: `failed` with the error for a permanent failure, still
    /// `queued` otherwise. Best effort: the failure itself is what the caller returns.
    async fn record_failure(&self, id: Uuid, failure: &Failure) {
        let permanent = failure.is_permanent();
        // A 5xx keeps the server's answer as is; anything else keeps the whole failure.
        let error = if failure.reason() == "smtp-5xx" {
            failure.detail().to_string()
        } else {
            failure.to_string()
        };
        let recorded = sqlx::query(
            "UPDATE outbound_emails SET attempts = attempts + 1, last_error = $2, \
                 status = CASE WHEN $3 THEN 'failed' ELSE status END, updated_at = now() \
             WHERE id = $1 AND status <> 'sent'",
        )
        .bind(id)
        .bind(truncate(&error, LAST_ERROR_MAX))
        .bind(permanent)
        .execute(&self.pool)
        .await;
        if let Err(err) = recorded {
            tracing::warn!(
                error = %error_chain(&err),
                "could not record the failed try on the outbound email"
            );
        }
    }
}

async fn load(tx: &mut PgConnection, id: Uuid) -> Result<Email, Failure> {
    type Row = (
        String,
        Option<String>,
        Vec<String>,
        Vec<String>,
        String,
        Option<String>,
        Option<String>,
        Option<String>,
        Vec<String>,
        String,
    );
    let row: Option<Row> = sqlx::query_as(
        "SELECT message_id, from_address, to_addresses, cc_addresses, subject, text_body, \
                html_body, in_reply_to, reference_ids, status \
         FROM outbound_emails WHERE id = $1 FOR UPDATE",
    )
    .bind(id)
    .fetch_optional(&mut *tx)
    .await
    .map_err(classify_db)?;
    let Some((message_id, from, to, cc, subject, text, html, in_reply_to, references, status)) =
        row
    else {
        return Err(Failure::permanent(
            "unknown-email",
            format!("no outbound email {id}"),
        ));
    };
    Ok(Email {
        message_id,
        from,
        to,
        cc,
        subject,
        text,
        html,
        in_reply_to,
        references,
        status,
    })
}

/// `250 2.0.0 Ok: queued as 1234`.
fn response_text(response: &Response) -> String {
    let lines: Vec<&str> = response.message().collect();
    format!("{} {}", response.code(), lines.join(" "))
        .trim()
        .to_string()
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

impl ConsumerJob for EmailSender {
    type Input = EmailSendCommand;

    fn name(&self) -> &str {
        JOB_NAME
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
        match self.run(command.email_message_id).await {
            Ok(handled) => Ok(handled),
            Err(failure) => {
                self.record_failure(command.email_message_id, &failure)
                    .await;
                Err(failure)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn security_reads_from_settings_words() {
        #[derive(Deserialize)]
        struct S {
            security: SmtpSecurity,
        }
        let read = |w: &str| {
            serde_json::from_str::<S>(&format!(r#"{{"security": "{w}"}}"#))
                .map(|s| s.security)
                .ok()
        };
        assert_eq!(read("plain"), Some(SmtpSecurity::Plain));
        assert_eq!(read("starttls"), Some(SmtpSecurity::Starttls));
        assert_eq!(read("tls"), Some(SmtpSecurity::Tls));
        assert_eq!(read("ssl"), None);
    }

    #[test]
    fn a_timeout_is_transient() {
        let f = classify(&SendError::TimedOut(Duration::from_secs(60)));
        assert_eq!(f.class(), worker_core::FailureClass::Transient);
        assert_eq!(f.detail(), "the SMTP send did not finish within 1m");
    }

    #[test]
    fn truncation_keeps_whole_characters() {
        assert_eq!(truncate("aé", 2), "a");
        assert_eq!(truncate("abc", 5), "abc");
    }
}
