//! The inbound email poller against the real Dovecot, SMTP sink and PostgreSQL.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

mod common;

use std::time::Duration;

use common::*;
use job_inbound_email_poller::{event_id, inbound_email_id};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpListener;
use worker_core::TlsMode;
use worker_core::{FailureClass, NoLease, SkipIfBusy, TickOutcome, tick_once};
use worker_messages::{DomainEvent, EMAIL_RECEIVED, EmailReceived};
use worker_testkit::TestDb;

#[tokio::test]
async fn a_failing_account_does_not_hold_back_the_others() -> anyhow::Result<()> {
    let db = TestDb::create().await?;
    let good = user("poll-good");
    let bad = user("poll-bad");
    let first = send(
        &good,
        "Alice Sender <alice@example.com>",
        "ping one",
        "hello one",
    )
    .await?;
    let second = send(&good, "bob@example.com", "ping two", "hello two").await?;
    send(&bad, "alice@example.com", "never read", "x").await?;
    wait_for_messages(&good, "INBOX", 2).await?;

    let mut unreachable = account("gone", &good, "secret");
    unreachable.port = 9; // nothing listens there: refused at once
    let poller = poller(
        &db.pool,
        config(vec![
            account("wrong-password", &bad, "not-the-password"),
            unreachable,
            account("good", &good, "secret"),
        ]),
    );
    let started = std::time::Instant::now();
    let outcome = tick_once(
        &poller,
        &SkipIfBusy::new("poller"),
        None::<&NoLease>,
        BOUND,
        &ctx(),
    )
    .await;
    let TickOutcome::Ran(report) = outcome else {
        panic!("one account worked, so the tick ran: {outcome:?}");
    };
    assert!(started.elapsed() < Duration::from_secs(15));
    assert_eq!(report.items, 2);
    let detail = report.detail.unwrap_or_default();
    assert!(detail.contains("2 failed"), "{detail}");
    assert!(
        detail.contains("wrong-password (permanent: imap-auth-failed"),
        "{detail}"
    );
    assert!(detail.contains("gone (transient"), "{detail}");

    let stats = poller.stats();
    let wrong = stats.account("wrong-password").unwrap_or_default();
    assert_eq!((wrong.consecutive_failures, wrong.failures), (1, 1));
    assert!(
        wrong
            .last_error
            .as_deref()
            .is_some_and(|e| e.starts_with("permanent imap-auth-failed")),
        "{wrong:?}"
    );
    let gone = stats.account("gone").unwrap_or_default();
    assert!(
        gone.last_error
            .as_deref()
            .is_some_and(|e| e.starts_with("transient")),
        "{gone:?}"
    );
    let ok = stats.account("good").unwrap_or_default();
    assert_eq!((ok.consecutive_failures, ok.stored), (0, 2));
    assert!(ok.last_success_at.is_some());

    // The good account's mail: two rows, two outbox rows.
    let stored = rows(&db.pool, "good").await?;
    assert_eq!(stored.len(), 2);
    assert!(
        stored
            .iter()
            .all(|r| r.status == "stored" && r.parse_error.is_none())
    );
    assert_eq!(stored[0].message_id.as_deref(), Some(first.as_str()));
    assert_eq!(stored[1].message_id.as_deref(), Some(second.as_str()));
    assert_eq!(stored[0].subject.as_deref(), Some("ping one"));
    assert_eq!(stored[0].from_address.as_deref(), Some("alice@example.com"));
    assert_eq!(
        stored[0].text_body.as_deref().map(str::trim),
        Some("hello one")
    );
    assert!(rows(&db.pool, "wrong-password").await?.is_empty());

    // The outbox rows hold decodable `email.received` events for the right mail.
    type OutboxRow = (
        String,
        Option<String>,
        String,
        String,
        Vec<u8>,
        Option<String>,
    );
    let outbox: Vec<OutboxRow> = sqlx::query_as(
        "SELECT message_id, message_type, exchange, routing_key, body, correlation_id FROM outbox ORDER BY id",
    )
    .fetch_all(&db.pool)
    .await?;
    assert_eq!(outbox.len(), 2);
    let versions: Vec<Option<String>> =
        sqlx::query_scalar("SELECT headers ->> 'x-schema-version' FROM outbox ORDER BY id")
            .fetch_all(&db.pool)
            .await?;
    assert_eq!(
        versions,
        [Some("1".into()), Some("1".into())],
        "x-schema-version"
    );
    let (message_id, message_type, exchange, routing_key, body, correlation) = &outbox[0];
    assert_eq!(message_type.as_deref(), Some(EMAIL_RECEIVED));
    assert_eq!(
        (exchange.as_str(), routing_key.as_str()),
        ("events", EMAIL_RECEIVED)
    );
    let event: DomainEvent = serde_json::from_slice(body)?;
    assert_eq!(event.event_type, EMAIL_RECEIVED);
    assert_eq!(&event.id.to_string(), message_id);
    assert_eq!(Some(event.id), stored[0].event_id);
    let data: EmailReceived = serde_json::from_value(event.data)?;
    let (uidvalidity, _) = examine(&good, "INBOX").await?;
    let row_id = inbound_email_id("good", "INBOX", uidvalidity, 1);
    assert_eq!(data.inbound_email_id, row_id);
    assert_eq!(event.id, event_id(row_id));
    assert_eq!(correlation.as_deref(), Some(row_id.to_string().as_str()));
    assert_eq!(data.account, "good");
    assert_eq!(data.mailbox, "INBOX");
    assert_eq!(data.subject.as_deref(), Some("ping one"));
    assert_eq!(data.from.as_deref(), Some("alice@example.com"));
    assert_eq!(data.from_name.as_deref(), Some("Alice Sender"));
    assert_eq!(data.to, [format!("{good}@localhost")]);
    assert_eq!(data.message_id.as_deref(), Some(first.as_str()));
    assert_eq!(data.text.as_deref().map(str::trim), Some("hello one"));
    assert_eq!(data.parse_error, None);
    Ok(())
}

