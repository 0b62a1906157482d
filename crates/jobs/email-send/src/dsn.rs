//! Delivery status notifications asked for where the relay offers them (RFC 3461): each
//! mail's MAIL FROM carries `ENVID`, its own Message-ID, which the reports the relay (and the
//! servers after it) write give back as `Original-Envelope-Id`, so the poller ties a report
//! to its mail even when it returns nothing of the mail itself.
//!
//! lettre keeps only the EHLO keywords it knows (8BITMIME, SMTPUTF8, STARTTLS, AUTH), so
//! whether the relay offers `DSN` is read from an EHLO of our own, once per connection: a
//! relay that does not offer it refuses an unknown MAIL FROM parameter (555), so `ENVID` is
//! never sent blind.

use lettre::Message;
use lettre::transport::smtp::client::AsyncSmtpConnection;
use lettre::transport::smtp::commands::Ehlo;
use lettre::transport::smtp::extension::{ClientId, MailParameter};

/// RFC 3461's limit on an `ENVID`, in characters.
const MAX_ENVID_CHARS: usize = 100;

/// Whether the server offers `DSN`: its answer to an EHLO sent again (RFC 5321 allows it at
/// any point; before AUTH it resets nothing else).
pub(crate) async fn offers_dsn(
    connection: &mut AsyncSmtpConnection,
    hello: &ClientId,
) -> Result<bool, lettre::transport::smtp::Error> {
    let answer = connection.command(Ehlo::new(hello.clone())).await?;
    Ok(answer.message().any(|line| {
        line.split_whitespace()
            .next()
            .is_some_and(|keyword| keyword.eq_ignore_ascii_case("DSN"))
    }))
}

/// `ENVID=<the mail's Message-ID>`, without its angle brackets; none when the mail has no
/// Message-ID or one too long for an envelope id.
pub(crate) fn envelope_id(message: &Message) -> Option<MailParameter> {
    let id = message.headers().get_raw("Message-ID")?;
    let id = id.trim().trim_start_matches('<').trim_end_matches('>');
    let usable = !id.is_empty()
        && id.chars().count() <= MAX_ENVID_CHARS
        && id.chars().all(|c| c.is_ascii_graphic());
    usable.then(|| MailParameter::Other {
        keyword: "ENVID".into(),
        value: Some(id.to_string()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mail(message_id: Option<&str>) -> Message {
        Message::builder()
            .from("a@example.com".parse().unwrap())
            .to("b@example.com".parse().unwrap())
            .message_id(message_id.map(str::to_string))
            .body(String::from("x"))
            .unwrap()
    }

    #[test]
    fn the_envelope_id_is_the_message_id_without_brackets() {
        let parameter = envelope_id(&mail(Some("<abc@worker-host>"))).map(|p| p.to_string());
        assert_eq!(parameter.as_deref(), Some("ENVID=abc@worker-host"));
    }

    #[test]
    fn a_message_id_too_long_for_an_envelope_id_is_not_sent() {
        let long = format!("<{}@worker-host>", "x".repeat(100));
        assert!(envelope_id(&mail(Some(&long))).is_none());
    }
}
