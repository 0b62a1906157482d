//! The poller, bare: one IMAP session that stays signed in and selected. Every `recheck` (half
//! of it after a recheck that found mail, by the host's own `next_recheck`) it asks the
//! server to look (`NOOP`, the host's default recheck on loopback: Dovecot holds its IDLE
//! notices back by 500 ms); on `EXISTS` or `RECENT` it fetches what is past the last UID
//! on the same session (sizes, then the bodies within the size limit, two commands for the
//! whole batch) and writes the batch with the poller's own statement (`record_batch`: the
//! UIDVALIDITY guard, the identity look-ups, the rows and their `email.received` outbox rows).
//! The last UID is kept in memory between batches: this is the only replica.

use std::time::Duration;

use async_imap::types::UnsolicitedResponse;
use chrono::Utc;
use futures::TryStreamExt;
use serde_json::Value;
use sha2::{Digest, Sha256};
use sqlx::PgPool;
use tracing::Instrument;
use uuid::Uuid;
use worker_messages::{DomainEvent, EMAIL_RECEIVED, EmailReceived, Message, SCHEMA_VERSION_HEADER};
use worker_store::outbox::OutboxMessage;

use job_inbound_email_poller::{
    Batch, BatchEvent, BatchRow, Identity, ParsedEmail, PollerConfig, event_id, inbound_email_id,
    next_recheck, record_batch,
};

const MAILBOX: &str = "INBOX";

type Session = async_imap::Session<tokio::net::TcpStream>;

pub struct Poller {
    session: Session,
    account: String,
    uidvalidity: u32,
    last_uid: u32,
    config: PollerConfig,
}

/// One fetched mail, read and decided, before its row is written.
struct Read {
    id: Uuid,
    uid: u32,
    skip_reason: Option<String>,
    parsed: ParsedEmail,
    raw_size: u64,
    content_hash: Option<String>,
    event: Option<(Uuid, OutboxMessage, Value)>,
}

impl Poller {
    /// Signs in, selects the mailbox and starts it after its last message (the mail the bench
    /// sends comes later), with the poller's own statement for that (`start_at`'s).
    pub async fn start(pool: &PgPool, imap_addr: &str, account: &str) -> anyhow::Result<Self> {
        let stream = tokio::net::TcpStream::connect(imap_addr).await?;
        stream.set_nodelay(true)?;
        let mut client = async_imap::Client::new(stream);
        client.read_response().await?;
        let mut session = client
            .login(account, "secret")
            .await
            .map_err(|(err, _)| err)?;
        let mailbox = session.select(MAILBOX).await?;
        let uidvalidity = mailbox.uid_validity.unwrap_or(1);
        let last_uid = mailbox.uid_next.unwrap_or(1).saturating_sub(1);
        sqlx::query(
            "INSERT INTO imap_poll_state (account, mailbox, uidvalidity, last_uid) \
             VALUES ($1, $2, $3, $4) \
             ON CONFLICT (account, mailbox) DO UPDATE \
             SET uidvalidity = EXCLUDED.uidvalidity, last_uid = EXCLUDED.last_uid, updated_at = now()",
        )
        .bind(account)
        .bind(MAILBOX)
        .bind(i64::from(uidvalidity))
        .bind(i64::from(last_uid))
        .execute(pool)
        .await?;
        Ok(Self {
            session,
            account: account.to_string(),
            uidvalidity,
            last_uid,
            config: PollerConfig::default(),
        })
    }

    pub async fn run(mut self, pool: PgPool, recheck: Duration) -> anyhow::Result<()> {
        // A batch that failed is read again at the next recheck, news or not: the last UID
        // moved only with the rows.
        let mut behind = false;
        let mut next = tokio::time::Instant::now();
        loop {
            tokio::time::sleep_until(next).await;
            let started = tokio::time::Instant::now();
            self.session.noop().await?;
            let mut news = behind;
            while let Ok(response) = self.session.unsolicited_responses.try_recv() {
                news |= matches!(
                    response,
                    UnsolicitedResponse::Exists(_) | UnsolicitedResponse::Recent(_)
                );
            }
            if news {
                let span = tracing::info_span!("poll", account = %self.account);
                behind = match self.fetch_new(&pool).instrument(span).await {
                    Ok(()) => false,
                    Err(err) => {
                        eprintln!("poll: {err}");
                        true
                    }
                };
            }
            // The host's rule: sooner after news, the whole interval after none.
            next = next_recheck(started, tokio::time::Instant::now(), recheck, news);
        }
    }

