//! The `webhook` action: an HTTP POST of `{"event": …, "action": {"type": "webhook"}}` as
//! JSON ([`body`]), under its own timeout, and the one function that classifies how it ended
//! ([`classify`]).
//!
//! | outcome | class |
//! |---|---|
//! | 2xx | success |
//! | 429 | throttled, for the `Retry-After` it gave (seconds or an HTTP date; [`DEFAULT_RETRY_AFTER`] when absent or unreadable; within 1 s ..= [`MAX_RETRY_AFTER`]) |
//! | 5xx, 408, no answer within the timeout, connection refused or reset, a TLS handshake that fails | transient; no connection at all also counts toward the host's circuit ([`crate::circuit`]) |
//! | any other 4xx, a 3xx (redirects are not followed: a POST must not turn into a GET) | permanent (`webhook-4xx`, `webhook-3xx`) |
//! | a request that cannot even be built (bad URL or header) | permanent (`webhook-invalid`) |
//! | an address inside the installation that `webhook_allow` does not name ([`crate::address`]) | permanent (`webhook-refused`), never connected to |
//!
//! The URL in every failure is [redacted](WebhookAction::redacted_url) (no user info, no
//! query string), and header values are never part of one: both often carry a token.
//!
//! Every request carries `Idempotency-Key: <action execution id>`: delivery is at least once
//! (see the crate docs), so a receiver that must not act twice can deduplicate on it.

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use reqwest::header::{CONTENT_TYPE, HeaderMap, HeaderName, HeaderValue, RETRY_AFTER};
use serde_json::{Value, json};
use worker_core::{Failure, error_chain};
use worker_messages::{DomainEvent, WebhookAction};

use crate::address::{self, GuardedResolver, Refused, WebhookAllow};

/// How long to wait after a 429 that does not say.
pub const DEFAULT_RETRY_AFTER: Duration = Duration::from_secs(30);
/// The longest wait a 429 may ask for; longer asks are cut to this.
pub const MAX_RETRY_AFTER: Duration = Duration::from_secs(3600);
/// How much of an error answer's body goes into the failure's detail.
pub const EXCERPT_BYTES: usize = 512;

/// The header that lets the receiver deduplicate.
pub const IDEMPOTENCY_KEY: &str = "idempotency-key";

/// What a webhook POSTs: the event, and the action by its type alone. The action's URL and
/// headers stay out: they are how the receiver knows the caller (a token in the query string,
/// an authorization header), and a body is logged, stored and forwarded by receivers that
/// were never meant to hold that secret.
pub fn body(event: &DomainEvent) -> Value {
    json!({ "event": event, "action": { "type": "webhook" } })
}

/// How one call ended, before classification.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CallResult {
    /// The server answered.
    Answered {
        status: u16,
        /// The `Retry-After` header, as sent.
        retry_after: Option<String>,
        /// The start of the body, for the failure's detail (empty for 2xx).
        excerpt: String,
    },
    /// No complete answer within the timeout.
    TimedOut(Duration),
    /// No connection: refused, not made within the timeout, a TLS handshake that failed, a
    /// name that does not resolve. The host's own failure ([`crate::circuit`]).
    NoConnection(String),
    /// The connection broke once it stood.
    Unreachable(String),
    /// The request could not be built: a bad URL or header.
    Invalid(String),
    /// The address is inside and not allowed ([`crate::address`]); nothing was sent.
    Refused(String),
}

/// The one classification of a webhook call: `Ok` for a 2xx, otherwise the failure the table
/// in the module docs gives. `now` reads an HTTP-date `Retry-After`.
pub fn classify(url: &str, result: &CallResult, now: DateTime<Utc>) -> Result<(), Failure> {
    match result {
        CallResult::Answered { status, .. } if (200..300).contains(status) => Ok(()),
        CallResult::Answered {
            status,
            retry_after,
            excerpt,
        } => {
            let detail = answer_detail(url, *status, excerpt);
            match status {
                429 => Err(Failure::throttled(
                    retry_after_duration(retry_after.as_deref(), now),
                    detail,
                )),
                408 | 500..=599 => Err(Failure::transient(detail)),
                300..=399 => Err(Failure::permanent("webhook-3xx", detail)),
                _ => Err(Failure::permanent("webhook-4xx", detail)),
            }
        }
        CallResult::TimedOut(after) => Err(Failure::transient(format!(
            "webhook POST {url}: no answer within {}",
            humantime::format_duration(*after)
        ))),
        CallResult::NoConnection(why) | CallResult::Unreachable(why) => {
            Err(Failure::transient(format!("webhook POST {url}: {why}")))
        }
        CallResult::Invalid(why) => Err(Failure::permanent(
            "webhook-invalid",
            format!("webhook POST {url}: {why}"),
        )),
        CallResult::Refused(why) => Err(Failure::permanent(
            "webhook-refused",
            format!("webhook POST {url}: refused: {why}"),
        )),
    }
}

