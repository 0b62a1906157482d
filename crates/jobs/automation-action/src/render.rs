//! Rendering a `send_email` action over an event's fields, with MiniJinja.
//!
//! The template context is the event's `data` object and nothing else: no environment, no
//! files, no settings (MiniJinja has no loader here, so `include` and `import` find nothing).
//! Each render is bounded by fuel (instructions), its recursion by [`MAX_RECURSION`], and
//! its output by [`MAX_BODY_BYTES`] *while it renders*: the output goes to a writer that
//! refuses the write that would pass the limit, which stops the render there. (Checked
//! after the render, a loop printing a large field would first build hundreds of MB.)
//!
//! * A field the event does not have is an error when printed or iterated (`{{ frm }}`: a
//!   typo), but may be tested (`{% if from_name %}`) or defaulted (`{{ x | default("") }}`).
//! * `null` prints as nothing, so `Re: {{ subject }}` of a mail without a subject is `Re:`
//!   (the subject is trimmed).
//! * The `html` body escapes the event's values; the other templates do not.
//!
//! Every error here is permanent: the same template over the same event fails the same way.

use minijinja::{AutoEscape, Environment, UndefinedBehavior, Value as Jinja};
use serde_json::Value;
use worker_core::Failure;
use worker_messages::SendEmailAction;

/// The fuel of one template's render: ample for any mail, and a bound on loops.
pub const FUEL: u64 = 100_000;

/// The largest rendered body, in bytes.
pub const MAX_BODY_BYTES: usize = 1024 * 1024;

/// Nested macro calls, includes and loops in one render (MiniJinja's default is 500).
pub const MAX_RECURSION: usize = 100;

/// The most ids kept in References: the first (the thread's root) and the latest ones.
pub const MAX_REFERENCES: usize = 20;

/// A `send_email` action rendered for one event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RenderedEmail {
    pub from: Option<String>,
    pub to: Vec<String>,
    pub cc: Vec<String>,
    pub subject: String,
    pub text: Option<String>,
    pub html: Option<String>,
    /// Without angle brackets.
    pub in_reply_to: Option<String>,
    /// Without angle brackets, oldest first, the replied-to message last.
    pub references: Vec<String>,
}

fn environment() -> Environment<'static> {
    let mut env = Environment::new();
    env.set_undefined_behavior(UndefinedBehavior::SemiStrict);
    env.set_fuel(Some(FUEL));
    env.set_recursion_limit(MAX_RECURSION);
    env.set_auto_escape_callback(|name| {
        if name == "html" {
            AutoEscape::Html
        } else {
            AutoEscape::None
        }
    });
    env.set_formatter(|out, state, value| {
        if value.is_none() {
            Ok(())
        } else {
            minijinja::escape_formatter(out, state, value)
        }
    });
    env
}

/// Renders `action` over the event's `data`. Errors are permanent (`template-error`,
/// `bad-recipient`, `no-recipient`, `too-large`).
pub fn render_email(action: &SendEmailAction, data: &Value) -> Result<RenderedEmail, Failure> {
    let env = environment();
    let context = match data {
        Value::Object(_) => Jinja::from_serialize(data),
        _ => Jinja::from_serialize(serde_json::Map::new()),
    };
    let render = |field: &str, source: &str| -> Result<String, Failure> {
        let template = env
            .template_from_named_str(field, source)
            .map_err(|err| template_error(field, &err))?;
        let mut out = Bounded::new(MAX_BODY_BYTES);
        if let Err(err) = template.render_captured_to(&context, &mut out) {
            return Err(if out.over {
                Failure::permanent(
                    "too-large",
                    format!("`{field}` rendered past {MAX_BODY_BYTES} bytes; stopped there"),
                )
            } else {
                template_error(field, &err)
            });
        }
        // MiniJinja writes whole `str` pieces: the bytes are UTF-8.
        String::from_utf8(out.bytes).map_err(|_| {
            Failure::permanent(
                "template-error",
                format!("`{field}` rendered invalid UTF-8"),
            )
        })
    };
    let recipients = |field: &str, templates: &[String]| -> Result<Vec<String>, Failure> {
        let mut out = Vec::new();
        for (i, source) in templates.iter().enumerate() {
            let name = format!("{field}[{i}]");
            for address in render(&name, source)?.split(',') {
                let address = address.trim();
                if address.is_empty() {
                    continue;
                }
                check_address(&name, address)?;
                if !out.iter().any(|a: &String| a.eq_ignore_ascii_case(address)) {
                    out.push(address.to_string());
                }
            }
        }
        Ok(out)
    };

    let to = recipients("to", &action.to)?;
    if to.is_empty() {
        return Err(Failure::permanent(
            "no-recipient",
            "every `to` template rendered empty for this event",
        ));
    }
    let cc = recipients("cc", &action.cc)?;
    let from = match &action.from {
        Some(source) => {
            let from = render("from", source)?.trim().to_string();
            if from.is_empty() {
                None
            } else {
                check_address("from", &from)?;
                Some(from)
            }
        }
        None => None,
    };
    let subject = one_line(&render("subject", &action.subject)?);
    let text = action
        .text
        .as_deref()
        .map(|s| render("text", s))
        .transpose()?;
    let html = action
        .html
        .as_deref()
        .map(|s| render("html", s))
        .transpose()?;

    let (in_reply_to, references) = if action.reply_headers {
        threading(data)
    } else {
        (None, Vec::new())
    };
    Ok(RenderedEmail {
        from,
        to,
        cc,
        subject,
        text,
        html,
        in_reply_to,
        references,
    })
}

