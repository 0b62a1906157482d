//! The actions an automation runs, as stored in `automations.actions` and snapshotted on each
//! action execution.
//!
//! The trigger consumer writes them (one execution per action, in list order), the action
//! executor reads them back, and a webhook posts one as the `action` of its body: so they are
//! shapes the jobs agree on, like the messages beside them. Text fields marked "template" are
//! MiniJinja templates rendered over the event's `data` fields (`{{ from }}`,
//! `Re: {{ subject }}`) and nothing else.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// One action of an automation, tagged by `type`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum AutomationAction {
    /// Queue an email (sent by the outbound email consumer).
    SendEmail(SendEmailAction),
    /// POST `{"event": …, "action": …}` as JSON to a URL.
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
}

/// `type = "webhook"`: an HTTP POST of the event and the action as JSON.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WebhookAction {
    /// `http://` or `https://` URL.
    pub url: String,
    /// Extra request headers (an authorization token, say). Not templates.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub headers: BTreeMap<String, String>,
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
    fn unknown_types_and_fields_are_refused() {
        assert!(
            serde_json::from_value::<AutomationAction>(serde_json::json!({"type": "sms"})).is_err()
        );
        let typo = serde_json::json!({"type": "webhook", "url": "http://x", "timout": 3});
        assert!(serde_json::from_value::<AutomationAction>(typo).is_err());
    }
}