fn answer_detail(url: &str, status: u16, excerpt: &str) -> String {
    let reason = reqwest::StatusCode::from_u16(status)
        .ok()
        .and_then(|s| s.canonical_reason())
        .unwrap_or("");
    let mut detail = format!("webhook POST {url} answered {status} {reason}");
    let excerpt = excerpt.trim();
    if !excerpt.is_empty() {
        detail.push_str(": ");
        detail.push_str(excerpt);
    }
    detail
}

/// `Retry-After` as delay-seconds or an HTTP date, within 1 s ..= [`MAX_RETRY_AFTER`];
/// [`DEFAULT_RETRY_AFTER`] when absent or unreadable.
pub fn retry_after_duration(value: Option<&str>, now: DateTime<Utc>) -> Duration {
    let Some(value) = value.map(str::trim).filter(|v| !v.is_empty()) else {
        return DEFAULT_RETRY_AFTER;
    };
    let asked = if let Ok(seconds) = value.parse::<u64>() {
        Duration::from_secs(seconds)
    } else if let Ok(at) = DateTime::parse_from_rfc2822(value) {
        (at.with_timezone(&Utc) - now)
            .to_std()
            .unwrap_or(Duration::ZERO)
    } else {
        return DEFAULT_RETRY_AFTER;
    };
    asked.clamp(Duration::from_secs(1), MAX_RETRY_AFTER)
}

/// A webhook caller with its own timeout, for the whole call (connect, send, answer), that
/// reaches inside addresses only where its [`WebhookAllow`] says (see [`crate::address`]).
#[derive(Debug, Clone)]
pub struct WebhookClient {
    /// One HTTP client for each port the allow list names, then one for every other port
    /// (`None`), each with the resolver for the entries that hold on its port: a resolver
    /// learns the name it resolves, not the port it is for.
    clients: Arc<[(Option<u16>, reqwest::Client)]>,
    allow: Arc<WebhookAllow>,
    timeout: Duration,
}

impl WebhookClient {
    /// A client whose every call is bounded by `timeout` and may reach no inside address.
    /// Redirects are not followed.
    pub fn new(timeout: Duration) -> Result<Self, reqwest::Error> {
        Self::with_allow(timeout, WebhookAllow::default())
    }

    /// A client that may also reach what `allow` names inside.
    pub fn with_allow(timeout: Duration, allow: WebhookAllow) -> Result<Self, reqwest::Error> {
        let ports = allow.ports().into_iter().map(Some).chain([None]);
        let clients = ports
            .map(|port| {
                let resolver = GuardedResolver::new(allow.for_port(port));
                let http = reqwest::Client::builder()
                    .timeout(timeout)
                    // A beat inside the call's own bound, so that a connection not made in
                    // time is told apart from an answer not given in time: only the first
                    // is the host's failure (its circuit counts it).
                    .connect_timeout(connect_timeout(timeout))
                    // A redirect would be a second request the checks never saw (and a POST
                    // must not turn into a GET).
                    .redirect(reqwest::redirect::Policy::none())
                    // Through a proxy the resolver would check the proxy, not the target.
                    .no_proxy()
                    .dns_resolver(Arc::new(resolver))
                    .user_agent(concat!("worker-host/", env!("CARGO_PKG_VERSION")))
                    .build()?;
                Ok((port, http))
            })
            .collect::<Result<Vec<_>, reqwest::Error>>()?;
        Ok(Self {
            clients: clients.into(),
            allow: Arc::new(allow),
            timeout,
        })
    }

    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// POSTs `body` to the action's URL and classifies the outcome ([`classify`]).
    pub async fn call(
        &self,
        action: &WebhookAction,
        body: &Value,
        idempotency_key: &str,
    ) -> Result<(), Failure> {
        let result = self.attempt(action, body, idempotency_key).await;
        classify(&action.redacted_url(), &result, Utc::now())
    }

    /// POSTs `body` to the action's URL: how it ended, unclassified, with the URL's secrets
    /// taken out.
    pub async fn attempt(
        &self,
        action: &WebhookAction,
        body: &Value,
        idempotency_key: &str,
    ) -> CallResult {
        scrub(action, self.send(action, body, idempotency_key).await)
    }

