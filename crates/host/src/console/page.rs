//! What every page shares: the frame around it (installation, replica, who is signed in, the
//! session's CSRF token), a problem shown as a page or as JSON, the guards on reading and
//! acting, and the headers every admin response carries.

use std::sync::Arc;

use axum::http::{HeaderMap, StatusCode};
use axum::response::{Html, IntoResponse, Json, Redirect, Response};
use minijinja::Value;
use serde::Serialize;

use worker_store::audit::Actor;

use super::Console;
use super::access::{Caller, Refusal};

/// Something a page or an API call cannot do, with the status it answers.
#[derive(Debug)]
pub struct Problem {
    pub status: StatusCode,
    pub title: String,
    pub detail: String,
    /// Answer as JSON (an `/api/` call) instead of a page.
    pub json: bool,
}

impl Problem {
    pub fn new(status: StatusCode, title: impl Into<String>, detail: impl Into<String>) -> Self {
        Self {
            status,
            title: title.into(),
            detail: detail.into(),
            json: false,
        }
    }

    pub fn bad_request(detail: impl Into<String>) -> Self {
        Self::new(
            StatusCode::BAD_REQUEST,
            "That request cannot be read",
            detail,
        )
    }

    pub fn not_found(detail: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, "Not found", detail)
    }

    /// A failure of the database or the broker while answering.
    pub fn failed(what: &str, failure: impl std::fmt::Display) -> Self {
        Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            format!("{what} failed"),
            failure.to_string(),
        )
    }

    /// Answers as JSON.
    #[must_use]
    pub fn json(mut self) -> Self {
        self.json = true;
        self
    }
}

impl From<Refusal> for Problem {
    fn from(refusal: Refusal) -> Self {
        let status = match refusal {
            Refusal::NotSignedIn | Refusal::WrongToken | Refusal::WrongPassword => {
                StatusCode::UNAUTHORIZED
            }
            Refusal::Throttled(_) => StatusCode::TOO_MANY_REQUESTS,
            Refusal::BadCsrf
            | Refusal::CrossSite
            | Refusal::Role { .. }
            | Refusal::NoAccount(_)
            | Refusal::ProxyBootstrap => StatusCode::FORBIDDEN,
            Refusal::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
        };
        Self::new(status, "Refused", refusal.to_string())
    }
}

/// A problem's JSON, kept on its page's response so that the API's layer can answer with it
/// instead ([`super::caller::api_answers`]).
#[derive(Debug, Clone, Serialize)]
pub struct ProblemBody {
    pub error: String,
    pub detail: String,
}

impl IntoResponse for Problem {
    fn into_response(self) -> Response {
        let body = ProblemBody {
            error: self.title.clone(),
            detail: self.detail.clone(),
        };
        if self.json {
            return (self.status, Json(body)).into_response();
        }
        // No template: a problem must show even when rendering is what failed.
        let page = format!(
            "<!doctype html><html lang=en><head><meta charset=utf-8><title>{title}</title>\
             <link rel=stylesheet href=/console.css></head><body><main class=problem>\
             <h1>{title}</h1><p class=detail>{detail}</p><p><a href=/>Back to the overview</a>\
             </p></main></body></html>",
            title = minijinja::HtmlEscape(&self.title),
            detail = minijinja::HtmlEscape(&self.detail),
        );
        let mut response = (self.status, Html(page)).into_response();
        response.extensions_mut().insert(body);
        response
    }
}

/// A page's answer: the page, or what kept it from being one.
pub type PageResult = Result<Response, Problem>;

/// The frame of every page.
#[derive(Debug, Serialize)]
struct Chrome {
    installation: String,
    replica: String,
    /// Who is signed in (`alice`, or `bootstrap (alice)`).
    operator: Option<String>,
    /// Their role.
    role: Option<String>,
    /// The session's token for every form that acts.
    csrf: Option<String>,
    /// The caller may act: the pages show the buttons that do.
    acts: bool,
    /// The caller may manage accounts.
    admin: bool,
    open_reading: bool,
    /// `admin.environment`: the band at the top of every page.
    environment: Option<worker_pages::environment::Environment>,
}

