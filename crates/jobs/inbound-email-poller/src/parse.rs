//! Turning the raw bytes of a mail into the fields the poller stores and announces.
//!
//! mail-parser is lenient: it reads what it can and rarely refuses. A mail counts as not
//! parsed ([`ParsedEmail::parse_error`]) when no header is found at all, when none of the
//! fields a mail must carry (From, Date, Message-ID, Subject, To) is there, or when a body
//! part could not be decoded. Such a mail is still stored, with whatever was read, and still
//! announced.

use chrono::{DateTime, Utc};
use mail_parser::{Address, HeaderValue, Message, MessageParser};

use crate::bounce::Report;
use crate::limits::{MailLimits, Refused, prescan};

/// The fields read from one mail, each already bounded and safe to store in PostgreSQL text.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ParsedEmail {
    /// Without angle brackets.
    pub message_id: Option<String>,
    pub from_address: Option<String>,
    pub from_name: Option<String>,
    pub to: Vec<String>,
    pub cc: Vec<String>,
    pub subject: Option<String>,
    pub sent_at: Option<DateTime<Utc>>,
    /// Without angle brackets.
    pub in_reply_to: Option<String>,
    /// The References header's message ids, oldest first, without angle brackets.
    pub references: Vec<String>,
    pub text_body: Option<String>,
    pub html_body: Option<String>,
    pub text_truncated: bool,
    pub html_truncated: bool,
    pub parse_error: Option<String>,
    /// The signs of mail that must not be answered automatically (RFC 3834), as sent:
    /// Auto-Submitted, Precedence and List-Id, unfolded and bounded.
    pub auto_submitted: Option<String>,
    pub precedence: Option<String>,
    pub list_id: Option<String>,
    /// The first (the delivering server's) Return-Path, without angle brackets: empty for the
    /// null sender `<>`.
    pub return_path: Option<String>,
    /// Signs RFC 3834 does not name, as sent, unfolded and bounded: X-Auto-Response-Suppress,
    /// X-Autoreply, List-Unsubscribe and List-Post.
    pub x_auto_response_suppress: Option<String>,
    pub x_autoreply: Option<String>,
    pub list_unsubscribe: Option<String>,
    pub list_post: Option<String>,
    /// What the mail reports, when it is a delivery status notification (a bounce): such a
    /// mail is recorded as a report, never announced ([`crate::bounce`]).
    pub report: Option<Report>,
}

/// The longest header value kept, in characters (a Subject of a megabyte is not kept whole).
const MAX_HEADER_CHARS: usize = 2_000;
/// The most addresses or references kept from one header.
const MAX_LIST_ITEMS: usize = 200;

/// Parses a whole mail; the text and HTML bodies are cut at `max_body_chars` characters each.
///
/// mail-parser 0.11 has a `debug_assert!` that fires on some malformed nesting (a
/// multipart's `message/rfc822` part holding an empty `message/rfc822`): a build with debug
/// assertions panics there. The panic is caught and the mail reads as not parsed (its header
/// fields are still read), so that it is stored with that reason rather than failing its
/// tick until it is given up on.
pub fn parse_email(raw: &[u8], max_body_chars: usize) -> ParsedEmail {
    std::panic::catch_unwind(|| parse_unguarded(raw, max_body_chars)).unwrap_or_else(|panic| {
        let why = panic
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| panic.downcast_ref::<String>().cloned())
            .unwrap_or_default();
        ParsedEmail {
            parse_error: Some(format!("the mail parser failed on it: {why}")),
            // The header fields alone do not go where the assertion is.
            ..std::panic::catch_unwind(|| parse_headers(raw)).unwrap_or_default()
        }
    })
}

