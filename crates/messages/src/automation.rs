//! The actions an automation runs, as stored in `automations.actions` and snapshotted on each
//! action execution.
//!
//! The trigger consumer writes them (one execution per action, in list order) and the action
//! executor reads them back: so they are shapes the jobs agree on, like the messages beside
//! them. Text fields marked "template" are
//! MiniJinja templates rendered over the event's `data` fields (`{{ from }}`,
//! `Re: {{ subject }}`) and nothing else.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// One action of an automation, tagged by `type`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum AutomationAction {
    /// Queue an email (sent by the outbound email consumer).
    SendEmail(SendEmailAction),
    /// POST `{"event": …, "action": {"type": "webhook"}}` as JSON to a URL.
    Webhook(WebhookAction),
}

impl AutomationAction {
    /// `send_email` or `webhook`, as in the `type` field.
    pub const fn kind(&self) -> &'static str {
        match self {
            Self::SendEmail(_) => "send_email",
            Self::Webhook(_) => "webhook",
        }
    }
}

/// `type = "send_email"`: an email whose every text is a template over the event's fields.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SendEmailAction {
    /// Recipients (templates). One that renders to a comma-separated list counts as several;
    /// one that renders empty is left out; at least one must remain.
    pub to: Vec<String>,
    /// Copy recipients (templates), like `to`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cc: Vec<String>,
    /// The sender (template); unset means the SMTP settings' default sender.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from: Option<String>,
    /// The subject (template). Line breaks in the rendered text become spaces.
    pub subject: String,
    /// The plain-text body (template). At least one of `text` and `html` is required.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    /// The HTML body (template, with the event's values HTML-escaped).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub html: Option<String>,
    /// When the event carries a `message_id` (an `email.received` event does), set
    /// In-Reply-To to it and References to the event's `references` plus it, so that the
    /// mail threads as a reply. On by default.
    #[serde(default = "yes")]
    pub reply_headers: bool,
    /// A reply older than this when its turn to be sent comes is recorded `expired` and not
    /// sent (`"2h"`, `"1day"`); written on the mail as its `expires_at` when it is queued, it
    /// wins over `jobs.email_send.max_age`. Unset: the job's setting.
    #[serde(
        default,
        with = "humantime_serde",
        skip_serializing_if = "Option::is_none"
    )]
    pub max_age: Option<Duration>,
}

/// `type = "webhook"`: an HTTP POST of the event as JSON (its own URL and headers are never
/// part of the body).
///
/// Its URL often carries a token (in the query string or the user info) and its headers an
/// authorization: `Debug` shows neither, and every text meant for people goes through
/// [`WebhookAction::redacted_url`] or [`WebhookAction::scrub`].
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WebhookAction {
    /// `http://` or `https://` URL.
    pub url: String,
    /// Extra request headers (an authorization token, say). Not templates.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub headers: BTreeMap<String, String>,
}

/// What stands in for a secret part of a webhook URL.
pub const REDACTED: &str = "[redacted]";

/// Shorter pieces of a URL are not searched for on their own in free text: a one-letter user
/// name would blot out every such letter of an error. The whole URL, which holds them, still
/// is.
const MIN_SCRUBBED_LEN: usize = 4;

impl WebhookAction {
    /// The URL with its user info, query string and fragment replaced by [`REDACTED`]:
    /// `https://[redacted]@hooks.example/x?[redacted]`. The scheme, host, port and path stay,
    /// which is what an operator needs to tell webhooks apart.
    pub fn redacted_url(&self) -> String {
        redact_url(&self.url)
    }

    /// `text` (an error, an answer's excerpt) with every appearance of the URL, and of its
    /// user info, query string and fragment, replaced by the redacted forms. The client
    /// library writes the URL as it parsed it, which may differ from the text given; both
    /// are searched for.
    pub fn scrub(&self, text: &str) -> String {
        let mut out = text.to_string();
        let parsed = url::Url::parse(&self.url).ok();
        let redacted = self.redacted_url();
        let mut whole = vec![self.url.clone()];
        if let Some(parsed) = &parsed {
            whole.push(parsed.as_str().to_string());
        }
        // Longest first, so that a URL is replaced whole before a part of it is.
        whole.sort_by_key(|u| std::cmp::Reverse(u.len()));
        for url in whole {
            out = out.replace(&url, &redacted);
        }
        let mut parts = secret_parts_raw(&self.url);
        if let Some(parsed) = &parsed {
            parts.extend(
                [
                    Some(parsed.username()),
                    parsed.password(),
                    parsed.query(),
                    parsed.fragment(),
                ]
                .into_iter()
                .flatten()
                .map(str::to_string),
            );
        }
        parts.retain(|p| p.len() >= MIN_SCRUBBED_LEN);
        parts.sort_by_key(|p| std::cmp::Reverse(p.len()));
        for part in parts {
            out = out.replace(&part, REDACTED);
        }
        out
    }
}

impl std::fmt::Debug for WebhookAction {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WebhookAction")
            .field("url", &self.redacted_url())
            .field("headers", &self.headers.keys().collect::<Vec<_>>())
            .finish()
    }
}

