//! The layer that finds out who made each console request ([`Access::identify`]) before its
//! handler runs, and the extractor handlers take it with. A session made for the request (by
//! the auth proxy's header) has its cookie set on the answer.
//!
//! Also the layer of the API's actions (`POST /api/...`): the same handlers as the pages'
//! forms, whose answers it turns into JSON (a redirect into `{"location": ...}`, a problem
//! into `{"error": ..., "detail": ...}`).
//!
//! [`Access::identify`]: super::Access::identify

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::{ConnectInfo, FromRequestParts, Request, State};
use axum::http::request::Parts;
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Json, Response};

use super::Console;
use super::access::{self, Caller, REFRESH_MARKER, Refusal, SESSION_COOKIE};
use super::page::{Problem, ProblemBody};

/// A request that came without its connection's address (only in tests of the router alone)
/// is taken as from an unknown, untrusted address.
const UNKNOWN_PEER: SocketAddr =
    SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED), 0);

fn self_refreshing(request: &Request) -> bool {
    request
        .uri()
        .query()
        .is_some_and(|q| q.split('&').any(|pair| pair == REFRESH_MARKER))
}

/// Finds the caller and hands it to the handler.
pub async fn identify(
    State(console): State<Arc<Console>>,
    mut request: Request,
    next: Next,
) -> Response {
    let peer = request
        .extensions()
        .get::<ConnectInfo<SocketAddr>>()
        .map_or(UNKNOWN_PEER, |c| c.0);
    let touch = !self_refreshing(&request);
    let api = request.uri().path().starts_with("/api/");
    let mut caller = match console
        .access
        .identify(&console.pool, peer, request.headers(), touch)
        .await
    {
        Ok(caller) => caller,
        Err(refusal) => {
            let retry = retry_after(&refusal);
            let problem = Problem::from(refusal);
            let answer = if api { problem.json() } else { problem }.into_response();
            return with_retry_after(answer, retry);
        }
    };
    caller.api = api;
    let cookie = caller
        .new_session
        .as_deref()
        .map(|id| access::set_cookie(caller.client.tls, SESSION_COOKIE, Some(id)));
    request.extensions_mut().insert(Arc::new(caller));
    let mut response = next.run(request).await;
    if let Some(value) = cookie.and_then(|c| HeaderValue::from_str(&c).ok()) {
        response.headers_mut().append(header::SET_COOKIE, value);
    }
    response
}

/// How long a throttled request is told to wait, whole seconds, at least one.
pub fn retry_after(refusal: &Refusal) -> Option<u64> {
    match refusal {
        Refusal::Throttled(after) => {
            Some((after.as_secs() + u64::from(after.subsec_nanos() > 0)).max(1))
        }
        _ => None,
    }
}

/// A throttled answer with its `Retry-After`.
pub fn with_retry_after(mut response: Response, seconds: Option<u64>) -> Response {
    if let Some(value) = seconds.and_then(|s| HeaderValue::from_str(&s.to_string()).ok()) {
        response.headers_mut().insert(header::RETRY_AFTER, value);
    }
    response
}

/// The caller as a handler takes it.
#[derive(Debug, Clone)]
pub struct Who(pub Arc<Caller>);

impl std::ops::Deref for Who {
    type Target = Caller;

    fn deref(&self) -> &Caller {
        &self.0
    }
}

impl<S: Send + Sync> FromRequestParts<S> for Who {
    type Rejection = Problem;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Problem> {
        parts
            .extensions
            .get::<Arc<Caller>>()
            .cloned()
            .map(Who)
            .ok_or_else(|| {
                Problem::new(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "No caller",
                    "this route was served without the console's identify layer",
                )
            })
    }
}

/// Turns a form handler's answer into the API's: a redirect becomes 200 with
/// `{"location": ...}`, a problem its JSON.
pub async fn api_answers(request: Request, next: Next) -> Response {
    let response = next.run(request).await;
    if let Some(body) = response.extensions().get::<ProblemBody>().cloned() {
        return (response.status(), Json(body)).into_response();
    }
    if response.status().is_redirection() {
        let location = response
            .headers()
            .get(header::LOCATION)
            .and_then(|l| l.to_str().ok())
            .unwrap_or_default()
            .to_string();
        return Json(serde_json::json!({ "location": location })).into_response();
    }
    response
}
