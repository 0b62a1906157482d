//! One message of a mailbox: checked, fetched, pre-scanned and parsed, or set aside, into
//! the row (and event) its batch writes ([`crate::record`]); and the failed attempts a
//! message collects.

use chrono::Utc;
use uuid::Uuid;
use worker_core::Failure;
use worker_messages::{DomainEvent, EMAIL_RECEIVED, EmailReceived, Message, SCHEMA_VERSION_HEADER};
use worker_store::outbox::OutboxMessage;

use crate::fetch::{MAX_HEADER_BYTES, Part, fetch_one};
use crate::ids::*;
use crate::imap::{Session, timed};
use crate::record::Identity;
use crate::*;

/// How one message went.
#[derive(Clone, Copy)]
pub(crate) enum Disposition {
    Stored {
        parse_error: bool,
    },
    TooLarge,
    TooComplex,
    GaveUp,
    Duplicate,
    Vanished,
    /// A delivery status notification: recorded with what it reports, never announced.
    Report,
}

impl Disposition {
    /// The `outcome` of the message's `poll` span.
    pub(crate) fn as_str(&self) -> &'static str {
        match self {
            Self::Stored { .. } => "stored",
            Self::TooLarge => "too-large",
            Self::TooComplex => "too-complex",
            Self::GaveUp => "gave-up",
            Self::Duplicate => "duplicate",
            Self::Vanished => "vanished",
            Self::Report => "delivery-report",
        }
    }
}

/// The span of one message's poll, `poll <account>`: the root of the mail's trace (the
/// outbox row of its `email.received` event stores this span's context, and every later hop
/// continues it), linked to the account's poll in the tick. Its `email.message_id` is
/// recorded once the mail is read, its `outcome` when the message is done.
pub(crate) fn message_span(account: &ImapAccount, uidvalidity: u32, uid: u32) -> tracing::Span {
    let span = tracing::info_span!(
        parent: None,
        "poll",
        otel.name = %format_args!("poll {}", account.name),
        otel.kind = "consumer",
        otel.status_code = tracing::field::Empty,
        job = JOB_NAME,
        account = %account.name,
        mailbox = %account.mailbox,
        imap.uidvalidity = uidvalidity,
        imap.uid = uid,
        inbound_email.id = %inbound_email_id(&account.name, &account.mailbox, uidvalidity, uid),
        email.message_id = tracing::field::Empty,
        outcome = tracing::field::Empty,
    );
    span.follows_from(tracing::Span::current());
    span
}

/// Records the mail's Message-ID on the current (the message's `poll`) span.
pub(crate) fn record_message_id(parsed: &ParsedEmail) {
    if let Some(id) = &parsed.message_id {
        tracing::Span::current().record("email.message_id", id.as_str());
    }
}

/// Why one message failed, and whether the failure is the message's own fault.
pub(crate) struct MessageFailure {
    pub(crate) failure: Failure,
    /// Counts as one of the message's `max_message_attempts`.
    pub(crate) counts_as_attempt: bool,
    /// The IMAP session is in an unknown state and must not be used again.
    pub(crate) session_broken: bool,
}

impl MessageFailure {
    pub(crate) fn imap(err: &ImapError) -> Self {
        use async_imap::error::Error as E;
        let failure = classify_imap(err);
        // What the server says about this message (a NO, an answer we cannot parse, no
        // answer in time) counts against it; a lost connection does not.
        let counts_as_attempt = match err {
            ImapError::Timeout { .. } | ImapError::Protocol { .. } => true,
            ImapError::Io { .. } | ImapError::Handshake { .. } | ImapError::Token(_) => false,
            ImapError::Imap { source, .. } => !matches!(source, E::Io(_) | E::ConnectionLost),
        };
        Self {
            failure,
            counts_as_attempt,
            session_broken: true,
        }
    }

    pub(crate) fn db(failure: Failure) -> Self {
        Self {
            counts_as_attempt: failure.is_permanent(),
            failure,
            session_broken: false,
        }
    }
}

/// A message's failures in a row, kept in memory (a restart forgives them).
#[derive(Debug, Clone)]
pub(crate) struct FailedAttempts {
    count: u32,
    last_error: String,
}

/// The message an attempt is at: account, mailbox, UIDVALIDITY and UID.
pub(crate) type AttemptKey = (String, String, u32, u32);

/// A message read and parsed, waiting for its batch's write.
pub(crate) enum Prepared {
    /// Nothing to write but the last UID past it: stored already under its UID (`Duplicate`),
    /// or gone from the mailbox (`Vanished`).
    Pass(Disposition),
    /// A row to write; what it turns out to be once the batch is written.
    Row(Box<PreparedRow>),
}

