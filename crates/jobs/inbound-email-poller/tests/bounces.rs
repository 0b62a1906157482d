//! Delivery reports read by the real poller from a real Dovecot mailbox (issue 39): each shape
//! of `tests/fixtures/bounces/` (RFC 3464, Google's, Microsoft's), its original's Message-ID
//! made one of a mail the host sent, is recorded against that mail; a permanent failure makes
//! it `bounced`, a delay does not; a report on mail the host did not send is kept unmatched;
//! the report itself is stored as what it is and never announced.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

mod common;

use std::sync::{Arc, Mutex};

use common::bounces::*;
use common::*;
use job_inbound_email_poller::InboundEmailPoller;
use job_inbound_email_poller::bounce::Class;
use uuid::Uuid;
use worker_testkit::TestDb;

type Seen = Arc<Mutex<Vec<(Class, bool, u64)>>>;

/// A poller on one fresh mailbox, with what it counted.
fn counted_poller(db: &TestDb, name: &str, user: &str) -> (InboundEmailPoller, Seen) {
    let seen: Seen = Arc::default();
    let counted = seen.clone();
    let poller = poller(&db.pool, config(vec![account(name, user, "secret")])).on_bounces(
        Arc::new(move |class, matched, rows| counted.lock().unwrap().push((class, matched, rows))),
    );
    (poller, seen)
}

/// Each fixture about a mail of its own: the mail ends `bounced`, with one row per recipient
/// linked to it, and the report's row says what it is, unannounced.
async fn each_bounces_its_mail(
    prefix: &str,
    fixtures: &[(&str, &str, &str, &str)],
) -> anyhow::Result<()> {
    let db = TestDb::create().await?;
    let u = user(prefix);
    let mut mails = Vec::new();
    for (name, original, recipient, _) in fixtures {
        let (id, message_id) = sent_mail(&db.pool, recipient).await?;
        append(&u, "INBOX", &fixture_about(name, original, &message_id)).await?;
        mails.push(id);
    }
    let (poller, seen) = counted_poller(&db, prefix, &u);
    let report = poll(&poller).await;
    let counts = report.accounts[0].counts;
    assert_eq!(report.accounts[0].failure, None);
    assert_eq!((counts.reports, counts.stored), (fixtures.len() as u64, 0));

    let recorded = bounces(&db.pool).await?;
    for ((name, _, recipient, status), id) in fixtures.iter().zip(&mails) {
        assert_eq!(status_of(&db.pool, *id).await?, "bounced", "{name}");
        let row = recorded
            .iter()
            .find(|b| b.outbound_email_id == Some(*id))
            .unwrap_or_else(|| panic!("{name}: a bounce linked to its mail in {recorded:?}"));
        assert_eq!(
            (
                row.recipient.as_str(),
                row.status.as_deref(),
                row.class.as_str()
            ),
            (*recipient, Some(*status), "permanent"),
            "{name}"
        );
        assert!(row.diagnostic.is_some(), "{name}: {row:?}");
    }
    for row in rows(&db.pool, prefix).await? {
        assert_eq!(row.status, "skipped");
        assert!(
            row.skip_reason
                .as_deref()
                .is_some_and(|r| r.starts_with("a delivery status report (")),
            "{:?}",
            row.skip_reason
        );
        assert_eq!(row.event_id, None, "a report is never announced");
    }
    assert_eq!(outbox_count(&db.pool).await?, 0);
    assert_eq!(
        *seen.lock().unwrap(),
        vec![(Class::Permanent, true, fixtures.len() as u64)]
    );
    Ok(())
}

#[tokio::test]
async fn an_rfc_3464_report_bounces_the_mail_whose_original_it_attaches() -> anyhow::Result<()> {
    each_bounces_its_mail(
        "bounce-rfc3464",
        &[
            (
                "rfc3464-01.eml",
                "E1C50F1B-1C83-4820-BC36-AC6FBFBE8568@example.org",
                "userunknown@bouncehammer.jp",
                "5.1.1",
            ),
            (
                "lhost-outlook-01.eml",
                "BLU436-SMTP6645ECA6E7FEFFE86D040BBA770@phx.gbl",
                "kijitora@example.jp",
                "5.2.2",
            ),
        ],
    )
    .await
}

#[tokio::test]
async fn googles_reports_bounce_the_mail_by_x_failed_recipients_and_the_original()
-> anyhow::Result<()> {
    each_bounces_its_mail(
        "bounce-google",
        &[
            (
                "lhost-googleworkspace-01.eml",
                "CAByYQsF5qdTf_h-1AAVPW0RgR1YN+LE=+0Uv9LpQ4aA_myPtCw@mail.gmail.com",
                "neko-nyaan-cat-meeting@google-groups.example.com",
                "5.0.0",
            ),
            (
                "lhost-gmail-01.eml",
                "D992C2C3-F175-4C4D-97E2-53A90E4E5BF5@gmail.com",
                "userunknown@example.jp",
                "5.1.1",
            ),
        ],
    )
    .await
}

#[tokio::test]
async fn microsofts_reports_bounce_the_mail_whose_header_their_text_quotes() -> anyhow::Result<()> {
    each_bounces_its_mail(
        "bounce-microsoft",
        &[
            (
                "lhost-office365-01.eml",
                "FFFFFFFF.EEEEEEEE@example.ed.jp",
                "kijitora@example.com",
                "5.1.10",
            ),
            (
                "lhost-office365-03.eml",
                "000000000000.2222.22222222222200000000@NEKO-NYAAN",
                "kijitora@example.com",
                "5.1.0",
            ),
        ],
    )
    .await
}

