//! The edit forms as posted: the one-time edit key, a mail's fields (recipients one per line
//! or comma-separated), and the diff of what changed, the audit entry's record of the edit.

use job_automation_action::RenderedEmail;
use job_email_send::edit::{MailEdit, OutboundMail};
use serde::Deserialize;
use serde_json::{Map, Value, json};
use uuid::Uuid;

use crate::page::Problem;

/// A mail's edit form, as posted (and as the API takes it). A field left out keeps the mail's
/// value, so that a script changing the recipients does not blank the subject; the page's
/// form posts every field (an emptied body is no body).
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct MailForm {
    pub csrf: String,
    /// The form's one-time key: the same form posted twice sends once.
    pub edit_key: String,
    pub to: Option<String>,
    pub cc: Option<String>,
    pub subject: Option<String>,
    pub text: Option<String>,
    pub html: Option<String>,
}

/// The one-time key of a form, checked.
pub fn edit_key(text: &str) -> Result<Uuid, Problem> {
    text.trim().parse().map_err(|_| {
        Problem::bad_request(format!(
            "edit_key: expected the one-time key the edit form carries (a UUID), found `{}`",
            text.trim()
        ))
    })
}

/// `a@x, b@y` or one per line: the addresses, trimmed, blanks dropped.
pub fn addresses(text: &str) -> Vec<String> {
    text.split([',', '\n'])
        .map(str::trim)
        .filter(|a| !a.is_empty())
        .map(str::to_string)
        .collect()
}

fn body(text: &str) -> Option<String> {
    // Browsers post a textarea's line breaks as CRLF; the stored bodies have LF.
    let text = text.replace("\r\n", "\n");
    (!text.trim().is_empty()).then_some(text)
}

impl MailForm {
    /// The fields as an edit of `mail`'s `current` ones. The subject is kept as typed: a line
    /// break in it is refused by the check, not quietly joined.
    pub fn edit(&self, current: &MailEdit) -> MailEdit {
        MailEdit {
            to: self
                .to
                .as_deref()
                .map_or_else(|| current.to.clone(), addresses),
            cc: self
                .cc
                .as_deref()
                .map_or_else(|| current.cc.clone(), addresses),
            subject: self
                .subject
                .as_deref()
                .map_or_else(|| current.subject.clone(), |s| s.trim().to_string()),
            text: self
                .text
                .as_deref()
                .map_or_else(|| current.text.clone(), body),
            html: self
                .html
                .as_deref()
                .map_or_else(|| current.html.clone(), body),
        }
    }
}

/// The edit as the automation's render would have made it, for its checks.
pub fn as_rendered(mail: &OutboundMail, edit: &MailEdit) -> RenderedEmail {
    RenderedEmail {
        from: mail.from_address.clone(),
        to: edit.to.clone(),
        cc: edit.cc.clone(),
        subject: edit.subject.clone(),
        text: edit.text.clone(),
        html: edit.html.clone(),
        in_reply_to: mail.in_reply_to.clone(),
        references: mail.reference_ids.clone(),
    }
}

/// The fields that changed, each `{"before": …, "after": …}`; empty when nothing did.
pub fn diff(before: &MailEdit, after: &MailEdit) -> Map<String, Value> {
    let mut changed = Map::new();
    let mut field = |name: &str, b: Value, a: Value| {
        if b != a {
            changed.insert(name.to_string(), json!({ "before": b, "after": a }));
        }
    };
    field("to", json!(before.to), json!(after.to));
    field("cc", json!(before.cc), json!(after.cc));
    field("subject", json!(before.subject), json!(after.subject));
    field("text", json!(before.text), json!(after.text));
    field("html", json!(before.html), json!(after.html));
    changed
}

/// A raw body's diff: before and after, as text (or the number of bytes, when not UTF-8).
pub fn body_diff(before: &[u8], after: &str) -> Map<String, Value> {
    let before = std::str::from_utf8(before).map_or_else(
        |_| json!(format!("({} bytes, not UTF-8)", before.len())),
        |text| json!(text),
    );
    let mut changed = Map::new();
    if before != json!(after) {
        changed.insert("body".into(), json!({ "before": before, "after": after }));
    }
    changed
}

#[cfg(test)]
mod tests {
    use super::*;

    fn edit(to: &[&str], subject: &str) -> MailEdit {
        MailEdit {
            to: to.iter().map(|s| s.to_string()).collect(),
            cc: vec![],
            subject: subject.into(),
            text: Some("pong".into()),
            html: None,
        }
    }

    #[test]
    fn the_diff_holds_only_the_fields_that_changed_with_before_and_after() {
        let before = edit(&["fail@x.example"], "Re: ping");
        let after = edit(&["ok@x.example"], "Re: ping");
        let diff = diff(&before, &after);
        assert_eq!(diff.len(), 1, "{diff:?}");
        assert_eq!(diff["to"]["before"], json!(["fail@x.example"]));
        assert_eq!(diff["to"]["after"], json!(["ok@x.example"]));
        assert!(super::diff(&before, &before).is_empty());
    }

    #[test]
    fn recipients_are_split_on_commas_and_lines_and_bodies_keep_lf() {
        let form = MailForm {
            to: Some("a@x.example,\r\n b@x.example\n\n".into()),
            subject: Some(" Re: ping ".into()),
            text: Some("line 1\r\nline 2".into()),
            html: Some("  ".into()),
            ..MailForm::default()
        };
        let edit = form.edit(&edit(&["old@x.example"], "old"));
        assert_eq!(edit.to, ["a@x.example", "b@x.example"]);
        assert_eq!(edit.subject, "Re: ping");
        assert_eq!(edit.text.as_deref(), Some("line 1\nline 2"));
        assert_eq!(edit.html, None);
    }

    #[test]
    fn a_field_left_out_keeps_the_mails_value() {
        let current = edit(&["old@x.example"], "Re: ping");
        let form = MailForm {
            to: Some("new@x.example".into()),
            ..MailForm::default()
        };
        let edit = form.edit(&current);
        assert_eq!(edit.to, ["new@x.example"]);
        assert_eq!(
            (edit.subject.as_str(), edit.text.as_deref()),
            ("Re: ping", Some("pong"))
        );
    }

    #[test]
    fn a_form_without_its_key_is_refused() {
        assert!(edit_key("").is_err());
        assert!(edit_key(&Uuid::new_v4().to_string()).is_ok());
    }

    #[test]
    fn a_body_diff_shows_bytes_that_are_not_text() {
        let diff = body_diff(&[0xff, 0xfe], "{}");
        assert_eq!(diff["body"]["before"], json!("(2 bytes, not UTF-8)"));
        assert!(body_diff(b"{}", "{}").is_empty());
    }
}
