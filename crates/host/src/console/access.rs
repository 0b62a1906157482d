//! Who may see and who may act. Reading needs nothing while the admin port is on loopback
//! (and a session anywhere else); every action needs an operator session, made by signing in
//! with `admin.operator_token` and the operator's name, and a CSRF token from the session in
//! the form that asks for it.
//!
//! A session lives in this process only (a cookie `wh_session`: HttpOnly, SameSite=Strict,
//! Secure behind TLS) and ends after `admin.session_idle` without use, or at sign-out. The
//! sign-in form carries a CSRF token of its own, bound to a `wh_signin` cookie (the same
//! attributes). Failed sign-ins are limited: past [`FAILURES_PER_MINUTE`] in a minute, every
//! sign-in is refused until the minute is over.

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use axum::http::HeaderMap;
use cookie::{Cookie, SameSite};
use sha2::{Digest, Sha256};
use worker_store::audit::Actor;

use crate::secret::Secret;

/// The session cookie.
pub const SESSION_COOKIE: &str = "wh_session";
/// The sign-in form's own CSRF cookie.
pub const SIGNIN_COOKIE: &str = "wh_signin";
/// Failed sign-ins in a minute past which sign-in is refused for the rest of it.
pub const FAILURES_PER_MINUTE: usize = 5;
/// Sessions kept at once; past it the least recently used one ends.
const SESSIONS_MAX: usize = 256;
/// The longest name an operator may sign in with.
pub const NAME_MAX_CHARS: usize = 80;

/// A signed-in operator.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Session {
    /// The name given at sign-in, recorded with every action.
    pub name: String,
    /// Where they signed in from, as the connection (and a proxy's `X-Forwarded-For`) says.
    pub from: String,
    /// The token every form of this session carries.
    pub csrf: String,
    last_used: Instant,
}

impl Session {
    /// Who the audit trail says acted: `console` from where, with the name given.
    pub fn actor(&self) -> Actor {
        Actor::new("console", self.from.clone()).with_name(Some(self.name.clone()))
    }
}

/// Why a request may not go on.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error("actions are off: no admin.operator_token is set")]
    ActionsOff,
    #[error("sign in first")]
    NotSignedIn,
    #[error("the form's CSRF token does not match this session: reload the page and try again")]
    BadCsrf,
    #[error("a request from another site is refused")]
    CrossSite,
    #[error("too many failed sign-ins: wait a minute")]
    Throttled,
    #[error("the operator token is wrong")]
    WrongToken,
}

/// The console's access rules and its sessions.
#[derive(Debug)]
pub struct Access {
    token: Option<Secret>,
    /// Reading needs no session (the admin port is on loopback).
    pub open_reading: bool,
    idle: Duration,
    sessions: Mutex<HashMap<String, Session>>,
    failures: Mutex<VecDeque<Instant>>,
}

/// 32 random bytes as hex: a session id or a CSRF token.
fn random_token() -> String {
    let bytes: [u8; 32] = rand::random();
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Compares two secrets by their SHA-256, so that the time taken says nothing about how much
/// of a guess was right.
fn same_secret(a: &str, b: &str) -> bool {
    Sha256::digest(a.as_bytes()) == Sha256::digest(b.as_bytes())
}

/// The value of cookie `name` in the request.
pub fn cookie_value(headers: &HeaderMap, name: &str) -> Option<String> {
    headers
        .get_all(axum::http::header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(Cookie::split_parse)
        .filter_map(Result::ok)
        .find(|c| c.name() == name)
        .map(|c| c.value().to_string())
}

/// Whether the request came through TLS (a reverse proxy that says so).
fn over_tls(headers: &HeaderMap) -> bool {
    headers
        .get("x-forwarded-proto")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.eq_ignore_ascii_case("https"))
}

/// A `Set-Cookie` value: HttpOnly, SameSite=Strict, path `/`, Secure behind TLS; `None` as
/// the value ends the cookie.
pub fn set_cookie(headers: &HeaderMap, name: &str, value: Option<&str>) -> String {
    let mut cookie = Cookie::build((name.to_string(), value.unwrap_or("").to_string()))
        .http_only(true)
        .same_site(SameSite::Strict)
        .path("/")
        .secure(over_tls(headers));
    if value.is_none() {
        cookie = cookie.max_age(cookie::time::Duration::ZERO);
    }
    cookie.build().to_string()
}

/// Where the request comes from: the peer, and the first `X-Forwarded-For` hop behind it.
pub fn origin_of(peer: SocketAddr, headers: &HeaderMap) -> String {
    let forwarded = headers
        .get("x-forwarded-for")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(',').next())
        .map(str::trim)
        .filter(|v| !v.is_empty());
    match forwarded {
        Some(client) => format!("{client} via {}", peer.ip()),
        None => peer.ip().to_string(),
    }
}

