//! `/jobs/{name}`: a timer job's schedule, last and next run, durations and skips by cause,
//! who paused it, its latest failed ticks and the operator actions on it; run it now,
//! pause and resume it (the pause in the database, so every replica obeys it). A consumer's
//! page shows its queue and counts, and pauses and resumes it the same way: its consumers
//! stop on every replica.

use axum::Form;
use axum::extract::Path;
use axum::http::{HeaderMap, StatusCode, Uri};
use serde::Serialize;
use worker_store::attempt_log::{self, AttemptRecord};
use worker_store::audit::{self, Entry, EntryKind, NewEntry};
use worker_store::pauses;

use super::Console;
use super::bulk::CsrfForm;
use super::caller::Who;
use super::page::{
    PageResult, Problem, State, may_act, may_read_api, render, see_other, sign_in_first,
};
use super::personal;
use crate::runtime::pause_of;

/// Latest failed ticks and audit entries a job's page lists.
const RECENT: u32 = 20;

#[derive(Debug, Serialize)]
struct JobPage {
    name: String,
    kind: &'static str,
    /// A timer's schedule, runs and counts.
    timer: Option<serde_json::Value>,
    /// A consumer's queue and counts.
    consumer: Option<serde_json::Value>,
    paused: Option<pauses::Pause>,
    /// A consumer's: whether this replica holds its consumers stopped now (it follows the
    /// pause within `workers.pause_poll`, at once on the notice).
    stopped_here: Option<bool>,
    /// Why it cannot be paused, when it cannot.
    not_pausable: Option<String>,
    /// The open circuits of the dependencies it cannot work without.
    circuits: Vec<crate::open_circuits::ShownCircuit>,
    /// email-send's: the SMTP account's sending rate, as `/status` shows it.
    sending_rate: Option<serde_json::Value>,
    recent_ticks: Vec<AttemptRecord>,
    actions: Vec<EntryRow>,
}

#[derive(Debug, Serialize)]
struct EntryRow {
    #[serde(flatten)]
    action: Entry,
    actor: String,
}

fn target(name: &str) -> serde_json::Value {
    serde_json::json!({ "job": name })
}

async fn job(console: &Console, name: &str) -> Result<JobPage, Problem> {
    let entry = console
        .runtime
        .jobs()
        .into_iter()
        .find(|job| job.name == name)
        .ok_or_else(|| Problem::not_found(format!("this host runs no job called `{name}`")))?;
    let failed = |what: &str| {
        let what = what.to_string();
        move |e: worker_core::Failure| Problem::failed(&what, e)
    };
    let (kind, timer, consumer) = match entry.queue {
        None => ("timer", Some(entry.shown), None),
        Some(queue) => (
            "consumer",
            None,
            Some(serde_json::json!({ "queue": queue, "counts": entry.shown })),
        ),
    };
    let paused = pauses::list(&console.pool)
        .await
        .map_err(failed("Reading the paused jobs"))?;
    let paused = pause_of(&*console.runtime, &paused, name).cloned();
    let recent_ticks = if timer.is_some() {
        recent_ticks(console, name)
            .await
            .map_err(failed("Reading the attempt log"))?
    } else {
        Vec::new()
    };
    let actions = audit::on_target(&console.pool, &target(name), RECENT)
        .await
        .map_err(failed("Reading the audit trail"))?
        .into_iter()
        .map(|action| EntryRow {
            actor: action.actor_label(),
            action,
        })
        .collect();
    let circuits = super::circuits::stopping(console, name).await?;
    let sending_rate = (name == job_email_send::JOB_NAME)
        .then(|| console.runtime.sending_rate())
        .flatten()
        .filter(|rate| !rate.is_null());
    let stopped_here = consumer
        .is_some()
        .then(|| console.runtime.stopped_here(name));
    Ok(JobPage {
        name: name.to_string(),
        kind,
        stopped_here,
        not_pausable: console.runtime.pausable(name).err(),
        circuits,
        sending_rate,
        timer,
        consumer,
        paused,
        recent_ticks,
        actions,
    })
}

pub async fn page(
    axum::extract::State(console): State,
    caller: Who,
    uri: Uri,
    Path(name): Path<String>,
    axum::extract::Query(query): axum::extract::Query<super::history::RangeQuery>,
) -> PageResult {
    if let Some(redirect) = sign_in_first(&caller, &format!("/jobs/{name}")) {
        return Ok(redirect);
    }
    let range = super::history::Range::of(&query)?;
    let job = job(&console, &name).await?;
    let history = super::history::job(&console, &name, range).await?;
    let (j, personal) = personal::for_page(&console, &caller, &uri, &job).await?;
    render(
        &console,
        &caller,
        "job.html",
        minijinja::context! { j, history => history.view(), personal },
    )
}