#[tokio::test]
async fn a_delay_is_noted_and_leaves_the_mail_sent() -> anyhow::Result<()> {
    let db = TestDb::create().await?;
    let u = user("bounce-delay");
    let (id, message_id) = sent_mail(&db.pool, "kijitora@example.net").await?;
    let raw = fixture_about(
        "rfc3464-07.eml",
        "000000000000000@list.example.jp",
        &message_id,
    );
    append(&u, "INBOX", &raw).await?;
    let (poller, seen) = counted_poller(&db, "delay", &u);
    assert_eq!(poll(&poller).await.accounts[0].counts.reports, 1);

    assert_eq!(status_of(&db.pool, id).await?, "sent");
    let recorded = bounces(&db.pool).await?;
    assert_eq!(recorded.len(), 1);
    assert_eq!(
        (
            recorded[0].outbound_email_id,
            recorded[0].action.as_str(),
            recorded[0].status.as_deref(),
            recorded[0].class.as_str()
        ),
        (Some(id), "delayed", Some("4.4.0"), "transient")
    );
    assert_eq!(*seen.lock().unwrap(), vec![(Class::Transient, true, 1)]);
    Ok(())
}

#[tokio::test]
async fn a_report_on_mail_the_host_did_not_send_is_recorded_unmatched_without_error()
-> anyhow::Result<()> {
    let db = TestDb::create().await?;
    let u = user("bounce-foreign");
    let (id, _) = sent_mail(&db.pool, "someone@example.com").await?;
    append(&u, "INBOX", &fixture_about("lhost-postfix-02.eml", "", "")).await?;
    let (poller, seen) = counted_poller(&db, "foreign", &u);
    let report = poll(&poller).await;
    assert_eq!(report.accounts[0].failure, None);
    assert_eq!(report.accounts[0].counts.reports, 1);

    let recorded = bounces(&db.pool).await?;
    let recipients: Vec<(&str, Option<Uuid>)> = recorded
        .iter()
        .map(|b| (b.recipient.as_str(), b.outbound_email_id))
        .collect();
    assert_eq!(
        recipients,
        [
            ("filtered@example.co.jp", None),
            ("userunknown@example.co.jp", None)
        ]
    );
    assert_eq!(
        status_of(&db.pool, id).await?,
        "sent",
        "another mail is untouched"
    );
    assert_eq!(*seen.lock().unwrap(), vec![(Class::Permanent, false, 2)]);
    Ok(())
}

#[tokio::test]
async fn a_report_without_the_original_is_linked_by_its_in_reply_to() -> anyhow::Result<()> {
    let db = TestDb::create().await?;
    let u = user("bounce-reply-to");
    let (id, message_id) = sent_mail(&db.pool, "userunknown@example.co.jp").await?;
    // Postfix's report keeps no Message-ID of the original; this one says In-Reply-To.
    let mut raw = format!("In-Reply-To: <{message_id}>\r\n").into_bytes();
    raw.extend(fixture_about("lhost-postfix-02.eml", "", ""));
    append(&u, "INBOX", &raw).await?;
    let (poller, _) = counted_poller(&db, "reply-to", &u);
    poll(&poller).await;

    assert_eq!(status_of(&db.pool, id).await?, "bounced");
    assert!(
        bounces(&db.pool)
            .await?
            .iter()
            .all(|b| b.outbound_email_id == Some(id))
    );
    Ok(())
}

#[tokio::test]
async fn a_report_read_again_under_another_uid_adds_nothing() -> anyhow::Result<()> {
    let db = TestDb::create().await?;
    let u = user("bounce-again");
    let (_, message_id) = sent_mail(&db.pool, "userunknown@bouncehammer.jp").await?;
    let raw = fixture_about(
        "rfc3464-01.eml",
        "E1C50F1B-1C83-4820-BC36-AC6FBFBE8568@example.org",
        &message_id,
    );
    append(&u, "INBOX", &raw).await?;
    let (poller, seen) = counted_poller(&db, "again", &u);
    poll(&poller).await;
    append(&u, "INBOX", &raw).await?;
    let second = poll(&poller).await;

    assert_eq!(second.accounts[0].counts.duplicates, 1);
    assert_eq!(bounces(&db.pool).await?.len(), 1);
    assert_eq!(*seen.lock().unwrap(), vec![(Class::Permanent, true, 1)]);
    Ok(())
}

#[tokio::test]
async fn a_report_that_returns_only_the_envelope_id_is_linked_by_it() -> anyhow::Result<()> {
    let db = TestDb::create().await?;
    let u = user("bounce-envid");
    let (id, message_id) = sent_mail(&db.pool, "userunknown@example.co.jp").await?;
    // Postfix's report keeps no Message-ID of the original; a relay that was given ENVID
    // says it back.
    let raw = fixture_about(
        "lhost-postfix-02.eml",
        "Reporting-MTA:",
        &format!("Original-Envelope-Id: {message_id}\nReporting-MTA:"),
    );
    append(&u, "INBOX", &raw).await?;
    let (poller, _) = counted_poller(&db, "envid", &u);
    poll(&poller).await;

    assert_eq!(status_of(&db.pool, id).await?, "bounced");
    let linked: Vec<Option<Uuid>> = bounces(&db.pool)
        .await?
        .iter()
        .map(|b| b.outbound_email_id)
        .collect();
    assert_eq!(linked, [Some(id), Some(id)]);
    Ok(())
}
