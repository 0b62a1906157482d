//! An operator's edit of a failed mail (issue 26): the mail as an operator sees it
//! ([`OutboundMail`]), the check an edit passes before it is accepted ([`check_buildable`]: the
//! very [`build`](crate::message::build) a send runs, so that an accepted edit is a mail this
//! job can send), and the statements of the edit's transaction: the original locked
//! ([`lock_for_edit`]), then the copy and its recipient rows written, the original marked
//! superseded and the copy's command put in the outbox ([`supersede`]), in the caller's transaction with its audit entry
//! and the dead letters it settles.
//!
//! The copy is a row of its own: its own id (derived from the original and the form's one-time
//! key, [`edited_id`]), its own Message-ID, `supersedes` naming the original. The original
//! keeps every field it had; `superseded_by`, `superseded_at` and `superseded_by_actor` say
//! what replaced it. The claim refuses to send a superseded row (`Claim::Superseded`), so a
//! late command of the original (its dead letter replayed, a redelivery) sends nothing.

use chrono::{DateTime, Utc};
use lettre::message::Mailbox;
use serde::Serialize;
use sqlx::{PgConnection, PgPool};
use uuid::Uuid;
use worker_core::Failure;
use worker_messages::{EMAIL_SEND, EmailSendCommand, Message as _, SCHEMA_VERSION_HEADER};
use worker_store::classify;
use worker_store::outbox::{self, OutboxMessage};

use crate::store::Email;

/// The namespace of an edited copy's id.
const EDIT_NAMESPACE: Uuid = Uuid::from_u128(0x8d2c_41f7_a3b0_4c6e_9e15_27d4_b8a9_0c31);

/// A stored outbound mail, whole, as the console shows it.
#[derive(Debug, Clone, PartialEq, Serialize, sqlx::FromRow)]
pub struct OutboundMail {
    pub id: Uuid,
    pub message_id: String,
    pub from_address: Option<String>,
    pub to_addresses: Vec<String>,
    pub cc_addresses: Vec<String>,
    pub subject: String,
    pub text_body: Option<String>,
    pub html_body: Option<String>,
    pub in_reply_to: Option<String>,
    pub reference_ids: Vec<String>,
    pub status: String,
    pub attempts: i32,
    pub last_error: Option<String>,
    pub smtp_response: Option<String>,
    pub created_at: DateTime<Utc>,
    pub sent_at: Option<DateTime<Utc>>,
    /// The mail this one is an edited copy of.
    pub supersedes: Option<Uuid>,
    /// The edited copy that went out in this one's place, when, and who edited it.
    pub superseded_by: Option<Uuid>,
    pub superseded_at: Option<DateTime<Utc>>,
    pub superseded_by_actor: Option<String>,
}

const COLUMNS: &str = "id, message_id, from_address, to_addresses, cc_addresses, subject, \
                       text_body, html_body, in_reply_to, reference_ids, status, attempts, \
                       last_error, smtp_response, created_at, sent_at, supersedes, superseded_by, \
                       superseded_at, superseded_by_actor";

/// The fields an operator may change: recipients, subject and bodies.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct MailEdit {
    pub to: Vec<String>,
    pub cc: Vec<String>,
    pub subject: String,
    pub text: Option<String>,
    pub html: Option<String>,
}

impl MailEdit {
    /// The mail's fields as they are, the form's first values.
    pub fn of(mail: &OutboundMail) -> Self {
        Self {
            to: mail.to_addresses.clone(),
            cc: mail.cc_addresses.clone(),
            subject: mail.subject.clone(),
            text: mail.text_body.clone(),
            html: mail.html_body.clone(),
        }
    }
}

/// Why an edit is refused before anything is written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refused {
    NotFound,
    /// Another edit went out first (ServiceControl#5122: a second edit is never dropped
    /// silently): the copy that superseded it, when and by whom.
    Superseded {
        by: Uuid,
        at: Option<DateTime<Utc>>,
        actor: Option<String>,
    },
    /// Only a mail the server refused for good is edited: a queued or sending one may still
    /// go out, a sent one went, an unknown one may have.
    NotFailed {
        status: String,
    },
}

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::NotFound => f.write_str("no outbound mail has this id"),
            Self::Superseded { by, at, actor } => {
                write!(
                    f,
                    "this mail was edited already: mail {by} went out in its place"
                )?;
                if let Some(actor) = actor {
                    write!(f, ", edited by {actor}")?;
                }
                if let Some(at) = at {
                    write!(f, " at {}", at.format("%Y-%m-%d %H:%M:%S UTC"))?;
                }
                f.write_str("; edit that one if it failed too")
            }
            Self::NotFailed { status } => write!(
                f,
                "the mail is `{status}`: only a mail the SMTP server refused for good (`failed`) is edited and sent again"
            ),
        }
    }
}