#[tokio::test]
async fn malformed_and_oversized_mail_is_recorded_and_the_poll_goes_on() -> anyhow::Result<()> {
    let db = TestDb::create().await?;
    let u = user("poll-odd");
    append(
        &u,
        "INBOX",
        &raw_mail("before@test", "a@example.com", "before", "first"),
    )
    .await?;
    append_garbage_and_big(&u).await?;
    append(
        &u,
        "INBOX",
        &raw_mail("after@test", "b@example.com", "after", "last"),
    )
    .await?;

    let poller = poller(&db.pool, config(vec![account("odd", &u, "secret")]));
    let report = poll(&poller).await;
    let a = &report.accounts[0];
    assert_eq!(a.failure, None, "{report:?}");
    assert_eq!(a.counts.stored, 3, "{report:?}");
    assert_eq!(a.counts.parse_errors, 1);
    assert_eq!(a.counts.too_large, 1);

    let r = rows(&db.pool, "odd").await?;
    assert_eq!(r.len(), 4);
    assert_eq!(r[0].subject.as_deref(), Some("before"));
    // The garbage: stored, with its parse error, and announced.
    assert_eq!(r[1].status, "stored");
    let parse_error = r[1].parse_error.as_deref().unwrap_or_default();
    assert!(!parse_error.is_empty(), "{:?}", r[1]);
    assert!(r[1].event_id.is_some());
    // The big one: skipped with its reason, headers read, no body, no event.
    assert_eq!(r[2].status, "skipped");
    let reason = r[2].skip_reason.as_deref().unwrap_or_default();
    assert!(
        reason.contains("over the limit of 102400 bytes"),
        "{reason}"
    );
    assert!(r[2].raw_size > 200 * 1024);
    assert_eq!(r[2].subject.as_deref(), Some("a big one"));
    assert_eq!(r[2].message_id.as_deref(), Some("big@test"));
    assert_eq!(r[2].text_body, None);
    assert_eq!(r[2].event_id, None);
    // And the poll went on.
    assert_eq!(
        (r[3].status.as_str(), r[3].subject.as_deref()),
        ("stored", Some("after"))
    );
    assert_eq!(outbox_count(&db.pool).await?, 3);

    let body: Vec<u8> = sqlx::query_scalar("SELECT body FROM outbox WHERE message_id = $1")
        .bind(r[1].event_id.map(|id| id.to_string()))
        .fetch_one(&db.pool)
        .await?;
    let event: DomainEvent = serde_json::from_slice(&body)?;
    let data: EmailReceived = serde_json::from_value(event.data)?;
    assert_eq!(data.parse_error.as_deref(), Some(parse_error));
    assert_eq!(data.subject, None);
    Ok(())
}