fn parse_unguarded(raw: &[u8], max_body_chars: usize) -> ParsedEmail {
    match MessageParser::default().parse(raw) {
        None => ParsedEmail {
            parse_error: Some(format!(
                "not a mail: no header found in its {} bytes",
                raw.len()
            )),
            ..ParsedEmail::default()
        },
        Some(message) => {
            let mut parsed = headers_of(&message);
            let (text, text_truncated) = bounded(message.body_text(0).as_deref(), max_body_chars);
            let (html, html_truncated) = bounded(message.body_html(0).as_deref(), max_body_chars);
            parsed.text_body = text;
            parsed.html_body = html;
            parsed.text_truncated = text_truncated;
            parsed.html_truncated = html_truncated;
            parsed.report = crate::bounce::read::report_of(&message).map(|report| Report {
                in_reply_to: parsed.in_reply_to.clone(),
                references: parsed.references.clone(),
                ..report
            });
            let mut problems = Vec::new();
            if missing_every_required_field(&parsed) {
                problems.push(
                    "no From, To, Date, Subject or Message-ID header: not an RFC 5322 mail"
                        .to_string(),
                );
            }
            let undecodable = message
                .parts
                .iter()
                .filter(|part| part.is_encoding_problem && !part.is_multipart())
                .count();
            if undecodable > 0 && !missing_every_required_field(&parsed) {
                problems.push(format!("{undecodable} MIME part(s) could not be decoded"));
            }
            if !problems.is_empty() {
                parsed.parse_error = Some(problems.join("; "));
            }
            parsed
        }
    }
}

/// A mail the pre-scan set aside: why, and the fields of its own header section (when that
/// section was within the limits; empty otherwise).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SetAside {
    pub refused: Refused,
    pub headers: ParsedEmail,
}

/// The poller's path for a fetched mail: [`prescan`] against `limits`, then
/// [`parse_email`]. A mail past a limit is not parsed; only its own header section is, when
/// that section was within the limits.
pub fn parse_within(
    raw: &[u8],
    max_body_chars: usize,
    limits: &MailLimits,
) -> Result<ParsedEmail, Box<SetAside>> {
    match prescan(raw, limits) {
        Ok(_) => Ok(parse_email(raw, max_body_chars)),
        Err(refused) => Err(Box::new(SetAside {
            refused,
            headers: refused
                .top_header_len
                .and_then(|len| raw.get(..len))
                .map(parse_headers)
                .unwrap_or_default(),
        })),
    }
}

/// Parses the header fields only (of a mail whose body is not fetched).
pub fn parse_headers(raw: &[u8]) -> ParsedEmail {
    match MessageParser::default().parse_headers(raw) {
        None => ParsedEmail::default(),
        Some(message) => headers_of(&message),
    }
}

fn missing_every_required_field(p: &ParsedEmail) -> bool {
    p.message_id.is_none()
        && p.from_address.is_none()
        && p.subject.is_none()
        && p.sent_at.is_none()
        && p.to.is_empty()
}

fn headers_of(message: &Message<'_>) -> ParsedEmail {
    let from = message.from().and_then(Address::first);
    ParsedEmail {
        message_id: message.message_id().and_then(clean_id),
        from_address: from.and_then(|a| a.address()).map(clean_header),
        from_name: from.and_then(|a| a.name()).map(clean_header),
        to: addresses(message.to()),
        cc: addresses(message.cc()),
        subject: message.subject().map(clean_header),
        sent_at: message
            .date()
            .filter(|d| d.is_valid())
            .and_then(|d| DateTime::from_timestamp(d.to_timestamp(), 0)),
        in_reply_to: ids(message.in_reply_to()).into_iter().next_back(),
        references: ids(message.references()),
        auto_submitted: first_raw(message, "auto-submitted").map(|v| clean_header(&v)),
        precedence: first_raw(message, "precedence").map(|v| clean_header(&v)),
        list_id: first_raw(message, "list-id").map(|v| clean_header(&v)),
        x_auto_response_suppress: first_raw(message, "x-auto-response-suppress")
            .map(|v| clean_header(&v)),
        x_autoreply: first_raw(message, "x-autoreply").map(|v| clean_header(&v)),
        list_unsubscribe: first_raw(message, "list-unsubscribe").map(|v| clean_header(&v)),
        list_post: first_raw(message, "list-post").map(|v| clean_header(&v)),
        return_path: first_raw(message, "return-path").map(|path| {
            // `<>`, `<a@b>` or a bare address; a comment after it is dropped.
            let path = path.split('(').next().unwrap_or_default().trim();
            clean_header(path.trim_start_matches('<').trim_end_matches('>').trim())
        }),
        ..ParsedEmail::default()
    }
}

