//! No mail loops and no backscatter (RFC 3834): which mail a `send_email` action must not
//! answer, read from the `email.received` event the poller wrote.
//!
//! Not answered: mail whose Auto-Submitted is anything but `no` (an autoresponder, a
//! notice), whose Precedence is `bulk`, `junk` or `list`, that carries a List-Id, whose
//! envelope sender is null (`Return-Path: <>`, a bounce) or whose sender is a MAILER-DAEMON,
//! and mail from one of the host's own sender addresses. Answering any of them risks a loop
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
    if let Some(value) = signs.precedence.as_deref() {
        let keyword = value.trim();
        if ["bulk", "junk", "list"]
            .iter()
            .any(|p| keyword.eq_ignore_ascii_case(p))
        {
            return Some(format!(
                "the mail is bulk or list mail (Precedence: {value}); it is not answered"
            ));
        }
    }
    if let Some(value) = signs.list_id.as_deref().filter(|v| !v.trim().is_empty()) {
        return Some(format!(
            "the mail came through a mailing list (List-Id: {value}); it is not answered"
        ));
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
}
