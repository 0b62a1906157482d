//! One mail, one event, whatever the mailbox does: a mail's identity is its Message-ID, or
//! its content when it has none, on every path; and the first poll of an account does not
//! announce the mail that was there before the poller started watching it.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

mod common;

use common::*;
use worker_testkit::TestDb;

/// Two days ago, as an IMAP date-time: mail that was in the mailbox long before the host.
fn two_days_ago() -> String {
    (chrono::Utc::now() - chrono::Duration::days(2))
        .format("%d-%b-%Y %H:%M:%S +0000")
        .to_string()
}

/// The rows of `account` that were recorded as duplicates, with their reasons.
async fn duplicate_rows(
    pool: &sqlx::PgPool,
    account: &str,
) -> anyhow::Result<Vec<(i64, String, Option<uuid::Uuid>)>> {
    Ok(sqlx::query_as(
        "SELECT uid, skip_reason, duplicate_of FROM inbound_emails \
         WHERE account = $1 AND status = 'skipped' ORDER BY uidvalidity, uid",
    )
    .bind(account)
    .fetch_all(pool)
    .await?)
}

#[tokio::test]
async fn the_first_poll_announces_only_mail_that_arrived_since_the_host_started_watching()
-> anyhow::Result<()> {
    let db = TestDb::create().await?;
    let u = user("poll-history");
    let old = two_days_ago();
    for i in 0..3 {
        let mail = raw_mail(&format!("old{i}@test"), "a@example.com", "old", "years ago");
        append_dated(&u, "INBOX", &mail, &old).await?;
    }
    // Arrived just before the first poll (a ping sent once the host was up): announced.
    append(
        &u,
        "INBOX",
        &raw_mail("recent@test", "a@example.com", "recent", "now"),
    )
    .await?;

    let poller = poller(&db.pool, config(vec![account("hist", &u, "secret")]));
    let r1 = poll(&poller).await;
    assert_eq!(r1.accounts[0].failure, None, "{r1:?}");
    let stored = rows(&db.pool, "hist").await?;
    let ids: Vec<_> = stored.iter().filter_map(|r| r.message_id.clone()).collect();
    assert_eq!(ids, ["recent@test"], "the history is not announced: {r1:?}");
    assert_eq!(outbox_count(&db.pool).await?, 1);

    // Mail that arrives later is announced as usual.
    append(
        &u,
        "INBOX",
        &raw_mail("later@test", "a@example.com", "later", "x"),
    )
    .await?;
    let r2 = poll(&poller).await;
    assert_eq!(r2.accounts[0].counts.stored, 1, "{r2:?}");
    assert_eq!(outbox_count(&db.pool).await?, 2);
    Ok(())
}

#[tokio::test]
async fn the_first_poll_of_an_empty_mailbox_announces_everything_that_arrives_after_it()
-> anyhow::Result<()> {
    let db = TestDb::create().await?;
    let u = user("poll-empty");
    let poller = poller(&db.pool, config(vec![account("empty", &u, "secret")]));
    let r1 = poll(&poller).await;
    assert_eq!(r1.accounts[0].failure, None, "{r1:?}");
    // Mail dated long ago but delivered now (an import, a delayed delivery) is new mail.
    append_dated(
        &u,
        "INBOX",
        &raw_mail("late@test", "a@example.com", "late", "x"),
        &two_days_ago(),
    )
    .await?;
    append(&u, "INBOX", &raw_mail("n@test", "a@example.com", "n", "x")).await?;
    let r2 = poll(&poller).await;
    assert_eq!(r2.accounts[0].counts.stored, 2, "{r2:?}");
    Ok(())
}

#[tokio::test]
async fn backfill_announces_the_history_on_the_first_poll() -> anyhow::Result<()> {
    let db = TestDb::create().await?;
    let u = user("poll-backfill");
    let old = two_days_ago();
    for i in 0..2 {
        let mail = raw_mail(&format!("bf{i}@test"), "a@example.com", "old", "x");
        append_dated(&u, "INBOX", &mail, &old).await?;
    }
    let mut backfill = account("backfill", &u, "secret");
    backfill.backfill = true;
    let poller = poller(&db.pool, config(vec![backfill]));
    let r = poll(&poller).await;
    assert_eq!(r.accounts[0].counts.stored, 2, "{r:?}");
    Ok(())
}

