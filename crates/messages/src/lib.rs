//! The messages the jobs exchange over the broker, and how they are routed.
//!
//! Jobs never depend on each other; they agree on these shapes instead. Every message is JSON.
//! A domain event goes to the events exchange with its type as the routing key; a command
//! goes to the commands exchange with the consuming queue's name as the routing key.
//!
//! Every message on the broker carries its schema version in the AMQP header
//! [`SCHEMA_VERSION_HEADER`], set by whoever writes its outbox row from [`Message::VERSION`];
//! a message without the header is version 1. The rule for changing a message is
//! ARCHITECTURE.md's "Message contract"; `tests/fixtures/` holds each message as each release
//! wrote it, and today's types must read them all.

use chrono::{DateTime, Utc};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use uuid::Uuid;

pub mod automation;

pub use automation::{AutomationAction, SendEmailAction, WebhookAction, redact_url};

/// The AMQP `type` property and routing key of the event the inbound poller emits.
pub const EMAIL_RECEIVED: &str = "email.received";
/// The routing key (and default queue) of [`ActionCommand`].
pub const AUTOMATION_ACTION: &str = "automation.action";
/// The routing key (and default queue) of [`EmailSendCommand`].
pub const EMAIL_SEND: &str = "email.send";
/// The AMQP `type` property and routing key of an [`AuditEntry`], on the events exchange.
pub const AUDIT_ENTRY: &str = "audit.entry";

/// Message types published to the events exchange that are not domain events (no `type`
/// field, no automations): a consumer of every event (`#`) skips them rather than
/// dead-letter them as malformed, since another consumer owns them.
pub const NOT_DOMAIN_EVENTS: &[&str] = &[AUDIT_ENTRY];

/// The AMQP header (an integer) that carries a message's schema version. A consumer refuses a
/// version newer than it reads, permanently, rather than misreading it.
pub const SCHEMA_VERSION_HEADER: &str = "x-schema-version";

/// The version of a message that carries no [`SCHEMA_VERSION_HEADER`]: every message written
/// before the header existed had the version-1 shapes.
pub const UNVERSIONED: u32 = 1;

/// A message type on the broker, with the schema version this release writes and reads.
///
/// `VERSION` changes only for a breaking change (a field removed, renamed or retyped, a
/// meaning changed); an added field is optional and keeps the version. The release that
/// raises it must still read every older version that can be in flight, and adds the new
/// version's fixture (`tests/fixtures/<TYPE>.v<VERSION>.json`).
pub trait Message: Serialize + DeserializeOwned {
    /// The AMQP `type` property and routing key (`email.send`).
    const TYPE: &'static str;
    /// The schema version this release writes, and the newest it reads.
    const VERSION: u32;
}

/// The `data` of an `email.received` event: its version is the whole event's, the
/// [`DomainEvent`] envelope included.
impl Message for EmailReceived {
    const TYPE: &'static str = EMAIL_RECEIVED;
    const VERSION: u32 = 1;
}

impl Message for ActionCommand {
    const TYPE: &'static str = AUTOMATION_ACTION;
    const VERSION: u32 = 1;
}

impl Message for EmailSendCommand {
    const TYPE: &'static str = EMAIL_SEND;
    const VERSION: u32 = 1;
}

impl Message for AuditEntry {
    const TYPE: &'static str = AUDIT_ENTRY;
    const VERSION: u32 = 1;
}

