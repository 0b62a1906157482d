//! `/privacy`: an admin erases what the host holds about one person's address (GDPR Art. 17),
//! as `worker-host privacy erase` does: a dry run first, with the rows per table, then the
//! erasure, which first empties the broker's dead queues into the archive. Both are audit
//! entries naming the address only by its keyed hash. `POST /api/privacy/erase` is the same
//! for a script with an admin's token.

use axum::Form;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Json};
use minijinja::Value;
use serde::{Deserialize, Serialize};
use worker_store::operators::Role;
use worker_store::privacy::erase::Erasure;
use worker_store::privacy::{self, Address};

use super::caller::Who;
use super::page::{PageResult, Problem, State, render, sign_in_first};

#[derive(Debug, Serialize)]
struct PrivacyPage {
    /// The address asked about, shown back to the admin who typed it.
    address: Option<String>,
    erasure: Option<Erasure>,
    /// The rows it erased (or would), configuration left out.
    rows: usize,
    /// Dead letters moved from the broker's dead queues into the archive first.
    archived: Option<u64>,
    available: bool,
}

pub async fn page(axum::extract::State(console): State, caller: Who) -> PageResult {
    if let Some(redirect) = sign_in_first(&caller, "/privacy") {
        return Ok(redirect);
    }
    admin_only(&caller)?;
    show(
        &console,
        &caller,
        PrivacyPage {
            address: None,
            erasure: None,
            rows: 0,
            archived: None,
            available: console.privacy_key.is_some(),
        },
    )
}

#[derive(Debug, Deserialize)]
pub struct EraseForm {
    #[serde(default)]
    csrf: String,
    address: String,
    /// `yes` to erase; anything else is a dry run.
    #[serde(default)]
    confirm: String,
}

/// `POST /privacy/erase`: the dry run, or with `confirm=yes` the erasure.
pub async fn erase(
    axum::extract::State(console): State,
    caller: Who,
    headers: HeaderMap,
    Form(form): Form<EraseForm>,
) -> PageResult {
    let actor = caller
        .may_act_as(Role::Admin, &headers, &form.csrf)
        .map_err(Problem::from)?;
    let key = console.privacy_key.as_ref().ok_or_else(|| {
        Problem::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "Erasure unavailable",
            "the settings give no database password, from which the keyed hash is derived",
        )
    })?;
    let address =
        Address::parse(&form.address).map_err(|e| Problem::bad_request(format!("address: {e}")))?;
    let dry_run = form.confirm != "yes";
    let archived = if dry_run {
        None
    } else {
        Some(
            console
                .runtime
                .archive_dead_queues(&console.pool)
                .await
                .map_err(|e| {
                    Problem::new(
                        StatusCode::SERVICE_UNAVAILABLE,
                        "The dead queues could not be archived first",
                        format!("nothing was erased: {e}"),
                    )
                })?,
        )
    };
    let erasure = privacy::erase::erase(&console.pool, &address, key, &actor, dry_run)
        .await
        .map_err(|e| Problem::failed("Erasing", e))?;
    if caller.api {
        return Ok(Json(erasure).into_response());
    }
    show(
        &console,
        &caller,
        PrivacyPage {
            address: Some(form.address),
            rows: erasure.erased(),
            erasure: Some(erasure),
            archived,
            available: true,
        },
    )
}

fn admin_only(caller: &Who) -> Result<(), Problem> {
    match caller.signed.as_ref() {
        Some(signed) if signed.role >= Role::Admin => Ok(()),
        Some(signed) => Err(Problem::new(
            StatusCode::FORBIDDEN,
            "Admins only",
            format!(
                "the account `{}` is a {}: erasing a person's data needs an admin",
                signed.account, signed.role
            ),
        )),
        None => Err(Problem::new(
            StatusCode::FORBIDDEN,
            "Admins only",
            "sign in as an admin to erase a person's data",
        )),
    }
}

fn show(console: &super::Console, caller: &Who, page: PrivacyPage) -> PageResult {
    render(
        console,
        caller,
        "privacy.html",
        minijinja::context! { p => Value::from_serialize(&page) },
    )
}