    async fn send(&self, action: &WebhookAction, body: &Value, key: &str) -> CallResult {
        let mut headers = HeaderMap::new();
        for (name, value) in &action.headers {
            match (
                HeaderName::from_bytes(name.as_bytes()),
                HeaderValue::from_str(value),
            ) {
                (Ok(name), Ok(value)) => {
                    headers.insert(name, value);
                }
                _ => return CallResult::Invalid(format!("header `{name}` is not valid")),
            }
        }
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        match HeaderValue::from_str(key) {
            Ok(value) => {
                headers.insert(HeaderName::from_static(IDEMPOTENCY_KEY), value);
            }
            Err(_) => return CallResult::Invalid(format!("idempotency key `{key}`")),
        }
        let body = match serde_json::to_vec(body) {
            Ok(body) => body,
            Err(err) => return CallResult::Invalid(err.to_string()),
        };
        let (http, url) = match self.route(&action.url) {
            Ok(route) => route,
            Err(result) => return result,
        };
        let call = async {
            let response = http.post(url).headers(headers).body(body).send().await?;
            let status = response.status().as_u16();
            if response.status().is_success() {
                return Ok((status, None, String::new()));
            }
            let retry_after = response
                .headers()
                .get(RETRY_AFTER)
                .and_then(|v| v.to_str().ok())
                .map(str::to_string);
            Ok::<_, reqwest::Error>((status, retry_after, excerpt(response).await))
        };
        // reqwest's own timeout covers the same span; this one also bounds what reqwest
        // does not (a resolver that hangs), so no call outlives its timeout.
        match tokio::time::timeout(self.timeout, call).await {
            Err(_elapsed) => CallResult::TimedOut(self.timeout),
            Ok(Ok((status, retry_after, excerpt))) => CallResult::Answered {
                status,
                retry_after,
                excerpt,
            },
            Ok(Err(err)) if refusal(&err).is_some() => {
                CallResult::Refused(refusal(&err).map(|r| r.reason.clone()).unwrap_or_default())
            }
            // Before the timeout: a connection not made in time is both.
            Ok(Err(err)) if err.is_connect() => CallResult::NoConnection(error_chain(&err)),
            Ok(Err(err)) if err.is_timeout() => CallResult::TimedOut(self.timeout),
            Ok(Err(err)) if err.is_builder() => CallResult::Invalid(error_chain(&err)),
            Ok(Err(err)) => CallResult::Unreachable(error_chain(&err)),
        }
    }
}

/// The result with the URL's secrets (user info, query string) taken out of every text in
/// it: the client library's errors quote the URL, and a receiver may echo it in its answer.
/// What comes out ends up in logs, `/status`, the attempt log and dead letters.
fn scrub(action: &WebhookAction, result: CallResult) -> CallResult {
    match result {
        CallResult::Answered {
            status,
            retry_after,
            excerpt,
        } => CallResult::Answered {
            status,
            retry_after,
            excerpt: action.scrub(&excerpt),
        },
        CallResult::NoConnection(why) => CallResult::NoConnection(action.scrub(&why)),
        CallResult::Unreachable(why) => CallResult::Unreachable(action.scrub(&why)),
        CallResult::Invalid(why) => CallResult::Invalid(action.scrub(&why)),
        CallResult::Refused(why) => CallResult::Refused(action.scrub(&why)),
        timed_out @ CallResult::TimedOut(_) => timed_out,
    }
}

impl WebhookClient {
    /// The HTTP client for the URL's port, once an address written in the URL has passed
    /// the check (a name is checked by that client's resolver).
    fn route(&self, url: &str) -> Result<(&reqwest::Client, reqwest::Url), CallResult> {
        let url = reqwest::Url::parse(url).map_err(|e| CallResult::Invalid(e.to_string()))?;
        if !matches!(url.scheme(), "http" | "https") {
            return Err(CallResult::Invalid(format!(
                "scheme `{}`: expected http or https",
                url.scheme()
            )));
        }
        let port = url
            .port_or_known_default()
            .ok_or_else(|| CallResult::Invalid("no port".into()))?;
        let host = url
            .host_str()
            .ok_or_else(|| CallResult::Invalid("no host".into()))?;
        // The URL parser has already read every way of writing an address (`2130706433`,
        // `0x7f.1`) into its usual form; IPv6 comes in brackets.
        if let Ok(ip) = host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .parse::<std::net::IpAddr>()
        {
            // The client connects to an address it is given without resolving it.
            address::check_address(&self.allow, &ip.to_string(), ip, port)
                .map_err(|refused| CallResult::Refused(refused.reason))?;
        }
        let http = self
            .clients
            .iter()
            .find(|(p, _)| *p == Some(port))
            .or_else(|| self.clients.iter().find(|(p, _)| p.is_none()))
            .map(|(_, http)| http)
            .ok_or_else(|| CallResult::Invalid("no HTTP client for the port".into()))?;
        Ok((http, url))
    }
}

/// The longest a connection may take to be made: the call's timeout less a beat (a tenth of
/// it, at most [`CONNECT_MARGIN`]), so that it runs out before the call's.
fn connect_timeout(timeout: Duration) -> Duration {
    timeout.saturating_sub((timeout / 10).min(CONNECT_MARGIN))
}

/// See [`connect_timeout`].
const CONNECT_MARGIN: Duration = Duration::from_millis(250);

