//! The mail a claimed row becomes: its addresses, the threading headers, `Auto-Submitted`
//! and the bodies (see "Headers" in the crate docs); and the server's answer as kept on
//! the row.

use lettre::Message;
use lettre::message::header::{ContentType, HeaderName, HeaderValue};
use lettre::message::{Mailbox, MultiPart, SinglePart};
use lettre::transport::smtp::response::Response;
use worker_core::Failure;

use crate::store::Email;

/// The message to send for `email`, from `default_from` when the row names no sender. An
/// address that does not parse is a permanent failure (`bad-address`).
pub(crate) fn build(email: &Email, default_from: &Mailbox) -> Result<Message, Failure> {
    let mailbox = |field: &str, address: &str| -> Result<Mailbox, Failure> {
        address
            .parse()
            .map_err(|err: lettre::address::AddressError| {
                Failure::permanent("bad-address", format!("{field} `{address}`: {err}"))
            })
    };
    let from = match &email.from_address {
        Some(address) => mailbox("from", address)?,
        None => default_from.clone(),
    };
    let mut builder = Message::builder()
        .from(from)
        .subject(email.subject.clone())
        .date_now()
        .message_id(Some(format!("<{}>", email.message_id)));
    for address in &email.to_addresses {
        builder = builder.to(mailbox("to", address)?);
    }
    for address in &email.cc_addresses {
        builder = builder.cc(mailbox("cc", address)?);
    }
    if let Some(parent) = &email.in_reply_to {
        builder = builder.in_reply_to(format!("<{parent}>"));
    }
    if !email.reference_ids.is_empty() {
        let chain: Vec<String> = email
            .reference_ids
            .iter()
            .map(|r| format!("<{r}>"))
            .collect();
        builder = builder.references(chain.join(" "));
    }
    let auto = if email.in_reply_to.is_some() {
        "auto-replied"
    } else {
        "auto-generated"
    };
    builder = builder.raw_header(HeaderValue::new(
        HeaderName::new_from_ascii_str("Auto-Submitted"),
        auto.to_string(),
    ));
    let built = match (&email.text_body, &email.html_body) {
        (Some(text), Some(html)) => builder.multipart(MultiPart::alternative_plain_html(
            text.clone(),
            html.clone(),
        )),
        (None, Some(html)) => builder.singlepart(SinglePart::html(html.clone())),
        (text, None) => builder.singlepart(
            SinglePart::builder()
                .header(ContentType::TEXT_PLAIN)
                .body(text.clone().unwrap_or_default()),
        ),
    };
    built.map_err(|err| Failure::permanent("bad-email", err))
}

/// `250 2.0.0 Ok: queued as 1234`.
pub(crate) fn response_text(response: &Response) -> String {
    let lines: Vec<&str> = response.message().collect();
    format!("{} {}", response.code(), lines.join(" "))
        .trim()
        .to_string()
}