impl Access {
    pub fn new(token: Option<Secret>, open_reading: bool, idle: Duration) -> Self {
        Self {
            token,
            open_reading,
            idle,
            sessions: Mutex::default(),
            failures: Mutex::default(),
        }
    }

    /// Whether actions are possible at all (an operator token is set).
    pub fn actions_on(&self) -> bool {
        self.token.is_some()
    }

    /// The request's session, if it has a live one (its use counted).
    pub fn session(&self, headers: &HeaderMap) -> Option<Session> {
        let id = cookie_value(headers, SESSION_COOKIE)?;
        let mut sessions = self.sessions.lock().ok()?;
        let now = Instant::now();
        sessions.retain(|_, s| now.duration_since(s.last_used) < self.idle);
        let session = sessions.get_mut(&id)?;
        session.last_used = now;
        Some(session.clone())
    }

    /// May this request read? On loopback anyone may; elsewhere only a session, or (for the
    /// JSON API) `Authorization: Bearer <operator token>`.
    pub fn may_read(&self, headers: &HeaderMap) -> Result<(), Refusal> {
        if self.open_reading || self.session(headers).is_some() || self.bearer_ok(headers) {
            Ok(())
        } else {
            Err(Refusal::NotSignedIn)
        }
    }

    fn bearer_ok(&self, headers: &HeaderMap) -> bool {
        let (Some(token), Some(given)) = (
            &self.token,
            headers
                .get(axum::http::header::AUTHORIZATION)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.strip_prefix("Bearer ")),
        ) else {
            return false;
        };
        same_secret(token.expose(), given.trim())
    }

    /// May this request act? It needs actions on, a live session, a form CSRF token that is
    /// the session's, and no sign that another site sent it.
    pub fn may_act(&self, headers: &HeaderMap, csrf: &str) -> Result<Session, Refusal> {
        if !self.actions_on() {
            return Err(Refusal::ActionsOff);
        }
        refuse_cross_site(headers)?;
        let session = self.session(headers).ok_or(Refusal::NotSignedIn)?;
        if !same_secret(&session.csrf, csrf) {
            return Err(Refusal::BadCsrf);
        }
        Ok(session)
    }

    /// Signs in with `token` and `name` from `from`; the new session's id for the cookie.
    /// The sign-in form's CSRF token must match its cookie's.
    pub fn sign_in(
        &self,
        headers: &HeaderMap,
        form_csrf: &str,
        token: &str,
        name: &str,
        from: String,
    ) -> Result<String, Refusal> {
        let Some(expected) = &self.token else {
            return Err(Refusal::ActionsOff);
        };
        refuse_cross_site(headers)?;
        let cookie = cookie_value(headers, SIGNIN_COOKIE).ok_or(Refusal::BadCsrf)?;
        if form_csrf.is_empty() || !same_secret(&cookie, form_csrf) {
            return Err(Refusal::BadCsrf);
        }
        if self.throttled() {
            return Err(Refusal::Throttled);
        }
        if !same_secret(expected.expose(), token) {
            self.count_failure();
            tracing::warn!(%from, "a console sign-in with a wrong operator token was refused");
            return Err(Refusal::WrongToken);
        }
        let id = random_token();
        let session = Session {
            name: name.to_string(),
            from,
            csrf: random_token(),
            last_used: Instant::now(),
        };
        tracing::info!(name = %session.name, from = %session.from, "an operator signed in to the console");
        if let Ok(mut sessions) = self.sessions.lock() {
            if sessions.len() >= SESSIONS_MAX
                && let Some(oldest) = sessions
                    .iter()
                    .min_by_key(|(_, s)| s.last_used)
                    .map(|(k, _)| k.clone())
            {
                sessions.remove(&oldest);
            }
            sessions.insert(id.clone(), session);
        }
        Ok(id)
    }

    /// Ends the request's session, if it has one.
    pub fn sign_out(&self, headers: &HeaderMap) {
        if let (Some(id), Ok(mut sessions)) =
            (cookie_value(headers, SESSION_COOKIE), self.sessions.lock())
        {
            sessions.remove(&id);
        }
    }

    /// A fresh CSRF token for a sign-in form (its cookie is set with it).
    pub fn signin_token() -> String {
        random_token()
    }

    fn throttled(&self) -> bool {
        let Ok(mut failures) = self.failures.lock() else {
            return true;
        };
        let now = Instant::now();
        while failures
            .front()
            .is_some_and(|at| now.duration_since(*at) > Duration::from_secs(60))
        {
            failures.pop_front();
        }
        failures.len() >= FAILURES_PER_MINUTE
    }

    fn count_failure(&self) {
        if let Ok(mut failures) = self.failures.lock() {
            failures.push_back(Instant::now());
        }
    }
}

