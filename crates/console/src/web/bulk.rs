//! Replay and purge from the console, one dead letter, a group, or everything a filter
//! matches: first a dry run (recorded) that shows the count, then, confirmed, a run at the
//! chosen rate on a task of this replica, whose progress page reads its audit row and can
//! cancel it. `/actions` lists the audit trail, the command line's actions with the console's.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Form;
use axum::extract::Path;
use axum::http::{HeaderMap, StatusCode, Uri};
use axum::response::{IntoResponse, Json};
use job_dead_letter_archive as archive;
use minijinja::Value;
use serde::{Deserialize, Serialize};
use worker_store::audit::{self, Entry};

use super::Console;
use super::caller::Who;
use super::filter::FilterForm;
use super::page::{
    PageResult, Problem, State, may_act, may_read_api, render, see_other, sign_in_first,
};
use super::personal;

/// Bulk actions one replica runs at once: each holds a database connection of the console's
/// pool while it publishes a batch.
pub const RUNNING_MAX: usize = 2;
/// The fastest rate a bulk action may ask for, in messages per second.
pub const RATE_MAX: u32 = 10_000;
/// Dry-run items the confirmation lists.
const PREVIEW_ITEMS: usize = 20;

/// The bulk actions running on this replica, and how to stop each. A run is in it from
/// before its task starts until the task ends, so that a quick one cannot outlive its entry.
#[derive(Debug, Default)]
pub struct BulkRuns {
    running: Mutex<HashMap<u64, archive::Control>>,
    next: std::sync::atomic::AtomicU64,
}

impl BulkRuns {
    /// Holds `control` until [`BulkRuns::remove`] with the key returned, while fewer than
    /// [`RUNNING_MAX`] run here; else `None`. The count and the insert are one step under the
    /// lock: counted, then inserted apart, two starts at once could both find room for one.
    fn admit(&self, control: archive::Control) -> Option<u64> {
        let mut running = self.running.lock().ok()?;
        if running.len() >= RUNNING_MAX {
            return None;
        }
        let key = self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        running.insert(key, control);
        Some(key)
    }

    #[cfg(test)]
    fn count(&self) -> usize {
        self.running.lock().map(|r| r.len()).unwrap_or(RUNNING_MAX)
    }

    fn remove(&self, key: u64) {
        if let Ok(mut running) = self.running.lock() {
            running.remove(&key);
        }
    }

    /// The control of action `id`, when it runs here.
    fn get(&self, id: i64) -> Option<archive::Control> {
        self.running
            .lock()
            .ok()?
            .values()
            .find(|control| control.action_id() == Some(id))
            .cloned()
    }
}

/// Replay or purge.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
enum Kind {
    Replay,
    Purge,
}

impl Kind {
    const fn path(self) -> &'static str {
        match self {
            Self::Replay => "replay",
            Self::Purge => "purge",
        }
    }
}

/// A bulk action's form: the filter (or one id), and once confirmed, the rate and the count
/// the operator was shown.
#[derive(Debug, Deserialize)]
pub struct BulkForm {
    #[serde(default)]
    csrf: String,
    #[serde(flatten)]
    filter: FilterForm,
    id: Option<String>,
    rate: Option<String>,
    planned: Option<String>,
    /// `yes`: the operator confirmed acting on every dead letter (no filter narrows it).
    all: Option<String>,
}

impl BulkForm {
    fn id(&self) -> Result<Option<i64>, Problem> {
        match self.id.as_deref().map(str::trim).filter(|t| !t.is_empty()) {
            None => Ok(None),
            Some(t) => t.parse().map(Some).map_err(|_| {
                Problem::bad_request(format!("id: expected a dead letter's id, found `{t}`"))
            }),
        }
    }

    /// The filter it acts on; an unnarrowed one only when the operator said `all`.
    fn target(&self) -> Result<archive::Filter, Problem> {
        let mut filter = self.filter.bulk_filter()?;
        filter.id = self.id()?;
        if !filter.narrows() && self.all.as_deref() != Some("yes") {
            return Err(Problem::bad_request(
                "no filter narrows this to some dead letters: confirm that every dead letter is meant",
            ));
        }
        Ok(filter)
    }

