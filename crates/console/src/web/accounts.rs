//! `/accounts`: the operator accounts every replica shares, with their role, origin, tokens and
//! live sessions; an admin makes, changes, disables, enables and removes them and gives them
//! API tokens here, as `worker-host operators` does on the command line. Each change goes
//! through [`worker_store::operators`], which records it in the audit trail.

use axum::Form;
use axum::extract::Path;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Json};
use minijinja::Value;
use serde::{Deserialize, Serialize};
use worker_store::operators::{self, Account, AccountError, Role};

use super::Console;
use super::caller::Who;
use super::page::{PageResult, Problem, State, may_read_api, render, see_other, sign_in_first};
use crate::credentials::{self, CredentialError};

#[derive(Debug, Serialize)]
struct AccountsPage {
    accounts: Vec<Account>,
    roles: [Role; 3],
    /// A token just made, shown this once.
    token: Option<NewToken>,
}

#[derive(Debug, Serialize)]
struct NewToken {
    account: String,
    token: String,
}

async fn accounts(console: &Console) -> Result<Vec<Account>, Problem> {
    operators::list(&console.pool)
        .await
        .map_err(|e| Problem::failed("Reading the accounts", e))
}

fn page_of(
    console: &Console,
    caller: &Who,
    token: Option<NewToken>,
    accounts: Vec<Account>,
) -> PageResult {
    let page = AccountsPage {
        accounts,
        roles: Role::ALL,
        token,
    };
    render(
        console,
        caller,
        "accounts.html",
        minijinja::context! { a => Value::from_serialize(&page) },
    )
}

pub async fn page(axum::extract::State(console): State, caller: Who) -> PageResult {
    if let Some(redirect) = sign_in_first(&caller, "/accounts") {
        return Ok(redirect);
    }
    let accounts = accounts(&console).await?;
    page_of(&console, &caller, None, accounts)
}

pub async fn api(axum::extract::State(console): State, caller: Who) -> PageResult {
    may_read_api(&caller)?;
    let accounts = accounts(&console).await.map_err(Problem::json)?;
    Ok(Json(accounts).into_response())
}

fn refused(e: AccountError) -> Problem {
    match e {
        AccountError::BadName(_) | AccountError::Bootstrap => Problem::bad_request(e.to_string()),
        AccountError::Exists(_) => {
            Problem::new(StatusCode::CONFLICT, "Exists already", e.to_string())
        }
        AccountError::NotFound(_) => Problem::not_found(e.to_string()),
        AccountError::Store(failure) => Problem::failed("Changing the account", failure),
    }
}

#[derive(Deserialize)]
pub struct AddForm {
    #[serde(default)]
    csrf: String,
    #[serde(default)]
    name: String,
    #[serde(default)]
    role: String,
    /// Empty: an account that signs in through the auth proxy or with API tokens only.
    #[serde(default)]
    password: String,
}

/// Never the password.
impl std::fmt::Debug for AddForm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AddForm")
            .field("name", &self.name)
            .field("role", &self.role)
            .finish_non_exhaustive()
    }
}

fn role_of(text: &str) -> Result<Role, Problem> {
    text.parse()
        .map_err(|why: String| Problem::bad_request(format!("role: {why}")))
}

pub async fn add(
    axum::extract::State(console): State,
    caller: Who,
    headers: HeaderMap,
    Form(form): Form<AddForm>,
) -> PageResult {
    let actor = caller
        .may_act_as(Role::Admin, &headers, &form.csrf)
        .map_err(Problem::from)?;
    let role = role_of(&form.role)?;
    let hash = if form.password.is_empty() {
        None
    } else {
        let settings = console.password_hashing;
        let password = form.password.clone();
        let hashed =
            tokio::task::spawn_blocking(move || credentials::hash_password(&password, settings))
                .await
                .map_err(|e| Problem::failed("Hashing the password", e))?;
        Some(hashed.map_err(|e| match e {
            CredentialError::TooShort => Problem::bad_request(format!("password: {e}")),
            other => Problem::failed("Hashing the password", other),
        })?)
    };
    operators::add(
        &console.pool,
        form.name.trim(),
        role,
        hash.as_deref(),
        &actor,
    )
    .await
    .map_err(refused)?;
    Ok(see_other("/accounts"))
}

#[derive(Debug, Deserialize)]
pub struct ChangeForm {
    #[serde(default)]
    csrf: String,
    /// For a change of role.
    role: Option<String>,
    /// For a token: what it is for.
    label: Option<String>,
}

/// A change of account `name`: `role`, `disable`, `enable`, `remove` or `token`.
pub async fn change(
    axum::extract::State(console): State,
    caller: Who,
    headers: HeaderMap,
    Path((name, what)): Path<(String, String)>,
    Form(form): Form<ChangeForm>,
) -> PageResult {
    let actor = caller
        .may_act_as(Role::Admin, &headers, &form.csrf)
        .map_err(Problem::from)?;
    let own = caller.signed.as_ref().is_some_and(|s| s.account == name);
    if own && what != "token" {
        return Err(Problem::new(
            StatusCode::CONFLICT,
            "Not your own account",
            "an admin does not change, disable or remove the account they are signed in with: ask another admin, or use worker-host operators",
        ));
    }
    let pool = &console.pool;
    match what.as_str() {
        "role" => {
            let role = role_of(form.role.as_deref().unwrap_or_default())?;
            operators::set_role(pool, &name, role, &actor).await
        }
        "disable" => operators::disable(pool, &name, &actor).await,
        "enable" => operators::enable(pool, &name, &actor).await,
        "remove" => operators::remove(pool, &name, &actor).await,
        "token" => {
            let token = credentials::new_token();
            let label = form
                .label
                .as_deref()
                .map(str::trim)
                .filter(|l| !l.is_empty());
            operators::add_token(
                pool,
                &name,
                label.unwrap_or("console"),
                &credentials::token_digest(&token),
                &actor,
            )
            .await
            .map_err(refused)?;
            let new = NewToken {
                account: name,
                token,
            };
            if caller.api {
                return Ok(Json(new).into_response());
            }
            let accounts = accounts(&console).await?;
            return page_of(&console, &caller, Some(new), accounts);
        }
        other => {
            return Err(Problem::not_found(format!(
                "`{other}` is no change of an account: role, disable, enable, remove or token"
            )));
        }
    }
    .map_err(refused)?;
    Ok(see_other("/accounts"))
}
