//! No mail loops and no backscatter (RFC 3834): which mail a `send_email` action must not
//! answer, read from the `email.received` event the poller wrote.
//!
//! Not answered: mail whose Auto-Submitted is anything but `no` (an autoresponder, a
//! notice), whose X-Auto-Response-Suppress is anything but `None` (Microsoft's way of asking
//! for no automatic answer), that carries X-Autoreply, whose Precedence is `bulk`, `junk`,
//! `list` or `auto_reply`, that carries a List-Id, List-Unsubscribe or List-Post (a mailing
//! list), whose envelope sender is null (`Return-Path: <>`, a bounce) or whose sender is a
//! MAILER-DAEMON, and mail from one of the host's own sender addresses. Answering any of them risks a loop
//! between two machines, or mail to someone who never wrote (a forged or bounced sender).
//!
//! ```
//! use job_automation_action::loops::reason_not_to_answer;
//! let data = serde_json::json!({"from": "alice@example.com", "auto_submitted": "auto-replied"});
//! let reason = reason_not_to_answer(&data, &[]).unwrap_or_default();
//! assert!(reason.contains("Auto-Submitted"));
//! let person = serde_json::json!({"from": "alice@example.com", "auto_submitted": "no"});
//! assert_eq!(reason_not_to_answer(&person, &[]), None);
//! ```

use serde::Deserialize;
use serde_json::Value;

/// The fields of an `email.received` event read here; every one optional, so that an event
/// of another type, or of an older poller, reads as "nothing against answering".
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct Signs {
    from: Option<String>,
    auto_submitted: Option<String>,
    precedence: Option<String>,
    list_id: Option<String>,
    return_path: Option<String>,
    null_sender: bool,
    x_auto_response_suppress: Option<String>,
    x_autoreply: Option<String>,
    list_unsubscribe: Option<String>,
    list_post: Option<String>,
}

/// The value when it says anything.
fn given(value: &Option<String>) -> Option<&str> {
    value.as_deref().filter(|v| !v.trim().is_empty())
}

/// Why the mail that made `data` (an event's `data`) must not be answered, or `None`.
/// `own` holds the host's own sender addresses, lower-case.
pub fn reason_not_to_answer(data: &Value, own: &[String]) -> Option<String> {
    let signs: Signs = serde_json::from_value(data.clone()).unwrap_or_default();
    if let Some(value) = signs.auto_submitted.as_deref() {
        // `auto-replied; owner-email=…` or `auto-generated (comment)`: the keyword counts.
        let keyword = value
            .split([';', '(', ' '])
            .next()
            .unwrap_or_default()
            .trim();
        if !keyword.is_empty() && !keyword.eq_ignore_ascii_case("no") {
            return Some(format!(
                "the mail is automatic (Auto-Submitted: {value}); RFC 3834 says not to answer it"
            ));
        }
    }
    if let Some(value) = given(&signs.x_auto_response_suppress)
        && !value.trim().eq_ignore_ascii_case("none")
    {
        return Some(format!(
            "the sender asks for no automatic answer (X-Auto-Response-Suppress: {value}); it is \
             not answered"
        ));
    }
    if let Some(value) = given(&signs.x_autoreply) {
        return Some(format!(
            "the mail is an automatic answer (X-Autoreply: {value}); it is not answered"
        ));
    }
    if let Some(value) = signs.precedence.as_deref() {
        let keyword = value.trim();
        if ["bulk", "junk", "list", "auto_reply"]
            .iter()
            .any(|p| keyword.eq_ignore_ascii_case(p))
        {
            return Some(format!(
                "the mail is bulk, list or automatic mail (Precedence: {value}); it is not answered"
            ));
        }
    }
    for (header, value) in [
        ("List-Id", &signs.list_id),
        ("List-Unsubscribe", &signs.list_unsubscribe),
        ("List-Post", &signs.list_post),
    ] {
        if let Some(value) = given(value) {
            return Some(format!(
                "the mail came through a mailing list ({header}: {value}); it is not answered"
            ));
        }
    }
    if signs.null_sender || signs.return_path.as_deref() == Some("") {
        return Some(
            "the mail has a null sender (Return-Path: <>), a bounce or a notice; it is not answered"
                .into(),
        );
    }
    let senders = [signs.from.as_deref(), signs.return_path.as_deref()];
    for sender in senders.into_iter().flatten() {
        let address = sender.trim().to_ascii_lowercase();
        let local = address.split('@').next().unwrap_or_default();
        if local == "mailer-daemon" {
            return Some(format!(
                "the mail comes from a MAILER-DAEMON ({sender}); it is not answered"
            ));
        }
        if own.contains(&address) {
            return Some(format!(
                "the mail comes from the host's own address ({sender}); answering it would loop"
            ));
        }
    }
    None
}

