//! `/dead-letters` (grouped by queue and fingerprint), `/dead-letters/messages` (the dead
//! letters of a filter, newest first) and `/dead-letters/{id}` (one, whole), with their
//! JSON under `/api/dead-letters`. Every list is a page of a query run in PostgreSQL.

use axum::extract::{Path, Query};
use axum::http::Uri;
use job_dead_letter_archive as archive;
use serde::{Deserialize, Serialize};
use worker_store::attempt_log::{self, AttemptRecord};

use super::Console;
use super::caller::Who;
use super::filter::FilterForm;
use super::page::{PageResult, Problem, State, may_read_api, render, sign_in_first};
use super::personal;

/// Groups on one page.
const GROUPS_PER_PAGE: u32 = 50;
/// Dead letters on one page.
const MESSAGES_PER_PAGE: u32 = 50;
/// The most of a body one dead letter's page shows as text, in characters.
pub const BODY_TEXT_MAX: usize = 64 * 1024;
/// The most of a body shown in hex, in bytes.
pub const BODY_HEX_MAX: usize = 4 * 1024;

/// The reasons a dead letter can have, for the filter's choices.
const REASONS: &[&str] = &[
    "malformed",
    "rejected",
    "gave-up",
    "delivery_limit",
    "outbox-failed",
    "stuck",
    "unknown",
];

/// The paging of a list, beside its filter.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct Paging {
    /// Groups: the page, from 0.
    page: Option<String>,
    /// Dead letters: the page below this id.
    before: Option<String>,
}

fn number<T: std::str::FromStr>(field: &str, text: &Option<String>) -> Result<Option<T>, Problem> {
    match text.as_deref().map(str::trim).filter(|t| !t.is_empty()) {
        None => Ok(None),
        Some(t) => t.parse().map(Some).map_err(|_| {
            Problem::bad_request(format!("{field}: expected a whole number, found `{t}`"))
        }),
    }
}

#[derive(Debug, Serialize)]
struct GroupRow {
    #[serde(flatten)]
    group: archive::Group,
    state: &'static str,
    /// The group's dead letters, under the same filter.
    link: String,
}

#[derive(Debug, Serialize)]
struct Groups {
    filter: FilterForm,
    query: String,
    groups: Vec<GroupRow>,
    total: u64,
    page: u64,
    pages: u64,
    /// The queues the host consumes, for the filter's choices.
    queues: Vec<String>,
    reasons: &'static [&'static str],
    /// How long replayed and purged dead letters are kept, in seconds.
    retention_secs: f64,
}

/// The consumer queues of this host, and the job of each.
fn consumers(console: &Console) -> Vec<(String, String)> {
    let mut queues: Vec<(String, String)> = console
        .runtime
        .jobs()
        .into_iter()
        .filter_map(|job| Some((job.queue?, job.name)))
        .collect();
    queues.push((archive::OUTBOX_QUEUE.to_string(), String::new()));
    queues
}

async fn groups(console: &Console, form: &FilterForm, paging: &Paging) -> Result<Groups, Problem> {
    let filter = form.filter()?;
    let page: u64 = number("page", &paging.page)?.unwrap_or(0);
    let offset = page.saturating_mul(u64::from(GROUPS_PER_PAGE));
    let found = archive::groups(&console.pool, &filter, offset, GROUPS_PER_PAGE)
        .await
        .map_err(|e| Problem::failed("Reading the dead-letter groups", e))?;
    let groups = found
        .items
        .into_iter()
        .map(|group| GroupRow {
            state: group.state(),
            link: format!(
                "/dead-letters/messages?{}",
                form.group(&group.queue, &group.fingerprint).query()
            ),
            group,
        })
        .collect();
    Ok(Groups {
        query: form.query(),
        filter: form.cleaned(),
        groups,
        total: found.total,
        page,
        pages: found.total.div_ceil(u64::from(GROUPS_PER_PAGE)),
        queues: consumers(console).into_iter().map(|(q, _)| q).collect(),
        reasons: REASONS,
        retention_secs: console.archive_retention.as_secs_f64(),
    })
}