/// The raw value of the first header field called `name` (any case), unfolded, its blanks
/// collapsed; `None` when there is none or it is not UTF-8.
fn first_raw(message: &Message<'_>, name: &str) -> Option<String> {
    let header = message
        .headers()
        .iter()
        .find(|h| h.name.as_str().eq_ignore_ascii_case(name))?;
    let raw = message
        .raw_message()
        .get(header.offset_start as usize..header.offset_end as usize)?;
    let value = std::str::from_utf8(raw).ok()?;
    Some(value.split_whitespace().collect::<Vec<_>>().join(" "))
}

fn addresses(address: Option<&Address<'_>>) -> Vec<String> {
    address
        .map(|a| {
            a.iter()
                .filter_map(|addr| addr.address())
                .map(clean_header)
                .take(MAX_LIST_ITEMS)
                .collect()
        })
        .unwrap_or_default()
}

fn ids(value: &HeaderValue<'_>) -> Vec<String> {
    let list: Vec<&str> = match value {
        HeaderValue::Text(text) => vec![text.as_ref()],
        HeaderValue::TextList(list) => list.iter().map(AsRef::as_ref).collect(),
        _ => Vec::new(),
    };
    list.into_iter()
        .filter_map(clean_id)
        .take(MAX_LIST_ITEMS)
        .collect()
}

/// A message id without its angle brackets and blanks, or `None` when nothing is left.
fn clean_id(id: &str) -> Option<String> {
    let id = clean_header(
        id.trim()
            .trim_start_matches('<')
            .trim_end_matches('>')
            .trim(),
    );
    (!id.is_empty()).then_some(id)
}

fn clean_header(value: &str) -> String {
    let (value, _) = bounded(Some(value), MAX_HEADER_CHARS);
    value.unwrap_or_default()
}

