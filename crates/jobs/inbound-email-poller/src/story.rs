//! What the poller recorded of a mail, read back for its story (`worker-host mail show`, the
//! console's `/mail/{id}`) and found by a search (`mail find`): the row of `inbound_emails`,
//! and the `email.received` event's data as it carried it, rebuilt from that row.

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::PgPool;
use uuid::Uuid;
use worker_core::Failure;
use worker_messages::{DomainEvent, EMAIL_RECEIVED, EmailReceived};
use worker_store::classify;

/// An inbound mail as the poller stored it (bodies left out but the text's start).
#[derive(Debug, Clone, PartialEq, Serialize, sqlx::FromRow)]
pub struct StoredMail {
    pub id: Uuid,
    pub account: String,
    pub mailbox: String,
    pub uidvalidity: i64,
    pub uid: i64,
    /// `stored` (and announced), or `skipped` (see `skip_reason`).
    pub status: String,
    pub skip_reason: Option<String>,
    pub message_id: Option<String>,
    pub from_address: Option<String>,
    pub from_name: Option<String>,
    pub to_addresses: Vec<String>,
    pub cc_addresses: Vec<String>,
    pub subject: Option<String>,
    /// The Date header.
    pub sent_at: Option<DateTime<Utc>>,
    pub in_reply_to: Option<String>,
    pub reference_ids: Vec<String>,
    pub text_body: Option<String>,
    pub text_truncated: bool,
    pub raw_size: i64,
    pub parse_error: Option<String>,
    /// The `email.received` event announced with the row (none for a skipped mail).
    pub event_id: Option<Uuid>,
    /// When the row was committed.
    pub received_at: DateTime<Utc>,
    /// For a skipped duplicate: the mail it duplicates.
    pub duplicate_of: Option<Uuid>,
}

const COLUMNS: &str = "id, account, mailbox, uidvalidity, uid, status, skip_reason, message_id, \
    from_address, from_name, to_addresses, cc_addresses, subject, sent_at, in_reply_to, \
    reference_ids, text_body, text_truncated, raw_size, parse_error, event_id, received_at, \
    duplicate_of";

impl StoredMail {
    /// The `email.received` event's data as the poller announced it, for the automations'
    /// conditions. The loop headers (Auto-Submitted, Precedence, List-Id, ...) are not stored,
    /// so they read as absent here.
    pub fn event(&self) -> Option<DomainEvent> {
        let event_id = self.event_id?;
        let data = EmailReceived {
            inbound_email_id: self.id,
            account: self.account.clone(),
            mailbox: self.mailbox.clone(),
            message_id: self.message_id.clone(),
            from: self.from_address.clone(),
            from_name: self.from_name.clone(),
            to: self.to_addresses.clone(),
            subject: self.subject.clone(),
            text: self.text_body.clone(),
            references: self.reference_ids.clone(),
            parse_error: self.parse_error.clone(),
            in_reply_to: self.in_reply_to.clone(),
            cc: self.cc_addresses.clone(),
            date: self.sent_at,
            text_truncated: self.text_truncated,
            auto_submitted: None,
            precedence: None,
            list_id: None,
            return_path: None,
            null_sender: false,
            x_auto_response_suppress: None,
            x_autoreply: None,
            list_unsubscribe: None,
            list_post: None,
        };
        Some(DomainEvent {
            id: event_id,
            event_type: EMAIL_RECEIVED.into(),
            occurred_at: self.received_at,
            data: serde_json::to_value(&data).unwrap_or(serde_json::Value::Null),
        })
    }
}

/// The stored mail `id`, if it is (still) there.
pub async fn stored_mail(pool: &PgPool, id: Uuid) -> Result<Option<StoredMail>, Failure> {
    sqlx::query_as(&format!(
        "SELECT {COLUMNS} FROM inbound_emails WHERE id = $1"
    ))
    .bind(id)
    .fetch_optional(pool)
    .await
    .map_err(classify)
}

/// What a search for mails asks. Every field narrows; none set finds the newest mails.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MailSearch {
    /// The sender's address, any case.
    pub from: Option<String>,
    /// The Message-ID, with or without angle brackets.
    pub message_id: Option<String>,
    /// A part of the subject, any case.
    pub subject: Option<String>,
    /// Only the mails announced by these events (the answers to one recipient, say).
    pub event_ids: Option<Vec<Uuid>>,
    pub since: Option<DateTime<Utc>>,
    pub until: Option<DateTime<Utc>>,
    /// A page after this mail (received time and id of the last one of the previous page).
    pub after: Option<(DateTime<Utc>, Uuid)>,
    pub limit: u32,
}

/// The mails a search finds, newest first, a page at a time (keyset paging on
/// `(received_at, id)`, so a page costs the same however deep it is).
pub async fn find(pool: &PgPool, search: &MailSearch) -> Result<Vec<StoredMail>, Failure> {
    let message_id = search.message_id.as_deref().map(|m| {
        m.trim()
            .trim_start_matches('<')
            .trim_end_matches('>')
            .to_string()
    });
    let subject = search.subject.as_deref().map(|s| {
        format!(
            "%{}%",
            s.replace('\\', "\\\\")
                .replace('%', "\\%")
                .replace('_', "\\_")
        )
    });
    let (after_at, after_id) = search.after.unzip();
    sqlx::query_as(&format!(
        "SELECT {COLUMNS} FROM inbound_emails \
         WHERE ($1::text IS NULL OR lower(from_address) = lower($1)) \
           AND ($2::text IS NULL OR message_id = $2) \
           AND ($3::text IS NULL OR subject ILIKE $3) \
           AND ($4::uuid[] IS NULL OR event_id = ANY($4)) \
           AND ($5::timestamptz IS NULL OR received_at >= $5) \
           AND ($6::timestamptz IS NULL OR received_at < $6) \
           AND ($7::timestamptz IS NULL OR (received_at, id) < ($7, $8)) \
         ORDER BY received_at DESC, id DESC LIMIT $9"
    ))
    .bind(search.from.as_deref().map(str::trim))
    .bind(message_id)
    .bind(subject)
    .bind(search.event_ids.as_deref())
    .bind(search.since)
    .bind(search.until)
    .bind(after_at)
    .bind(after_id)
    .bind(i64::from(search.limit.clamp(1, 500)))
    .fetch_all(pool)
    .await
    .map_err(classify)
}