/// The render's output, refusing the write that would take it past `limit` bytes (which
/// ends the render with an error).
struct Bounded {
    bytes: Vec<u8>,
    limit: usize,
    over: bool,
}

impl Bounded {
    fn new(limit: usize) -> Self {
        Self {
            bytes: Vec::new(),
            limit,
            over: false,
        }
    }
}

impl std::io::Write for Bounded {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.bytes.len().saturating_add(buf.len()) > self.limit {
            self.over = true;
            return Err(std::io::Error::other(
                "the rendered output is over its limit",
            ));
        }
        self.bytes.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn template_error(field: &str, err: &minijinja::Error) -> Failure {
    // The alternate form adds the template's source around the error's line when the debug
    // info is there; the plain one is enough for a dead-letter header.
    let mut detail = format!("`{field}`: {err}");
    if let Some(line) = err.line() {
        detail.push_str(&format!(" (line {line})"));
    }
    Failure::permanent("template-error", detail)
}

/// A recipient or sender must look like `local@domain` or `Name <local@domain>`; the SMTP
/// consumer parses it strictly. No line breaks: they would be header injection.
pub(crate) fn check_address(field: &str, address: &str) -> Result<(), Failure> {
    let bare = match (address.rfind('<'), address.strip_suffix('>')) {
        (Some(open), Some(inner)) => &inner[open + 1..],
        _ => address,
    };
    let ok = !address.contains(['\r', '\n'])
        && bare.split_once('@').is_some_and(|(local, domain)| {
            !local.is_empty() && !domain.is_empty() && !bare.contains(char::is_whitespace)
        });
    if ok {
        Ok(())
    } else {
        Err(Failure::permanent(
            "bad-recipient",
            format!("`{field}` rendered to `{address}`, which is not an email address"),
        ))
    }
}

/// Line breaks (and runs of white space around them) become one space.
fn one_line(text: &str) -> String {
    text.split(['\r', '\n'])
        .map(str::trim)
        .filter(|part| !part.is_empty())
        .collect::<Vec<_>>()
        .join(" ")
}

/// In-Reply-To = the event's `message_id`; References = its `references` plus that id
/// (without angle brackets, duplicates dropped, at most [`MAX_REFERENCES`]: the root and the
/// latest).
fn threading(data: &Value) -> (Option<String>, Vec<String>) {
    let Some(message_id) = data
        .get("message_id")
        .and_then(Value::as_str)
        .map(bare_id)
        .filter(|id| !id.is_empty())
    else {
        return (None, Vec::new());
    };
    let mut references: Vec<String> = Vec::new();
    let earlier = data
        .get("references")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .map(bare_id);
    for id in earlier.chain(std::iter::once(message_id.clone())) {
        if !id.is_empty() && !references.contains(&id) {
            references.push(id);
        }
    }
    if references.len() > MAX_REFERENCES {
        let tail = references.split_off(references.len() - (MAX_REFERENCES - 1));
        references.truncate(1);
        references.extend(tail);
    }
    (Some(message_id), references)
}

/// `<a@b>` -> `a@b`; white space and line breaks removed.
fn bare_id(id: &str) -> String {
    id.trim()
        .trim_start_matches('<')
        .trim_end_matches('>')
        .chars()
        .filter(|c| !c.is_whitespace())
        .collect()
}

#[cfg(test)]
mod tests {
    use serde_json::json;
    use worker_core::FailureClass;

    use super::*;

    fn reply() -> SendEmailAction {
        SendEmailAction {
            to: vec!["{{ from }}".into()],
            cc: vec![],
            from: None,
            subject: "Re: {{ subject }}".into(),
            text: Some("Hello {{ from_name or from }},\nwe got \"{{ subject }}\".".into()),
            html: Some("<p>We got <b>{{ subject }}</b></p>".into()),
            reply_headers: true,
            max_age: None,
        }
    }

    fn mail() -> Value {
        json!({
            "message_id": "<m2@example.com>",
            "from": "alice@localhost",
            "from_name": null,
            "to": ["demo@localhost"],
            "subject": "ping <now>",
            "references": ["m0@example.com", "<m1@example.com>"],
        })
    }