/// The default queue of each consumer job. A command queue is named after its command's
/// routing key, so a command published with that key reaches it on the commands exchange.
pub mod queues {
    /// Every domain event (bound with `#` on the events exchange), for the automation trigger.
    pub const AUTOMATION_TRIGGER: &str = "automation.trigger";
    /// The topic patterns the automation trigger's queue is bound with: every event.
    pub const AUTOMATION_TRIGGER_EVENTS: &[&str] = &["#"];
    /// [`ActionCommand`](crate::ActionCommand)s, for the automation action.
    pub const AUTOMATION_ACTION: &str = crate::AUTOMATION_ACTION;
    /// [`EmailSendCommand`](crate::EmailSendCommand)s, for the email send.
    pub const EMAIL_SEND: &str = crate::EMAIL_SEND;
    /// [`AuditEntry`](crate::AuditEntry)s, for the audit log.
    pub const AUDIT_LOG: &str = "audit.log";
    /// The topic patterns the audit log's queue is bound with: audit entries only.
    pub const AUDIT_LOG_EVENTS: &[&str] = &[crate::AUDIT_ENTRY];
}

/// A domain event: something that happened, which automations may react to.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DomainEvent {
    /// Unique per event; a redelivered or republished event keeps it.
    pub id: Uuid,
    /// `email.received`, …: also the routing key on the events exchange.
    #[serde(rename = "type")]
    pub event_type: String,
    pub occurred_at: DateTime<Utc>,
    /// The event's fields, which automation conditions and templates read.
    pub data: serde_json::Value,
}

impl DomainEvent {
    /// The schema version of the envelope alone (`id`, `type`, `occurred_at`, `data`), which an
    /// event of a type this release has no data type for is read by.
    pub const ENVELOPE_VERSION: u32 = 1;

    /// The newest schema version of an event of `event_type` that this release reads: its
    /// data type's [`Message::VERSION`] when it has one, else the envelope's.
    pub fn reads_version(event_type: &str) -> u32 {
        match event_type {
            EMAIL_RECEIVED => EmailReceived::VERSION,
            _ => Self::ENVELOPE_VERSION,
        }
    }
}

/// The fields of an `email.received` event's `data`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EmailReceived {
    /// The stored inbound email's row id.
    pub inbound_email_id: Uuid,
    /// The IMAP account's name in the settings.
    pub account: String,
    pub mailbox: String,
    /// The Message-ID header, without angle brackets, when the mail had one.
    pub message_id: Option<String>,
    /// The sender's address (`alice@example.com`), when it parsed.
    pub from: Option<String>,
    /// The sender's display name, when it had one.
    pub from_name: Option<String>,
    pub to: Vec<String>,
    pub subject: Option<String>,
    /// The plain-text body, bounded in size.
    pub text: Option<String>,
    /// The References header's message ids, oldest first.
    pub references: Vec<String>,
    /// Set when the mail did not parse; the event is still emitted.
    pub parse_error: Option<String>,
    /// The In-Reply-To header's message id, without angle brackets.
    #[serde(default)]
    pub in_reply_to: Option<String>,
    /// The Cc addresses.
    #[serde(default)]
    pub cc: Vec<String>,
    /// The Date header, when it parsed.
    #[serde(default)]
    pub date: Option<DateTime<Utc>>,
    /// Whether the text body was cut at the poller's limit.
    #[serde(default)]
    pub text_truncated: bool,
    /// The Auto-Submitted header (RFC 3834), as sent: anything but `no` means a machine sent
    /// it, and it must not be answered automatically.
    #[serde(default)]
    pub auto_submitted: Option<String>,
    /// The Precedence header (`bulk`, `junk`, `list` mark mail not to answer).
    #[serde(default)]
    pub precedence: Option<String>,
    /// The List-Id header: the mail came through a mailing list.
    #[serde(default)]
    pub list_id: Option<String>,
    /// The envelope sender, from the Return-Path header the delivering server added, without
    /// angle brackets: empty for the null sender (`<>`, a bounce or another notice).
    #[serde(default)]
    pub return_path: Option<String>,
    /// The envelope sender was null (`Return-Path: <>`).
    #[serde(default)]
    pub null_sender: bool,
    /// Microsoft's X-Auto-Response-Suppress (`All`, `OOF`, `DR, RN, NRN`, …): anything but
    /// `None` asks that no automatic answer be sent.
    #[serde(default)]
    pub x_auto_response_suppress: Option<String>,
    /// X-Autoreply (`yes`): an autoresponder sent it, whatever the value.
    #[serde(default)]
    pub x_autoreply: Option<String>,
    /// The List-Unsubscribe header: the mail came through a mailing list.
    #[serde(default)]
    pub list_unsubscribe: Option<String>,
    /// The List-Post header: the mail came through a mailing list.
    #[serde(default)]
    pub list_post: Option<String>,
}