    fn rate(&self, default: u32) -> Result<u32, Problem> {
        let text = self.rate.as_deref().map(str::trim).unwrap_or("");
        if text.is_empty() {
            return Ok(default);
        }
        match text.parse::<u32>() {
            Ok(rate) if (1..=RATE_MAX).contains(&rate) => Ok(rate),
            _ => Err(Problem::bad_request(format!(
                "rate: expected messages per second from 1 to {RATE_MAX}, found `{text}`"
            ))),
        }
    }
}

#[derive(Debug, Serialize)]
struct Plan {
    kind: Kind,
    /// What a run would act on now.
    matched: u64,
    /// The dry run's audit row.
    action_id: i64,
    /// The first few, for the operator to recognise them.
    items: Vec<archive::ReplayItem>,
    /// Of a replay's, the replies past their age limit: recorded `expired`, not sent.
    would_expire: u64,
    filter: FilterForm,
    id: Option<i64>,
    all: bool,
    rate: u32,
    rate_max: u32,
}

async fn plan(
    console: Arc<Console>,
    caller: Who,
    headers: HeaderMap,
    form: BulkForm,
    kind: Kind,
) -> PageResult {
    let actor = may_act(&caller, &headers, &form.csrf)?;
    let filter = form.target()?;
    if kind == Kind::Replay {
        super::edit::refuse_replay_of_edited(&console, filter.id).await?;
    }
    let run = archive::Run::new(actor.clone()).dry(true);
    let mut would_expire = 0;
    let (action_id, matched, items) = match kind {
        Kind::Replay => {
            let report = archive::replay_run(&console.pool, &console.publisher, &filter, &run)
                .await
                .map_err(|e| Problem::failed("The dry run", e))?;
            let ids: Vec<String> = report
                .items
                .iter()
                .filter_map(|item| item.message_id.clone())
                .collect();
            would_expire =
                job_email_send::expiry::would_expire(&console.pool, &ids, console.email_max_age)
                    .await
                    .map_err(|e| Problem::failed("Counting the replies that would expire", e))?;
            let items = report.items.into_iter().take(PREVIEW_ITEMS).collect();
            (report.action_id, report.matched, items)
        }
        Kind::Purge => {
            let report = archive::purge_run(&console.pool, &filter, &run)
                .await
                .map_err(|e| Problem::failed("The dry run", e))?;
            (report.action_id, report.matched, Vec::new())
        }
    };
    let plan = Plan {
        kind,
        matched,
        action_id,
        items,
        would_expire,
        filter: form.filter.cleaned(),
        id: filter.id,
        all: !filter.narrows(),
        rate: console.bulk_rate,
        rate_max: RATE_MAX,
    };
    if caller.api {
        return Ok(Json(plan).into_response());
    }
    render(
        &console,
        &caller,
        "confirm.html",
        minijinja::context! { p => Value::from_serialize(&plan) },
    )
}

pub async fn replay_plan(
    axum::extract::State(console): State,
    caller: Who,
    headers: HeaderMap,
    Form(form): Form<BulkForm>,
) -> PageResult {
    plan(console, caller, headers, form, Kind::Replay).await
}

pub async fn purge_plan(
    axum::extract::State(console): State,
    caller: Who,
    headers: HeaderMap,
    Form(form): Form<BulkForm>,
) -> PageResult {
    plan(console, caller, headers, form, Kind::Purge).await
}