    #[test]
    fn a_reply_renders_from_the_event_fields() {
        let email = render_email(&reply(), &mail()).unwrap();
        assert_eq!(email.to, ["alice@localhost"]);
        assert_eq!(email.subject, "Re: ping <now>");
        assert_eq!(
            email.text.as_deref(),
            Some("Hello alice@localhost,\nwe got \"ping <now>\".")
        );
        assert_eq!(
            email.html.as_deref(),
            Some("<p>We got <b>ping &lt;now&gt;</b></p>"),
            "values are escaped in the html body"
        );
        assert_eq!(email.in_reply_to.as_deref(), Some("m2@example.com"));
        assert_eq!(
            email.references,
            ["m0@example.com", "m1@example.com", "m2@example.com"]
        );
    }

    #[test]
    fn null_prints_as_nothing_and_line_breaks_leave_the_subject() {
        let mut data = mail();
        data["subject"] = json!(null);
        assert_eq!(render_email(&reply(), &data).unwrap().subject, "Re:");
        data["subject"] = json!("a\r\n  b\nc");
        assert_eq!(render_email(&reply(), &data).unwrap().subject, "Re: a b c");
    }

    #[test]
    fn a_typo_or_a_syntax_error_is_a_permanent_template_error() {
        let mut typo = reply();
        typo.subject = "Re: {{ subjcet }}".into();
        let err = render_email(&typo, &mail()).unwrap_err();
        assert_eq!(
            (err.class(), err.reason()),
            (FailureClass::Permanent, "template-error")
        );
        assert!(err.detail().contains("`subject`"), "{err}");

        let mut syntax = reply();
        syntax.text = Some("{% if %}".into());
        assert_eq!(
            render_email(&syntax, &mail()).unwrap_err().reason(),
            "template-error"
        );

        let mut endless = reply();
        endless.text = Some(
            "{% for i in range(100000) %}{% for j in range(100000) %}x{% endfor %}{% endfor %}"
                .into(),
        );
        assert_eq!(
            render_email(&endless, &mail()).unwrap_err().reason(),
            "template-error",
            "out of fuel"
        );
    }

    #[test]
    fn endless_recursion_is_a_template_error_within_a_small_stack() {
        let mut recursive = reply();
        recursive.text = Some("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}".into());
        // A tokio worker's stack is 2 MiB: an overflow there aborts the whole host.
        let err = std::thread::Builder::new()
            .stack_size(2 * 1024 * 1024)
            .spawn(move || render_email(&recursive, &mail()))
            .unwrap()
            .join()
            .unwrap()
            .unwrap_err();
        assert_eq!(err.reason(), "template-error", "{err}");
    }

    #[test]
    fn output_just_under_the_limit_renders_whole() {
        let mut big = reply();
        big.text = Some(format!("{{{{ '{}' }}}}", "x".repeat(1000)).repeat(MAX_BODY_BYTES / 1000));
        let text = render_email(&big, &mail()).unwrap().text.unwrap();
        assert_eq!(text.len(), MAX_BODY_BYTES / 1000 * 1000);
        big.text = Some(format!("{}{{{{ 'x' }}}}", big.text.unwrap_or_default()).repeat(2));
        assert_eq!(
            render_email(&big, &mail()).unwrap_err().reason(),
            "too-large"
        );
    }

    #[test]
    fn recipients_split_dedup_and_must_be_addresses() {
        let mut many = reply();
        many.to = vec![
            "{{ to | join(',') }}, ops@localhost".into(),
            "{{ from }}".into(),
            "".into(),
        ];
        many.cc = vec!["Boss <boss@localhost>".into()];
        let email = render_email(&many, &mail()).unwrap();
        assert_eq!(
            email.to,
            ["demo@localhost", "ops@localhost", "alice@localhost"]
        );
        assert_eq!(email.cc, ["Boss <boss@localhost>"]);

        let mut bad = reply();
        bad.to = vec!["{{ subject }}".into()];
        assert_eq!(
            render_email(&bad, &mail()).unwrap_err().reason(),
            "bad-recipient"
        );

        let mut nobody = reply();
        nobody.to = vec!["{{ from_name }}".into()];
        assert_eq!(
            render_email(&nobody, &mail()).unwrap_err().reason(),
            "no-recipient"
        );
    }

    #[test]
    fn threading_can_be_turned_off_and_is_absent_without_a_message_id() {
        let mut plain = reply();
        plain.reply_headers = false;
        let email = render_email(&plain, &mail()).unwrap();
        assert_eq!((email.in_reply_to, email.references.len()), (None, 0));

        let mut data = mail();
        data["message_id"] = json!(null);
        assert_eq!(render_email(&reply(), &data).unwrap().in_reply_to, None);
    }

    #[test]
    fn long_reference_chains_keep_the_root_and_the_latest() {
        let mut data = mail();
        data["references"] = json!((0..40).map(|i| format!("r{i}@x")).collect::<Vec<_>>());
        let email = render_email(&reply(), &data).unwrap();
        assert_eq!(email.references.len(), MAX_REFERENCES);
        assert_eq!(email.references[0], "r0@x");
        assert_eq!(
            email.references.last().map(String::as_str),
            Some("m2@example.com")
        );
        assert_eq!(email.references[MAX_REFERENCES - 2], "r39@x");
    }
}