#[tokio::test]
async fn nothing_is_fetched_twice_across_ticks_and_restarts() -> anyhow::Result<()> {
    let db = TestDb::create().await?;
    let u = user("poll-again");
    for i in 0..3 {
        append(
            &u,
            "INBOX",
            &raw_mail(
                &format!("m{i}@test"),
                "a@example.com",
                &format!("n{i}"),
                "x",
            ),
        )
        .await?;
    }
    let mut cfg = config(vec![account("again", &u, "secret")]);
    cfg.max_messages_per_account = 2;
    let first = poller(&db.pool, cfg.clone());

    let r1 = poll(&first).await;
    assert_eq!(r1.accounts[0].counts.stored, 2, "bounded per tick: {r1:?}");
    assert!(r1.accounts[0].more_waiting);
    let r2 = poll(&first).await;
    assert_eq!(r2.accounts[0].counts.stored, 1, "{r2:?}");
    assert!(!r2.accounts[0].more_waiting);
    let r3 = poll(&first).await;
    assert_eq!(
        r3.accounts[0].counts,
        Default::default(),
        "nothing new: {r3:?}"
    );

    // A restart: a fresh poller on the same database.
    let restarted = poller(&db.pool, cfg);
    let r4 = poll(&restarted).await;
    assert_eq!(r4.accounts[0].counts, Default::default(), "{r4:?}");
    assert_eq!(r4.accounts[0].failure, None);

    append(
        &u,
        "INBOX",
        &raw_mail("m3@test", "a@example.com", "n3", "x"),
    )
    .await?;
    let r5 = poll(&restarted).await;
    assert_eq!(r5.accounts[0].counts.stored, 1, "{r5:?}");
    assert_eq!(
        poll(&restarted).await.accounts[0].counts,
        Default::default()
    );

    let stored = rows(&db.pool, "again").await?;
    let uids: Vec<i64> = stored.iter().map(|r| r.uid).collect();
    assert_eq!(uids, [1, 2, 3, 4]);
    assert_eq!(outbox_count(&db.pool).await?, 4);
    let last: i64 =
        sqlx::query_scalar("SELECT last_uid FROM imap_poll_state WHERE account = 'again'")
            .fetch_one(&db.pool)
            .await?;
    assert_eq!(last, 4);

    // A poll state set back (an operator's mistake, a restored backup): the existence
    // check on the UID keeps every message from being stored or announced twice.
    sqlx::query("UPDATE imap_poll_state SET last_uid = 0")
        .execute(&db.pool)
        .await?;
    let r6 = poll(&restarted).await;
    let r7 = poll(&restarted).await;
    for r in [&r6, &r7] {
        assert_eq!(r.accounts[0].counts.duplicates, 2, "two per tick: {r:?}");
        assert_eq!(r.accounts[0].counts.stored, 0);
    }
    assert_eq!(
        poll(&restarted).await.accounts[0].counts,
        Default::default()
    );
    assert_eq!(outbox_count(&db.pool).await?, 4);
    Ok(())
}

