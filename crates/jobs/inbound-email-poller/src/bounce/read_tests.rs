//! The reader on the real reports of `tests/fixtures/bounces/` (see its README), and on mail
//! that is not a report.

use mail_parser::MessageParser;

use super::*;
use crate::bounce::Class;

fn fixture(name: &str) -> Vec<u8> {
    let path = format!(
        "{}/tests/fixtures/bounces/{name}",
        env!("CARGO_MANIFEST_DIR")
    );
    std::fs::read(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

fn read(name: &str) -> Report {
    let raw = fixture(name);
    let message = MessageParser::default().parse(&raw).expect("a mail");
    report_of(&message).unwrap_or_else(|| panic!("{name} reads as a report"))
}

/// (recipient, action, status, class) of each recipient.
fn summary(report: &Report) -> Vec<(String, String, Option<String>, Class)> {
    report
        .recipients
        .iter()
        .map(|r| {
            (
                r.recipient.clone(),
                r.action.clone(),
                r.status.clone(),
                r.class(),
            )
        })
        .collect()
}

fn one(
    recipient: &str,
    action: &str,
    status: &str,
    class: Class,
) -> Vec<(String, String, Option<String>, Class)> {
    vec![(recipient.into(), action.into(), Some(status.into()), class)]
}

#[test]
fn an_rfc_3464_report_gives_each_recipient_and_the_attached_originals_message_id() {
    let report = read("rfc3464-01.eml");
    assert_eq!(
        summary(&report),
        one(
            "userunknown@bouncehammer.jp",
            "failed",
            "5.1.1",
            Class::Permanent
        )
    );
    let r = &report.recipients[0];
    assert_eq!(
        r.diagnostic.as_deref(),
        Some("550 5.1.1 <userunknown@bouncehammer.jp>... User Unknown")
    );
    assert_eq!(
        r.at.map(|t| t.to_rfc3339()).as_deref(),
        Some("2013-10-16T05:15:35+00:00"),
        "Last-Attempt-Date"
    );
    assert_eq!(
        report.original_message_id.as_deref(),
        Some("E1C50F1B-1C83-4820-BC36-AC6FBFBE8568@example.org")
    );
}

#[test]
fn a_delay_is_transient_and_its_original_comes_from_the_returned_header() {
    let report = read("rfc3464-07.eml");
    assert_eq!(
        summary(&report),
        one("kijitora@example.net", "delayed", "4.4.0", Class::Transient)
    );
    assert_eq!(
        report.original_message_id.as_deref(),
        Some("000000000000000@list.example.jp")
    );
}

#[test]
fn postfix_and_outlook_reports_read_as_rfc_3464_one_entry_per_recipient() {
    let postfix = read("lhost-postfix-02.eml");
    let statuses: Vec<_> = postfix
        .recipients
        .iter()
        .map(|r| (r.recipient.as_str(), r.status.as_deref()))
        .collect();
    assert_eq!(
        statuses,
        [
            ("filtered@example.co.jp", Some("5.2.1")),
            ("userunknown@example.co.jp", Some("5.1.1"))
        ]
    );
    // Its attached original kept no Message-ID: nothing to link by.
    assert_eq!(postfix.original_message_id, None);
    let outlook = read("lhost-outlook-01.eml");
    assert_eq!(
        summary(&outlook),
        one("kijitora@example.jp", "failed", "5.2.2", Class::Permanent)
    );
    assert_eq!(
        outlook.original_message_id.as_deref(),
        Some("BLU436-SMTP6645ECA6E7FEFFE86D040BBA770@phx.gbl")
    );
}

#[test]
fn googles_empty_delivery_status_falls_back_to_x_failed_recipients_and_its_words() {
    let report = read("lhost-googleworkspace-01.eml");
    assert_eq!(
        summary(&report),
        one(
            "neko-nyaan-cat-meeting@google-groups.example.com",
            "failed",
            "5.0.0",
            Class::Permanent
        )
    );
    let diagnostic = report.recipients[0].diagnostic.clone().unwrap_or_default();
    assert!(
        diagnostic.contains("Smtp server does not advertise AUTH capability"),
        "{diagnostic}"
    );
    assert_eq!(
        report.original_message_id.as_deref(),
        Some("CAByYQsF5qdTf_h-1AAVPW0RgR1YN+LE=+0Uv9LpQ4aA_myPtCw@mail.gmail.com")
    );
}

#[test]
fn gmails_plain_text_shape_names_the_status_in_its_words_and_quotes_the_original() {
    let report = read("lhost-gmail-01.eml");
    assert_eq!(
        summary(&report),
        one(
            "userunknown@example.jp",
            "failed",
            "5.1.1",
            Class::Permanent
        )
    );
    assert_eq!(
        report.original_message_id.as_deref(),
        Some("D992C2C3-F175-4C4D-97E2-53A90E4E5BF5@gmail.com")
    );
}

#[test]
fn microsofts_text_gives_the_recipient_the_status_and_the_original_without_a_status_part() {
    let report = read("lhost-office365-01.eml");
    assert_eq!(
        summary(&report),
        one("kijitora@example.com", "failed", "5.1.10", Class::Permanent)
    );
    let diagnostic = report.recipients[0].diagnostic.clone().unwrap_or_default();
    assert!(
        diagnostic.starts_with("550 5.1.10 RESOLVER.ADR.RecipientNotFound"),
        "{diagnostic}"
    );
    assert_eq!(
        report.original_message_id.as_deref(),
        Some("FFFFFFFF.EEEEEEEE@example.ed.jp")
    );
}

#[test]
fn microsofts_status_part_is_read_and_the_original_is_quoted_in_its_text() {
    let report = read("lhost-office365-03.eml");
    assert_eq!(
        summary(&report),
        one("kijitora@example.com", "failed", "5.1.0", Class::Permanent)
    );
    assert_eq!(
        report.original_message_id.as_deref(),
        Some("000000000000.2222.22222222222200000000@NEKO-NYAAN")
    );
}

#[test]
fn mail_that_is_not_a_delivery_report_is_not_one() {
    for raw in [
        // The poller's own loop test's "bounce": automatic, but says nothing of delivery.
        &b"Return-Path: <>\r\nMessage-ID: <b@test>\r\nFrom: MAILER-DAEMON@example.com\r\n\
To: someone@localhost\r\nSubject: Undelivered Mail\r\nAuto-Submitted: auto-replied\r\n\r\nsorry\r\n"[..],
        // A read receipt: a report, of another type.
        b"Message-ID: <r@test>\r\nFrom: a@example.com\r\nTo: b@example.com\r\nSubject: Read\r\n\
Content-Type: multipart/report; report-type=disposition-notification; boundary=x\r\n\r\n\
--x\r\nContent-Type: text/plain\r\n\r\nread\r\n--x\r\n\
Content-Type: message/disposition-notification\r\n\r\nFinal-Recipient: rfc822; b@example.com\r\n\
Disposition: manual-action/MDN-sent-manually; displayed\r\n--x--\r\n",
        b"Message-ID: <p@test>\r\nFrom: a@example.com\r\nTo: b@example.com\r\nSubject: hi\r\n\r\nhello\r\n",
    ] {
        let message = MessageParser::default().parse(raw).unwrap();
        assert_eq!(report_of(&message), None);
    }
}

#[test]
fn the_envelope_id_a_relay_gives_back_is_read_xtext_decoded() {
    let raw = b"Message-ID: <r@relay>\r\nFrom: MAILER-DAEMON@relay\r\nTo: host@example.com\r\n\
Subject: Undelivered Mail\r\n\
Content-Type: multipart/report; report-type=delivery-status; boundary=b\r\n\r\n\
--b\r\nContent-Type: text/plain\r\n\r\nIt did not arrive.\r\n\
--b\r\nContent-Type: message/delivery-status\r\n\r\n\
Reporting-MTA: dns; relay\r\nOriginal-Envelope-Id: abc+2Bdef@worker-host\r\n\r\n\
Final-Recipient: rfc822; ann@example.com\r\nAction: failed\r\nStatus: 5.1.1\r\n\
--b--\r\n";
    let message = MessageParser::default().parse(&raw[..]).unwrap();
    let report = report_of(&message).unwrap();
    assert_eq!(report.envelope_id.as_deref(), Some("abc+def@worker-host"));
    assert_eq!(report.original_message_id, None);
    assert_eq!(report.link_candidates(), ["abc+def@worker-host"]);
}

#[test]
fn the_link_candidates_are_the_envelope_id_the_original_then_in_reply_to_then_references() {
    let report = Report {
        envelope_id: Some("e@x".into()),
        original_message_id: Some("o@x".into()),
        in_reply_to: Some("r@x".into()),
        references: vec!["a@x".into(), "r@x".into(), "b@x".into()],
        ..Report::default()
    };
    assert_eq!(
        report.link_candidates(),
        ["e@x", "o@x", "r@x", "b@x", "a@x"]
    );
}