pub async fn api(
    axum::extract::State(console): State,
    caller: Who,
    uri: Uri,
    Path(name): Path<String>,
) -> PageResult {
    may_read_api(&caller)?;
    let job = job(&console, &name).await.map_err(Problem::json)?;
    personal::for_api(&console, &caller, &uri, &job).await
}

/// Runs a timer's tick now on this replica (through its busy guard, lease and timeout, even
/// while it is paused), recorded in the audit trail whether the loop took it or not.
pub async fn run_now(
    axum::extract::State(console): State,
    caller: Who,
    headers: HeaderMap,
    Path(name): Path<String>,
    Form(form): Form<CsrfForm>,
) -> PageResult {
    let actor = may_act(&caller, &headers, &form.csrf)?;
    let taken = console.runtime.run_now(&name).ok_or_else(|| {
        Problem::not_found(format!("this host runs no timer job called `{name}`"))
    })?;
    let note = match &taken {
        Ok(()) => format!("run now on replica {}", console.replica),
        Err(refused) => format!("not run: {refused}"),
    };
    let mut conn = console
        .pool
        .acquire()
        .await
        .map_err(|e| Problem::failed("Recording the operator action", e))?;
    audit::record(
        &mut conn,
        &NewEntry::new(EntryKind::RunNow, &actor, target(&name)),
        u64::from(taken.is_ok()),
        u64::from(taken.is_err()),
        Some(note),
    )
    .await
    .map_err(|e| Problem::failed("Recording the operator action", e))?;
    match taken {
        Ok(()) => Ok(see_other(&format!("/jobs/{name}"))),
        Err(refused) => Err(Problem::new(
            StatusCode::CONFLICT,
            "Not run",
            format!("{name}: {refused}"),
        )),
    }
}

/// A pause's or a resume's form: the session's CSRF token and, optionally, why.
#[derive(Debug, serde::Deserialize)]
pub struct PauseForm {
    #[serde(default)]
    pub csrf: String,
    #[serde(default)]
    pub reason: Option<String>,
}

async fn change_pause(
    console: &Console,
    caller: &Who,
    headers: &HeaderMap,
    name: &str,
    form: &PauseForm,
    pause: bool,
) -> PageResult {
    let actor = may_act(caller, headers, &form.csrf)?;
    if !runs(console, name) {
        return Err(Problem::not_found(format!(
            "this host runs no job called `{name}`"
        )));
    }
    let spec = console
        .runtime
        .pausable(name)
        .map_err(|why| Problem::new(StatusCode::CONFLICT, "Cannot be paused", why))?;
    let reason = form.reason.as_deref();
    let changed = if pause {
        pauses::pause(&console.pool, spec, &actor, reason).await
    } else {
        pauses::resume(&console.pool, spec, &actor, reason).await
    };
    changed.map_err(|e| Problem::failed("Changing the pause", e))?;
    Ok(see_other(&format!("/jobs/{name}")))
}

pub async fn pause(
    axum::extract::State(console): State,
    caller: Who,
    headers: HeaderMap,
    Path(name): Path<String>,
    Form(form): Form<PauseForm>,
) -> PageResult {
    change_pause(&console, &caller, &headers, &name, &form, true).await
}

pub async fn resume(
    axum::extract::State(console): State,
    caller: Who,
    headers: HeaderMap,
    Path(name): Path<String>,
    Form(form): Form<PauseForm>,
) -> PageResult {
    change_pause(&console, &caller, &headers, &name, &form, false).await
}

/// A timer's latest rows of the attempt log, newest first, under its name and every name it
/// had (a renamed job's ticks before the upgrade stay on its page until retention sweeps them).
async fn recent_ticks(
    console: &Console,
    name: &str,
) -> Result<Vec<AttemptRecord>, worker_core::Failure> {
    let names: Vec<&str> = console
        .runtime
        .job(name)
        .map_or_else(|| vec![name], |spec| spec.names().collect());
    let mut rows = Vec::new();
    for job in names {
        rows.extend(attempt_log::recent(&console.pool, job, RECENT).await?);
    }
    rows.sort_by_key(|row| std::cmp::Reverse(row.at));
    rows.truncate(RECENT as usize);
    Ok(rows)
}

/// Whether this host runs a job called `name`.
pub fn runs(console: &Console, name: &str) -> bool {
    console.runtime.jobs().iter().any(|job| job.name == name)
}