#[tokio::test]
async fn a_changed_uidvalidity_rescans_without_duplicating_by_message_id() -> anyhow::Result<()> {
    let db = TestDb::create().await?;
    let u = user("poll-uv");
    command(&u, "CREATE Work").await?;
    append(
        &u,
        "Work",
        &raw_mail("one@test", "a@example.com", "one", "1"),
    )
    .await?;
    append(
        &u,
        "Work",
        &raw_mail("two@test", "a@example.com", "two", "2"),
    )
    .await?;
    let (before, _) = examine(&u, "Work").await?;

    let mut work = account("work", &u, "secret");
    work.mailbox = "Work".into();
    let poller = poller(&db.pool, config(vec![work]));
    let r1 = poll(&poller).await;
    assert_eq!(r1.accounts[0].counts.stored, 2, "{r1:?}");
    assert!(!r1.accounts[0].rescanned);

    // The mailbox is rebuilt on the server: a new UIDVALIDITY, the old mail again, one new.
    command(&u, "DELETE Work").await?;
    command(&u, "CREATE Work").await?;
    append(
        &u,
        "Work",
        &raw_mail("one@test", "a@example.com", "one", "1"),
    )
    .await?;
    append(
        &u,
        "Work",
        &raw_mail("two@test", "a@example.com", "two", "2"),
    )
    .await?;
    append(
        &u,
        "Work",
        &raw_mail("three@test", "a@example.com", "three", "3"),
    )
    .await?;
    let (after, _) = examine(&u, "Work").await?;
    assert_ne!(
        before, after,
        "Dovecot gives a recreated mailbox a new UIDVALIDITY"
    );

    let r2 = poll(&poller).await;
    let a = &r2.accounts[0];
    assert!(a.rescanned, "{r2:?}");
    assert_eq!((a.counts.stored, a.counts.duplicates), (1, 2), "{r2:?}");
    // The mail seen before has a row under the new UIDVALIDITY too, skipped as a duplicate.
    let all = rows(&db.pool, "work").await?;
    let stored: Vec<_> = all.iter().filter(|r| r.status == "stored").collect();
    let ids: Vec<_> = stored
        .iter()
        .filter_map(|r| r.message_id.as_deref())
        .collect();
    assert_eq!(ids, ["one@test", "two@test", "three@test"]);
    assert_eq!(stored[2].uidvalidity, i64::from(after));
    assert_eq!(all.len(), 5);
    assert_eq!(outbox_count(&db.pool).await?, 3);
    let state: (i64, i64) = sqlx::query_as("SELECT uidvalidity, last_uid FROM imap_poll_state")
        .fetch_one(&db.pool)
        .await?;
    assert_eq!(state, (i64::from(after), 3));

    // The same, simulated in the database: a stored UIDVALIDITY that no longer matches.
    sqlx::query("UPDATE imap_poll_state SET uidvalidity = 1")
        .execute(&db.pool)
        .await?;
    let r3 = poll(&poller).await;
    assert!(r3.accounts[0].rescanned);
    assert_eq!(
        (
            r3.accounts[0].counts.stored,
            r3.accounts[0].counts.duplicates
        ),
        (0, 3),
        "{r3:?}"
    );
    assert_eq!(outbox_count(&db.pool).await?, 3);
    Ok(())
}

#[tokio::test]
async fn misconfigured_accounts_fail_permanently_and_a_tick_of_only_those_fails()
-> anyhow::Result<()> {
    let db = TestDb::create().await?;
    let u = user("poll-conf");
    let mut starttls = account("starttls", &u, "secret");
    starttls.security = TlsMode::Starttls;
    let mut missing = account("missing", &u, "secret");
    missing.mailbox = "No-Such-Folder".into();
    let poller = poller(&db.pool, config(vec![starttls, missing]));
    let report = poll(&poller).await;
    let reasons: Vec<(&str, String)> = report
        .failed()
        .map(|(name, f)| (name, f.reason().to_string()))
        .collect();
    assert_eq!(
        reasons,
        [
            ("starttls", "imap-starttls-refused".to_string()),
            ("missing", "imap-mailbox".to_string())
        ]
    );

    let outcome = tick_once(
        &poller,
        &SkipIfBusy::new("p"),
        None::<&NoLease>,
        BOUND,
        &ctx(),
    )
    .await;
    match outcome {
        TickOutcome::Failed(failure) => {
            assert_eq!(failure.class(), FailureClass::Permanent);
            assert_eq!(failure.reason(), "imap-accounts");
        }
        other => panic!("every account failed: {other:?}"),
    }
    Ok(())
}