/// Renders page `template` with `context`, framed for the caller.
pub fn render(console: &Console, caller: &Caller, template: &str, context: Value) -> PageResult {
    let chrome = Chrome {
        installation: console.board.installation.clone(),
        replica: console.replica.clone(),
        operator: caller.signed.as_ref().map(super::access::Signed::label),
        role: caller.signed.as_ref().map(|s| s.role.to_string()),
        csrf: caller.csrf().map(str::to_string),
        acts: caller.acts() && caller.csrf().is_some(),
        admin: caller
            .signed
            .as_ref()
            .is_some_and(|s| s.role >= worker_store::operators::Role::Admin)
            && caller.csrf().is_some(),
        open_reading: console.access.open_reading(),
        environment: console.board.environment.clone(),
    };
    let context = minijinja::context! { chrome => Value::from_serialize(&chrome), ..context };
    console
        .views
        .render(template, context)
        .map(|html| Html(html).into_response())
        .map_err(|e| {
            // The whole report (the template's source and its variables) goes to the log
            // only: the page says which template and line.
            tracing::error!(template, error = %format!("{e:#}"), "a console page failed to render");
            Problem::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "This page failed to render",
                e.to_string(),
            )
        })
}

/// `None` when the caller may read the page at `path`; else the redirect that sends the
/// browser to sign in first.
pub fn sign_in_first(caller: &Caller, path: &str) -> Option<Response> {
    caller
        .may_read()
        .err()
        .map(|_| Redirect::to(&format!("/sign-in?next={}", next_param(path))).into_response())
}

/// Lets an API call through if the caller may read.
pub fn may_read_api(caller: &Caller) -> Result<(), Problem> {
    caller.may_read().map_err(|r| Problem::from(r).json())
}

/// Who acts, if the caller may act with `csrf`.
pub fn may_act(caller: &Caller, headers: &HeaderMap, csrf: &str) -> Result<Actor, Problem> {
    caller.may_act(headers, csrf).map_err(Problem::from)
}

/// Whether `path` is a path of this site: it starts with one `/`, holds no backslash and no
/// control character or space (a browser drops a tab or a newline from a URL, so `/\t/host`
/// would become `//host`, another site).
pub fn local_path(path: &str) -> bool {
    path.starts_with('/')
        && !path.starts_with("//")
        && !path.contains('\\')
        && !path.chars().any(|c| c.is_control() || c.is_whitespace())
}

/// `path` as a `next` parameter: only a path of this site (no `//host`, no scheme).
pub fn next_param(path: &str) -> String {
    let path = if local_path(path) { path } else { "/" };
    form_urlencoded(path)
}

fn form_urlencoded(text: &str) -> String {
    serde_urlencoded::to_string([("", text)])
        .map(|s| s.trim_start_matches('=').to_string())
        .unwrap_or_default()
}

/// Sends the browser on to `path` after an action (303: the next request is a GET).
pub fn see_other(path: &str) -> Response {
    Redirect::to(path).into_response()
}

/// The console's state, as handlers take it.
pub type State = axum::extract::State<Arc<Console>>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_next_parameter_stays_on_this_site() {
        assert_eq!(
            next_param("/dead-letters?queue=a"),
            "%2Fdead-letters%3Fqueue%3Da"
        );
        assert_eq!(next_param("//evil.example/"), "%2F");
        assert_eq!(next_param("https://evil.example/"), "%2F");
    }

    #[test]
    fn a_problem_page_escapes_what_it_shows() {
        let response = Problem::bad_request("<b>bold</b>").into_response();
        assert_eq!(response.status(), StatusCode::BAD_REQUEST);
    }
}
