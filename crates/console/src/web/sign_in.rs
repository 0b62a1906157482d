//! `/sign-in` and `/sign-out`: a console session of an operator account, from its name and
//! password (or from `admin.operator_token` and the operator's own name, as the bootstrap
//! account), shared by every replica and recorded with every action of the session.

use axum::Form;
use axum::extract::Query;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;

use super::access::{self, Access, NAME_MAX_CHARS, Refusal, SESSION_COOKIE, SIGNIN_COOKIE};
use super::caller::Who;
use super::page::{PageResult, Problem, State, local_path, render, see_other};

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct NextQuery {
    next: Option<String>,
}

/// Where to go after signing in: a path of this site, else the overview.
fn next_path(next: Option<&str>) -> String {
    match next {
        Some(path) if local_path(path) => path.to_string(),
        _ => "/".to_string(),
    }
}

fn with_cookie(mut response: Response, cookie: &str) -> Response {
    if let Ok(value) = HeaderValue::from_str(cookie) {
        response.headers_mut().append(header::SET_COOKIE, value);
    }
    response
}

/// The sign-in form, with a CSRF token of its own (and its cookie).
fn form_page(
    console: &super::Console,
    caller: &Who,
    next: &str,
    problem: Option<String>,
    status: StatusCode,
) -> PageResult {
    let token = Access::signin_token();
    let page = render(
        console,
        caller,
        "sign_in.html",
        minijinja::context! { signin_csrf => token, next => next, problem => problem },
    )?;
    let mut page = with_cookie(
        page,
        &access::set_cookie(caller.client.tls, SIGNIN_COOKIE, Some(&token)),
    );
    *page.status_mut() = status;
    Ok(page)
}

pub async fn form(
    axum::extract::State(console): State,
    caller: Who,
    Query(query): Query<NextQuery>,
) -> PageResult {
    let next = next_path(query.next.as_deref());
    form_page(&console, &caller, &next, None, StatusCode::OK)
}

#[derive(Deserialize)]
pub struct SignInForm {
    #[serde(default)]
    csrf: String,
    #[serde(default)]
    name: String,
    #[serde(default)]
    password: String,
    next: Option<String>,
}

/// Never the password.
impl std::fmt::Debug for SignInForm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SignInForm")
            .field("name", &self.name)
            .field("password", &"<redacted>")
            .field("next", &self.next)
            .finish_non_exhaustive()
    }
}

pub async fn submit(
    axum::extract::State(console): State,
    caller: Who,
    headers: HeaderMap,
    Form(form): Form<SignInForm>,
) -> PageResult {
    let next = next_path(form.next.as_deref());
    let name = form.name.trim();
    if name.is_empty() || name.chars().count() > NAME_MAX_CHARS {
        return form_page(
            &console,
            &caller,
            &next,
            Some(format!(
                "Give your account's name (1 to {NAME_MAX_CHARS} characters): the audit trail records it with everything you do."
            )),
            StatusCode::BAD_REQUEST,
        );
    }
    let signed_in = console
        .access
        .sign_in(
            &console.pool,
            &caller.client,
            &headers,
            &form.csrf,
            name,
            &form.password,
        )
        .await;
    let tls = caller.client.tls;
    match signed_in {
        Ok(id) => {
            let response = with_cookie(
                see_other(&next),
                &access::set_cookie(tls, SESSION_COOKIE, Some(&id)),
            );
            Ok(with_cookie(
                response,
                &access::set_cookie(tls, SIGNIN_COOKIE, None),
            ))
        }
        Err(refusal @ (Refusal::WrongPassword | Refusal::Throttled(_) | Refusal::BadCsrf)) => {
            let status = Problem::from(refusal.clone()).status;
            let page = form_page(&console, &caller, &next, Some(refusal.to_string()), status)?;
            let retry = super::caller::retry_after(&refusal);
            Ok(super::caller::with_retry_after(page, retry))
        }
        Err(refusal) => Err(Problem::from(refusal)),
    }
}

#[derive(Debug, Deserialize)]
pub struct SignOutForm {
    #[serde(default)]
    csrf: String,
}

/// Ends the session on every replica. Any role may sign out; the CSRF token keeps another
/// site from signing an operator out.
pub async fn sign_out(
    axum::extract::State(console): State,
    caller: Who,
    headers: HeaderMap,
    Form(form): Form<SignOutForm>,
) -> PageResult {
    caller
        .may_act_as(worker_store::operators::Role::Viewer, &headers, &form.csrf)
        .map_err(Problem::from)?;
    console
        .access
        .sign_out(&console.pool, &headers)
        .await
        .map_err(Problem::from)?;
    Ok(with_cookie(
        see_other("/"),
        &access::set_cookie(caller.client.tls, SESSION_COOKIE, None),
    )
    .into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn after_signing_in_the_browser_stays_on_this_site() {
        assert_eq!(
            next_path(Some("/dead-letters?queue=x")),
            "/dead-letters?queue=x"
        );
        assert_eq!(next_path(Some("//evil.example")), "/");
        assert_eq!(next_path(Some("https://evil.example")), "/");
        assert_eq!(next_path(None), "/");
    }

    #[test]
    fn a_sign_in_form_never_prints_its_password() {
        let form = SignInForm {
            csrf: "c".into(),
            name: "alice".into(),
            password: "hunter2-long-enough".into(),
            next: None,
        };
        let shown = format!("{form:?}");
        assert!(
            shown.contains("alice") && !shown.contains("hunter2"),
            "{shown}"
        );
    }

    #[test]
    fn a_tab_or_newline_cannot_turn_next_into_another_site() {
        // `next=/%09/evil.example`, as the form decodes it: a browser drops the tab.
        assert_eq!(next_path(Some("/\t/evil.example")), "/");
        assert_eq!(next_path(Some("/\n/evil.example")), "/");
        assert_eq!(next_path(Some("/ /evil.example")), "/");
        assert_eq!(next_path(Some("/\\evil.example")), "/");
    }
}