#[tokio::test]
async fn tls_to_a_plain_server_fails_the_handshake_for_that_account_only() -> anyhow::Result<()> {
    let db = TestDb::create().await?;
    let u = user("poll-tls");
    append(
        &u,
        "INBOX",
        &raw_mail("tls@test", "a@example.com", "beside tls", "x"),
    )
    .await?;
    let mut tls = account("tls", &u, "secret");
    tls.security = TlsMode::Tls;
    let poller = poller(&db.pool, config(vec![tls, account("plain", &u, "secret")]));
    let report = poll(&poller).await;
    let failures: Vec<_> = report.failed().collect();
    assert_eq!(failures.len(), 1, "{report:?}");
    assert_eq!(failures[0].0, "tls");
    assert!(
        failures[0].1.detail().starts_with("the TLS handshake"),
        "{}",
        failures[0].1
    );
    assert_eq!(report.accounts[1].counts.stored, 1);
    Ok(())
}

/// A server that accepts connections and never says a word.
async fn silent_server() -> anyhow::Result<(u16, tokio::task::JoinHandle<()>)> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let port = listener.local_addr()?.port();
    let task = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((socket, _)) = listener.accept().await {
            held.push(socket);
        }
    });
    Ok((port, task))
}

#[tokio::test]
async fn a_server_that_never_answers_costs_its_connect_timeout_only() -> anyhow::Result<()> {
    let db = TestDb::create().await?;
    let u = user("poll-beside");
    send(&u, "a@example.com", "beside a silent server", "x").await?;
    wait_for_messages(&u, "INBOX", 1).await?;
    let (port, server) = silent_server().await?;
    let mut silent = account("silent", "whoever", "secret");
    silent.port = port;
    let mut cfg = config(vec![silent, account("fine", &u, "secret")]);
    cfg.connect_timeout = Duration::from_secs(1);
    let poller = poller(&db.pool, cfg);

    let started = std::time::Instant::now();
    let report = poll(&poller).await;
    let elapsed = started.elapsed();
    assert!(elapsed < Duration::from_secs(5), "{elapsed:?}");
    let failures: Vec<_> = report.failed().collect();
    assert_eq!(failures.len(), 1);
    assert_eq!(failures[0].0, "silent");
    assert_eq!(failures[0].1.class(), FailureClass::Transient);
    assert!(
        failures[0].1.detail().contains("no answer within 1000ms"),
        "{}",
        failures[0].1
    );
    assert_eq!(report.accounts[1].counts.stored, 1);
    server.abort();
    Ok(())
}

/// A minimal IMAP server with one message (UID 7) whose body FETCH never gets an answer.
async fn hanging_fetch_server() -> anyhow::Result<(u16, tokio::task::JoinHandle<()>)> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let port = listener.local_addr()?.port();
    let task = tokio::spawn(async move {
        while let Ok((socket, _)) = listener.accept().await {
            tokio::spawn(async move {
                let (read, mut write) = socket.into_split();
                let mut lines = BufReader::new(read).lines();
                let _ = write
                    .write_all(b"* OK [CAPABILITY IMAP4rev1] fake ready\r\n")
                    .await;
                while let Ok(Some(line)) = lines.next_line().await {
                    let (tag, rest) = line.split_once(' ').unwrap_or((&line, ""));
                    let upper = rest.to_ascii_uppercase();
                    let reply = if upper.starts_with("LOGIN") {
                        format!("{tag} OK logged in\r\n")
                    } else if upper.starts_with("SELECT") {
                        format!(
                            "* 1 EXISTS\r\n* 0 RECENT\r\n* OK [UIDVALIDITY 42] ok\r\n* OK [UIDNEXT 8] ok\r\n\
                             * FLAGS (\\Seen)\r\n{tag} OK [READ-WRITE] selected\r\n"
                        )
                    } else if upper.starts_with("UID SEARCH") {
                        format!("* SEARCH 7\r\n{tag} OK searched\r\n")
                    } else if upper.starts_with("UID FETCH") && upper.contains("RFC822.SIZE") {
                        format!("* 1 FETCH (UID 7 RFC822.SIZE 120)\r\n{tag} OK fetched\r\n")
                    } else if upper.starts_with("UID FETCH") {
                        std::future::pending::<()>().await;
                        String::new()
                    } else if upper.starts_with("LOGOUT") {
                        format!("* BYE bye\r\n{tag} OK bye\r\n")
                    } else {
                        format!("{tag} BAD unknown\r\n")
                    };
                    if write.write_all(reply.as_bytes()).await.is_err() {
                        break;
                    }
                }
            });
        }
    });
    Ok((port, task))
}

