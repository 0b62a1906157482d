//! The rules a rendered mail is held to, for a mail that was not rendered here: an operator's
//! edit of a failed one (issue 26). The same functions the render uses, so that an edit
//! cannot let through what a template could not: [`check_rendered`].

use worker_core::Failure;

use crate::render::{MAX_BODY_BYTES, RenderedEmail, check_address};
use crate::reply_limit::over_recipients_max;

/// Checks `email` as a render would have made it: at least one `to`, every address an
/// address (no line breaks: header injection), a subject on one line, each body at most
/// [`MAX_BODY_BYTES`], and at most `recipients_max` distinct recipients. Errors are permanent
/// (`no-recipient`, `bad-recipient`, `bad-subject`, `too-large`, `too-many-recipients`) and
/// name the field.
pub fn check_rendered(email: &RenderedEmail, recipients_max: u32) -> Result<(), Failure> {
    if email.to.iter().all(|a| a.trim().is_empty()) {
        return Err(Failure::permanent(
            "no-recipient",
            "`to` has no address: a mail needs at least one",
        ));
    }
    for (field, list) in [("to", &email.to), ("cc", &email.cc)] {
        for (i, address) in list.iter().enumerate() {
            check_address(&format!("{field}[{i}]"), address)?;
        }
    }
    if let Some(from) = &email.from {
        check_address("from", from)?;
    }
    if email.subject.contains(['\r', '\n']) {
        return Err(Failure::permanent(
            "bad-subject",
            "`subject` holds a line break: a header is one line",
        ));
    }
    for (field, body) in [("text", &email.text), ("html", &email.html)] {
        let bytes = body.as_deref().map_or(0, str::len);
        if bytes > MAX_BODY_BYTES {
            return Err(Failure::permanent(
                "too-large",
                format!("`{field}` is {bytes} bytes; at most {MAX_BODY_BYTES}"),
            ));
        }
    }
    if let Some(reason) = over_recipients_max(email, recipients_max) {
        return Err(Failure::permanent("too-many-recipients", reason));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mail() -> RenderedEmail {
        RenderedEmail {
            from: None,
            to: vec!["alice@example.com".into()],
            cc: vec!["Boss <boss@example.com>".into()],
            subject: "Re: ping".into(),
            text: Some("pong".into()),
            html: None,
            in_reply_to: None,
            references: vec![],
        }
    }

    fn reason(email: &RenderedEmail, max: u32) -> String {
        check_rendered(email, max).map_or_else(|e| e.reason().to_string(), |()| "ok".into())
    }

    #[test]
    fn a_mail_a_render_could_make_passes() {
        assert_eq!(reason(&mail(), 50), "ok");
    }

    #[test]
    fn each_rule_of_a_rendered_mail_refuses_by_name() {
        let mut nobody = mail();
        nobody.to = vec![" ".into()];
        assert_eq!(reason(&nobody, 50), "no-recipient");
        let mut bad = mail();
        bad.cc = vec!["boss at example".into()];
        assert_eq!(reason(&bad, 50), "bad-recipient");
        let mut injected = mail();
        injected.to = vec!["a@example.com\r\nBcc: x@evil.example".into()];
        assert_eq!(reason(&injected, 50), "bad-recipient");
        let mut header = mail();
        header.subject = "Re: ping\r\nBcc: x@evil.example".into();
        assert_eq!(reason(&header, 50), "bad-subject");
        let mut big = mail();
        big.html = Some("x".repeat(MAX_BODY_BYTES + 1));
        assert_eq!(reason(&big, 50), "too-large");
        assert_eq!(reason(&mail(), 1), "too-many-recipients");
    }
}
