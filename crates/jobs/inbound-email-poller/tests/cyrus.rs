//! The poller against a second IMAP server that is not Dovecot: Cyrus IMAP 3.6, as
//! `scripts/services/cyrus.sh` runs it (WH_TEST_CYRUS plain with STARTTLS offered,
//! WH_TEST_CYRUS_TLS TLS from the first byte). Any user name logs in with `secret` and finds its
//! INBOX made at that login; mail is put in with IMAP APPEND. Cyrus names folders
//! `INBOX.Sub` (Dovecot here: `Sub`), stamps each mailbox's UIDVALIDITY from the clock, writes
//! the day of an INTERNALDATE padded with a space (` 4-Dec-2026`), answers FETCH items in its
//! own order (FLAGS first) and tells IDLE sessions of news through its idled at once.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

mod common;

use std::time::{Duration, Instant};

use common::idling::Idling;
use common::*;
use job_inbound_email_poller::{IdleConfig, ImapAccount, RecheckWith};
use worker_core::TlsMode;
use worker_testkit::TestDb;

/// `host:port` of Cyrus's plain IMAP port (STARTTLS offered).
fn cyrus_addr() -> String {
    std::env::var("WH_TEST_CYRUS").unwrap_or_else(|_| "127.0.0.1:10146".into())
}

/// `host:port` of Cyrus's IMAP over TLS.
fn cyrus_tls_addr() -> String {
    std::env::var("WH_TEST_CYRUS_TLS").unwrap_or_else(|_| "127.0.0.1:10994".into())
}

/// Cyrus's admin: may give itself the right to delete a user's mailboxes.
const ADMIN: &str = "cyrus";

/// An account on Cyrus, plain IMAP with the password.
fn cyrus(name: &str, user: &str) -> ImapAccount {
    let (host, port) = host_port(&cyrus_addr());
    ImapAccount {
        host,
        port,
        ..account(name, user, "secret")
    }
}

async fn put(user: &str, mailbox: &str, raw: &[u8]) -> anyhow::Result<()> {
    append_at(&cyrus_addr(), user, mailbox, raw).await
}

#[tokio::test]
async fn a_poll_reads_new_mail_once_from_the_inbox_and_a_sub_folder() -> anyhow::Result<()> {
    let db = TestDb::create().await?;
    let u = user("cyrus-once");
    put(
        &u,
        "INBOX",
        &raw_mail("one@cyrus", "a@example.com", "one", "first"),
    )
    .await?;
    put(
        &u,
        "INBOX",
        &raw_mail("two@cyrus", "b@example.com", "two", "second"),
    )
    .await?;
    // Cyrus's folders are below INBOX, with `.` between (Dovecot's here would be `Work`).
    command_at(&cyrus_addr(), &u, "CREATE INBOX.Work").await?;
    put(
        &u,
        "INBOX.Work",
        &raw_mail("work@cyrus", "c@example.com", "work", "w"),
    )
    .await?;
    let mut work = cyrus("work", &u);
    work.mailbox = "INBOX.Work".into();
    // The name that finds it on Dovecot finds nothing here: a failure of that account alone.
    let mut dovecot_name = cyrus("dovecot-name", &u);
    dovecot_name.mailbox = "Work".into();

    let poller = poller(
        &db.pool,
        config(vec![cyrus("inbox", &u), work, dovecot_name]),
    );
    let report = poll(&poller).await;
    let failed: Vec<_> = report
        .failed()
        .map(|(name, f)| (name, f.reason().to_string()))
        .collect();
    assert_eq!(
        failed,
        [("dovecot-name", "imap-mailbox".to_string())],
        "{report:?}"
    );
    assert_eq!(report.accounts[0].counts.stored, 2, "{report:?}");
    assert_eq!(report.accounts[1].counts.stored, 1, "{report:?}");
    let inbox = rows(&db.pool, "inbox").await?;
    let subjects: Vec<_> = inbox.iter().map(|r| r.subject.as_deref()).collect();
    assert_eq!(subjects, [Some("one"), Some("two")]);
    assert_eq!(inbox[1].from_address.as_deref(), Some("b@example.com"));
    assert_eq!(inbox[0].text_body.as_deref().map(str::trim), Some("first"));
    assert_eq!(outbox_count(&db.pool).await?, 3);

    let again = poll(&poller).await;
    for a in &again.accounts[..2] {
        assert_eq!(a.failure, None, "{again:?}");
        assert_eq!(a.counts, Default::default(), "nothing new: {again:?}");
    }
    put(
        &u,
        "INBOX",
        &raw_mail("three@cyrus", "a@example.com", "three", "3"),
    )
    .await?;
    assert_eq!(poll(&poller).await.accounts[0].counts.stored, 1);
    assert_eq!(outbox_count(&db.pool).await?, 4);
    Ok(())
}