#[tokio::test]
async fn a_message_that_keeps_timing_out_is_skipped_after_its_attempts() -> anyhow::Result<()> {
    let db = TestDb::create().await?;
    let (port, server) = hanging_fetch_server().await?;
    let mut hang = account("hang", "someone", "secret");
    hang.port = port;
    // The fake server knows no INTERNALDATE: its one message is taken as it is.
    hang.backfill = true;
    let mut cfg = config(vec![hang]);
    cfg.message_timeout = Duration::from_millis(500);
    cfg.max_message_attempts = 2;
    let poller = poller(&db.pool, cfg);

    for attempt in 1..=2 {
        let report = poll(&poller).await;
        let failure = report.accounts[0].failure.clone();
        let failure =
            failure.unwrap_or_else(|| panic!("attempt {attempt} should time out: {report:?}"));
        assert_eq!(failure.class(), FailureClass::Transient);
        assert!(failure.detail().contains("message UID 7"), "{failure}");
        assert!(rows(&db.pool, "hang").await?.is_empty());
    }
    let report = poll(&poller).await;
    assert_eq!(report.accounts[0].failure, None, "{report:?}");
    assert_eq!(report.accounts[0].counts.gave_up, 1);
    let r = rows(&db.pool, "hang").await?;
    assert_eq!(r.len(), 1);
    assert_eq!(
        (r[0].uid, r[0].uidvalidity, r[0].status.as_str()),
        (7, 42, "skipped")
    );
    let reason = r[0].skip_reason.as_deref().unwrap_or_default();
    assert!(
        reason.starts_with("gave up after 2 failed attempts"),
        "{reason}"
    );
    // Either the command's own bound or the message's timeout fires first: both are timeouts.
    assert!(
        reason.contains("timeout") || reason.contains("no answer within"),
        "{reason}"
    );
    assert_eq!(outbox_count(&db.pool).await?, 0);
    // And the mailbox moves on: the next poll finds nothing new.
    let report = poll(&poller).await;
    assert_eq!(report.accounts[0].counts, Default::default());
    server.abort();
    Ok(())
}

/// A minimal IMAP server with one message (UID 7) that closes the connection (FIN) right
/// after the `UID FETCH` it is told to drop, before any answer: the sizes fetch
/// (`RFC822.SIZE`) or the body fetch.
async fn closing_fetch_server(
    drop_sizes_fetch: bool,
) -> anyhow::Result<(u16, tokio::task::JoinHandle<()>)> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let port = listener.local_addr()?.port();
    let task = tokio::spawn(async move {
        while let Ok((socket, _)) = listener.accept().await {
            tokio::spawn(async move {
                let (read, mut write) = socket.into_split();
                let mut lines = BufReader::new(read).lines();
                let _ = write
                    .write_all(b"* OK [CAPABILITY IMAP4rev1] fake ready\r\n")
                    .await;
                while let Ok(Some(line)) = lines.next_line().await {
                    let (tag, rest) = line.split_once(' ').unwrap_or((&line, ""));
                    let upper = rest.to_ascii_uppercase();
                    let sizes = upper.contains("RFC822.SIZE");
                    let reply = if upper.starts_with("LOGIN") {
                        format!("{tag} OK logged in\r\n")
                    } else if upper.starts_with("SELECT") {
                        format!(
                            "* 1 EXISTS\r\n* 0 RECENT\r\n* OK [UIDVALIDITY 42] ok\r\n* OK [UIDNEXT 8] ok\r\n\
                             * FLAGS (\\Seen)\r\n{tag} OK [READ-WRITE] selected\r\n"
                        )
                    } else if upper.starts_with("UID SEARCH") {
                        format!("* SEARCH 7\r\n{tag} OK searched\r\n")
                    } else if upper.starts_with("UID FETCH") && sizes == drop_sizes_fetch {
                        // The connection drops with the command sent and no byte answered.
                        break;
                    } else if upper.starts_with("UID FETCH") {
                        format!("* 1 FETCH (UID 7 RFC822.SIZE 120)\r\n{tag} OK fetched\r\n")
                    } else if upper.starts_with("LOGOUT") {
                        format!("* BYE bye\r\n{tag} OK bye\r\n")
                    } else {
                        format!("{tag} BAD unknown\r\n")
                    };
                    if write.write_all(reply.as_bytes()).await.is_err() {
                        break;
                    }
                }
            });
        }
    });
    Ok((port, task))
}