/// The bare address of `Name <a@b>` or `a@b`, lower-case.
pub fn bare_address(mailbox: &str) -> String {
    let mailbox = mailbox.trim();
    let inner = match (mailbox.rfind('<'), mailbox.rfind('>')) {
        (Some(open), Some(close)) if open < close => &mailbox[open + 1..close],
        _ => mailbox,
    };
    inner.trim().to_ascii_lowercase()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_person_is_answered_and_the_machines_are_not() {
        let own = vec![bare_address("Host <host@example.com>")];
        assert_eq!(own, ["host@example.com"]);
        let answered = [
            json!({"from": "a@x"}),
            json!({"from": "a@x", "auto_submitted": "No", "precedence": "first-class"}),
            json!({"from": "a@x", "list_id": "  ", "return_path": "a@x"}),
            json!("not an object"),
        ];
        for data in answered {
            assert_eq!(reason_not_to_answer(&data, &own), None, "{data}");
        }
        let refused = [
            json!({"from": "a@x", "auto_submitted": "auto-notified"}),
            json!({"from": "a@x", "precedence": " JUNK "}),
            json!({"from": "a@x", "list_id": "<l.x>"}),
            json!({"from": "a@x", "return_path": ""}),
            json!({"from": "Mailer-Daemon@x"}),
            json!({"from": "a@x", "return_path": "MAILER-DAEMON@relay"}),
            json!({"from": "HOST@example.com"}),
        ];
        for data in refused {
            assert!(reason_not_to_answer(&data, &own).is_some(), "{data}");
        }
    }

    fn refused(extra: serde_json::Value) -> String {
        let mut data = json!({"from": "a@x"});
        if let (Some(data), serde_json::Value::Object(extra)) = (data.as_object_mut(), extra) {
            data.extend(extra);
        }
        reason_not_to_answer(&data, &[]).unwrap_or_default()
    }

    #[test]
    fn x_auto_response_suppress_other_than_none_is_not_answered() {
        for value in [
            "All",
            "OOF",
            "AutoReply",
            "DR",
            "NDR",
            "RN",
            "NRN",
            "DR, RN, NRN",
        ] {
            let reason = refused(json!({ "x_auto_response_suppress": value }));
            assert!(
                reason.contains("X-Auto-Response-Suppress"),
                "{value}: {reason}"
            );
        }
        for value in ["", "  ", "None", "none"] {
            let data = json!({"from": "a@x", "x_auto_response_suppress": value});
            assert_eq!(reason_not_to_answer(&data, &[]), None, "{value}");
        }
    }

    #[test]
    fn precedence_auto_reply_is_not_answered() {
        let reason = refused(json!({"precedence": "auto_reply"}));
        assert!(reason.contains("Precedence: auto_reply"), "{reason}");
    }

    #[test]
    fn x_autoreply_with_any_value_is_not_answered() {
        for value in ["yes", "YES", "1"] {
            let reason = refused(json!({ "x_autoreply": value }));
            assert!(reason.contains("X-Autoreply"), "{value}: {reason}");
        }
    }

    #[test]
    fn list_unsubscribe_is_a_mailing_list() {
        let reason = refused(json!({"list_unsubscribe": "<mailto:leave@lists.example>"}));
        assert!(reason.contains("List-Unsubscribe"), "{reason}");
    }

    #[test]
    fn list_post_is_a_mailing_list() {
        let reason = refused(json!({"list_post": "<mailto:team@lists.example>"}));
        assert!(reason.contains("List-Post"), "{reason}");
    }

    /// The names read here are the ones the poller's event writes.
    #[test]
    fn the_event_s_own_fields_are_read() {
        let event: worker_messages::EmailReceived = serde_json::from_value(json!({
            "inbound_email_id": "00000000-0000-0000-0000-000000000001",
            "account": "a", "mailbox": "INBOX", "message_id": null, "from": "a@x",
            "from_name": null, "to": [], "subject": null, "text": null, "references": [],
            "parse_error": null,
        }))
        .unwrap();
        let written = serde_json::to_value(&event).unwrap();
        assert_eq!(reason_not_to_answer(&written, &[]), None);
        for (field, header) in [
            ("x_auto_response_suppress", "X-Auto-Response-Suppress"),
            ("x_autoreply", "X-Autoreply"),
            ("list_unsubscribe", "List-Unsubscribe"),
            ("list_post", "List-Post"),
        ] {
            assert!(written.get(field).is_some(), "the event has no `{field}`");
            let mut data = written.clone();
            data[field] = json!("yes");
            let event: worker_messages::EmailReceived = serde_json::from_value(data).unwrap();
            let data = serde_json::to_value(&event).unwrap();
            let reason = reason_not_to_answer(&data, &[]).unwrap_or_default();
            assert!(reason.contains(header), "{field}: {reason}");
        }
    }
}
