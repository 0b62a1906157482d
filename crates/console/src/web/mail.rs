//! `/mail` (a search for mails, each with its end state) and `/mail/{id}` (one mail's story
//! as a timeline), with their JSON under `/api/mail`. The same [`crate::story`] as
//! `worker-host mail show|find`.

use axum::extract::{Path, Query};
use axum::http::Uri;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use super::Console;
use super::caller::Who;
use super::filter::{given, parse_time};
use super::page::{PageResult, Problem, State, may_read_api, render, sign_in_first};
use super::personal;
use crate::story::{self, Found, Search, Story};

/// Mails on one page of a search.
const PER_PAGE: u32 = 50;

/// The search form, as the query string carries it.
#[derive(Debug, Default, Clone, Serialize, Deserialize)]
#[serde(default)]
pub struct SearchForm {
    from: Option<String>,
    to: Option<String>,
    message_id: Option<String>,
    subject: Option<String>,
    since: Option<String>,
    until: Option<String>,
    /// The next page: the last mail of this one, `<received_at>_<id>`.
    after: Option<String>,
}

impl SearchForm {
    fn search(&self) -> Result<Search, Problem> {
        let time = |field: &str, text: &Option<String>| -> Result<Option<DateTime<Utc>>, Problem> {
            given(text).map(|t| parse_time(field, &t)).transpose()
        };
        let after = match given(&self.after) {
            None => None,
            Some(cursor) => Some(parse_cursor(&cursor).ok_or_else(|| {
                Problem::bad_request(format!("after: not a page cursor: `{cursor}`"))
            })?),
        };
        Ok(Search {
            from: given(&self.from),
            to: given(&self.to),
            message_id: given(&self.message_id),
            subject: given(&self.subject),
            since: time("since", &self.since)?,
            until: time("until", &self.until)?,
            after,
            limit: PER_PAGE,
        })
    }

    /// This search's query string for the page after `last`.
    fn next(&self, last: &Found) -> String {
        let mut next = self.clone();
        next.after = Some(format!("{}_{}", last.received_at.to_rfc3339(), last.id));
        serde_urlencoded::to_string(&next).unwrap_or_default()
    }
}

fn parse_cursor(cursor: &str) -> Option<(DateTime<Utc>, Uuid)> {
    let (at, id) = cursor.rsplit_once('_')?;
    Some((
        DateTime::parse_from_rfc3339(at).ok()?.with_timezone(&Utc),
        id.parse().ok()?,
    ))
}

#[derive(Debug, Serialize)]
struct Results {
    form: SearchForm,
    mails: Vec<FoundRow>,
    /// The next page's query, when this one is full.
    next: Option<String>,
    per_page: u32,
}

#[derive(Debug, Serialize)]
struct FoundRow {
    #[serde(flatten)]
    found: Found,
    state: &'static str,
    sentence: String,
}

async fn results(console: &Console, form: SearchForm) -> Result<Results, Problem> {
    let search = form.search()?;
    let found = story::find(&console.pool, &search)
        .await
        .map_err(|e| Problem::failed("Searching the mails", e))?;
    let next = (found.len() >= PER_PAGE as usize)
        .then(|| found.last().map(|last| form.next(last)))
        .flatten();
    let mails = found
        .into_iter()
        .map(|found| FoundRow {
            state: found.end.name(),
            sentence: found.end.sentence(),
            found,
        })
        .collect();
    Ok(Results {
        form,
        mails,
        next,
        per_page: PER_PAGE,
    })
}

pub async fn search_page(
    axum::extract::State(console): State,
    caller: Who,
    uri: Uri,
    Query(form): Query<SearchForm>,
) -> PageResult {
    if let Some(redirect) = sign_in_first(&caller, "/mail") {
        return Ok(redirect);
    }
    let results = results(&console, form).await?;
    let (r, personal) = personal::for_page(&console, &caller, &uri, &results).await?;
    render(
        &console,
        &caller,
        "mails.html",
        minijinja::context! { r, personal },
    )
}

pub async fn search_api(
    axum::extract::State(console): State,
    caller: Who,
    uri: Uri,
    Query(form): Query<SearchForm>,
) -> PageResult {
    may_read_api(&caller)?;
    let results = results(&console, form).await.map_err(Problem::json)?;
    personal::for_api(&console, &caller, &uri, &results).await
}

async fn story_of(console: &Console, id: &str) -> Result<Story, Problem> {
    let id: Uuid = id
        .parse()
        .map_err(|_| Problem::not_found(format!("no stored mail has id `{id}`")))?;
    story::read_story(&console.pool, id, console.story_retention)
        .await
        .map_err(|e| Problem::failed("Reading the mail's story", e))?
        .ok_or_else(|| Problem::not_found(format!("no stored mail has id {id}")))
}

pub async fn story_page(
    axum::extract::State(console): State,
    caller: Who,
    uri: Uri,
    Path(id): Path<String>,
) -> PageResult {
    if let Some(redirect) = sign_in_first(&caller, &format!("/mail/{id}")) {
        return Ok(redirect);
    }
    let story = story_of(&console, &id).await?;
    let end = (story.end.name(), story.end.sentence());
    let (s, personal) = personal::for_page(&console, &caller, &uri, &story).await?;
    // The link to the sender's other mails names the sender: not for whom it is masked.
    let masked = personal.get_attr("masked").is_ok_and(|m| m.is_true());
    let others = story
        .mail
        .from_address
        .as_deref()
        .filter(|_| !masked)
        .map(|from| serde_urlencoded::to_string([("from", from)]).unwrap_or_default());
    render(
        &console,
        &caller,
        "mail.html",
        minijinja::context! {
            s,
            state => end.0,
            sentence => end.1,
            others => others,
            personal,
        },
    )
}

pub async fn story_api(
    axum::extract::State(console): State,
    caller: Who,
    uri: Uri,
    Path(id): Path<String>,
) -> PageResult {
    may_read_api(&caller)?;
    let story = story_of(&console, &id).await.map_err(Problem::json)?;
    personal::for_api(&console, &caller, &uri, &story).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_page_cursor_reads_back_as_the_mail_it_names() {
        let at = Utc::now();
        let id = Uuid::new_v4();
        let cursor = format!("{}_{id}", at.to_rfc3339());
        assert_eq!(parse_cursor(&cursor), Some((at, id)));
        assert_eq!(parse_cursor("yesterday"), None);
    }

    #[test]
    fn a_bad_time_in_the_search_names_its_field() {
        let form = SearchForm {
            since: Some("last tuesday".into()),
            ..SearchForm::default()
        };
        let problem = form.search().unwrap_err();
        assert!(format!("{problem:?}").contains("since"), "{problem:?}");
    }
}
