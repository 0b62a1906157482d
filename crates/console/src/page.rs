//! What every page and API answer shares: a problem shown as a page or as JSON, the guards on
//! reading and acting, and the paths a page may send a browser to. The frame around a page is
//! rendered by [`crate::web::page`].

use axum::http::{HeaderMap, StatusCode};
use axum::response::{Html, IntoResponse, Json, Redirect, Response};
use serde::Serialize;

use worker_store::audit::Actor;

use crate::access::{Caller, Refusal};

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
/// instead ([`crate::web::caller::api_answers`]).
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