/// A row to write (see [`crate::record::BatchRow`], which borrows from it).
pub(crate) struct PreparedRow {
    pub(crate) id: Uuid,
    pub(crate) skip_reason: Option<String>,
    pub(crate) parsed: ParsedEmail,
    pub(crate) raw_size: u64,
    /// `None` when nothing was read (given up on): then its identity is not looked up.
    pub(crate) content_hash: Option<String>,
    /// The event and its stored headers (with the trace context of the mail's span).
    pub(crate) event: Option<(Uuid, OutboxMessage, serde_json::Value)>,
    /// What it is when it is written and is not a duplicate.
    pub(crate) disposition: Disposition,
}

impl PreparedRow {
    /// The bytes it holds, to bound a batch's memory.
    pub(crate) fn bytes(&self) -> usize {
        let p = &self.parsed;
        p.text_body.as_ref().map_or(0, String::len)
            + p.html_body.as_ref().map_or(0, String::len)
            + self.event.as_ref().map_or(0, |(_, m, _)| m.body.len())
    }

    /// What it is looked up by among the mail recorded before (none for a mail not read).
    pub(crate) fn identity(&self) -> Option<Identity<'_>> {
        let hash = self.content_hash.as_deref()?;
        Some(match &self.parsed.message_id {
            Some(id) => Identity::MessageId(id),
            None => Identity::Content(hash),
        })
    }
}

impl InboundEmailPoller {
    /// Reads the message and decides its row, writing nothing: its batch is written once
    /// the tick's messages are read ([`crate::record`]). Runs in the message's span. `body`:
    /// the message's bytes when they were fetched already (by the IDLE session, several
    /// messages in one FETCH); otherwise it is fetched here.
    #[allow(clippy::too_many_arguments)] // one message's coordinates, each its own
    pub(crate) async fn prepare_message(
        &self,
        session: &mut Session,
        account: &ImapAccount,
        uidvalidity: u32,
        uid: u32,
        size: Option<u32>,
        stored: bool,
        body: Option<Vec<u8>>,
    ) -> Result<Prepared, MessageFailure> {
        let (name, mailbox) = (account.name.as_str(), account.mailbox.as_str());
        let limit = self.config.message_timeout;
        if stored {
            return Ok(Prepared::Pass(Disposition::Duplicate));
        }
        let Some(size) = size else {
            return Ok(Prepared::Pass(Disposition::Vanished));
        };
        let id = inbound_email_id(name, mailbox, uidvalidity, uid);
        let key = (name.to_string(), mailbox.to_string(), uidvalidity, uid);
        let row = |skip_reason: Option<String>,
                   parsed: ParsedEmail,
                   content_hash: Option<String>,
                   disposition: Disposition| PreparedRow {
            id,
            skip_reason,
            parsed,
            raw_size: u64::from(size),
            content_hash,
            event: None,
            disposition,
        };

        if let Some(failed) = self.failed_attempts_of(&key)
            && failed.count >= self.config.max_message_attempts
        {
            let reason = format!(
                "gave up after {} failed attempts; the last: {}",
                failed.count, failed.last_error
            );
            tracing::error!(job = JOB_NAME, account = name, uid, %reason, "a message keeps failing: recording it as skipped");
            let gave_up = row(
                Some(reason),
                ParsedEmail::default(),
                None,
                Disposition::GaveUp,
            );
            return Ok(Prepared::Row(Box::new(gave_up)));
        }

        if u64::from(size) > self.config.max_message_bytes {
            let query = format!("BODY.PEEK[HEADER]<0.{MAX_HEADER_BYTES}>");
            let header = timed(
                Stage::Fetch,
                limit,
                fetch_one(session, uid, &query, Part::Header),
            )
            .await
            .map_err(|e| MessageFailure::imap(&e))?;
            let parsed = header
                .as_deref()
                .map(parse::parse_headers)
                .unwrap_or_default();
            record_message_id(&parsed);
            let hash = content_hash(b"header\0", header.as_deref().unwrap_or_default());
            let reason = format!(
                "the message is {size} bytes, over the limit of {} bytes; its body was not fetched",
                self.config.max_message_bytes
            );
            tracing::warn!(
                job = JOB_NAME,
                account = name,
                uid,
                size,
                "a message over the size limit is recorded as skipped"
            );
            let too_large = row(Some(reason), parsed, Some(hash), Disposition::TooLarge);
            return Ok(Prepared::Row(Box::new(too_large)));
        }

        let raw = match body {
            Some(body) => Some(body),
            None => timed(
                Stage::Fetch,
                limit,
                fetch_one(session, uid, "BODY.PEEK[]", Part::Body),
            )
            .await
            .map_err(|e| MessageFailure::imap(&e))?,
        };
        let Some(raw) = raw else {
            return Ok(Prepared::Pass(Disposition::Vanished));
        };
        let hash = content_hash(b"mail\0", &raw);
        let parsed = match parse::parse_within(
            &raw,
            self.config.max_body_chars,
            &self.config.mail_limits,
        ) {
            Ok(parsed) => parsed,
            Err(set_aside) => {
                let parse::SetAside { headers, refused } = *set_aside;
                record_message_id(&headers);
                let reason = format!("{refused}, over the poller's mail limits; not parsed");
                tracing::warn!(job = JOB_NAME, account = name, uid, size, %reason, "a message past the mail limits is recorded as skipped");
                let too_complex = row(Some(reason), headers, Some(hash), Disposition::TooComplex);
                return Ok(Prepared::Row(Box::new(too_complex)));
            }
        };
        drop(raw);
        record_message_id(&parsed);
        if let Some(report) = &parsed.report {
            let reason = crate::bounce::skip_reason(report);
            tracing::info!(job = JOB_NAME, account = name, uid, %reason, "a delivery report: recorded with what it reports, never announced");
            let report = row(Some(reason), parsed, Some(hash), Disposition::Report);
            return Ok(Prepared::Row(Box::new(report)));
        }
        if let Some(error) = &parsed.parse_error {
            tracing::warn!(job = JOB_NAME, account = name, uid, %error, "a message did not parse; it is stored and announced with its parse error");
        }

        let event = email_received_event(id, account, &parsed);
        let message = OutboxMessage::json(event.id.to_string(), EMAIL_RECEIVED, &event)
            .map_err(|e| MessageFailure::db(Failure::permanent("event-encoding", e)))?
            .with_correlation_id(id.to_string())
            .with_header(SCHEMA_VERSION_HEADER, EmailReceived::VERSION)
            .with_header("account", account.name.as_str());
        // Taken here, in the mail's span: its outbox row starts the mail's trace there.
        let headers = message.stored_headers();
        let disposition = Disposition::Stored {
            parse_error: parsed.parse_error.is_some(),
        };
        let mut stored = row(None, parsed, Some(hash), disposition);
        stored.event = Some((event.id, message, headers));
        Ok(Prepared::Row(Box::new(stored)))
    }

