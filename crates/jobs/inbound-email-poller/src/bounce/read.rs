//! Reading a parsed mail as a delivery status notification, whichever of the three shapes it
//! has (see the module's docs). A mail that shows no sign of being one, or names no recipient,
//! is not a report: it is stored and announced as any other mail (the automations' loop guard
//! still keeps automatic mail unanswered).

use chrono::{DateTime, Utc};
use mail_parser::{HeaderValue, Message, MessagePart, MimeHeaders};

use super::text;
use super::{RecipientReport, Report};
use crate::parse::bounded;

/// The longest diagnostic kept, in characters.
const MAX_DIAGNOSTIC_CHARS: usize = 1_000;
/// The most recipients kept from one report.
const MAX_RECIPIENTS: usize = 100;

/// The report `message` is, or `None` when it is not one.
pub fn report_of(message: &Message<'_>) -> Option<Report> {
    let status_part = message
        .parts
        .iter()
        .find(|p| is_type(p, "message", &["delivery-status", "global-delivery-status"]));
    let failed_header = header_text(message, "x-failed-recipients");
    let signs = is_report_container(message)
        || status_part.is_some()
        || failed_header.is_some()
        || header_text(message, "x-ms-exchange-message-is-ndr").is_some();
    if !signs {
        return None;
    }
    let sent_at = message
        .date()
        .filter(|d| d.is_valid())
        .and_then(|d| DateTime::from_timestamp(d.to_timestamp(), 0));
    let body = message
        .body_text(0)
        .map(|b| b.into_owned())
        .unwrap_or_default();
    let status_fields = status_part
        .map(|part| field_blocks(&String::from_utf8_lossy(part.contents())))
        .unwrap_or_default();
    let mut recipients = from_status_fields(&status_fields, sent_at);
    if recipients.is_empty() {
        recipients = from_text(message, failed_header.as_deref(), &body, sent_at);
    }
    dedupe(&mut recipients);
    if recipients.is_empty() {
        return None;
    }
    Some(Report {
        recipients,
        envelope_id: status_fields
            .first()
            .and_then(|block| field(block, "original-envelope-id"))
            .map(|id| xtext_decoded(&id))
            .filter(|id| !id.is_empty()),
        original_message_id: original_message_id(message, &body),
        in_reply_to: None,
        references: Vec::new(),
    })
}

/// `multipart/report; report-type=delivery-status` (a read receipt is a report too, of
/// another type, and is not one of these).
fn is_report_container(message: &Message<'_>) -> bool {
    message.content_type().is_some_and(|ct| {
        ct.ctype().eq_ignore_ascii_case("multipart")
            && ct
                .subtype()
                .is_some_and(|s| s.eq_ignore_ascii_case("report"))
            && ct
                .attribute("report-type")
                .is_some_and(|t| t.eq_ignore_ascii_case("delivery-status"))
    })
}

fn is_type(part: &MessagePart<'_>, ctype: &str, subtypes: &[&str]) -> bool {
    part.content_type().is_some_and(|ct| {
        ct.ctype().eq_ignore_ascii_case(ctype)
            && ct
                .subtype()
                .is_some_and(|s| subtypes.iter().any(|t| s.eq_ignore_ascii_case(t)))
    })
}

/// The first header field `name` as text, trimmed; `None` when absent (an empty one, as
/// Exchange sends `X-MS-Exchange-Message-Is-Ndr:`, reads as `Some("")`).
fn header_text(message: &Message<'_>, name: &str) -> Option<String> {
    message
        .headers()
        .iter()
        .find(|h| h.name.as_str().eq_ignore_ascii_case(name))
        .map(|h| match &h.value {
            HeaderValue::Text(t) => t.trim().to_string(),
            HeaderValue::TextList(list) => list.join(", "),
            _ => String::new(),
        })
}

/// RFC 3464's fields: a block for the message, then one per recipient, separated by blank
/// lines, each field possibly folded.
fn from_status_fields(
    blocks: &[Vec<(String, String)>],
    sent_at: Option<DateTime<Utc>>,
) -> Vec<RecipientReport> {
    let arrival = blocks
        .iter()
        .find_map(|b| field(b, "arrival-date"))
        .and_then(|d| parse_date(&d));
    blocks
        .iter()
        .filter_map(|block| {
            let recipient = field(block, "final-recipient")
                .or_else(|| field(block, "original-recipient"))
                .map(|r| address_of(&r))
                .filter(|r| !r.is_empty())?;
            let action = field(block, "action")
                .map(|a| {
                    a.split_whitespace()
                        .next()
                        .unwrap_or_default()
                        .to_ascii_lowercase()
                })
                .unwrap_or_else(|| "failed".into());
            let status = field(block, "status").and_then(|s| text::status_code(&s));
            let diagnostic = field(block, "diagnostic-code")
                .map(|d| {
                    d.split_once(';')
                        .map_or(d.as_str(), |(_, text)| text)
                        .trim()
                        .to_string()
                })
                .filter(|d| !d.is_empty());
            let at = field(block, "last-attempt-date")
                .and_then(|d| parse_date(&d))
                .or(arrival)
                .or(sent_at);
            Some(RecipientReport {
                recipient,
                action,
                status,
                diagnostic: diagnostic.map(|d| short(&d)),
                at,
            })
        })
        .collect()
}

