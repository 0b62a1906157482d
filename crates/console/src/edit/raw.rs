//! A malformed dead letter's body, edited (issue 26): the new body must decode as the
//! message's type (the types of `worker-messages`, the ones its consumer decodes) before it is
//! accepted; then, in one transaction, it goes into the outbox to where a replay would send it
//! (its queue through the default exchange, an outbox row's own exchange and key), the audit
//! entry records the diff, and the dead letter is settled `edited`. The same one-time key
//! answers a double submit as the mail edit's does.

use serde::Serialize;
use serde_json::{Value, json};
use sqlx::PgPool;
use uuid::Uuid;
use worker_core::Failure;
use worker_messages::{
    ActionCommand, DomainEvent, EMAIL_RECEIVED, EmailReceived, EmailSendCommand, Message,
    SCHEMA_VERSION_HEADER, queues,
};
use worker_store::audit::{self, Actor, EntryKind, NewEntry};
use worker_store::dead_letters::{REPLAYED_FROM_HEADER, Source, edited};
use worker_store::outbox::{self, OutboxMessage};

use super::form::body_diff;

/// The namespace of an edited body's message id.
const RAW_NAMESPACE: Uuid = Uuid::from_u128(0x1b7e_9a52_c0d4_4f38_a6e1_5d92_37c0_b4f8);

/// The reason a dead letter's body never decoded.
const MALFORMED: &str = "malformed";

/// What an accepted body edit did.
#[derive(Debug, Clone, Serialize)]
pub struct EditedBody {
    /// `published` (through the outbox), or `already-published` (a double submit).
    pub outcome: &'static str,
    pub dead_letter: i64,
    /// The new message's id.
    pub message_id: String,
    pub action_id: i64,
}

/// Why a body edit was not accepted.
#[derive(Debug)]
pub enum BodyError {
    NotFound,
    /// The dead letter cannot be edited so (settled already, or not malformed).
    Refused(String),
    /// The body does not decode as the message's type.
    Invalid(String),
    Failed(Failure),
}

impl From<Failure> for BodyError {
    fn from(failure: Failure) -> Self {
        Self::Failed(failure)
    }
}

/// The type a dead letter's message has: its `type` property, else its queue's.
pub fn message_type(message_type: Option<&str>, queue: &str) -> Option<&'static str> {
    let by_queue = match queue {
        queues::EMAIL_SEND => Some(EmailSendCommand::TYPE),
        queues::AUTOMATION_ACTION => Some(ActionCommand::TYPE),
        queues::AUTOMATION_TRIGGER => Some(EMAIL_RECEIVED),
        _ => None,
    };
    match message_type {
        Some(t) if t == EmailSendCommand::TYPE => Some(EmailSendCommand::TYPE),
        Some(t) if t == ActionCommand::TYPE => Some(ActionCommand::TYPE),
        Some(t) if t == EMAIL_RECEIVED => Some(EMAIL_RECEIVED),
        _ => by_queue,
    }
}

/// Decodes `body` as `kind` (as its consumer would); the message's schema version.
pub fn decode(kind: &str, body: &str) -> Result<u32, String> {
    fn as_type<T: Message>(body: &str) -> Result<u32, String> {
        serde_json::from_str::<T>(body)
            .map(|_| T::VERSION)
            .map_err(|e| format!("the body does not decode as `{}`: {e}", T::TYPE))
    }
    match kind {
        k if k == EmailSendCommand::TYPE => as_type::<EmailSendCommand>(body),
        k if k == ActionCommand::TYPE => as_type::<ActionCommand>(body),
        EMAIL_RECEIVED => {
            let event: DomainEvent = serde_json::from_str(body)
                .map_err(|e| format!("the body does not decode as an event: {e}"))?;
            if event.event_type == EMAIL_RECEIVED {
                serde_json::from_value::<EmailReceived>(event.data).map_err(|e| {
                    format!("the event's `data` does not decode as `{EMAIL_RECEIVED}`: {e}")
                })?;
            }
            Ok(DomainEvent::reads_version(&event.event_type))
        }
        other => Err(format!(
            "no message type `{other}` is known to check the body against"
        )),
    }
}

