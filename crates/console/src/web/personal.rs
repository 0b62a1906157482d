//! Who sees customers' personal data on a page: operators and admins always; a viewer masked
//! ([`super::masking`]), unless its account may reveal it and revealed that page in the last
//! [`REVEAL_WINDOW`] (`POST /reveal`, an audit entry each); a reader without an account
//! (`admin.open_reading`) masked always. Also the grant of that right to a viewer, which an
//! operator or admin gives (`POST /accounts/{name}/personal-data`).

use std::time::Duration;

use axum::Form;
use axum::http::{HeaderMap, HeaderValue, StatusCode, Uri};
use axum::response::{IntoResponse, Json};
use serde::{Deserialize, Serialize};
use worker_store::operators::{self, AccountError, Role};

use super::Console;
use super::access::Caller;
use super::caller::Who;
use super::masking;
use super::page::{PageResult, Problem, State, local_path, see_other};

/// How long a reveal shows a page's personal data to the viewer who asked.
pub const REVEAL_WINDOW: Duration = Duration::from_secs(15 * 60);

/// The header an API answer carries when its personal data is masked.
pub const MASKED_HEADER: &str = "x-personal-data";

/// What a caller sees of one page's personal data.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Sight {
    pub masked: bool,
    /// The caller may reveal it (`POST /reveal`).
    pub may_reveal: bool,
}

impl Sight {
    const FULL: Self = Self {
        masked: false,
        may_reveal: false,
    };

    /// `data` masked, for a caller who may not see it; `None` for one who may, whose answer is
    /// `data` itself (no round trip through JSON on an operator's every page).
    fn masked_copy<T: Serialize>(&self, data: &T) -> Result<Option<serde_json::Value>, Problem> {
        if !self.masked {
            return Ok(None);
        }
        serde_json::to_value(data)
            .map(|value| Some(masking::masked(value)))
            .map_err(|e| {
                Problem::new(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "This answer could not be prepared",
                    e.to_string(),
                )
            })
    }

    /// `data` as an API answer this caller may see, marked when masked.
    fn answer<T: Serialize>(&self, data: &T) -> PageResult {
        let Some(shown) = self.masked_copy(data).map_err(Problem::json)? else {
            return Ok(Json(data).into_response());
        };
        let mut response = Json(shown).into_response();
        response
            .headers_mut()
            .insert(MASKED_HEADER, HeaderValue::from_static("masked"));
        Ok(response)
    }
}

/// The page a path's personal data is revealed for: its API twin's too, without the query.
pub fn page_of(path: &str) -> String {
    let path = path.split(['?', '#']).next().unwrap_or(path);
    let path = path.strip_prefix("/api").unwrap_or(path);
    if path.is_empty() {
        "/".to_string()
    } else {
        path.to_string()
    }
}

/// What `caller` sees of the personal data on `path`.
pub async fn sight(console: &Console, caller: &Caller, path: &str) -> Result<Sight, Problem> {
    let Some(signed) = caller.signed.as_ref() else {
        return Ok(Sight {
            masked: true,
            ..Sight::FULL
        });
    };
    if signed.role >= Role::Operator {
        return Ok(Sight::FULL);
    }
    let viewer = operators::viewer_sight(
        &console.pool,
        &signed.account,
        &page_of(path),
        REVEAL_WINDOW,
    )
    .await
    .map_err(|e| Problem::failed("Reading what this account may see", e))?;
    Ok(Sight {
        masked: !viewer.revealed,
        may_reveal: viewer.may_reveal && !viewer.revealed,
    })
}

#[derive(Debug, Deserialize)]
pub struct RevealForm {
    #[serde(default)]
    csrf: String,
    /// The console path whose personal data to show.
    page: String,
}

/// `POST /reveal`: shows a viewer the personal data of one page, recorded in the audit trail.
pub async fn reveal(
    axum::extract::State(console): State,
    caller: Who,
    headers: HeaderMap,
    Form(form): Form<RevealForm>,
) -> PageResult {
    let actor = caller
        .may_act_as(Role::Viewer, &headers, &form.csrf)
        .map_err(Problem::from)?;
    if !local_path(&form.page) {
        return Err(Problem::bad_request(format!(
            "page: `{}` is not a path of this console",
            form.page
        )));
    }
    let page = page_of(&form.page);
    let revealed = operators::reveal(&console.pool, &actor, &page)
        .await
        .map_err(|e| Problem::failed("Recording the reveal", e))?;
    if !revealed {
        return Err(Problem::new(
            StatusCode::FORBIDDEN,
            "Not allowed",
            "this account may not reveal personal data: an operator or admin can allow it on the accounts page",
        ));
    }
    Ok(see_other(&form.page))
}

#[derive(Debug, Deserialize)]
pub struct RightForm {
    #[serde(default)]
    csrf: String,
    /// `yes` to allow, `no` to take the right back.
    allowed: String,
}

/// `POST /accounts/{name}/personal-data`: an operator or admin lets a viewer reveal personal
/// data, or no longer.
pub async fn set_right(
    axum::extract::State(console): State,
    caller: Who,
    headers: HeaderMap,
    axum::extract::Path(name): axum::extract::Path<String>,
    Form(form): Form<RightForm>,
) -> PageResult {
    let actor = caller
        .may_act_as(Role::Operator, &headers, &form.csrf)
        .map_err(Problem::from)?;
    let allowed = match form.allowed.as_str() {
        "yes" => true,
        "no" => false,
        other => {
            return Err(Problem::bad_request(format!(
                "allowed: expected yes or no, found `{other}`"
            )));
        }
    };
    operators::set_reveal_right(&console.pool, &name, allowed, &actor)
        .await
        .map_err(right_refused)?;
    Ok(see_other("/accounts"))
}

fn right_refused(e: AccountError) -> Problem {
    match e {
        AccountError::NotFound(_) => Problem::not_found(e.to_string()),
        AccountError::Store(failure) => Problem::failed("Changing the account", failure),
        _ => Problem::bad_request(e.to_string()),
    }
}

/// The template's banner: masked or not, and the reveal button's target.
fn banner(sight: Sight, uri: &Uri) -> minijinja::Value {
    let page = uri.path_and_query().map_or(uri.path(), |p| p.as_str());
    minijinja::context! { masked => sight.masked, may_reveal => sight.may_reveal, page => page }
}

/// A page's data as `caller` may see it, and the banner its template shows (`personal`).
pub async fn for_page<T: Serialize>(
    console: &Console,
    caller: &Caller,
    uri: &Uri,
    data: &T,
) -> Result<(minijinja::Value, minijinja::Value), Problem> {
    let sight = sight(console, caller, uri.path()).await?;
    let shown = match sight.masked_copy(data)? {
        Some(masked) => minijinja::Value::from_serialize(&masked),
        None => minijinja::Value::from_serialize(data),
    };
    Ok((shown, banner(sight, uri)))
}

/// An API answer's data as `caller` may see it.
pub async fn for_api<T: Serialize>(
    console: &Console,
    caller: &Caller,
    uri: &Uri,
    data: &T,
) -> PageResult {
    let sight = sight(console, caller, uri.path())
        .await
        .map_err(Problem::json)?;
    sight.answer(data)
}