/// Run one action of one automation for one event (queue `automation.action`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ActionCommand {
    /// Derived from (event id, automation id, action position): a duplicate event produces
    /// the same id, and the executor's guard drops the duplicate.
    pub action_execution_id: Uuid,
    pub automation_id: Uuid,
    pub event_id: Uuid,
    /// The action's position in the automation's list, from 0.
    pub action_index: u32,
}

/// Send one stored outbound email (queue `email.send`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EmailSendCommand {
    /// The `outbound_emails` row to send, its id derived from the action execution id that
    /// queued it. `email_message_id` on the wire, its name before: published messages, the
    /// fixtures and the other side of the contract carry it.
    #[serde(rename = "email_message_id")]
    pub outbound_email_id: Uuid,
}

/// One entry of another team's audit log (`audit.entry` on the events exchange; its AMQP
/// `message_id` is `id`): who did what to which entity, stored once by `id`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AuditEntry {
    /// Unique per entry; a redelivered or republished entry keeps it.
    pub id: Uuid,
    pub occurred_at: DateTime<Utc>,
    pub actor: String,
    pub action: String,
    pub entity_type: String,
    pub entity_id: String,
    /// The entry's details: a JSON object.
    pub data: serde_json::Map<String, serde_json::Value>,
}

/// The namespace of the deterministic (v5) ids derived here.
const ID_NAMESPACE: Uuid = Uuid::from_u128(0x5f1e_8a3c_2b7d_4e90_9c41_7a26_d0b3_e815);

/// The action execution id for (event, automation, action position): the same inputs give
/// the same id on every replica and every redelivery.
pub fn action_execution_id(event_id: Uuid, automation_id: Uuid, action_index: u32) -> Uuid {
    let mut name = Vec::with_capacity(36);
    name.extend_from_slice(event_id.as_bytes());
    name.extend_from_slice(automation_id.as_bytes());
    name.extend_from_slice(&action_index.to_be_bytes());
    Uuid::new_v5(&ID_NAMESPACE, &name)
}

/// The outbound email id for the action execution that queues it.
pub fn outbound_email_id(action_execution_id: Uuid) -> Uuid {
    let mut name = b"email:".to_vec();
    name.extend_from_slice(action_execution_id.as_bytes());
    Uuid::new_v5(&ID_NAMESPACE, &name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn derived_ids_are_stable_and_distinct() {
        let (event, automation) = (Uuid::new_v4(), Uuid::new_v4());
        assert_eq!(
            action_execution_id(event, automation, 0),
            action_execution_id(event, automation, 0)
        );
        assert_ne!(
            action_execution_id(event, automation, 0),
            action_execution_id(event, automation, 1)
        );
        assert_ne!(
            action_execution_id(event, automation, 0),
            action_execution_id(automation, event, 0)
        );
        let execution = action_execution_id(event, automation, 0);
        assert_eq!(outbound_email_id(execution), outbound_email_id(execution));
        assert_ne!(outbound_email_id(execution), execution);
    }

    #[test]
    fn an_event_round_trips_with_its_type_field() {
        let event = DomainEvent {
            id: Uuid::new_v4(),
            event_type: EMAIL_RECEIVED.into(),
            occurred_at: Utc::now(),
            data: serde_json::json!({"subject": "ping"}),
        };
        let json = serde_json::to_value(&event).unwrap();
        assert_eq!(json["type"], EMAIL_RECEIVED);
        assert_eq!(serde_json::from_value::<DomainEvent>(json).unwrap(), event);
    }
}
