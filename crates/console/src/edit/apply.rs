//! The mail edit's one transaction: the original locked, the edit checked as a rendered mail
//! is, the copy written and its command put in the outbox, the original marked superseded, the
//! audit entry with the diff, and the original's dead letters settled `edited`. Committed
//! together, or nothing is.
//!
//! Exactly once from the operator's side:
//! - two edits of one mail queue on the original's row lock; the second finds it superseded
//!   and is refused, naming the copy (never dropped silently, ServiceControl#5122);
//! - the same form posted twice carries the same one-time key: the second post finds the
//!   first's audit entry (or, racing it, the copy named by the key) and answers with it. The
//!   key counts on the mail it was posted for only: the same key on another mail is another
//!   edit, never the first mail's answer (which would drop that edit silently);
//! - the original is never sent after the edit: its dead letters leave `dead` here, and the
//!   sender's claim refuses a superseded row (ServicePulse#2424).

use job_automation_action::reply_limit;
use job_email_send::edit::{self as mail, CommandRoute, MailEdit, OutboundMail, Refused};
use serde::Serialize;
use serde_json::{Map, Value, json};
use sqlx::PgPool;
use uuid::Uuid;
use worker_core::Failure;
use worker_store::audit::{self, Actor, EntryKind, NewEntry};
use worker_store::dead_letters::edited;

use super::form::{MailForm, as_rendered, diff};

/// How the console edits mail: where the copies' commands go, and the recipient cap the
/// automation's mails have.
#[derive(Debug, Clone)]
pub struct EditSettings {
    pub route: CommandRoute,
    pub recipients_max: u32,
}

/// What an accepted edit did.
#[derive(Debug, Clone, Serialize)]
pub struct Edited {
    /// `sent` (this post), or `already-sent` (the same form was posted before: its answer).
    pub outcome: &'static str,
    pub original: Uuid,
    /// The copy that goes out in the original's place.
    pub copy: Uuid,
    /// The audit entry, with the diff.
    pub action_id: i64,
    /// The original's dead letters this edit settled.
    pub dead_letters: Vec<i64>,
    pub diff: Value,
}

/// Why an edit was not accepted.
#[derive(Debug)]
pub enum EditError {
    /// The mail cannot be edited (none, superseded, not failed).
    Refused(Refused),
    /// The edit is not a mail that could be sent (the check's failure, naming the field).
    Invalid(Failure),
    /// The edit changes nothing: the same mail would be refused again.
    Unchanged,
    /// The database failed.
    Failed(Failure),
}

impl From<Failure> for EditError {
    fn from(failure: Failure) -> Self {
        Self::Failed(failure)
    }
}

/// Checks `edit` of `original` as a rendered mail is checked, and as the send builds it.
pub fn check(
    settings: &EditSettings,
    original: &OutboundMail,
    edit: &MailEdit,
) -> Result<(), Failure> {
    job_automation_action::check_rendered(&as_rendered(original, edit), settings.recipients_max)?;
    mail::check_buildable(original, edit)
}

/// The answer the first post of the form `key` had, if there was one.
fn earlier(entry: &audit::Entry, original: Uuid) -> Option<Edited> {
    let copy = entry.filter.get("copy")?.as_str()?.parse().ok()?;
    Some(Edited {
        outcome: "already-sent",
        original,
        copy,
        action_id: entry.id,
        dead_letters: entry
            .filter
            .get("dead_letters")
            .and_then(|d| serde_json::from_value(d.clone()).ok())
            .unwrap_or_default(),
        diff: entry.filter.get("diff").cloned().unwrap_or(Value::Null),
    })
}

/// Edits the failed mail `id` with the form `key`'s `edit`, as `actor`: the whole transaction.
pub async fn edit_mail(
    pool: &PgPool,
    settings: &EditSettings,
    id: Uuid,
    key: Uuid,
    posted: &MailForm,
    actor: &Actor,
) -> Result<Edited, EditError> {
    let db = worker_store::classify;
    let mut tx = pool.begin().await.map_err(db)?;
    // The key and the mail together: a key is one form's, and a form edits one mail.
    let by_key = json!({ "edit_key": key, "outbound_email_id": id });
    let seen = audit::latest_on_target_in(&mut tx, &by_key).await?;
    if let Some(first) = seen.as_ref().and_then(|entry| earlier(entry, id)) {
        return Ok(first);
    }
    let copy = mail::edited_id(id, key);
    let original = match mail::lock_for_edit(&mut tx, id).await? {
        Ok(original) => original,
        // The same form, posted again while its first post committed: that post's answer.
        Err(Refused::Superseded { by, .. }) if by == copy => {
            let entry = audit::latest_on_target_in(&mut tx, &by_key).await?;
            if let Some(first) = entry.as_ref().and_then(|e| earlier(e, id)) {
                return Ok(first);
            }
            return Err(EditError::Refused(Refused::Superseded {
                by,
                at: None,
                actor: None,
            }));
        }
        Err(refused) => return Err(EditError::Refused(refused)),
    };
    let edit = &posted.edit(&MailEdit::of(&original));
    check(settings, &original, edit).map_err(EditError::Invalid)?;
    let changed: Map<String, Value> = diff(&MailEdit::of(&original), edit);
    if changed.is_empty() {
        return Err(EditError::Unchanged);
    }
    if !mail::supersede(
        &mut tx,
        &original,
        copy,
        edit,
        &actor.label(),
        &settings.route,
    )
    .await?
    {
        // Unreachable under the row lock; refused rather than sent twice all the same.
        return Err(EditError::Refused(Refused::Superseded {
            by: copy,
            at: None,
            actor: None,
        }));
    }
    let recipients = reply_limit::counted_recipients(&as_rendered(&original, edit));
    reply_limit::record_edited_copy(&mut tx, copy, original.id, &recipients).await?;
    let dead = edited::dead_of_message(&mut tx, &id.to_string()).await?;
    let target = json!({
        "outbound_email_id": id,
        "copy": copy,
        "edit_key": key,
        "dead_letters": dead,
        "diff": changed,
    });
    let fields: Vec<&String> = changed.keys().collect();
    let note = format!(
        "mail {id} edited ({}) and sent again as mail {copy}",
        fields
            .iter()
            .map(|f| f.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    );
    let action_id = audit::record(
        &mut tx,
        &NewEntry::new(EntryKind::Edit, actor, target),
        1,
        0,
        Some(note),
    )
    .await?;
    edited::mark_edited(&mut tx, action_id, &dead).await?;
    tx.commit().await.map_err(db)?;
    tracing::info!(original = %id, %copy, action_id, "an operator edited a failed mail; the copy is queued");
    Ok(Edited {
        outcome: "sent",
        original: id,
        copy,
        action_id,
        dead_letters: dead,
        diff: Value::Object(changed),
    })
}
