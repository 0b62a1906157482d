//! Edit and retry, where the failure is in the content (issue 26): `/outbound/{id}` (an outbound
//! mail, whole, with what superseded it or what it supersedes and the edits' diffs),
//! `/outbound/{id}/edit` (an operator's form over a failed mail's recipients, subject and
//! bodies, posted to `/outbound/{id}/edited`), and `/dead-letters/{id}/edit` (a malformed dead
//! letter's raw body, posted to `/dead-letters/{id}/edited`); each with its JSON under
//! `/api/`. The transactions are `apply.rs` (a mail) and `raw.rs` (a body).

use crate::edit::{apply, form, raw};

use axum::Form;
use axum::extract::Path;
use axum::http::{HeaderMap, StatusCode, Uri};
use axum::response::{IntoResponse, Json};
use job_email_send::edit::{self as mail, MailEdit, OutboundMail, Refused};
use minijinja::Value;
use serde::{Deserialize, Serialize};
use serde_json::json;
use uuid::Uuid;
use worker_store::audit;

use apply::EditError;
pub use apply::EditSettings;
use raw::BodyError;

use super::Console;
use super::caller::Who;
use super::page::{
    PageResult, Problem, State, may_act, may_read_api, render, see_other, sign_in_first,
};
use super::personal;

/// The audit entries a mail's page lists.
const EDITS_SHOWN: u32 = 20;

fn mail_id(text: &str) -> Result<Uuid, Problem> {
    text.parse()
        .map_err(|_| Problem::not_found(format!("`{text}` is not an outbound mail's id")))
}

#[derive(Debug, Serialize)]
struct MailPage {
    mail: OutboundMail,
    /// The stored inbound mail this one answers, for the link to its story.
    story: Option<Uuid>,
    /// The edits of it (as the original) and the one that made it (as a copy), with diffs.
    edits: Vec<audit::Entry>,
    /// Why it cannot be edited, when it cannot.
    not_editable: Option<String>,
}

fn not_editable(mail: &OutboundMail) -> Option<String> {
    match (mail.superseded_by, mail.status.as_str()) {
        (Some(by), _) => Some(
            Refused::Superseded {
                by,
                at: mail.superseded_at,
                actor: mail.superseded_by_actor.clone(),
            }
            .to_string(),
        ),
        (None, "failed") => None,
        (None, status) => Some(
            Refused::NotFailed {
                status: status.to_string(),
            }
            .to_string(),
        ),
    }
}

async fn mail_page_data(console: &Console, id: Uuid) -> Result<MailPage, Problem> {
    let failed = |e: worker_core::Failure| Problem::failed("Reading the mail", e);
    let Some(found) = mail::read(&console.pool, id).await.map_err(failed)? else {
        return Err(Problem::not_found(format!("no outbound mail has id {id}")));
    };
    let mut edits = audit::on_target(
        &console.pool,
        &json!({ "outbound_email_id": id }),
        EDITS_SHOWN,
    )
    .await
    .map_err(failed)?;
    edits.extend(
        audit::on_target(&console.pool, &json!({ "copy": id }), 1)
            .await
            .map_err(failed)?,
    );
    let story = crate::story::mail_of_message(&console.pool, &id.to_string())
        .await
        .map_err(failed)?;
    Ok(MailPage {
        story,
        not_editable: not_editable(&found),
        mail: found,
        edits,
    })
}

pub async fn mail_page(
    axum::extract::State(console): State,
    caller: Who,
    uri: Uri,
    Path(id): Path<String>,
) -> PageResult {
    if let Some(redirect) = sign_in_first(&caller, &format!("/outbound/{id}")) {
        return Ok(redirect);
    }
    let page = mail_page_data(&console, mail_id(&id)?).await?;
    let (e, personal) = personal::for_page(&console, &caller, &uri, &page).await?;
    render(
        &console,
        &caller,
        "outbound_mail.html",
        minijinja::context! { e, personal },
    )
}

pub async fn mail_api(
    axum::extract::State(console): State,
    caller: Who,
    uri: Uri,
    Path(id): Path<String>,
) -> PageResult {
    may_read_api(&caller)?;
    let id = mail_id(&id).map_err(Problem::json)?;
    let page = mail_page_data(&console, id).await.map_err(Problem::json)?;
    personal::for_api(&console, &caller, &uri, &page).await
}

