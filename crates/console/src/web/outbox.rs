//! `/outbox`: the outbox's counts, its pending rows (with their backoff and last error) and
//! its failed ones; put one failed row back to pending, or every one: first a dry run that
//! says how many (recorded), then the confirmed run, which puts back no more than that.

use axum::Form;
use axum::http::{HeaderMap, Uri};
use axum::response::{IntoResponse, Json};
use minijinja::Value;
use serde::{Deserialize, Serialize};
use worker_store::outbox::{self, FailedRow, OutboxStatus, PendingRow, RetryResult};

use super::Console;
use super::caller::Who;
use super::page::{
    PageResult, Problem, State, may_act, may_read_api, render, see_other, sign_in_first,
};
use super::personal;

/// Rows of each kind the page lists.
const ROWS: u32 = 100;

#[derive(Debug, Serialize)]
struct OutboxPage {
    status: OutboxStatus,
    pending: Vec<PendingRow>,
    failed: Vec<FailedRow>,
    rows_max: u32,
}

async fn outbox(console: &Console) -> Result<OutboxPage, Problem> {
    let failed = |e: worker_core::Failure| Problem::failed("Reading the outbox", e);
    Ok(OutboxPage {
        status: outbox::status(&console.pool).await.map_err(failed)?,
        pending: outbox::pending(&console.pool, ROWS).await.map_err(failed)?,
        failed: outbox::failed(&console.pool, ROWS).await.map_err(failed)?,
        rows_max: ROWS,
    })
}

pub async fn page(axum::extract::State(console): State, caller: Who, uri: Uri) -> PageResult {
    if let Some(redirect) = sign_in_first(&caller, "/outbox") {
        return Ok(redirect);
    }
    let page = outbox(&console).await?;
    let (o, personal) = personal::for_page(&console, &caller, &uri, &page).await?;
    render(
        &console,
        &caller,
        "outbox.html",
        minijinja::context! { o, personal },
    )
}

pub async fn api(axum::extract::State(console): State, caller: Who, uri: Uri) -> PageResult {
    may_read_api(&caller)?;
    let page = outbox(&console).await.map_err(Problem::json)?;
    personal::for_api(&console, &caller, &uri, &page).await
}

#[derive(Debug, Deserialize)]
pub struct RetryForm {
    #[serde(default)]
    csrf: String,
    /// One row; absent with `all=failed`, every failed row.
    id: Option<String>,
    all: Option<String>,
    /// `yes`: the operator confirmed the dry run's count, `planned`.
    confirm: Option<String>,
    planned: Option<String>,
}

#[derive(Debug, Serialize)]
struct RetryPlan {
    report: outbox::RetryAllReport,
}

/// Every failed row back to pending: a dry run unless confirmed, then no more than planned.
async fn retry_every_failed(
    console: &Console,
    caller: &Who,
    actor: &worker_store::audit::Actor,
    form: &RetryForm,
) -> PageResult {
    let failed = |e: worker_core::Failure| Problem::failed("Retrying the outbox", e);
    if form.confirm.as_deref() != Some("yes") {
        let report =
            outbox::retry_all_failed_dry_run(&console.pool, actor, outbox::RETRY_PREVIEW_ROWS)
                .await
                .map_err(failed)?;
        let plan = RetryPlan { report };
        if caller.api {
            return Ok(Json(plan.report).into_response());
        }
        return render(
            console,
            caller,
            "outbox_confirm.html",
            minijinja::context! { p => Value::from_serialize(&plan) },
        );
    }
    let text = form.planned.as_deref().map(str::trim).unwrap_or_default();
    let planned: u64 = text.parse().map_err(|_| {
        Problem::bad_request(format!(
            "planned: expected the dry run's count the operator confirmed, found `{text}`"
        ))
    })?;
    let report = outbox::retry_failed(&console.pool, actor, Some(planned))
        .await
        .map_err(failed)?;
    if caller.api {
        return Ok(Json(report).into_response());
    }
    Ok(see_other("/outbox"))
}

pub async fn retry(
    axum::extract::State(console): State,
    caller: Who,
    headers: HeaderMap,
    Form(form): Form<RetryForm>,
) -> PageResult {
    let actor = may_act(&caller, &headers, &form.csrf)?;
    let failed = |e: worker_core::Failure| Problem::failed("Retrying the outbox", e);
    match (form.id.as_deref().map(str::trim), form.all.as_deref()) {
        (Some(id), _) if !id.is_empty() => {
            let id: i64 = id.parse().map_err(|_| {
                Problem::bad_request(format!("id: expected an outbox row's id, found `{id}`"))
            })?;
            match outbox::retry(&console.pool, id, &actor)
                .await
                .map_err(failed)?
            {
                RetryResult::Gone => {
                    return Err(Problem::not_found(RetryResult::gone_message(id)));
                }
                RetryResult::Requeued => {}
            }
        }
        (_, Some("failed")) => {
            return retry_every_failed(&console, &caller, &actor, &form).await;
        }
        _ => {
            return Err(Problem::bad_request(
                "say which row (id) or every failed row (all=failed)",
            ));
        }
    }
    Ok(see_other("/outbox"))
}