/// The id of the copy an edit with one-time key `edit_key` makes of `original`: the same form
/// posted twice names the same copy.
pub fn edited_id(original: Uuid, edit_key: Uuid) -> Uuid {
    let mut name = original.as_bytes().to_vec();
    name.extend_from_slice(edit_key.as_bytes());
    Uuid::new_v5(&EDIT_NAMESPACE, &name)
}

/// Checks that `edit` of `mail` builds as a send builds it: every address parses (lettre's
/// strict parser, the one the send uses), the headers are valid. A failure is `bad-address` or
/// `bad-email`, with the field. (The sizes, the line breaks and the recipient cap are the
/// rendered mail's rules, `job_automation_action::check_rendered`, which the caller runs too.)
pub fn check_buildable(mail: &OutboundMail, edit: &MailEdit) -> Result<(), Failure> {
    let email = Email {
        message_id: mail.message_id.clone(),
        from_address: mail.from_address.clone(),
        to_addresses: edit.to.clone(),
        cc_addresses: edit.cc.clone(),
        subject: edit.subject.clone(),
        text_body: edit.text.clone(),
        html_body: edit.html.clone(),
        in_reply_to: mail.in_reply_to.clone(),
        reference_ids: mail.reference_ids.clone(),
    };
    // The host's sender is not known here; any valid one builds the same headers.
    let stand_in = Mailbox::new(
        None,
        lettre::Address::new("edit-check", "localhost")
            .map_err(|e| Failure::permanent("bad-email", e))?,
    );
    crate::message::build(&email, &stand_in).map(|_| ())
}

/// One mail, whole.
pub async fn read(pool: &PgPool, id: Uuid) -> Result<Option<OutboundMail>, Failure> {
    sqlx::query_as(&format!(
        "SELECT {COLUMNS} FROM outbound_emails WHERE id = $1"
    ))
    .bind(id)
    .fetch_optional(pool)
    .await
    .map_err(classify)
}

/// Locks the mail `id` for an edit in the caller's transaction: two edits of one mail queue
/// here, and the second finds the first's copy. Refused unless it is `failed` and not yet
/// superseded.
pub async fn lock_for_edit(
    tx: &mut PgConnection,
    id: Uuid,
) -> Result<Result<OutboundMail, Refused>, Failure> {
    let mail: Option<OutboundMail> = sqlx::query_as(&format!(
        "SELECT {COLUMNS} FROM outbound_emails WHERE id = $1 FOR UPDATE"
    ))
    .bind(id)
    .fetch_optional(&mut *tx)
    .await
    .map_err(classify)?;
    Ok(match mail {
        None => Err(Refused::NotFound),
        Some(mail) => match (mail.superseded_by, mail.status.as_str()) {
            (Some(by), _) => Err(Refused::Superseded {
                by,
                at: mail.superseded_at,
                actor: mail.superseded_by_actor.clone(),
            }),
            (None, "failed") => Ok(mail),
            (None, status) => Err(Refused::NotFailed {
                status: status.to_string(),
            }),
        },
    })
}

/// Where the copy's command goes: the commands exchange and the email-send routing key.
#[derive(Debug, Clone)]
pub struct CommandRoute {
    pub exchange: String,
    pub routing_key: String,
}

impl CommandRoute {
    /// The email-send queue's key on `exchange`.
    pub fn new(exchange: impl Into<String>) -> Self {
        Self {
            exchange: exchange.into(),
            routing_key: EMAIL_SEND.to_string(),
        }
    }
}