/// The first poll leaves the history alone: mail that arrived (INTERNALDATE) long before is not
/// announced. Cyrus writes the day padded with a space (`" 5-Jan-2020 10:00:00 +0000"`).
#[tokio::test]
async fn the_first_poll_leaves_old_mail_alone_whatever_the_padding_of_its_date()
-> anyhow::Result<()> {
    let db = TestDb::create().await?;
    let u = user("cyrus-history");
    let addr = cyrus_addr();
    let old = raw_mail("old@cyrus", "a@example.com", "old", "history");
    append_dated_at(&addr, &u, "INBOX", &old, Some("05-Jan-2020 10:00:00 +0000")).await?;
    put(
        &u,
        "INBOX",
        &raw_mail("new@cyrus", "a@example.com", "new", "x"),
    )
    .await?;

    let poller = poller(&db.pool, config(vec![cyrus("history", &u)]));
    let report = poll(&poller).await;
    assert_eq!(report.failed().count(), 0, "{report:?}");
    assert_eq!(
        report.accounts[0].counts.stored, 1,
        "only the new mail: {report:?}"
    );
    let subjects: Vec<_> = rows(&db.pool, "history")
        .await?
        .into_iter()
        .map(|r| r.subject)
        .collect();
    assert_eq!(subjects, [Some("new".to_string())]);
    Ok(())
}

#[tokio::test]
async fn tls_and_starttls_with_the_test_ca_read_the_mail() -> anyhow::Result<()> {
    let db = TestDb::create().await?;
    let u = user("cyrus-tls");
    put(
        &u,
        "INBOX",
        &raw_mail("tls@cyrus", "a@example.com", "over tls", "x"),
    )
    .await?;
    let secured = |name: &str, addr: String, security: TlsMode| ImapAccount {
        // The certificate names localhost and 127.0.0.1; the name is checked too.
        host: "localhost".into(),
        port: host_port(&addr).1,
        security,
        ca_file: Some(worker_testkit::mail_ca()),
        ..cyrus(name, &u)
    };
    let poller = poller(
        &db.pool,
        config(vec![
            secured("tls", cyrus_tls_addr(), TlsMode::Tls),
            secured("starttls", cyrus_addr(), TlsMode::Starttls),
        ]),
    );
    let report = poll(&poller).await;
    assert_eq!(report.failed().count(), 0, "{report:?}");
    assert_eq!(report.accounts[0].counts.stored, 1, "{report:?}");
    assert_eq!(report.accounts[1].counts.stored, 1, "{report:?}");
    Ok(())
}

#[tokio::test]
async fn a_wrong_password_is_refused() -> anyhow::Result<()> {
    let db = TestDb::create().await?;
    let u = user("cyrus-wrong");
    let wrong = ImapAccount {
        password: Some(worker_core::Secret::new("not-the-password")),
        ..cyrus("wrong", &u)
    };
    let report = poll(&poller(&db.pool, config(vec![wrong]))).await;
    let (_, failure) = report.failed().next().expect("refused");
    assert_eq!(failure.reason(), "imap-auth-failed", "{failure}");
    Ok(())
}

#[tokio::test]
async fn a_message_over_the_size_limit_is_recorded_as_skipped_without_its_body()
-> anyhow::Result<()> {
    let db = TestDb::create().await?;
    let u = user("cyrus-big");
    let big_body = "x".repeat(200 * 1024);
    put(
        &u,
        "INBOX",
        &raw_mail("big@cyrus", "big@example.com", "a big one", &big_body),
    )
    .await?;
    put(
        &u,
        "INBOX",
        &raw_mail("after@cyrus", "b@example.com", "after", "small"),
    )
    .await?;

    let poller = poller(&db.pool, config(vec![cyrus("big", &u)]));
    let report = poll(&poller).await;
    let a = &report.accounts[0];
    assert_eq!(a.failure, None, "{report:?}");
    assert_eq!((a.counts.stored, a.counts.too_large), (1, 1), "{report:?}");
    let r = rows(&db.pool, "big").await?;
    assert_eq!(r.len(), 2);
    assert_eq!(r[0].status, "skipped");
    let reason = r[0].skip_reason.as_deref().unwrap_or_default();
    assert!(
        reason.contains("over the limit of 102400 bytes"),
        "{reason}"
    );
    assert!(r[0].raw_size > 200 * 1024);
    assert_eq!(r[0].subject.as_deref(), Some("a big one"));
    assert_eq!(r[0].message_id.as_deref(), Some("big@cyrus"));
    assert_eq!((r[0].text_body.as_deref(), r[0].event_id), (None, None));
    assert_eq!(
        (r[1].status.as_str(), r[1].subject.as_deref()),
        ("stored", Some("after"))
    );
    assert_eq!(outbox_count(&db.pool).await?, 1);
    Ok(())
}