/// Edits the malformed dead letter `id`'s body to `body`, with the form `key`, as `actor`.
pub async fn edit_body(
    pool: &PgPool,
    id: i64,
    key: Uuid,
    body: &str,
    actor: &Actor,
) -> Result<EditedBody, BodyError> {
    let db = worker_store::classify;
    let mut tx = pool.begin().await.map_err(db)?;
    let by_key = json!({ "edit_key": key, "dead_letter_id": id });
    let first = |entry: audit::Entry| EditedBody {
        outcome: "already-published",
        dead_letter: id,
        message_id: entry.filter["message_id"]
            .as_str()
            .unwrap_or_default()
            .to_string(),
        action_id: entry.id,
    };
    if let Some(entry) = audit::latest_on_target_in(&mut tx, &by_key).await? {
        return Ok(first(entry));
    }
    let Some(dead) = edited::lock_for_edit(&mut tx, id).await? else {
        return Err(BodyError::NotFound);
    };
    if dead.status != "dead" {
        // The same form, posted again while its first post committed.
        if let Some(entry) = audit::latest_on_target_in(&mut tx, &by_key).await? {
            return Ok(first(entry));
        }
        let by = dead
            .action_id
            .map(|a| format!(" by operator action {a} (/actions/{a})"))
            .unwrap_or_default();
        return Err(BodyError::Refused(format!(
            "dead letter {id} is `{}` already{by}: only a dead one is edited",
            dead.status
        )));
    }
    if dead.reason != MALFORMED {
        return Err(BodyError::Refused(format!(
            "dead letter {id} died `{}`, not `{MALFORMED}`: its body decoded, so the failure is elsewhere (a failed mail is edited on its mail's page)",
            dead.reason
        )));
    }
    let Some(kind) = message_type(dead.message_type.as_deref(), &dead.queue) else {
        return Err(BodyError::Refused(format!(
            "dead letter {id} names no message type this release knows (queue `{}`)",
            dead.queue
        )));
    };
    let version = decode(kind, body).map_err(BodyError::Invalid)?;
    let mut name = id.to_be_bytes().to_vec();
    name.extend_from_slice(key.as_bytes());
    let message_id = Uuid::new_v5(&RAW_NAMESPACE, &name).to_string();
    let (exchange, routing_key) = if Source::parse(&dead.source) == Source::Outbox {
        (
            dead.exchange.clone().unwrap_or_default(),
            dead.routing_key.clone().unwrap_or_default(),
        )
    } else {
        (String::new(), dead.queue.clone())
    };
    let message = OutboxMessage::new(message_id.clone(), body.as_bytes().to_vec())
        .with_type(kind)
        .with_content_type("application/json")
        .with_header(SCHEMA_VERSION_HEADER, version)
        .with_header(REPLAYED_FROM_HEADER, id);
    outbox::enqueue(&mut tx, &exchange, &routing_key, &message).await?;
    let target = json!({
        "dead_letter_id": id,
        "message_id": message_id,
        "edit_key": key,
        "diff": Value::Object(body_diff(&dead.body, body)),
    });
    let action_id = audit::record(
        &mut tx,
        &NewEntry::new(EntryKind::Edit, actor, target),
        1,
        0,
        Some(format!(
            "dead letter {id}'s body edited and published again as message {message_id}"
        )),
    )
    .await?;
    edited::mark_edited(&mut tx, action_id, &[id]).await?;
    tx.commit().await.map_err(db)?;
    Ok(EditedBody {
        outcome: "published",
        dead_letter: id,
        message_id,
        action_id,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_body_must_decode_as_its_type_before_it_is_accepted() {
        let id = Uuid::new_v4();
        let good = format!(r#"{{"email_message_id": "{id}"}}"#);
        assert_eq!(decode(EmailSendCommand::TYPE, &good), Ok(1));
        let bad = decode(EmailSendCommand::TYPE, r#"{"email_message_id": "nope"}"#).unwrap_err();
        assert!(bad.contains("email.send"), "{bad}");
        assert!(decode(ActionCommand::TYPE, "{").is_err());
        assert!(decode("unheard.of", "{}").is_err());
    }

    #[test]
    fn the_type_comes_from_the_property_else_the_queue() {
        assert_eq!(message_type(None, "email.send"), Some("email.send"));
        assert_eq!(
            message_type(Some("automation.action"), "elsewhere"),
            Some("automation.action")
        );
        assert_eq!(message_type(None, "elsewhere"), None);
    }
}