/// The edit form's page: the mail's fields (or the operator's, with what was wrong with them).
#[derive(Debug, Serialize)]
struct EditPage {
    mail: OutboundMail,
    edit: MailEdit,
    edit_key: String,
    error: Option<String>,
    not_editable: Option<String>,
}

fn edit_form(console: &Console, caller: &Who, page: &EditPage, status: StatusCode) -> PageResult {
    let mut response = render(
        console,
        caller,
        "mail_edit.html",
        minijinja::context! { e => Value::from_serialize(page) },
    )?;
    *response.status_mut() = status;
    Ok(response)
}

pub async fn edit_page(
    axum::extract::State(console): State,
    caller: Who,
    Path(id): Path<String>,
) -> PageResult {
    if let Some(redirect) = sign_in_first(&caller, &format!("/outbound/{id}/edit")) {
        return Ok(redirect);
    }
    let page = mail_page_data(&console, mail_id(&id)?).await?;
    let page = EditPage {
        edit: MailEdit::of(&page.mail),
        edit_key: Uuid::new_v4().to_string(),
        error: None,
        not_editable: page.not_editable,
        mail: page.mail,
    };
    edit_form(&console, &caller, &page, StatusCode::OK)
}

/// A refusal's answer: a page naming (and linking) what superseded the mail, or its JSON.
fn refused(console: &Console, caller: &Who, id: Uuid, refusal: &Refused) -> PageResult {
    let (status, by) = match refusal {
        Refused::NotFound => {
            return Err(Problem::not_found(format!("no outbound mail has id {id}")));
        }
        Refused::Superseded { by, .. } => (StatusCode::CONFLICT, Some(*by)),
        Refused::NotFailed { .. } => (StatusCode::CONFLICT, None),
    };
    if caller.api {
        let body = json!({
            "error": "Refused",
            "detail": refusal.to_string(),
            "superseded_by": by,
            "link": by.map(|b| format!("/outbound/{b}")),
        });
        return Ok((status, Json(body)).into_response());
    }
    let context = json!({ "id": id, "detail": refusal.to_string(), "by": by });
    let mut response = render(
        console,
        caller,
        "mail_refused.html",
        minijinja::context! { r => Value::from_serialize(&context) },
    )?;
    *response.status_mut() = status;
    Ok(response)
}

pub async fn edit_submit(
    axum::extract::State(console): State,
    caller: Who,
    headers: HeaderMap,
    Path(id): Path<String>,
    Form(posted): Form<form::MailForm>,
) -> PageResult {
    let actor = may_act(&caller, &headers, &posted.csrf)?;
    let id = mail_id(&id)?;
    let key = form::edit_key(&posted.edit_key)?;
    match apply::edit_mail(&console.pool, &console.edits, id, key, &posted, &actor).await {
        Ok(done) if caller.api => Ok(Json(done).into_response()),
        Ok(done) => Ok(see_other(&format!("/outbound/{}", done.copy))),
        Err(EditError::Refused(refusal)) => refused(&console, &caller, id, &refusal),
        Err(EditError::Failed(e)) => Err(Problem::failed("The edit", e)),
        Err(invalid) => {
            let error = match invalid {
                EditError::Invalid(failure) => format!("{}: {}", failure.reason(), failure.detail()),
                _ => "nothing changed: the same mail would be refused again (replay its dead letter to send it unchanged)".to_string(),
            };
            if caller.api {
                return Ok((
                    StatusCode::UNPROCESSABLE_ENTITY,
                    Json(json!({ "error": "Not accepted", "detail": error })),
                )
                    .into_response());
            }
            let page = mail_page_data(&console, id).await?;
            let page = EditPage {
                edit: posted.edit(&MailEdit::of(&page.mail)),
                edit_key: key.to_string(),
                error: Some(error),
                not_editable: None,
                mail: page.mail,
            };
            edit_form(&console, &caller, &page, StatusCode::UNPROCESSABLE_ENTITY)
        }
    }
}

/// The body form of a malformed dead letter.
#[derive(Debug, Serialize)]
struct BodyPage {
    id: i64,
    queue: String,
    reason: String,
    message_type: Option<String>,
    body: String,
    edit_key: String,
    error: Option<String>,
}

fn body_form(console: &Console, caller: &Who, page: &BodyPage, status: StatusCode) -> PageResult {
    let mut response = render(
        console,
        caller,
        "dead_letter_edit.html",
        minijinja::context! { e => Value::from_serialize(page) },
    )?;
    *response.status_mut() = status;
    Ok(response)
}