/// Refuses what a browser says another site sent (`Sec-Fetch-Site: cross-site`) or whose
/// `Origin` is not the host it was sent to. SameSite=Strict cookies already keep another
/// site's forms from carrying a session; this keeps them from reaching the sign-in.
fn refuse_cross_site(headers: &HeaderMap) -> Result<(), Refusal> {
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    if header("sec-fetch-site") == Some("cross-site") {
        return Err(Refusal::CrossSite);
    }
    if let (Some(origin), Some(host)) = (header("origin"), header("host")) {
        let origin_host = origin
            .split_once("://")
            .map_or(origin, |(_, rest)| rest)
            .trim_end_matches('/');
        if origin != "null" && !origin_host.eq_ignore_ascii_case(host) {
            return Err(Refusal::CrossSite);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn access() -> Access {
        Access::new(
            Some(Secret::new("an-operator-token-long-enough")),
            true,
            Duration::from_secs(60),
        )
    }

    fn with_cookie(name: &str, value: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(
            axum::http::header::COOKIE,
            format!("other=1; {name}={value}").parse().unwrap(),
        );
        headers
    }

    fn signed_in(access: &Access) -> HeaderMap {
        let pre = with_cookie(SIGNIN_COOKIE, "form-token");
        let id = access
            .sign_in(
                &pre,
                "form-token",
                "an-operator-token-long-enough",
                "alice",
                "127.0.0.1".into(),
            )
            .unwrap();
        with_cookie(SESSION_COOKIE, &id)
    }

    #[test]
    fn a_session_acts_only_with_its_own_csrf_token() {
        let access = access();
        let headers = signed_in(&access);
        let session = access.session(&headers).unwrap();
        assert_eq!(session.name, "alice");
        assert_eq!(
            access.may_act(&headers, &session.csrf).unwrap().name,
            "alice"
        );
        assert_eq!(access.may_act(&headers, "forged"), Err(Refusal::BadCsrf));
        assert_eq!(
            access.may_act(&HeaderMap::new(), &session.csrf),
            Err(Refusal::NotSignedIn)
        );
    }

    #[test]
    fn a_wrong_token_is_refused_and_enough_of_them_throttle_every_sign_in() {
        let access = access();
        let pre = with_cookie(SIGNIN_COOKIE, "t");
        for _ in 0..FAILURES_PER_MINUTE {
            assert_eq!(
                access.sign_in(&pre, "t", "guess", "mallory", "x".into()),
                Err(Refusal::WrongToken)
            );
        }
        assert_eq!(
            access.sign_in(
                &pre,
                "t",
                "an-operator-token-long-enough",
                "alice",
                "x".into()
            ),
            Err(Refusal::Throttled)
        );
    }

    #[test]
    fn a_sign_in_without_its_forms_cookie_is_refused() {
        let access = access();
        let no_cookie = HeaderMap::new();
        assert_eq!(
            access.sign_in(
                &no_cookie,
                "t",
                "an-operator-token-long-enough",
                "a",
                "x".into()
            ),
            Err(Refusal::BadCsrf)
        );
        let other = with_cookie(SIGNIN_COOKIE, "other");
        assert_eq!(
            access.sign_in(
                &other,
                "t",
                "an-operator-token-long-enough",
                "a",
                "x".into()
            ),
            Err(Refusal::BadCsrf)
        );
    }

    #[test]
    fn without_a_token_nobody_acts() {
        let access = Access::new(None, true, Duration::from_secs(60));
        assert_eq!(
            access.may_act(&HeaderMap::new(), "x"),
            Err(Refusal::ActionsOff)
        );
        assert!(access.may_read(&HeaderMap::new()).is_ok());
    }

    #[test]
    fn off_loopback_reading_needs_a_session_or_the_bearer_token() {
        let access = Access::new(
            Some(Secret::new("an-operator-token-long-enough")),
            false,
            Duration::from_secs(60),
        );
        assert_eq!(
            access.may_read(&HeaderMap::new()),
            Err(Refusal::NotSignedIn)
        );
        let mut bearer = HeaderMap::new();
        bearer.insert(
            axum::http::header::AUTHORIZATION,
            "Bearer an-operator-token-long-enough".parse().unwrap(),
        );
        assert!(access.may_read(&bearer).is_ok());
        assert!(access.may_read(&signed_in(&access)).is_ok());
    }

    #[test]
    fn another_sites_request_is_refused() {
        let mut headers = HeaderMap::new();
        headers.insert("host", "127.0.0.1:9180".parse().unwrap());
        headers.insert("origin", "http://127.0.0.1:9180".parse().unwrap());
        assert!(refuse_cross_site(&headers).is_ok());
        headers.insert("origin", "https://evil.example".parse().unwrap());
        assert_eq!(refuse_cross_site(&headers), Err(Refusal::CrossSite));
        let mut fetch = HeaderMap::new();
        fetch.insert("sec-fetch-site", "cross-site".parse().unwrap());
        assert_eq!(refuse_cross_site(&fetch), Err(Refusal::CrossSite));
    }

    #[test]
    fn an_idle_session_ends() {
        let access = Access::new(
            Some(Secret::new("an-operator-token-long-enough")),
            true,
            Duration::from_millis(1),
        );
        let headers = signed_in(&access);
        std::thread::sleep(Duration::from_millis(5));
        assert!(access.session(&headers).is_none());
    }

    #[test]
    fn cookies_are_http_only_and_strict() {
        let set = set_cookie(&HeaderMap::new(), SESSION_COOKIE, Some("abc"));
        assert!(set.contains("HttpOnly"), "{set}");
        assert!(set.contains("SameSite=Strict"), "{set}");
        assert!(!set.contains("Secure"), "{set}");
        let mut tls = HeaderMap::new();
        tls.insert("x-forwarded-proto", "https".parse().unwrap());
        assert!(set_cookie(&tls, SESSION_COOKIE, Some("abc")).contains("Secure"));
        assert!(set_cookie(&tls, SESSION_COOKIE, None).contains("Max-Age=0"));
    }
}
