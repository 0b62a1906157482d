//! One message of a mailbox: checked, fetched, pre-scanned, parsed and recorded with its
//! event in one transaction, or set aside; and the failed attempts a message collects.

use chrono::Utc;
use uuid::Uuid;
use worker_core::Failure;
use worker_messages::{DomainEvent, EMAIL_RECEIVED, EmailReceived, Message, SCHEMA_VERSION_HEADER};
use worker_store::outbox::OutboxMessage;

use crate::fetch::{MAX_HEADER_BYTES, Part, fetch_one};
use crate::ids::*;
use crate::imap::{Session, timed};
use crate::store::{Identity, NewInbound};
use crate::*;

/// How one message went.
pub(crate) enum Disposition {
    Stored { parse_error: bool },
    TooLarge,
    TooComplex,
    GaveUp,
    Duplicate,
    Vanished,
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
            ImapError::Io { .. } | ImapError::Handshake { .. } => false,
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

impl InboundEmailPoller {
    pub(crate) async fn handle_message(
        &self,
        session: &mut Session,
        account: &ImapAccount,
        uidvalidity: u32,
        uid: u32,
        size: Option<u32>,
        stored: bool,
    ) -> Result<Disposition, MessageFailure> {
        let (name, mailbox) = (account.name.as_str(), account.mailbox.as_str());
        let pool = &self.pool;
        let limit = self.config.message_timeout;
        if stored {
            store::skip_past(pool, name, mailbox, uidvalidity, uid)
                .await
                .map_err(MessageFailure::db)?;
            return Ok(Disposition::Duplicate);
        }
        let Some(size) = size else {
            store::skip_past(pool, name, mailbox, uidvalidity, uid)
                .await
                .map_err(MessageFailure::db)?;
            return Ok(Disposition::Vanished);
        };
        let id = inbound_email_id(name, mailbox, uidvalidity, uid);
        let key = (name.to_string(), mailbox.to_string(), uidvalidity, uid);

        if let Some(failed) = self.failed_attempts_of(&key)
            && failed.count >= self.config.max_message_attempts
        {
            let reason = format!(
                "gave up after {} failed attempts; the last: {}",
                failed.count, failed.last_error
            );
            tracing::error!(job = JOB_NAME, account = name, uid, %reason, "a message keeps failing: recording it as skipped");
            let row = NewInbound {
                id,
                account: name,
                mailbox,
                uidvalidity,
                uid,
                skip_reason: Some(reason),
                parsed: &ParsedEmail::default(),
                raw_size: u64::from(size),
                content_hash: None,
                duplicate_of: None,
            };
            store::record(pool, &row, None)
                .await
                .map_err(MessageFailure::db)?;
            return Ok(Disposition::GaveUp);
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
            if self
                .recorded_before(account, uidvalidity, uid, size, &parsed, &hash)
                .await?
            {
                return Ok(Disposition::Duplicate);
            }
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
            let row = NewInbound {
                id,
                account: name,
                mailbox,
                uidvalidity,
                uid,
                skip_reason: Some(reason),
                parsed: &parsed,
                raw_size: u64::from(size),
                content_hash: Some(&hash),
                duplicate_of: None,
            };
            store::record(pool, &row, None)
                .await
                .map_err(MessageFailure::db)?;
            return Ok(Disposition::TooLarge);
        }

        let raw = timed(
            Stage::Fetch,
            limit,
            fetch_one(session, uid, "BODY.PEEK[]", Part::Body),
        )
        .await
        .map_err(|e| MessageFailure::imap(&e))?;
        let Some(raw) = raw else {
            store::skip_past(pool, name, mailbox, uidvalidity, uid)
                .await
                .map_err(MessageFailure::db)?;
            return Ok(Disposition::Vanished);
        };
        let hash = content_hash(b"mail\0", &raw);
        let parsed =
            match parse::parse_within(&raw, self.config.max_body_chars, &self.config.mail_limits) {
                Ok(parsed) => parsed,
                Err(set_aside) => {
                    return self
                        .set_aside(account, uidvalidity, uid, size, *set_aside, &hash)
                        .await;
                }
            };
        record_message_id(&parsed);
        if self
            .recorded_before(account, uidvalidity, uid, size, &parsed, &hash)
            .await?
        {
            return Ok(Disposition::Duplicate);
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
        let row = NewInbound {
            id,
            account: name,
            mailbox,
            uidvalidity,
            uid,
            skip_reason: None,
            parsed: &parsed,
            raw_size: u64::from(size),
            content_hash: Some(&hash),
            duplicate_of: None,
        };
        let inserted = store::record(
            pool,
            &row,
            Some((
                &self.config.events_exchange,
                EMAIL_RECEIVED,
                &message,
                event.id,
            )),
        )
        .await
        .map_err(MessageFailure::db)?;
        if inserted {
            Ok(Disposition::Stored {
                parse_error: parsed.parse_error.is_some(),
            })
        } else {
            Ok(Disposition::Duplicate)
        }
    }

    /// Records a mail the pre-scan set aside: `skipped` with the limit it passed, the fields
    /// of its own header section when those could be read, no event.
    pub(crate) async fn set_aside(
        &self,
        account: &ImapAccount,
        uidvalidity: u32,
        uid: u32,
        size: u32,
        set_aside: parse::SetAside,
        hash: &str,
    ) -> Result<Disposition, MessageFailure> {
        let (name, mailbox) = (account.name.as_str(), account.mailbox.as_str());
        let pool = &self.pool;
        let id = inbound_email_id(name, mailbox, uidvalidity, uid);
        let parsed = set_aside.headers;
        let refused = set_aside.refused;
        record_message_id(&parsed);
        if self
            .recorded_before(account, uidvalidity, uid, size, &parsed, hash)
            .await?
        {
            return Ok(Disposition::Duplicate);
        }
        let reason = format!("{refused}, over the poller's mail limits; not parsed");
        tracing::warn!(job = JOB_NAME, account = name, uid, size, %reason, "a message past the mail limits is recorded as skipped");
        let row = NewInbound {
            id,
            account: name,
            mailbox,
            uidvalidity,
            uid,
            skip_reason: Some(reason),
            parsed: &parsed,
            raw_size: u64::from(size),
            content_hash: Some(hash),
            duplicate_of: None,
        };
        store::record(pool, &row, None)
            .await
            .map_err(MessageFailure::db)?;
        Ok(Disposition::TooComplex)
    }

    /// Whether this mail was recorded before from this mailbox under another UID (moved out
    /// and back, a mailbox rebuilt, a Message-ID reused): if so, its own row is recorded
    /// `skipped`, naming the earlier one, with no event, and the last UID moves past it.
    pub(crate) async fn recorded_before(
        &self,
        account: &ImapAccount,
        uidvalidity: u32,
        uid: u32,
        size: u32,
        parsed: &ParsedEmail,
        hash: &str,
    ) -> Result<bool, MessageFailure> {
        let (pool, name, mailbox) = (&self.pool, &account.name, &account.mailbox);
        let identity = match &parsed.message_id {
            Some(id) => Identity::MessageId(id),
            None => Identity::Content(hash),
        };
        let Some(earlier) = store::earlier(pool, name, mailbox, uidvalidity, uid, identity)
            .await
            .map_err(MessageFailure::db)?
        else {
            return Ok(false);
        };
        let same = match identity {
            Identity::MessageId(id) => format!("the same Message-ID {id}"),
            Identity::Content(hash) => format!("the same content (SHA-256 {hash})"),
        };
        let reason = format!(
            "a duplicate of the mail recorded as {} (UIDVALIDITY {}, UID {}): {same}; not announced again",
            earlier.id, earlier.uidvalidity, earlier.uid
        );
        tracing::info!(job = JOB_NAME, account = %name, uid, duplicate_of = %earlier.id, "a mail recorded before under another UID: recorded as a duplicate, not announced");
        let row = NewInbound {
            id: inbound_email_id(name, mailbox, uidvalidity, uid),
            account: name,
            mailbox,
            uidvalidity,
            uid,
            skip_reason: Some(reason),
            parsed,
            raw_size: u64::from(size),
            content_hash: Some(hash),
            duplicate_of: Some(earlier.id),
        };
        store::record(pool, &row, None)
            .await
            .map_err(MessageFailure::db)?;
        Ok(true)
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
