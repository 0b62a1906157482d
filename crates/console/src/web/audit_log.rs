//! `/audit-log`: other teams' audit entries as the audit-log job stored them (`audit.entry`),
//! with the search of `worker-host audit-log find` (actor, entity, time), newest first, a page
//! at a time (keyset: "older" carries the last entry's time and id), each entry's `data`
//! behind a disclosure; with the retention in force and the queue's depth. JSON under
//! `/api/audit-log`. For whom personal data is masked, the actor is shown as its first letter,
//! besides the masking every page has (addresses, bodies).

use std::time::Duration;

use axum::extract::Query;
use axum::http::Uri;
use job_audit_log::{Cursor, Search, StoredEntry};
use serde::{Deserialize, Serialize};

use super::Console;
use super::caller::Who;
use super::filter::{given, parse_time};
use super::page::{PageResult, Problem, State, may_read_api, render, sign_in_first};
use super::personal;
use crate::masking;
use crate::runtime::QueueReading;

/// Entries on one page.
const PER_PAGE: u32 = 50;

/// The search form, as the query string carries it.
#[derive(Debug, Default, Clone, Serialize, Deserialize)]
#[serde(default)]
pub struct SearchForm {
    actor: Option<String>,
    entity_type: Option<String>,
    entity_id: Option<String>,
    since: Option<String>,
    until: Option<String>,
    /// The page after another: its last entry, `<occurred_at>_<id>`.
    before: Option<String>,
}

impl SearchForm {
    fn search(&self) -> Result<Search, Problem> {
        let time = |field: &str, text: &Option<String>| {
            given(text).map(|t| parse_time(field, &t)).transpose()
        };
        let before = given(&self.before)
            .map(|cursor| {
                cursor
                    .parse::<Cursor>()
                    .map_err(|e| Problem::bad_request(format!("before: {e}")))
            })
            .transpose()?;
        Ok(Search {
            actor: given(&self.actor),
            entity_type: given(&self.entity_type),
            entity_id: given(&self.entity_id),
            since: time("since", &self.since)?,
            until: time("until", &self.until)?,
            limit: PER_PAGE,
            before,
        })
    }

    /// This search's query string for the page after `last`.
    fn older(&self, last: &StoredEntry) -> String {
        let mut next = self.clone();
        next.before = Some(Cursor::after(last).to_string());
        serde_urlencoded::to_string(&next).unwrap_or_default()
    }
}

#[derive(Debug, Serialize)]
struct Results {
    form: SearchForm,
    entries: Vec<StoredEntry>,
    /// The next (older) page's query, when this one is full.
    older: Option<String>,
    per_page: u32,
    /// `jobs.retention.audit_log`, in seconds: entries that occurred longer ago are deleted;
    /// `None`, kept.
    retention_secs: Option<u64>,
    /// The queue the entries arrive on, with its tiers and dead queue, as last sampled.
    queue: Option<QueueReading>,
}

async fn results(console: &Console, form: SearchForm) -> Result<Results, Problem> {
    let search = form.search()?;
    let entries = job_audit_log::find(&console.pool, &search)
        .await
        .map_err(|e| Problem::failed("Searching the audit log", e))?;
    let older = (entries.len() >= PER_PAGE as usize)
        .then(|| entries.last().map(|last| form.older(last)))
        .flatten();
    Ok(Results {
        form,
        entries,
        older,
        per_page: PER_PAGE,
        retention_secs: console.audit_log_retention.as_ref().map(Duration::as_secs),
        queue: queue(console),
    })
}

/// The audit-log job's queue as the sampler last read it, when this host runs the job.
fn queue(console: &Console) -> Option<QueueReading> {
    let name = console
        .runtime
        .jobs()
        .into_iter()
        .find(|job| job.name == job_audit_log::JOB_NAME)?
        .queue?;
    console
        .runtime
        .readings()
        .queues
        .into_iter()
        .find(|reading| reading.queue == name)
}

/// `results` with each actor masked, when `caller` may not see personal data on `uri`'s page;
/// the rest is masked as on every page.
async fn as_seen(
    console: &Console,
    caller: &Who,
    uri: &Uri,
    mut results: Results,
) -> Result<Results, Problem> {
    if personal::sight(console, caller, uri.path()).await?.masked {
        for entry in &mut results.entries {
            entry.actor = masking::name(&entry.actor);
        }
    }
    Ok(results)
}

pub async fn page(
    axum::extract::State(console): State,
    caller: Who,
    uri: Uri,
    Query(form): Query<SearchForm>,
) -> PageResult {
    if let Some(redirect) = sign_in_first(&caller, "/audit-log") {
        return Ok(redirect);
    }
    let results = results(&console, form).await?;
    let results = as_seen(&console, &caller, &uri, results).await?;
    let (r, personal) = personal::for_page(&console, &caller, &uri, &results).await?;
    render(
        &console,
        &caller,
        "audit_log.html",
        minijinja::context! { r, personal },
    )
}

pub async fn api(
    axum::extract::State(console): State,
    caller: Who,
    uri: Uri,
    Query(form): Query<SearchForm>,
) -> PageResult {
    may_read_api(&caller)?;
    let results = results(&console, form).await.map_err(Problem::json)?;
    let results = as_seen(&console, &caller, &uri, results)
        .await
        .map_err(Problem::json)?;
    personal::for_api(&console, &caller, &uri, &results).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bad_cursor_or_time_names_its_field() {
        for (form, field) in [
            (
                SearchForm {
                    before: Some("yesterday".into()),
                    ..SearchForm::default()
                },
                "before",
            ),
            (
                SearchForm {
                    since: Some("last tuesday".into()),
                    ..SearchForm::default()
                },
                "since",
            ),
        ] {
            let problem = form.search().unwrap_err();
            assert!(format!("{problem:?}").contains(field), "{problem:?}");
        }
    }

    #[test]
    fn the_older_link_reads_back_as_the_last_entry() {
        use chrono::SubsecRound;
        let last = StoredEntry {
            id: uuid::Uuid::new_v4(),
            // As PostgreSQL keeps a time: to the microsecond.
            occurred_at: chrono::Utc::now().trunc_subsecs(6),
            actor: "dispatch-7".into(),
            action: "shipment.cancelled".into(),
            entity_type: "shipment".into(),
            entity_id: "S-1".into(),
            data: serde_json::json!({}),
            recorded_at: chrono::Utc::now(),
        };
        let form = SearchForm {
            actor: Some("dispatch-7".into()),
            ..SearchForm::default()
        };
        let query: SearchForm = serde_urlencoded::from_str(&form.older(&last)).unwrap();
        let search = query.search().unwrap();
        assert_eq!(search.actor.as_deref(), Some("dispatch-7"));
        assert_eq!(search.before, Some(Cursor::after(&last)));
    }
}