pub async fn groups_page(
    axum::extract::State(console): State,
    caller: Who,
    uri: Uri,
    Query(form): Query<FilterForm>,
    Query(paging): Query<Paging>,
) -> PageResult {
    if let Some(redirect) = sign_in_first(&caller, "/dead-letters") {
        return Ok(redirect);
    }
    let groups = groups(&console, &form, &paging).await?;
    let (g, personal) = personal::for_page(&console, &caller, &uri, &groups).await?;
    render(
        &console,
        &caller,
        "groups.html",
        minijinja::context! { g, personal },
    )
}

pub async fn groups_api(
    axum::extract::State(console): State,
    caller: Who,
    uri: Uri,
    Query(form): Query<FilterForm>,
    Query(paging): Query<Paging>,
) -> PageResult {
    may_read_api(&caller)?;
    let groups = groups(&console, &form, &paging)
        .await
        .map_err(Problem::json)?;
    personal::for_api(&console, &caller, &uri, &groups).await
}

#[derive(Debug, Serialize)]
struct Messages {
    filter: FilterForm,
    query: String,
    messages: Vec<archive::DeadLetterSummary>,
    total: u64,
    /// The next page's link, when there is one.
    next: Option<String>,
    /// The dead letters a bulk action would act on now (the filter's, in state `dead`).
    narrowed: bool,
    queues: Vec<String>,
    reasons: &'static [&'static str],
    retention_secs: f64,
}

async fn messages(
    console: &Console,
    form: &FilterForm,
    paging: &Paging,
) -> Result<Messages, Problem> {
    let filter = form.filter()?;
    let before = number("before", &paging.before)?;
    let found = archive::dead_letters(&console.pool, &filter, before, MESSAGES_PER_PAGE)
        .await
        .map_err(|e| Problem::failed("Reading the dead letters", e))?;
    let query = form.query();
    Ok(Messages {
        next: found.next_before.map(|id| {
            let sep = if query.is_empty() { "" } else { "&" };
            format!("/dead-letters/messages?{query}{sep}before={id}")
        }),
        filter: form.cleaned(),
        query,
        messages: found.items,
        total: found.total,
        narrowed: form.narrows(),
        queues: consumers(console).into_iter().map(|(q, _)| q).collect(),
        reasons: REASONS,
        retention_secs: console.archive_retention.as_secs_f64(),
    })
}

pub async fn messages_page(
    axum::extract::State(console): State,
    caller: Who,
    uri: Uri,
    Query(form): Query<FilterForm>,
    Query(paging): Query<Paging>,
) -> PageResult {
    if let Some(redirect) = sign_in_first(&caller, "/dead-letters/messages") {
        return Ok(redirect);
    }
    let messages = messages(&console, &form, &paging).await?;
    let (l, personal) = personal::for_page(&console, &caller, &uri, &messages).await?;
    render(
        &console,
        &caller,
        "messages.html",
        minijinja::context! { l, personal },
    )
}

pub async fn messages_api(
    axum::extract::State(console): State,
    caller: Who,
    uri: Uri,
    Query(form): Query<FilterForm>,
    Query(paging): Query<Paging>,
) -> PageResult {
    may_read_api(&caller)?;
    let messages = messages(&console, &form, &paging)
        .await
        .map_err(Problem::json)?;
    personal::for_api(&console, &caller, &uri, &messages).await
}

/// A body as a page shows it: text or hex, bounded.
#[derive(Debug, Serialize)]
struct Body {
    text: Option<String>,
    hex: Option<String>,
    bytes: usize,
    /// Only the first part is shown.
    cut: bool,
}

fn body(dead: &archive::DeadLetter) -> Body {
    let bytes = dead.body.len();
    if let Ok(text) = std::str::from_utf8(&dead.body) {
        let cut = text.chars().count() > BODY_TEXT_MAX;
        return Body {
            text: Some(text.chars().take(BODY_TEXT_MAX).collect()),
            hex: None,
            bytes,
            cut,
        };
    }
    let shown = &dead.body[..bytes.min(BODY_HEX_MAX)];
    let hex = shown
        .chunks(32)
        .enumerate()
        .map(|(i, line)| {
            let digits: Vec<String> = line.iter().map(|b| format!("{b:02x}")).collect();
            format!("{:06x}  {}", i * 32, digits.join(" "))
        })
        .collect::<Vec<_>>()
        .join("\n");
    Body {
        text: None,
        hex: Some(hex),
        bytes,
        cut: bytes > BODY_HEX_MAX,
    }
}