    /// `UID FETCH last+1:* (UID RFC822.SIZE)`, then the bodies of those within the size
    /// limit in one `UID FETCH`, then the batch's one statement.
    async fn fetch_new(&mut self, pool: &PgPool) -> anyhow::Result<()> {
        let sizes: Vec<(u32, u32)> = self
            .session
            .uid_fetch(format!("{}:*", self.last_uid + 1), "(UID RFC822.SIZE)")
            .await?
            .try_collect::<Vec<_>>()
            .await?
            .iter()
            // `n:*` matches the last message even when it is older than `n`.
            .filter_map(|f| Some((f.uid?, f.size?)))
            .filter(|(uid, _)| *uid > self.last_uid)
            .collect();
        let Some(last_uid) = sizes.iter().map(|(uid, _)| *uid).max() else {
            return Ok(());
        };
        let within: Vec<String> = sizes
            .iter()
            .filter(|(_, size)| u64::from(*size) <= self.config.max_message_bytes)
            .map(|(uid, _)| uid.to_string())
            .collect();
        let mut bodies = std::collections::HashMap::new();
        if !within.is_empty() {
            let fetched: Vec<_> = self
                .session
                .uid_fetch(within.join(","), "(UID BODY.PEEK[])")
                .await?
                .try_collect()
                .await?;
            for f in &fetched {
                if let (Some(uid), Some(body)) = (f.uid, f.body()) {
                    bodies.insert(uid, body.to_vec());
                }
            }
        }
        let read: Vec<Read> = sizes
            .iter()
            .map(|&(uid, size)| self.read(uid, size, bodies.get(&uid).map(Vec::as_slice)))
            .collect::<anyhow::Result<_>>()?;
        let rows: Vec<BatchRow<'_>> = read
            .iter()
            .map(|r| BatchRow {
                id: r.id,
                uid: r.uid,
                skip_reason: r.skip_reason.as_deref(),
                parsed: &r.parsed,
                raw_size: r.raw_size,
                content_hash: r.content_hash.as_deref(),
                identity: match (&r.parsed.message_id, &r.content_hash) {
                    (Some(id), _) => Some(Identity::MessageId(id)),
                    (None, Some(hash)) => Some(Identity::Content(hash)),
                    (None, None) => None,
                },
                event: r.event.as_ref().map(|(id, message, headers)| BatchEvent {
                    id: *id,
                    message,
                    headers,
                }),
            })
            .collect();
        record_batch(
            pool,
            &Batch {
                account: &self.account,
                mailbox: MAILBOX,
                uidvalidity: self.uidvalidity,
                last_uid,
                exchange: &self.config.events_exchange,
                routing_key: EMAIL_RECEIVED,
                rows: &rows,
            },
        )
        .await?;
        self.last_uid = last_uid;
        Ok(())
    }

    /// The mail's row, as the poller decides it: over the size limit or past the mail limits,
    /// skipped with its reason; else parsed, stored and announced.
    fn read(&self, uid: u32, size: u32, raw: Option<&[u8]>) -> anyhow::Result<Read> {
        let id = inbound_email_id(&self.account, MAILBOX, self.uidvalidity, uid);
        let skipped = |reason: String, parsed: ParsedEmail, hash: Option<String>| Read {
            id,
            uid,
            skip_reason: Some(reason),
            parsed,
            raw_size: u64::from(size),
            content_hash: hash,
            event: None,
        };
        let Some(raw) = raw else {
            return Ok(skipped(
                format!("the message is {size} bytes, over the size limit"),
                ParsedEmail::default(),
                None,
            ));
        };
        let hash = content_hash(raw);
        let parsed = match job_inbound_email_poller::parse::parse_within(
            raw,
            self.config.max_body_chars,
            &self.config.mail_limits,
        ) {
            Ok(parsed) => parsed,
            Err(set_aside) => {
                let reason = format!("{}, over the poller's mail limits", set_aside.refused);
                return Ok(skipped(reason, set_aside.headers, Some(hash)));
            }
        };
        if parsed.report.is_some() {
            return Ok(skipped("a delivery report".into(), parsed, Some(hash)));
        }
        let event = received_event(id, &self.account, &parsed);
        let message = OutboxMessage::json(event.id.to_string(), EMAIL_RECEIVED, &event)?
            .with_correlation_id(id.to_string())
            .with_header(SCHEMA_VERSION_HEADER, EmailReceived::VERSION)
            .with_header("account", self.account.as_str());
        let headers = message.stored_headers();
        Ok(Read {
            id,
            uid,
            skip_reason: None,
            parsed,
            raw_size: u64::from(size),
            content_hash: Some(hash),
            event: Some((event.id, message, headers)),
        })
    }
}

/// The poller's identity hash of a whole mail (its `content_hash` with the `mail` label).
fn content_hash(raw: &[u8]) -> String {
    let digest = Sha256::new()
        .chain_update(b"mail\0")
        .chain_update(raw)
        .finalize();
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

/// The `email.received` event, field for field as the poller writes it.
fn received_event(id: Uuid, account: &str, parsed: &ParsedEmail) -> DomainEvent {
    let data = EmailReceived {
        inbound_email_id: id,
        account: account.to_string(),
        mailbox: MAILBOX.to_string(),
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
        data: serde_json::to_value(&data).unwrap_or(Value::Null),
    }
}
