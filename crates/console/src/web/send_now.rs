//! "Send parked now" from a queue's page (issue 39): a dry run first (recorded), whose page
//! shows the count per retry tier and asks to confirm it; then a run that moves at most that
//! count back to the work queue, recorded with who and why. Both through
//! [`crate::parked::send_now`], as `worker-host queues send-now` does, and both under `/api/`
//! for scripts, answering its report as JSON.

use std::sync::Arc;

use axum::Form;
use axum::extract::Path;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Json};
use minijinja::Value;
use serde::Deserialize;
use worker_broker::RetryTier;

use super::Console;
use super::caller::Who;
use super::page::{PageResult, Problem, State, may_act, render, see_other};
use crate::parked::{self, Request};

/// The form: the session's token, the operator's reason and, once confirmed, the count the
/// dry run showed.
#[derive(Debug, Deserialize)]
pub struct SendNowForm {
    #[serde(default)]
    csrf: String,
    reason: Option<String>,
    planned: Option<String>,
}

/// The retry tiers of `name` as this replica's topology has them (its sampler's reading).
fn tiers_of(console: &Console, name: &str) -> Result<Vec<RetryTier>, Problem> {
    let readings = console.runtime.readings();
    let queue = readings
        .queues
        .iter()
        .find(|q| q.queue == name)
        .ok_or_else(|| Problem::not_found(format!("no consumer queue called `{name}`")))?;
    Ok(queue
        .tiers
        .iter()
        .map(|t| RetryTier {
            delay: t.delay,
            queue: t.queue.clone(),
        })
        .collect())
}

async fn send_now(
    console: Arc<Console>,
    caller: Who,
    headers: HeaderMap,
    name: String,
    form: SendNowForm,
    planned: Option<u64>,
) -> PageResult {
    let actor = may_act(&caller, &headers, &form.csrf)?;
    let tiers = tiers_of(&console, &name)?;
    let session = console
        .publisher
        .current_session()
        .await
        .map_err(|e| Problem::failed("Reaching the broker", e))?;
    let request = Request {
        actor,
        reason: form.reason.clone(),
        dry_run: planned.is_none(),
        planned,
    };
    let what = if request.dry_run {
        "The dry run"
    } else {
        "Sending parked messages now"
    };
    let report = parked::send_now(
        &console.pool,
        &session,
        &console.publisher,
        &name,
        &tiers,
        &request,
    )
    .await
    .map_err(|e| Problem::failed(what, e))?;
    if caller.api {
        return Ok(Json(report).into_response());
    }
    if !report.dry_run {
        return Ok(see_other(&format!("/actions/{}", report.action_id)));
    }
    render(
        &console,
        &caller,
        "send_now_confirm.html",
        minijinja::context! {
            r => Value::from_serialize(&report),
            reason => form.reason.unwrap_or_default(),
        },
    )
}

/// `POST /queues/{name}/send-now`: the dry run, and the page that confirms its count.
pub async fn plan(
    axum::extract::State(console): State,
    caller: Who,
    headers: HeaderMap,
    Path(name): Path<String>,
    Form(form): Form<SendNowForm>,
) -> PageResult {
    send_now(console, caller, headers, name, form, None).await
}

/// `POST /queues/{name}/send-now/run`: at most the confirmed count (`planned`) moves.
pub async fn run(
    axum::extract::State(console): State,
    caller: Who,
    headers: HeaderMap,
    Path(name): Path<String>,
    Form(form): Form<SendNowForm>,
) -> PageResult {
    let text = form.planned.as_deref().map(str::trim).unwrap_or("");
    let planned = match text.parse::<u64>() {
        Ok(n) if n >= 1 => n,
        _ => {
            return Err(Problem::bad_request(format!(
                "planned: expected the count the dry run showed (at least 1), found `{text}`"
            )));
        }
    };
    send_now(console, caller, headers, name, form, Some(planned)).await
}