#[derive(Debug, Serialize)]
struct One {
    dead: archive::DeadLetter,
    body: Body,
    error_chain: Vec<String>,
    trace_id: Option<String>,
    history: archive::History,
    /// The job that consumed its queue, whose attempt log is shown.
    job: Option<String>,
    attempts: Vec<AttemptRecord>,
    /// The filter of its group, for the link back.
    group_link: String,
    retention_secs: f64,
    /// The outbound mail its `email.send` command names (edited on the mail's page).
    mail: Option<uuid::Uuid>,
    /// The stored inbound mail whose story this dead letter is part of.
    story: Option<uuid::Uuid>,
}

async fn one(console: &Console, id: i64) -> Result<One, Problem> {
    let Some(mut dead) = archive::show_one(&console.pool, id)
        .await
        .map_err(|e| Problem::failed("Reading the dead letter", e))?
    else {
        return Err(Problem::not_found(format!(
            "no dead letter has id {id} (the retention sweep deletes replayed and purged ones after their window)"
        )));
    };
    let history = archive::history(&console.pool, &dead)
        .await
        .map_err(|e| Problem::failed("Reading the dead letter's history", e))?;
    let job = consumers(console)
        .into_iter()
        .find(|(queue, job)| *queue == dead.queue && !job.is_empty())
        .map(|(_, job)| job);
    let attempts = match (&job, &dead.message_id) {
        (Some(job), Some(message_id)) => attempt_log::for_message(&console.pool, job, message_id)
            .await
            .map_err(|e| Problem::failed("Reading the attempt log", e))?,
        _ => Vec::new(),
    };
    let group = FilterForm {
        status: Some("all".into()),
        ..FilterForm::default()
    }
    .group(&dead.queue, &dead.fingerprint);
    let story = match &dead.message_id {
        Some(message_id) => crate::story::mail_of_message(&console.pool, message_id)
            .await
            .map_err(|e| Problem::failed("Finding the dead letter's mail", e))?,
        None => None,
    };
    let body = body(&dead);
    let mail = super::edit::mail_of(dead.message_type.as_deref(), &dead.queue, &dead.body);
    // Only the bounded copy goes out.
    (dead.body_text, dead.body_hex) = (None, None);
    Ok(One {
        body,
        error_chain: dead
            .last_error
            .as_deref()
            .map(|e| {
                archive::error_chain(e)
                    .into_iter()
                    .map(String::from)
                    .collect()
            })
            .unwrap_or_default(),
        trace_id: archive::trace_id(&dead),
        history,
        job,
        attempts,
        group_link: format!("/dead-letters/messages?{}", group.query()),
        retention_secs: console.archive_retention.as_secs_f64(),
        mail,
        story,
        dead,
    })
}

pub async fn one_page(
    axum::extract::State(console): State,
    caller: Who,
    uri: Uri,
    Path(id): Path<String>,
) -> PageResult {
    let path = format!("/dead-letters/{id}");
    if let Some(redirect) = sign_in_first(&caller, &path) {
        return Ok(redirect);
    }
    let id: i64 = id
        .parse()
        .map_err(|_| Problem::not_found(format!("`{id}` is not a dead letter's id")))?;
    let one = one(&console, id).await?;
    let (d, personal) = personal::for_page(&console, &caller, &uri, &one).await?;
    render(
        &console,
        &caller,
        "dead_letter.html",
        minijinja::context! { d, personal },
    )
}

pub async fn one_api(
    axum::extract::State(console): State,
    caller: Who,
    uri: Uri,
    Path(id): Path<String>,
) -> PageResult {
    may_read_api(&caller)?;
    let id: i64 = id
        .parse()
        .map_err(|_| Problem::not_found(format!("`{id}` is not a dead letter's id")).json())?;
    let one = one(&console, id).await.map_err(Problem::json)?;
    personal::for_api(&console, &caller, &uri, &one).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paging_numbers_are_checked_by_name() {
        assert_eq!(number::<u64>("page", &Some("2".into())).unwrap(), Some(2));
        assert_eq!(number::<u64>("page", &Some(" ".into())).unwrap(), None);
        let bad = number::<i64>("before", &Some("x".into())).unwrap_err();
        assert!(bad.detail.starts_with("before:"));
    }
}