/// The resolver's refusal, found in the error's chain of causes.
fn refusal(err: &reqwest::Error) -> Option<&Refused> {
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(err);
    while let Some(error) = cause {
        if let Some(refused) = error.downcast_ref::<Refused>() {
            return Some(refused);
        }
        cause = error.source();
    }
    None
}

/// The first [`EXCERPT_BYTES`] of an answer's body, lossily decoded; what could not be read
/// is left out.
async fn excerpt(mut response: reqwest::Response) -> String {
    let mut bytes = Vec::new();
    while bytes.len() < EXCERPT_BYTES {
        match response.chunk().await {
            Ok(Some(chunk)) => bytes.extend_from_slice(&chunk),
            Ok(None) | Err(_) => break,
        }
    }
    bytes.truncate(EXCERPT_BYTES);
    String::from_utf8_lossy(&bytes).replace(['\r', '\n'], " ")
}

#[cfg(test)]
mod tests {
    use worker_core::FailureClass;

    use super::*;

    fn answered(status: u16, retry_after: Option<&str>) -> CallResult {
        CallResult::Answered {
            status,
            retry_after: retry_after.map(str::to_string),
            excerpt: "nope".into(),
        }
    }

    fn class(result: &CallResult) -> Option<(FailureClass, String)> {
        classify("http://h/x", result, Utc::now())
            .err()
            .map(|f| (f.class(), f.reason().to_string()))
    }

    #[test]
    fn each_outcome_gets_its_class() {
        assert_eq!(class(&answered(200, None)), None);
        assert_eq!(class(&answered(204, None)), None);
        let t = |c: FailureClass, r: &str| Some((c, r.to_string()));
        assert_eq!(
            class(&answered(503, None)),
            t(FailureClass::Transient, "transient")
        );
        assert_eq!(
            class(&answered(500, None)),
            t(FailureClass::Transient, "transient")
        );
        assert_eq!(
            class(&answered(408, None)),
            t(FailureClass::Transient, "transient")
        );
        assert_eq!(
            class(&answered(429, Some("7"))),
            t(FailureClass::Throttled, "throttled")
        );
        assert_eq!(
            class(&answered(404, None)),
            t(FailureClass::Permanent, "webhook-4xx")
        );
        assert_eq!(
            class(&answered(400, None)),
            t(FailureClass::Permanent, "webhook-4xx")
        );
        assert_eq!(
            class(&answered(302, None)),
            t(FailureClass::Permanent, "webhook-3xx")
        );
        assert_eq!(
            class(&CallResult::TimedOut(Duration::from_secs(1))),
            t(FailureClass::Transient, "transient")
        );
        assert_eq!(
            class(&CallResult::Unreachable("refused".into())),
            t(FailureClass::Transient, "transient")
        );
        assert_eq!(
            class(&CallResult::Invalid("bad url".into())),
            t(FailureClass::Permanent, "webhook-invalid")
        );
        let detail = classify("http://h/x", &answered(404, None), Utc::now()).unwrap_err();
        assert_eq!(
            detail.detail(),
            "webhook POST http://h/x answered 404 Not Found: nope"
        );
    }

    #[test]
    fn a_connection_must_be_made_a_beat_before_the_call_runs_out() {
        assert_eq!(
            connect_timeout(Duration::from_millis(300)),
            Duration::from_millis(270)
        );
        assert_eq!(
            connect_timeout(Duration::from_secs(30)),
            Duration::from_millis(29_750)
        );
    }

    #[test]
    fn retry_after_reads_seconds_and_http_dates() {
        let now = DateTime::parse_from_rfc3339("2026-11-29T12:00:00Z")
            .unwrap()
            .with_timezone(&Utc);
        assert_eq!(retry_after_duration(Some("7"), now), Duration::from_secs(7));
        assert_eq!(
            retry_after_duration(Some(" 120 "), now),
            Duration::from_secs(120)
        );
        assert_eq!(
            retry_after_duration(Some("Sun, 29 Nov 2026 12:01:30 GMT"), now),
            Duration::from_secs(90)
        );
        assert_eq!(
            retry_after_duration(Some("Sun, 29 Nov 2026 11:00:00 GMT"), now),
            Duration::from_secs(1),
            "a date in the past: as soon as allowed"
        );
        assert_eq!(retry_after_duration(Some("0"), now), Duration::from_secs(1));
        assert_eq!(retry_after_duration(Some("999999"), now), MAX_RETRY_AFTER);
        assert_eq!(retry_after_duration(None, now), DEFAULT_RETRY_AFTER);
        assert_eq!(retry_after_duration(Some("soon"), now), DEFAULT_RETRY_AFTER);
        assert_eq!(retry_after_duration(Some("-5"), now), DEFAULT_RETRY_AFTER);
    }
}