/// The blocks of `name: value` fields, unfolded, names in lower case.
fn field_blocks(fields: &str) -> Vec<Vec<(String, String)>> {
    let mut blocks: Vec<Vec<(String, String)>> = vec![Vec::new()];
    for line in fields.lines() {
        let line = line.trim_end_matches('\r');
        if line.trim().is_empty() {
            if blocks.last().is_some_and(|b| !b.is_empty()) {
                blocks.push(Vec::new());
            }
        } else if line.starts_with([' ', '\t']) {
            if let Some((_, value)) = blocks.last_mut().and_then(|b| b.last_mut()) {
                value.push(' ');
                value.push_str(line.trim());
            }
        } else if let Some((name, value)) = line.split_once(':')
            && let Some(block) = blocks.last_mut()
        {
            block.push((name.trim().to_ascii_lowercase(), value.trim().to_string()));
        }
    }
    blocks.retain(|b| !b.is_empty());
    blocks
}

fn field(block: &[(String, String)], name: &str) -> Option<String> {
    block
        .iter()
        .find(|(n, _)| n == name)
        .map(|(_, v)| v.clone())
}

/// `rfc822; <ann@example.com>` → `ann@example.com`.
fn address_of(value: &str) -> String {
    let address = value.split_once(';').map_or(value, |(_, a)| a);
    let address = address
        .trim()
        .trim_start_matches('<')
        .trim_end_matches('>')
        .trim();
    bounded(Some(address), 320).0.unwrap_or_default()
}

/// The recipients of a report whose delivery-status part is missing or empty (Google's,
/// Microsoft's): `X-Failed-Recipients`, else the addresses Microsoft's text names.
fn from_text(
    message: &Message<'_>,
    failed_header: Option<&str>,
    body: &str,
    sent_at: Option<DateTime<Utc>>,
) -> Vec<RecipientReport> {
    let delayed = message
        .subject()
        .is_some_and(|s| s.to_ascii_lowercase().contains("delay"));
    let action = if delayed { "delayed" } else { "failed" };
    let found = match failed_header {
        Some(list) => list
            .split(',')
            .map(address_of)
            .filter(|a| a.contains('@'))
            .map(|a| (a, text::google_diagnostic(body)))
            .collect(),
        None => text::microsoft_recipients(body),
    };
    found
        .into_iter()
        .map(|(recipient, diagnostic)| {
            let status = diagnostic
                .as_deref()
                .and_then(text::status_code)
                .or_else(|| text::status_code(body))
                .or_else(|| Some(if delayed { "4.0.0" } else { "5.0.0" }.to_string()));
            RecipientReport {
                recipient,
                action: action.to_string(),
                status,
                diagnostic: diagnostic.map(|d| short(&d)),
                at: sent_at,
            }
        })
        .collect()
}

/// The original's Message-ID: the attached mail's, the returned header's
/// (`text/rfc822-headers`), else the header the text quotes.
fn original_message_id(message: &Message<'_>, body: &str) -> Option<String> {
    let attached = message.parts.iter().find_map(|part| {
        if let Some(original) = part.message() {
            return original.message_id().map(str::to_string);
        }
        if is_type(part, "text", &["rfc822-headers"]) {
            return mail_parser::MessageParser::default()
                .parse_headers(part.contents())
                .and_then(|h| h.message_id().map(str::to_string));
        }
        None
    });
    attached
        .or_else(|| text::quoted_message_id(body))
        .map(|id| {
            id.trim()
                .trim_start_matches('<')
                .trim_end_matches('>')
                .trim()
                .to_string()
        })
        .filter(|id| !id.is_empty())
        .and_then(|id| bounded(Some(&id), 2_000).0)
}

/// RFC 3461's xtext: `+XX` is the byte XX.
fn xtext_decoded(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    let mut rest = value.trim();
    while let Some(at) = rest.find('+') {
        out.push_str(&rest[..at]);
        let hex = rest
            .get(at + 1..at + 3)
            .and_then(|h| u8::from_str_radix(h, 16).ok());
        match hex {
            Some(byte) if byte.is_ascii() => {
                out.push(char::from(byte));
                rest = &rest[at + 3..];
            }
            _ => {
                out.push('+');
                rest = &rest[at + 1..];
            }
        }
    }
    out.push_str(rest);
    bounded(Some(&out), 2_000).0.unwrap_or_default()
}

fn parse_date(value: &str) -> Option<DateTime<Utc>> {
    mail_parser::DateTime::parse_rfc822(value)
        .filter(|d| d.is_valid())
        .and_then(|d| DateTime::from_timestamp(d.to_timestamp(), 0))
}

fn short(text: &str) -> String {
    let unfolded = text.split_whitespace().collect::<Vec<_>>().join(" ");
    bounded(Some(&unfolded), MAX_DIAGNOSTIC_CHARS)
        .0
        .unwrap_or_default()
}

fn dedupe(recipients: &mut Vec<RecipientReport>) {
    let mut seen = std::collections::HashSet::new();
    recipients.retain(|r| seen.insert(r.recipient.to_ascii_lowercase()));
    recipients.truncate(MAX_RECIPIENTS);
}

#[cfg(test)]
#[path = "read_tests.rs"]
mod tests;
