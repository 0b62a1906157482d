//! `/sign-in` and `/sign-out`: an operator session from `admin.operator_token` and the
//! operator's name, which the audit trail records with every action of the session.

use std::net::SocketAddr;

use axum::Form;
use axum::extract::{ConnectInfo, Query};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;

use super::access::{self, Access, NAME_MAX_CHARS, Refusal, SESSION_COOKIE, SIGNIN_COOKIE};
use super::page::{PageResult, Problem, State, may_act, render, see_other};

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct NextQuery {
    next: Option<String>,
}

/// Where to go after signing in: a path of this site, else the overview.
fn next_path(next: Option<&str>) -> String {
    match next {
        Some(path) if path.starts_with('/') && !path.starts_with("//") && !path.contains('\\') => {
            path.to_string()
        }
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
    headers: &HeaderMap,
    next: &str,
    problem: Option<String>,
    status: StatusCode,
) -> PageResult {
    let token = Access::signin_token();
    let page = render(
        console,
        headers,
        "sign_in.html",
        minijinja::context! { signin_csrf => token, next => next, problem => problem },
    )?;
    let mut page = with_cookie(
        page,
        &access::set_cookie(headers, SIGNIN_COOKIE, Some(&token)),
    );
    *page.status_mut() = status;
    Ok(page)
}

pub async fn form(
    axum::extract::State(console): State,
    headers: HeaderMap,
    Query(query): Query<NextQuery>,
) -> PageResult {
    let next = next_path(query.next.as_deref());
    form_page(&console, &headers, &next, None, StatusCode::OK)
}

#[derive(Debug, Deserialize)]
pub struct SignInForm {
    #[serde(default)]
    csrf: String,
    #[serde(default)]
    token: String,
    #[serde(default)]
    name: String,
    next: Option<String>,
}

pub async fn submit(
    axum::extract::State(console): State,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    headers: HeaderMap,
    Form(form): Form<SignInForm>,
) -> PageResult {
    let next = next_path(form.next.as_deref());
    let name = form.name.trim();
    if name.is_empty() || name.chars().count() > NAME_MAX_CHARS {
        return form_page(
            &console,
            &headers,
            &next,
            Some(format!(
                "Give your name (1 to {NAME_MAX_CHARS} characters): the audit trail records it with everything you do."
            )),
            StatusCode::BAD_REQUEST,
        );
    }
    let from = access::origin_of(peer, &headers);
    match console
        .access
        .sign_in(&headers, &form.csrf, &form.token, name, from)
    {
        Ok(id) => {
            let response = with_cookie(
                see_other(&next),
                &access::set_cookie(&headers, SESSION_COOKIE, Some(&id)),
            );
            Ok(with_cookie(
                response,
                &access::set_cookie(&headers, SIGNIN_COOKIE, None),
            ))
        }
        Err(refusal @ (Refusal::WrongToken | Refusal::Throttled | Refusal::BadCsrf)) => {
            let status = Problem::from(refusal.clone()).status;
            form_page(&console, &headers, &next, Some(refusal.to_string()), status)
        }
        Err(refusal) => Err(Problem::from(refusal)),
    }
}

#[derive(Debug, Deserialize)]
pub struct SignOutForm {
    #[serde(default)]
    csrf: String,
}

pub async fn sign_out(
    axum::extract::State(console): State,
    headers: HeaderMap,
    Form(form): Form<SignOutForm>,
) -> PageResult {
    may_act(&console, &headers, &form.csrf)?;
    console.access.sign_out(&headers);
    Ok(with_cookie(
        see_other("/"),
        &access::set_cookie(&headers, SESSION_COOKIE, None),
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
}