#[tokio::test]
async fn a_mail_moved_out_of_the_folder_and_back_is_not_announced_again() -> anyhow::Result<()> {
    let db = TestDb::create().await?;
    let u = user("poll-move");
    command(&u, "CREATE Elsewhere").await?;
    append(
        &u,
        "INBOX",
        &raw_mail("moved@test", "a@example.com", "with an id", "1"),
    )
    .await?;
    append(
        &u,
        "INBOX",
        &raw_mail_without_id("a@example.com", "without an id", "2"),
    )
    .await?;
    let poller = poller(&db.pool, config(vec![account("move", &u, "secret")]));
    let r1 = poll(&poller).await;
    assert_eq!(r1.accounts[0].counts.stored, 2, "{r1:?}");

    move_all(&u, "INBOX", "Elsewhere").await?;
    move_all(&u, "Elsewhere", "INBOX").await?;
    let r2 = poll(&poller).await;
    let a = &r2.accounts[0];
    assert_eq!((a.counts.stored, a.counts.duplicates), (0, 2), "{r2:?}");
    assert_eq!(outbox_count(&db.pool).await?, 2, "one mail, one event");
    // Each new UID has its row, which says what it duplicates.
    let dups = duplicate_rows(&db.pool, "move").await?;
    assert_eq!(dups.len(), 2, "{dups:?}");
    assert!(dups[0].1.contains("Message-ID moved@test"), "{dups:?}");
    assert!(dups[1].1.contains("the same content"), "{dups:?}");
    assert!(dups.iter().all(|d| d.2.is_some()), "{dups:?}");
    // And nothing more on the next poll.
    assert_eq!(poll(&poller).await.accounts[0].counts, Default::default());
    Ok(())
}

#[tokio::test]
async fn after_a_uidvalidity_change_mail_without_a_message_id_is_not_announced_again()
-> anyhow::Result<()> {
    let db = TestDb::create().await?;
    let u = user("poll-uv-noid");
    command(&u, "CREATE Work").await?;
    let first = raw_mail_without_id("a@example.com", "one", "1");
    let second = raw_mail_without_id("b@example.com", "two", "2");
    append(&u, "Work", &first).await?;
    append(&u, "Work", &second).await?;
    let mut work = account("noid", &u, "secret");
    work.mailbox = "Work".into();
    let poller = poller(&db.pool, config(vec![work]));
    assert_eq!(poll(&poller).await.accounts[0].counts.stored, 2);

    command(&u, "DELETE Work").await?;
    command(&u, "CREATE Work").await?;
    append(&u, "Work", &first).await?;
    append(&u, "Work", &second).await?;
    let r = poll(&poller).await;
    let a = &r.accounts[0];
    assert!(a.rescanned, "{r:?}");
    assert_eq!((a.counts.stored, a.counts.duplicates), (0, 2), "{r:?}");
    assert_eq!(outbox_count(&db.pool).await?, 2);
    let hashes: Vec<Option<String>> = sqlx::query_scalar(
        "SELECT content_hash FROM inbound_emails WHERE account = 'noid' ORDER BY received_at",
    )
    .fetch_all(&db.pool)
    .await?;
    assert_eq!(hashes.len(), 4);
    assert!(
        hashes
            .iter()
            .all(|h| h.as_ref().is_some_and(|h| h.len() == 64)),
        "{hashes:?}"
    );
    assert_eq!(hashes[0], hashes[2], "the same bytes, the same hash");
    Ok(())
}

#[tokio::test]
async fn a_new_mail_reusing_an_older_message_id_gets_a_row_that_says_so() -> anyhow::Result<()> {
    let db = TestDb::create().await?;
    let u = user("poll-reuse");
    command(&u, "CREATE Work").await?;
    append(
        &u,
        "Work",
        &raw_mail("reused@test", "a@example.com", "first", "1"),
    )
    .await?;
    let mut work = account("reuse", &u, "secret");
    work.mailbox = "Work".into();
    let poller = poller(&db.pool, config(vec![work]));
    assert_eq!(poll(&poller).await.accounts[0].counts.stored, 1);

    command(&u, "DELETE Work").await?;
    command(&u, "CREATE Work").await?;
    append(
        &u,
        "Work",
        &raw_mail("reused@test", "b@example.com", "another mail", "2"),
    )
    .await?;
    let r = poll(&poller).await;
    assert_eq!(r.accounts[0].counts.duplicates, 1, "{r:?}");
    let all = rows(&db.pool, "reuse").await?;
    assert_eq!(all.len(), 2, "the new mail has its row: {all:?}");
    assert_eq!(all[1].status, "skipped");
    assert_eq!(all[1].subject.as_deref(), Some("another mail"));
    assert_eq!(all[1].event_id, None);
    let dups = duplicate_rows(&db.pool, "reuse").await?;
    assert!(
        dups[0].1.contains("a duplicate of") && dups[0].1.contains("reused@test"),
        "{dups:?}"
    );
    assert_eq!(outbox_count(&db.pool).await?, 1);
    Ok(())
}

#[tokio::test]
async fn the_history_cutoff_is_when_the_first_process_started_watching_not_the_last()
-> anyhow::Result<()> {
    let db = TestDb::create().await?;
    let u = user("poll-watch");
    // An earlier process began watching three days ago and never reached the server.
    sqlx::query(
        "INSERT INTO imap_poll_state (account, mailbox, uidvalidity, last_uid, watching_since) \
         VALUES ('watch', 'INBOX', 0, 0, now() - interval '3 days')",
    )
    .execute(&db.pool)
    .await?;
    let mail = raw_mail("meanwhile@test", "a@example.com", "meanwhile", "x");
    append_dated(&u, "INBOX", &mail, &two_days_ago()).await?;
    let poller = poller(&db.pool, config(vec![account("watch", &u, "secret")]));
    let r = poll(&poller).await;
    assert_eq!(
        r.accounts[0].counts.stored, 1,
        "arrived while watched: {r:?}"
    );
    Ok(())
}