    pub(crate) fn failed_attempts_of(&self, key: &AttemptKey) -> Option<FailedAttempts> {
        self.failed_attempts
            .lock()
            .ok()
            .and_then(|failed| failed.get(key).cloned())
    }

    pub(crate) fn count_failed_attempt(&self, key: &AttemptKey, failure: &Failure) {
        if let Ok(mut failed) = self.failed_attempts.lock() {
            let entry = failed.entry(key.clone()).or_insert(FailedAttempts {
                count: 0,
                last_error: String::new(),
            });
            entry.count += 1;
            entry.last_error = failure.to_string();
        }
    }

    pub(crate) fn forgive(&self, key: &AttemptKey) {
        if let Ok(mut failed) = self.failed_attempts.lock() {
            failed.remove(key);
        }
    }
}

/// The `email.received` event for a stored mail.
pub(crate) fn email_received_event(
    id: Uuid,
    account: &ImapAccount,
    parsed: &ParsedEmail,
) -> DomainEvent {
    let data = EmailReceived {
        inbound_email_id: id,
        account: account.name.clone(),
        mailbox: account.mailbox.clone(),
        message_id: parsed.message_id.clone(),
        from: parsed.from_address.clone(),
        from_name: parsed.from_name.clone(),
        to: parsed.to.clone(),
        subject: parsed.subject.clone(),
        text: parsed.text_body.clone(),
        references: parsed.references.clone(),
        parse_error: parsed.parse_error.clone(),
        in_reply_to: parsed.in_reply_to.clone(),
        cc: parsed.cc.clone(),
        date: parsed.sent_at,
        text_truncated: parsed.text_truncated,
        auto_submitted: parsed.auto_submitted.clone(),
        precedence: parsed.precedence.clone(),
        list_id: parsed.list_id.clone(),
        return_path: parsed.return_path.clone(),
        null_sender: parsed.return_path.as_deref() == Some(""),
        x_auto_response_suppress: parsed.x_auto_response_suppress.clone(),
        x_autoreply: parsed.x_autoreply.clone(),
        list_unsubscribe: parsed.list_unsubscribe.clone(),
        list_post: parsed.list_post.clone(),
    };
    DomainEvent {
        id: event_id(id),
        event_type: EMAIL_RECEIVED.into(),
        occurred_at: Utc::now(),
        // A struct of strings, lists and options always serializes.
        data: serde_json::to_value(&data).unwrap_or(serde_json::Value::Null),
    }
}