#[tokio::test]
async fn a_connection_dropped_during_a_fetch_is_a_failure_not_a_vanished_message()
-> anyhow::Result<()> {
    for drop_sizes_fetch in [true, false] {
        let db = TestDb::create().await?;
        let (port, server) = closing_fetch_server(drop_sizes_fetch).await?;
        let mut dropping = account("dropping", "someone", "secret");
        dropping.port = port;
        // The fake server knows no INTERNALDATE: its one message is taken as it is.
        dropping.backfill = true;
        let poller = poller(&db.pool, config(vec![dropping]));
        let what = if drop_sizes_fetch { "sizes" } else { "body" };

        for _ in 0..4 {
            let report = poll(&poller).await;
            let failure = report.accounts[0]
                .failure
                .clone()
                .unwrap_or_else(|| panic!("a dropped {what} fetch must fail the poll: {report:?}"));
            assert_eq!(failure.class(), FailureClass::Transient, "{failure}");
            assert_eq!(report.accounts[0].counts.vanished, 0, "{report:?}");
            // The message is neither skipped past nor given up on: the next tick tries it.
            let last: Option<i64> = sqlx::query_scalar(
                "SELECT last_uid FROM imap_poll_state WHERE account = 'dropping'",
            )
            .fetch_optional(&db.pool)
            .await?;
            assert_eq!(last.unwrap_or(0), 0, "after a dropped {what} fetch");
            assert!(rows(&db.pool, "dropping").await?.is_empty());
        }
        server.abort();
    }
    Ok(())
}

#[tokio::test]
async fn a_tick_that_leaves_mail_waiting_wakes_the_next_one_at_once() -> anyhow::Result<()> {
    let db = TestDb::create().await?;
    let mailbox = user("poll-backlog");
    for i in 0..3 {
        send(&mailbox, "alice@example.com", &format!("ping {i}"), "x").await?;
    }
    wait_for_messages(&mailbox, "INBOX", 3).await?;
    let mut one_at_a_time = config(vec![account("backlog", &mailbox, "secret")]);
    one_at_a_time.max_messages_per_account = 1;
    let wake = std::sync::Arc::new(tokio::sync::Notify::new());
    let poller = poller(&db.pool, one_at_a_time).wake_on_backlog(wake.clone());
    let busy = SkipIfBusy::new("poller");
    let context = ctx();
    let tick = || tick_once(&poller, &busy, None::<&NoLease>, BOUND, &context);
    let woken = || tokio::time::timeout(Duration::from_millis(100), wake.notified());
    for waiting in [2, 1] {
        assert!(matches!(tick().await, TickOutcome::Ran(_)));
        assert!(
            woken().await.is_ok(),
            "{waiting} waiting: the next tick is asked for at once"
        );
    }
    assert!(matches!(tick().await, TickOutcome::Ran(_)));
    assert!(woken().await.is_err(), "nothing waits after the last one");
    assert_eq!(rows(&db.pool, "backlog").await?.len(), 3);
    Ok(())
}