async fn start(
    console: Arc<Console>,
    caller: Who,
    headers: HeaderMap,
    form: BulkForm,
    kind: Kind,
) -> PageResult {
    let actor = may_act(&caller, &headers, &form.csrf)?;
    let filter = form.target()?;
    if kind == Kind::Replay {
        super::edit::refuse_replay_of_edited(&console, filter.id).await?;
    }
    let rate = form.rate(console.bulk_rate)?;
    let planned = form
        .planned
        .as_deref()
        .and_then(|p| p.trim().parse::<u64>().ok());
    let control = archive::Control::default();
    let Some(key) = console.bulk.admit(control.clone()) else {
        return Err(Problem::new(
            StatusCode::TOO_MANY_REQUESTS,
            "Busy",
            format!(
                "{RUNNING_MAX} bulk actions already run on this replica: wait for one to end, or cancel one on /actions"
            ),
        ));
    };
    let run = archive::Run::new(actor.clone())
        .rate(Some(rate))
        .planned(planned)
        .controlled_by(control.clone());
    let task = {
        let console = console.clone();
        let control = control.clone();
        async move {
            let shutdown = console.shutdown.clone();
            let work = async {
                match kind {
                    Kind::Replay => {
                        archive::replay_run(&console.pool, &console.publisher, &filter, &run)
                            .await
                            .map(|r| r.stopped)
                    }
                    Kind::Purge => archive::purge_run(&console.pool, &filter, &run)
                        .await
                        .map(|r| r.stopped),
                }
            };
            tokio::pin!(work);
            let result = tokio::select! {
                result = &mut work => result,
                () = shutdown.cancelled() => {
                    control.stop("the host is shutting down");
                    work.await
                }
            };
            console.bulk.remove(key);
            match &result {
                Ok(stopped) => {
                    tracing::info!(kind = kind.path(), action_id = ?control.action_id(), ?stopped, "a bulk action from the console ended")
                }
                Err(e) => {
                    tracing::error!(kind = kind.path(), action_id = ?control.action_id(), error = %e, "a bulk action from the console failed")
                }
            }
            result
        }
    };
    let mut handle = console.tracker.spawn(task);
    let begun = tokio::time::timeout(Duration::from_secs(15), async {
        tokio::select! {
            id = control.begun_as() => Ok(id),
            ended = &mut handle => Err(ended),
        }
    })
    .await;
    match begun {
        Ok(Ok(id)) => Ok(see_other(&format!("/actions/{id}"))),
        Ok(Err(Ok(Err(failure)))) => Err(Problem::failed("Starting the action", failure)),
        Ok(Err(_)) => Err(Problem::failed(
            "Starting the action",
            "its task ended before it was recorded",
        )),
        Err(_) => {
            control.stop("it could not be recorded within 15 s");
            Err(Problem::failed(
                "Starting the action",
                "the audit trail did not answer within 15 s",
            ))
        }
    }
}

pub async fn replay_start(
    axum::extract::State(console): State,
    caller: Who,
    headers: HeaderMap,
    Form(form): Form<BulkForm>,
) -> PageResult {
    start(console, caller, headers, form, Kind::Replay).await
}

pub async fn purge_start(
    axum::extract::State(console): State,
    caller: Who,
    headers: HeaderMap,
    Form(form): Form<BulkForm>,
) -> PageResult {
    start(console, caller, headers, form, Kind::Purge).await
}

#[derive(Debug, Serialize)]
struct Progress {
    action: Entry,
    actor: String,
    /// Running on this replica, so that it can be cancelled here.
    cancellable: bool,
    running: bool,
    /// Done so far, of what was confirmed (or matched).
    done: i64,
    of: Option<i64>,
    /// Its dead letters, in every state.
    link: Option<String>,
}

/// The filter an action acted on, as the console's link to its dead letters.
fn dead_letters_link(action: &Entry) -> Option<String> {
    if !matches!(action.action.as_str(), "replay" | "purge") {
        return None;
    }
    let filter: archive::Filter = serde_json::from_value(action.filter.clone()).ok()?;
    let form = FilterForm {
        queue: filter.queue,
        reason: filter.reason,
        fingerprint: filter.fingerprint,
        since: filter.since.map(|t| t.to_rfc3339()),
        until: filter.until.map(|t| t.to_rfc3339()),
        search: filter.search,
        status: Some("all".into()),
    };
    Some(match filter.id {
        Some(id) => format!("/dead-letters/{id}"),
        None => format!("/dead-letters/messages?{}", form.query()),
    })
}

async fn progress(console: &Console, id: &str) -> Result<Progress, Problem> {
    let not_found = || Problem::not_found(format!("no recorded action has id {id}"));
    let id: i64 = id.parse().map_err(|_| not_found())?;
    let action = audit::get(&console.pool, id)
        .await
        .map_err(|e| Problem::failed("Reading the audit trail", e))?
        .ok_or_else(not_found)?;
    Ok(Progress {
        actor: action.actor_label(),
        cancellable: action.running() && console.bulk.get(id).is_some(),
        running: action.running(),
        done: action.succeeded + action.failed,
        of: action
            .planned
            .or((!action.running()).then_some(action.matched)),
        link: dead_letters_link(&action),
        action,
    })
}