fn dead_letter_id(text: &str) -> Result<i64, Problem> {
    text.parse()
        .map_err(|_| Problem::not_found(format!("`{text}` is not a dead letter's id")))
}

async fn body_page(
    console: &Console,
    id: i64,
    body: Option<String>,
    key: Option<Uuid>,
    error: Option<String>,
) -> Result<BodyPage, Problem> {
    let Some(dead) = worker_store::dead_letters::show_one(&console.pool, id)
        .await
        .map_err(|e| Problem::failed("Reading the dead letter", e))?
    else {
        return Err(Problem::not_found(format!("no dead letter has id {id}")));
    };
    Ok(BodyPage {
        id,
        body: body.unwrap_or_else(|| String::from_utf8_lossy(&dead.body).into_owned()),
        message_type: raw::message_type(dead.message_type.as_deref(), &dead.queue)
            .map(str::to_string),
        queue: dead.queue,
        reason: dead.reason,
        edit_key: key.unwrap_or_else(Uuid::new_v4).to_string(),
        error,
    })
}

pub async fn body_edit_page(
    axum::extract::State(console): State,
    caller: Who,
    Path(id): Path<String>,
) -> PageResult {
    if let Some(redirect) = sign_in_first(&caller, &format!("/dead-letters/{id}/edit")) {
        return Ok(redirect);
    }
    let page = body_page(&console, dead_letter_id(&id)?, None, None, None).await?;
    body_form(&console, &caller, &page, StatusCode::OK)
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct BodyForm {
    csrf: String,
    edit_key: String,
    body: String,
}

pub async fn body_edit_submit(
    axum::extract::State(console): State,
    caller: Who,
    headers: HeaderMap,
    Path(id): Path<String>,
    Form(posted): Form<BodyForm>,
) -> PageResult {
    let actor = may_act(&caller, &headers, &posted.csrf)?;
    let id = dead_letter_id(&id)?;
    let key = form::edit_key(&posted.edit_key)?;
    let body = posted.body.replace("\r\n", "\n");
    let problem =
        |status: StatusCode, title: &str, detail: String| Problem::new(status, title, detail);
    match raw::edit_body(&console.pool, id, key, &body, &actor).await {
        Ok(done) if caller.api => Ok(Json(done).into_response()),
        Ok(_) => Ok(see_other(&format!("/dead-letters/{id}"))),
        Err(BodyError::NotFound) => Err(Problem::not_found(format!("no dead letter has id {id}"))),
        Err(BodyError::Refused(why)) => Err(problem(StatusCode::CONFLICT, "Refused", why)),
        Err(BodyError::Failed(e)) => Err(Problem::failed("The edit", e)),
        Err(BodyError::Invalid(why)) => {
            if caller.api {
                return Err(problem(
                    StatusCode::UNPROCESSABLE_ENTITY,
                    "Not accepted",
                    why,
                ));
            }
            let page = body_page(&console, id, Some(body), Some(key), Some(why)).await?;
            body_form(&console, &caller, &page, StatusCode::UNPROCESSABLE_ENTITY)
        }
    }
}

/// A replay of one dead letter an edit settled would send the original again
/// (ServicePulse#2424): refused, naming the edit.
pub async fn refuse_replay_of_edited(console: &Console, id: Option<i64>) -> Result<(), Problem> {
    let Some(id) = id else {
        return Ok(());
    };
    let found = worker_store::dead_letters::edited::status_of(&console.pool, id)
        .await
        .map_err(|e| Problem::failed("Reading the dead letter", e))?;
    match found {
        Some((status, action)) if status == "edited" => Err(Problem::new(
            StatusCode::CONFLICT,
            "Refused",
            format!(
                "dead letter {id} was edited{}: its edited copy went out in its place, and a replay would send the original too",
                action
                    .map(|a| format!(" (operator action {a}, /actions/{a})"))
                    .unwrap_or_default()
            ),
        )),
        _ => Ok(()),
    }
}

/// The mail a dead letter's `email.send` command names, for a link to its page.
pub fn mail_of(message_type: Option<&str>, queue: &str, body: &[u8]) -> Option<Uuid> {
    use worker_messages::{EmailSendCommand, Message as _};
    let kind = message_type.unwrap_or(queue);
    (kind == EmailSendCommand::TYPE || queue == EmailSendCommand::TYPE)
        .then(|| serde_json::from_slice::<EmailSendCommand>(body).ok())
        .flatten()
        .map(|c| c.outbound_email_id)
}