/// At most `max_chars` characters of `text`, without NUL characters (which PostgreSQL text
/// refuses); and whether anything was cut.
pub(crate) fn bounded(text: Option<&str>, max_chars: usize) -> (Option<String>, bool) {
    let Some(text) = text else {
        return (None, false);
    };
    let mut out = String::with_capacity(text.len().min(max_chars.saturating_mul(4)));
    let mut truncated = false;
    for (taken, c) in text.chars().filter(|c| *c != '\0').enumerate() {
        if taken == max_chars {
            truncated = true;
            break;
        }
        out.push(c);
    }
    (Some(out), truncated)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAIL: &[u8] = b"Message-ID: <abc@example.com>\r\n\
From: Alice Example <alice@example.com>\r\n\
To: bob@example.com, Carol <carol@example.com>\r\n\
Cc: dave@example.com\r\n\
Subject: =?utf-8?q?ping_=C3=A9t=C3=A9?=\r\n\
Date: Tue, 1 Dec 2026 10:00:00 +0100\r\n\
In-Reply-To: <prev@example.com>\r\n\
References: <root@example.com> <prev@example.com>\r\n\
MIME-Version: 1.0\r\n\
Content-Type: multipart/alternative; boundary=b1\r\n\
\r\n\
--b1\r\n\
Content-Type: text/plain; charset=utf-8\r\n\
\r\n\
hello there\r\n\
--b1\r\n\
Content-Type: text/html; charset=utf-8\r\n\
\r\n\
<p>hello there</p>\r\n\
--b1--\r\n";

    #[test]
    fn a_well_formed_mail_gives_every_field() {
        let p = parse_email(MAIL, 1_000);
        assert_eq!(p.parse_error, None);
        assert_eq!(p.message_id.as_deref(), Some("abc@example.com"));
        assert_eq!(p.from_address.as_deref(), Some("alice@example.com"));
        assert_eq!(p.from_name.as_deref(), Some("Alice Example"));
        assert_eq!(p.to, ["bob@example.com", "carol@example.com"]);
        assert_eq!(p.cc, ["dave@example.com"]);
        assert_eq!(p.subject.as_deref(), Some("ping été"));
        assert_eq!(
            p.sent_at.map(|d| d.to_rfc3339()),
            Some("2026-12-01T09:00:00+00:00".to_string())
        );
        assert_eq!(p.in_reply_to.as_deref(), Some("prev@example.com"));
        assert_eq!(p.references, ["root@example.com", "prev@example.com"]);
        assert_eq!(p.text_body.as_deref().map(str::trim), Some("hello there"));
        assert!(
            p.html_body
                .as_deref()
                .is_some_and(|h| h.contains("<p>hello there</p>"))
        );
        assert!(!p.text_truncated && !p.html_truncated);
    }

    #[test]
    fn bodies_are_cut_at_the_character_limit() {
        let p = parse_email(MAIL, 5);
        assert_eq!(p.text_body.as_deref(), Some("hello"));
        assert!(p.text_truncated);
        assert_eq!(p.html_body.as_deref(), Some("<p>he"));
        assert!(p.html_truncated);
        assert_eq!(bounded(Some("étéé"), 3), (Some("été".into()), true));
        assert_eq!(bounded(Some("a\0b"), 10), (Some("ab".into()), false));
        assert_eq!(bounded(None, 3), (None, false));
    }

    #[test]
    fn garbage_is_reported_as_a_parse_error() {
        for garbage in [
            &b"\x00\x01\x02\xff\xfe garbage without any header \x00\r\n\x80\x81"[..],
            b"",
            b"just some words\r\nand more words\r\n",
        ] {
            let p = parse_email(garbage, 100);
            assert!(p.parse_error.is_some(), "{garbage:?} -> {p:?}");
            if let Some(text) = &p.text_body {
                assert!(!text.contains('\0'));
            }
        }
    }

    #[test]
    fn a_nesting_that_trips_the_parser_is_a_parse_error_not_a_panic() {
        let raw = b"Content-Type: multipart/mixed; boundary=\"b\"\r\n\r\n--b\r\n\
Content-Type: message/rfc822\r\n\r\nContent-Type: message/rfc822\r\n\r\n\r\n--b--\r\n";
        let p = parse_email(raw, 100);
        if cfg!(debug_assertions) {
            let error = p.parse_error.unwrap_or_default();
            assert!(
                error.starts_with("the mail parser failed on it: "),
                "{error}"
            );
        }
    }

    #[test]
    fn the_signs_of_automatic_mail_are_read() {
        let p = parse_headers(
            b"Return-Path: <>\r\nReturn-Path: <older@x>\r\nAuto-Submitted: auto-replied\r\n\
              PRECEDENCE: bulk\r\nList-Id: Team\r\n <team.example.com>\r\nFrom: a@x\r\n\r\n",
        );
        assert_eq!(p.return_path.as_deref(), Some(""));
        assert_eq!(p.auto_submitted.as_deref(), Some("auto-replied"));
        assert_eq!(p.precedence.as_deref(), Some("bulk"));
        assert!(
            p.list_id
                .as_deref()
                .is_some_and(|l| l.contains("team.example.com"))
        );
        let p = parse_headers(b"Return-Path: <bob@example.com> (via x)\r\nFrom: b@x\r\n\r\n");
        assert_eq!(p.return_path.as_deref(), Some("bob@example.com"));
        assert_eq!(
            (p.auto_submitted, p.precedence, p.list_id),
            (None, None, None)
        );
    }

    #[test]
    fn headers_alone_parse_too() {
        let p = parse_headers(b"Message-ID: <big@x>\r\nFrom: a@x\r\nSubject: big\r\n\r\n");
        assert_eq!(p.message_id.as_deref(), Some("big@x"));
        assert_eq!(p.from_address.as_deref(), Some("a@x"));
        assert_eq!(p.subject.as_deref(), Some("big"));
        assert_eq!(p.text_body, None);
    }
}