pub async fn entry_page(
    axum::extract::State(console): State,
    caller: Who,
    uri: Uri,
    Path(id): Path<String>,
) -> PageResult {
    if let Some(redirect) = sign_in_first(&caller, &format!("/actions/{id}")) {
        return Ok(redirect);
    }
    let progress = progress(&console, &id).await?;
    let (a, personal) = personal::for_page(&console, &caller, &uri, &progress).await?;
    render(
        &console,
        &caller,
        "action.html",
        minijinja::context! { a, personal },
    )
}

pub async fn entry_api(
    axum::extract::State(console): State,
    caller: Who,
    uri: Uri,
    Path(id): Path<String>,
) -> PageResult {
    may_read_api(&caller)?;
    let progress = progress(&console, &id).await.map_err(Problem::json)?;
    personal::for_api(&console, &caller, &uri, &progress).await
}

#[derive(Debug, Deserialize)]
pub struct CsrfForm {
    #[serde(default)]
    pub csrf: String,
}

pub async fn cancel(
    axum::extract::State(console): State,
    caller: Who,
    headers: HeaderMap,
    Path(id): Path<String>,
    Form(form): Form<CsrfForm>,
) -> PageResult {
    let actor = may_act(&caller, &headers, &form.csrf)?;
    let action_id: i64 = id
        .parse()
        .map_err(|_| Problem::not_found(format!("no recorded action has id {id}")))?;
    let Some(control) = console.bulk.get(action_id) else {
        return Err(Problem::new(
            StatusCode::CONFLICT,
            "Not running here",
            format!(
                "action {action_id} is not running on this replica: it ended, or another replica runs it"
            ),
        ));
    };
    control.stop(format!("cancelled by {}", actor.label()));
    Ok(see_other(&format!("/actions/{action_id}")))
}

/// The audit trail's latest rows, the command line's and the console's.
const TRAIL_ROWS: u32 = 100;

#[derive(Debug, Serialize)]
struct Trail {
    actions: Vec<TrailRow>,
}

#[derive(Debug, Serialize)]
struct TrailRow {
    #[serde(flatten)]
    action: Entry,
    actor: String,
}

async fn trail(console: &Console) -> Result<Trail, Problem> {
    let actions = audit::recent(&console.pool, TRAIL_ROWS)
        .await
        .map_err(|e| Problem::failed("Reading the audit trail", e))?;
    Ok(Trail {
        actions: actions
            .into_iter()
            .map(|action| TrailRow {
                actor: action.actor_label(),
                action,
            })
            .collect(),
    })
}

pub async fn trail_page(axum::extract::State(console): State, caller: Who, uri: Uri) -> PageResult {
    if let Some(redirect) = sign_in_first(&caller, "/actions") {
        return Ok(redirect);
    }
    let trail = trail(&console).await?;
    let (t, personal) = personal::for_page(&console, &caller, &uri, &trail).await?;
    render(
        &console,
        &caller,
        "actions.html",
        minijinja::context! { t, personal },
    )
}

pub async fn trail_api(axum::extract::State(console): State, caller: Who, uri: Uri) -> PageResult {
    may_read_api(&caller)?;
    let trail = trail(&console).await.map_err(Problem::json)?;
    personal::for_api(&console, &caller, &uri, &trail).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn starts_at_once_never_run_more_than_the_cap() {
        let runs = Arc::new(BulkRuns::default());
        let most = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let threads: Vec<_> = (0..8)
            .map(|_| {
                let runs = runs.clone();
                let most = most.clone();
                std::thread::spawn(move || {
                    for _ in 0..20_000 {
                        if let Some(key) = runs.admit(archive::Control::default()) {
                            most.fetch_max(runs.count(), std::sync::atomic::Ordering::SeqCst);
                            runs.remove(key);
                        }
                    }
                })
            })
            .collect();
        for thread in threads {
            thread.join().unwrap();
        }
        let most = most.load(std::sync::atomic::Ordering::SeqCst);
        assert!(most <= RUNNING_MAX, "{most} ran at once");
    }
}