/// In the caller's transaction, after [`lock_for_edit`]: writes the copy `new_id` of the
/// locked `original` with `edit` (its recipient rows are the reply limit's to write:
/// `job_automation_action::reply_limit::record_edited_copy`), marks the original superseded by it (only if no other edit
/// did: `WHERE superseded_by IS NULL`) and puts the copy's send command in the outbox. `false`
/// when another edit superseded it first (nothing is written then; the caller rolls back).
pub async fn supersede(
    tx: &mut PgConnection,
    original: &OutboundMail,
    new_id: Uuid,
    edit: &MailEdit,
    actor: &str,
    route: &CommandRoute,
) -> Result<bool, Failure> {
    let marked = sqlx::query(
        "UPDATE outbound_emails SET superseded_by = $2, superseded_at = now(), \
             superseded_by_actor = $3, updated_at = now() \
         WHERE id = $1 AND superseded_by IS NULL",
    )
    .bind(original.id)
    .bind(new_id)
    .bind(actor)
    .execute(&mut *tx)
    .await
    .map_err(classify)?
    .rows_affected();
    if marked != 1 {
        return Ok(false);
    }
    // The copy's Message-ID is its own, on the original's domain.
    let domain = original
        .message_id
        .rsplit_once('@')
        .map_or("worker-host", |(_, d)| d);
    sqlx::query(
        "INSERT INTO outbound_emails (id, message_id, from_address, to_addresses, cc_addresses, \
             subject, text_body, html_body, in_reply_to, reference_ids, supersedes) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)",
    )
    .bind(new_id)
    .bind(format!("{new_id}@{domain}"))
    .bind(&original.from_address)
    .bind(&edit.to)
    .bind(&edit.cc)
    .bind(&edit.subject)
    .bind(&edit.text)
    .bind(&edit.html)
    .bind(&original.in_reply_to)
    .bind(&original.reference_ids)
    .bind(original.id)
    .execute(&mut *tx)
    .await
    .map_err(classify)?;
    let command = EmailSendCommand {
        outbound_email_id: new_id,
    };
    let message = OutboxMessage::json(new_id.to_string(), EMAIL_SEND, &command)
        .map_err(|err| Failure::permanent("serialize", err))?
        .with_header(SCHEMA_VERSION_HEADER, EmailSendCommand::VERSION)
        .with_correlation_id(original.id.to_string());
    outbox::enqueue(tx, &route.exchange, &route.routing_key, &message).await?;
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mail() -> OutboundMail {
        OutboundMail {
            id: Uuid::new_v4(),
            message_id: "m@worker-host".into(),
            from_address: None,
            to_addresses: vec!["a@example.com".into()],
            cc_addresses: vec![],
            subject: "Re: ping".into(),
            text_body: Some("pong".into()),
            html_body: None,
            in_reply_to: None,
            reference_ids: vec![],
            status: "failed".into(),
            attempts: 1,
            last_error: Some("550 5.1.1 no such user".into()),
            smtp_response: None,
            created_at: Utc::now(),
            sent_at: None,
            supersedes: None,
            superseded_by: None,
            superseded_at: None,
            superseded_by_actor: None,
        }
    }

    #[test]
    fn an_edit_with_an_address_lettre_refuses_is_a_bad_address() {
        let mut edit = MailEdit::of(&mail());
        assert!(check_buildable(&mail(), &edit).is_ok());
        edit.to = vec!["not an address".into()];
        let err = check_buildable(&mail(), &edit).unwrap_err();
        assert_eq!(err.reason(), "bad-address", "{err}");
        assert!(err.detail().contains("not an address"), "{err}");
    }

    #[test]
    fn the_same_form_names_the_same_copy_and_another_form_another() {
        let (original, key) = (Uuid::new_v4(), Uuid::new_v4());
        assert_eq!(edited_id(original, key), edited_id(original, key));
        assert_ne!(
            edited_id(original, key),
            edited_id(original, Uuid::new_v4())
        );
        assert_ne!(edited_id(original, key), edited_id(Uuid::new_v4(), key));
    }

    #[test]
    fn a_second_edit_is_refused_naming_the_copy() {
        let by = Uuid::new_v4();
        let text = Refused::Superseded {
            by,
            at: None,
            actor: Some("alice".into()),
        }
        .to_string();
        assert!(
            text.contains(&by.to_string()) && text.contains("alice"),
            "{text}"
        );
    }
}
