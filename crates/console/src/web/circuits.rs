//! The dependencies' open circuits on the console: read from the shared table, so that every
//! replica's console shows the same, for the overview and the page of the job each stops;
//! and an operator's close, from that job's page (`POST /jobs/{job}/circuits/{dependency}/close`)
//! or by a script (`POST /api/circuits/{dependency}/close`, answering JSON), through
//! `worker_store::circuits::close_by_hand` as `worker-host circuits close` does: audited
//! (`circuit-close`) with who and why, on every replica at once.

use axum::Form;
use axum::extract::Path;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Json};
use serde::Deserialize;
use worker_store::circuits;

use super::Console;
use super::caller::Who;
use super::page::{PageResult, Problem, State, may_act, see_other};
use crate::open_circuits::ShownCircuit;

/// The longest dependency name the table takes.
const DEPENDENCY_MAX: usize = 300;

/// Every open circuit, as the shared table has it now.
pub async fn open(console: &Console) -> Result<Vec<ShownCircuit>, Problem> {
    let open = circuits::list(&console.pool)
        .await
        .map_err(|e| Problem::failed("Reading the open circuits", e))?;
    Ok(ShownCircuit::all(&open, chrono::Utc::now()))
}

/// The open circuits that stop job `name`.
pub async fn stopping(console: &Console, name: &str) -> Result<Vec<ShownCircuit>, Problem> {
    let mut open = open(console).await?;
    open.retain(|c| c.job == Some(name));
    Ok(open)
}

/// A close's form: the session's CSRF token and, optionally, why.
#[derive(Debug, Deserialize)]
pub struct CloseForm {
    #[serde(default)]
    csrf: String,
    #[serde(default)]
    reason: Option<String>,
}

/// Closes `dependency`'s circuit for the caller; where a page goes next is `back`.
async fn close_circuit(
    console: &Console,
    caller: &Who,
    headers: &HeaderMap,
    dependency: &str,
    form: &CloseForm,
    back: &str,
) -> PageResult {
    let actor = may_act(caller, headers, &form.csrf)?;
    if dependency.is_empty() || dependency.chars().count() > DEPENDENCY_MAX {
        return Err(Problem::bad_request(format!(
            "a dependency is named in 1 to {DEPENDENCY_MAX} characters"
        )));
    }
    let change = circuits::close_by_hand(&console.pool, dependency, &actor, form.reason.as_deref())
        .await
        .map_err(|e| Problem::failed("Closing the circuit", e))?;
    if caller.api {
        return Ok(Json(serde_json::json!({
            "dependency": dependency,
            "closed": change.changed,
            "action_id": change.action_id,
        }))
        .into_response());
    }
    Ok(see_other(back))
}

/// `POST /jobs/{job}/circuits/{dependency}/close`: back to the job's page.
pub async fn close_from_job(
    axum::extract::State(console): State,
    caller: Who,
    headers: HeaderMap,
    Path((job, dependency)): Path<(String, String)>,
    Form(form): Form<CloseForm>,
) -> PageResult {
    if !super::jobs::runs(&console, &job) {
        return Err(Problem::not_found(format!(
            "this host runs no job called `{job}`"
        )));
    }
    let back = format!("/jobs/{job}");
    close_circuit(&console, &caller, &headers, &dependency, &form, &back).await
}

/// `POST /circuits/{dependency}/close` (and under `/api/`): back to the overview.
pub async fn close(
    axum::extract::State(console): State,
    caller: Who,
    headers: HeaderMap,
    Path(dependency): Path<String>,
    Form(form): Form<CloseForm>,
) -> PageResult {
    close_circuit(&console, &caller, &headers, &dependency, &form, "/").await
}