#[tokio::test]
async fn an_inbox_deleted_and_made_again_is_rescanned_without_duplicates() -> anyhow::Result<()> {
    let db = TestDb::create().await?;
    let u = user("cyrus-uv");
    let addr = cyrus_addr();
    let mails = [
        raw_mail("one@cyrus", "a@example.com", "one", "1"),
        raw_mail("two@cyrus", "a@example.com", "two", "2"),
        raw_mail("three@cyrus", "a@example.com", "three", "3"),
    ];
    for mail in &mails[..2] {
        put(&u, "INBOX", mail).await?;
    }
    let (before, _) = examine_at(&addr, &u, "INBOX").await?;
    let poller = poller(&db.pool, config(vec![cyrus("uv", &u)]));
    let r1 = poll(&poller).await;
    assert_eq!(r1.accounts[0].counts.stored, 2, "{r1:?}");

    // The admin deletes the user's INBOX (user.NAME: the admin gives itself the right `x`
    // first, even an admin may not delete without it) and makes it again, with the old mail and
    // one new.
    let inbox = format!("user.{u}");
    command_at(&addr, ADMIN, &format!("SETACL {inbox} {ADMIN} x")).await?;
    command_at(&addr, ADMIN, &format!("DELETE {inbox}")).await?;
    command_at(&addr, ADMIN, &format!("CREATE {inbox}")).await?;
    for mail in &mails {
        put(&u, "INBOX", mail).await?;
    }
    let (after, exists) = examine_at(&addr, &u, "INBOX").await?;
    assert_eq!(exists, 3);
    assert_ne!(before, after, "Cyrus gives the new INBOX a new UIDVALIDITY");

    let r2 = poll(&poller).await;
    let a = &r2.accounts[0];
    assert!(a.rescanned, "{r2:?}");
    assert_eq!((a.counts.stored, a.counts.duplicates), (1, 2), "{r2:?}");
    let all = rows(&db.pool, "uv").await?;
    let stored: Vec<_> = all
        .iter()
        .filter(|r| r.status == "stored")
        .filter_map(|r| r.message_id.as_deref())
        .collect();
    assert_eq!(stored, ["one@cyrus", "two@cyrus", "three@cyrus"]);
    assert_eq!(all.len(), 5);
    assert_eq!(outbox_count(&db.pool).await?, 3);
    let state: (i64, i64) = sqlx::query_as("SELECT uidvalidity, last_uid FROM imap_poll_state")
        .fetch_one(&db.pool)
        .await?;
    assert_eq!(state, (i64::from(after), 3));
    Ok(())
}

/// Cyrus's idled tells an IDLE session of new mail at once (no recheck here), and, the
/// account never polled, the session leaves it to the poll that its wake starts (the fetch on
/// the session itself: `idle_fetch.rs`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_wakes_the_poller_when_mail_arrives() -> anyhow::Result<()> {
    let db = TestDb::create().await?;
    let u = user("cyrus-idle");
    let mut config = config(vec![cyrus("idle", &u)]);
    config.message_timeout = Duration::from_secs(2);
    config.idle = IdleConfig {
        enabled: true,
        refresh: Duration::from_secs(60),
        recheck: Some(Duration::ZERO),
        recheck_with: RecheckWith::default(),
        lease_retry: Duration::from_millis(200),
        reconnect_max: Duration::from_secs(1),
    };
    let poller = poller(&db.pool, config);
    let idling = Idling::start(poller.idler(), &db);
    let idler = &idling.idler;
    let woken = |within| tokio::time::timeout(within, idling.wake.notified());

    let deadline = Instant::now() + BOUND;
    let state = loop {
        let state = idler.stats().account("idle").and_then(|s| s.idle);
        let state = state.unwrap_or_default();
        if state.starts_with("idling") || Instant::now() > deadline {
            break state;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(state, "idling", "Cyrus offers IDLE");
    assert!(
        woken(Duration::from_secs(5)).await.is_ok(),
        "the connect's own wake"
    );

    put(
        &u,
        "INBOX",
        &raw_mail("idle@cyrus", "a@example.com", "ping idle", "x"),
    )
    .await?;
    let sent = Instant::now();
    assert!(
        woken(Duration::from_secs(5)).await.is_ok(),
        "Cyrus's news woke the poller"
    );
    // idled passes the news on at once; without idled imapd would look every imapidlepoll
    // (60 s by default).
    assert!(
        sent.elapsed() < Duration::from_secs(2),
        "{:?}",
        sent.elapsed()
    );
    let counted = Instant::now() + Duration::from_secs(5);
    while idler.stats().account("idle").map_or(0, |s| s.idle_news) == 0 && Instant::now() < counted
    {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let news = idler.stats().account("idle").map_or(0, |s| s.idle_news);
    assert!(news >= 1, "counted as news: {news}");
    assert_eq!(poll(&poller).await.totals().stored, 1);

    tokio::time::timeout(BOUND, idling.end()).await?;
    Ok(())
}