/// `url` with its user info, query string and fragment replaced by [`REDACTED`]. Works on
/// the text as given, so that even a URL that does not parse loses them.
pub fn redact_url(url: &str) -> String {
    let (before_fragment, fragment) = match url.split_once('#') {
        Some((before, _)) => (before, true),
        None => (url, false),
    };
    let (before_query, query) = match before_fragment.split_once('?') {
        Some((before, _)) => (before, true),
        None => (before_fragment, false),
    };
    let (scheme, rest) = match before_query.split_once("://") {
        Some((scheme, rest)) => (format!("{scheme}://"), rest),
        None => (String::new(), before_query),
    };
    let authority_end = rest.find('/').unwrap_or(rest.len());
    let (authority, path) = rest.split_at(authority_end);
    let authority = match authority.rsplit_once('@') {
        Some((_, host)) => format!("{REDACTED}@{host}"),
        None => authority.to_string(),
    };
    let mut out = format!("{scheme}{authority}{path}");
    if query {
        out.push('?');
        out.push_str(REDACTED);
    }
    if fragment {
        out.push('#');
        out.push_str(REDACTED);
    }
    out
}

/// The user info, query string and fragment of `url` as written.
fn secret_parts_raw(url: &str) -> Vec<String> {
    let mut parts = Vec::new();
    let (before_fragment, fragment) = url.split_once('#').unwrap_or((url, ""));
    parts.push(fragment.to_string());
    let (before_query, query) = before_fragment
        .split_once('?')
        .unwrap_or((before_fragment, ""));
    parts.push(query.to_string());
    let rest = before_query
        .split_once("://")
        .map_or(before_query, |(_, r)| r);
    let authority = &rest[..rest.find('/').unwrap_or(rest.len())];
    if let Some((userinfo, _)) = authority.rsplit_once('@') {
        parts.push(userinfo.to_string());
        if let Some((user, password)) = userinfo.split_once(':') {
            parts.push(user.to_string());
            parts.push(password.to_string());
        }
    }
    parts
}

const fn yes() -> bool {
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn actions_are_tagged_by_type() {
        let json = serde_json::json!([
            {"type": "send_email", "to": ["{{ from }}"], "subject": "Re: {{ subject }}", "text": "pong"},
            {"type": "webhook", "url": "http://127.0.0.1:9/hook", "headers": {"authorization": "Bearer t"}}
        ]);
        let actions: Vec<AutomationAction> = serde_json::from_value(json).unwrap();
        let AutomationAction::SendEmail(email) = &actions[0] else {
            panic!("{actions:?}")
        };
        assert!(email.reply_headers, "reply headers are on by default");
        assert_eq!(email.cc, Vec::<String>::new());
        assert_eq!(actions[1].kind(), "webhook");
        let back = serde_json::to_value(&actions).unwrap();
        assert_eq!(back[0]["type"], "send_email");
        assert_eq!(
            serde_json::from_value::<Vec<AutomationAction>>(back).unwrap(),
            actions
        );
    }

    #[test]
    fn a_send_emails_max_age_reads_as_a_duration_and_round_trips() {
        let json = serde_json::json!(
            {"type": "send_email", "to": ["{{ from }}"], "subject": "Re", "text": "pong", "max_age": "1day"}
        );
        let action: AutomationAction = serde_json::from_value(json).unwrap();
        let AutomationAction::SendEmail(email) = &action else {
            panic!("{action:?}")
        };
        assert_eq!(email.max_age, Some(Duration::from_secs(86_400)));
        let back = serde_json::to_value(&action).unwrap();
        assert_eq!(
            serde_json::from_value::<AutomationAction>(back).unwrap(),
            action
        );
    }

    #[test]
    fn a_webhook_url_loses_its_user_info_query_and_fragment() {
        let hook = WebhookAction {
            url: "https://user:pass-word@hooks.example:8443/in/x?token=abcd1234#frag-ment".into(),
            headers: BTreeMap::from([("authorization".into(), "Bearer tok-3141".into())]),
        };
        assert_eq!(
            hook.redacted_url(),
            "https://[redacted]@hooks.example:8443/in/x?[redacted]#[redacted]"
        );
        assert_eq!(redact_url("http://h/x"), "http://h/x");
        assert_eq!(redact_url("not a url?k=v"), "not a url?[redacted]");
        let debug = format!("{hook:?}");
        for secret in ["pass-word", "abcd1234", "tok-3141", "frag-ment"] {
            assert!(!debug.contains(secret), "{debug}");
        }
        let scrubbed = hook.scrub(&format!(
            "error sending request for url ({}): the server echoed token=abcd1234 and pass-word",
            hook.url
        ));
        assert_eq!(
            scrubbed,
            "error sending request for url (https://[redacted]@hooks.example:8443/in/x?[redacted]#[redacted]): \
             the server echoed [redacted] and [redacted]"
        );
    }

    #[test]
    fn unknown_types_and_fields_are_refused() {
        assert!(
            serde_json::from_value::<AutomationAction>(serde_json::json!({"type": "sms"})).is_err()
        );
        let typo = serde_json::json!({"type": "webhook", "url": "http://x", "timout": 3});
        assert!(serde_json::from_value::<AutomationAction>(typo).is_err());
    }
}
