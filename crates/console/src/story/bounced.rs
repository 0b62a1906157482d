//! The words for what delivery reports said (issue 39): a reply that bounced, a delay noted
//! on a reply that was sent, and a report's own story. The status codes are RFC 3463's,
//! said in words an operator reads without the RFC.

use job_email_send::story::OutboundRecord;
use job_inbound_email_poller::bounce::story::BounceRecord;

/// "the reply to ann@example.com was accepted by the relay, then bounced for
/// ann@example.com: 5.1.1, the address does not exist (550 5.1.1 ... User unknown)".
pub(super) fn bounced_detail(mail: &OutboundRecord, bounces: &[BounceRecord]) -> String {
    let permanent: Vec<String> = of_mail(mail, bounces)
        .filter(|b| b.class == "permanent")
        .map(said)
        .collect();
    let why = if permanent.is_empty() {
        "(the report is no longer kept)".to_string()
    } else {
        permanent.join("; ")
    };
    format!(
        "the reply to {} was accepted by the relay, then bounced for {why}",
        mail.to_addresses.join(", ")
    )
}

/// What reports said of `mail` short of a failure (a delay, a `4.x.x`), to note after its
/// answer; empty when none did.
pub(super) fn noted(mail: &OutboundRecord, bounces: &[BounceRecord]) -> String {
    let transient: Vec<String> = of_mail(mail, bounces)
        .filter(|b| b.class != "permanent")
        .map(said)
        .collect();
    if transient.is_empty() {
        return String::new();
    }
    format!("; then a delivery report said {}", transient.join("; "))
}

/// A report's own end: what it said, and of which mail.
pub(super) fn report_detail(reported: &[BounceRecord]) -> String {
    let on = match reported.iter().find_map(|b| b.outbound_email_id) {
        Some(id) => format!("outbound mail {id}"),
        None => "a mail this host did not send (unmatched)".to_string(),
    };
    let said: Vec<String> = reported.iter().map(said).collect();
    format!("a report on {on}: {}", said.join("; "))
}

/// One recipient as a report gave it: "ann@example.com: 5.1.1, the address does not exist
/// (550 5.1.1 ... User unknown)"; a delay says so.
pub(super) fn said(bounce: &BounceRecord) -> String {
    let status = match &bounce.status {
        Some(code) => format!("{code}, {}", status_words(code)),
        None => bounce.action.clone(),
    };
    let delayed = if bounce.action == "delayed" {
        "delayed, "
    } else {
        ""
    };
    let diagnostic = bounce
        .diagnostic
        .as_deref()
        .map(|d| format!(" ({d})"))
        .unwrap_or_default();
    format!("{}: {delayed}{status}{diagnostic}", bounce.recipient)
}

fn of_mail<'a>(
    mail: &'a OutboundRecord,
    bounces: &'a [BounceRecord],
) -> impl Iterator<Item = &'a BounceRecord> {
    bounces
        .iter()
        .filter(move |b| b.outbound_email_id == Some(mail.id))
}

/// RFC 3463's status codes in words, the common ones by subject and detail, the others by
/// subject, else by class.
pub fn status_words(code: &str) -> &'static str {
    let mut parts = code.split('.');
    let (class, subject, detail) = (parts.next(), parts.next(), parts.next());
    match (subject, detail) {
        (Some("1"), Some("1" | "10")) => "the address does not exist",
        (Some("1"), Some("2")) => "the recipient's domain does not exist or takes no mail",
        (Some("1"), Some("3")) => "the address is malformed",
        (Some("1"), Some("6")) => "the mailbox has moved",
        (Some("1"), _) => "a problem with the address",
        (Some("2"), Some("1")) => "the mailbox is disabled",
        (Some("2"), Some("2")) => "the mailbox is full",
        (Some("2"), Some("3")) => "the mail is larger than the mailbox takes",
        (Some("2"), _) => "a problem with the mailbox",
        (Some("3"), _) => "a problem of the receiving system",
        (Some("4"), Some("7")) => "the delivery time expired",
        (Some("4"), _) => "the mail could not be routed",
        (Some("5"), _) => "the servers could not speak",
        (Some("6"), _) => "a problem with the mail's content",
        (Some("7"), Some("1")) => "the receiving side refused it (delivery not authorized)",
        (Some("7"), _) => "refused by the receiving side's policy or security",
        _ => match class {
            Some("5") => "a permanent failure",
            Some("4") => "a temporary failure",
            _ => "a status report",
        },
    }
}

#[cfg(test)]
mod tests {
    use chrono::Utc;
    use uuid::Uuid;

    use super::*;

    fn bounce(outbound: Option<u128>, action: &str, status: &str, class: &str) -> BounceRecord {
        BounceRecord {
            id: 1,
            inbound_email_id: Uuid::from_u128(9),
            outbound_email_id: outbound.map(Uuid::from_u128),
            recipient: "ann@example.com".into(),
            action: action.into(),
            status: Some(status.into()),
            class: class.into(),
            diagnostic: Some("550 5.1.1 <ann@example.com>: User unknown".into()),
            reported_at: None,
            recorded_at: Utc::now(),
        }
    }

    fn sent_mail() -> OutboundRecord {
        OutboundRecord {
            id: Uuid::from_u128(1),
            action_execution_id: None,
            message_id: "1@worker-host".into(),
            to_addresses: vec!["ann@example.com".into()],
            cc_addresses: vec![],
            subject: "Re: ping".into(),
            status: "bounced".into(),
            attempts: 1,
            last_error: None,
            smtp_response: Some("250 ok".into()),
            created_at: Utc::now(),
            updated_at: Utc::now(),
            sent_at: Some(Utc::now()),
            expires_at: None,
            supersedes: None,
            superseded_by: None,
        }
    }

    #[test]
    fn a_bounced_reply_says_the_status_in_words_and_the_servers_reason() {
        let detail = bounced_detail(
            &sent_mail(),
            &[bounce(Some(1), "failed", "5.1.1", "permanent")],
        );
        assert_eq!(
            detail,
            "the reply to ann@example.com was accepted by the relay, then bounced for \
             ann@example.com: 5.1.1, the address does not exist \
             (550 5.1.1 <ann@example.com>: User unknown)"
        );
    }

    #[test]
    fn a_delay_is_noted_and_another_mails_report_is_not() {
        let bounces = [
            bounce(Some(1), "delayed", "4.4.1", "transient"),
            bounce(Some(2), "failed", "5.2.2", "permanent"),
        ];
        let noted = noted(&sent_mail(), &bounces);
        assert!(
            noted.starts_with("; then a delivery report said ann@example.com: delayed, 4.4.1"),
            "{noted}"
        );
        assert!(!noted.contains("5.2.2"), "{noted}");
    }

    #[test]
    fn a_report_on_a_mail_the_host_did_not_send_says_unmatched() {
        let detail = report_detail(&[bounce(None, "failed", "5.2.2", "permanent")]);
        assert!(detail.starts_with("a report on a mail this host did not send (unmatched): ann@example.com: 5.2.2, the mailbox is full"), "{detail}");
    }

    #[test]
    fn status_codes_read_in_words_by_subject_and_detail() {
        assert_eq!(status_words("5.1.1"), "the address does not exist");
        assert_eq!(status_words("5.1.10"), "the address does not exist");
        assert_eq!(status_words("4.2.2"), "the mailbox is full");
        assert_eq!(
            status_words("5.7.26"),
            "refused by the receiving side's policy or security"
        );
        assert_eq!(status_words("5.0.0"), "a permanent failure");
    }
}
