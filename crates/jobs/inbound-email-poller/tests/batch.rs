//! A tick's mails are written together: the rows, their `email.received` outbox rows and the
//! mailbox's last UID in one transaction, duplicates found for the whole batch at once.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

mod common;

use common::statements::counting;
use common::*;
use worker_testkit::TestDb;

/// The transactions that wrote `account`'s rows, its outbox rows and its poll state: the
/// distinct `xmin` of those rows (each row keeps the id of the transaction that wrote it).
async fn writing_transactions(pool: &sqlx::PgPool, account: &str) -> anyhow::Result<Vec<i64>> {
    Ok(sqlx::query_scalar(
        "SELECT DISTINCT x FROM ( \
             SELECT xmin::text::bigint AS x FROM inbound_emails WHERE account = $1 \
             UNION ALL SELECT xmin::text::bigint FROM outbox WHERE headers ->> 'account' = $1 \
             UNION ALL SELECT xmin::text::bigint FROM imap_poll_state WHERE account = $1) t \
         ORDER BY x",
    )
    .bind(account)
    .fetch_all(pool)
    .await?)
}

const N: usize = 10;

#[tokio::test]
async fn a_ticks_mails_are_written_in_one_transaction() -> anyhow::Result<()> {
    let db = TestDb::create().await?;
    let u = user("batch-one");
    for i in 0..N {
        append(
            &u,
            "INBOX",
            &raw_mail(
                &format!("b{i}@test"),
                "a@example.com",
                &format!("n{i}"),
                "x",
            ),
        )
        .await?;
    }
    let mut account = account("batch", &u, "secret");
    account.backfill = true;
    let poller = poller(&db.pool, config(vec![account]));
    // The first poll writes the account's poll state before it selects: a transaction of
    // its own, out of the count.
    let (report, statements) = counting(poll(&poller)).await;
    let a = &report.accounts[0];
    assert_eq!(
        (a.failure.clone(), a.counts.stored),
        (None, N as u64),
        "{report:?}"
    );
    let taken = statements.taken();
    eprintln!(
        "{N} mails in one tick: {} statements, {} of them BEGIN/COMMIT: {taken:#?}",
        taken.len(),
        statements.transaction_control()
    );
    assert!(
        taken.len() <= 5,
        "the poll state (3), the existence check and one write, whatever N: {taken:#?}"
    );
    assert_eq!(statements.transaction_control(), 0);
    assert_eq!(outbox_count(&db.pool).await?, N as i64);
    let writers = writing_transactions(&db.pool, "batch").await?;
    assert_eq!(
        writers.len(),
        1,
        "rows, outbox rows and last UID in one transaction: {writers:?}"
    );

    // A later tick: the poll state (which says no row is stored above its last UID, so no
    // existence check is needed) and the write.
    for i in N..2 * N {
        append(
            &u,
            "INBOX",
            &raw_mail(
                &format!("b{i}@test"),
                "a@example.com",
                &format!("n{i}"),
                "x",
            ),
        )
        .await?;
    }
    let (report, statements) = counting(poll(&poller)).await;
    assert_eq!(report.accounts[0].counts.stored, N as u64, "{report:?}");
    let taken = statements.taken();
    eprintln!(
        "{N} more mails in a later tick: {} statements: {taken:#?}",
        taken.len()
    );
    assert_eq!(taken.len(), 2, "{taken:#?}");
    assert_eq!(outbox_count(&db.pool).await?, 2 * N as i64);
    assert_eq!(writing_transactions(&db.pool, "batch").await?.len(), 2);
    let last: i64 =
        sqlx::query_scalar("SELECT last_uid FROM imap_poll_state WHERE account = 'batch'")
            .fetch_one(&db.pool)
            .await?;
    assert_eq!(last, 2 * N as i64);

    // The poll state set back: the state's read sees rows above its last UID, and the
    // existence check runs before anything is fetched.
    sqlx::query("UPDATE imap_poll_state SET last_uid = $1")
        .bind(N as i64)
        .execute(&db.pool)
        .await?;
    let (report, statements) = counting(poll(&poller)).await;
    let a = &report.accounts[0];
    assert_eq!(
        (a.counts.duplicates, a.counts.stored),
        (N as u64, 0),
        "{report:?}"
    );
    let taken = statements.taken();
    assert_eq!(taken.len(), 3, "{taken:#?}");
    assert!(
        taken[1].starts_with("SELECT uid FROM inbound_emails"),
        "{taken:#?}"
    );
    assert_eq!(outbox_count(&db.pool).await?, 2 * N as i64);
    Ok(())
}

#[tokio::test]
async fn a_message_id_twice_in_one_batch_is_one_mail_and_one_duplicate() -> anyhow::Result<()> {
    let db = TestDb::create().await?;
    let u = user("batch-dup");
    append(
        &u,
        "INBOX",
        &raw_mail("twice@test", "a@example.com", "first", "1"),
    )
    .await?;
    append(
        &u,
        "INBOX",
        &raw_mail_without_id("c@example.com", "no id", "same bytes"),
    )
    .await?;
    append(
        &u,
        "INBOX",
        &raw_mail("twice@test", "b@example.com", "second", "2"),
    )
    .await?;
    append(
        &u,
        "INBOX",
        &raw_mail("once@test", "a@example.com", "unique", "3"),
    )
    .await?;
    append(
        &u,
        "INBOX",
        &raw_mail_without_id("c@example.com", "no id", "same bytes"),
    )
    .await?;
    let mut account = account("dup", &u, "secret");
    account.backfill = true;
    let poller = poller(&db.pool, config(vec![account]));

    let report = poll(&poller).await;
    let a = &report.accounts[0];
    assert_eq!(a.failure, None, "{report:?}");
    assert_eq!((a.counts.stored, a.counts.duplicates), (3, 2), "{report:?}");
    let r = rows(&db.pool, "dup").await?;
    let status: Vec<(i64, &str)> = r.iter().map(|r| (r.uid, r.status.as_str())).collect();
    assert_eq!(
        status,
        [
            (1, "stored"),
            (2, "stored"),
            (3, "skipped"),
            (4, "stored"),
            (5, "skipped")
        ]
    );
    let (uidvalidity, _) = examine(&u, "INBOX").await?;
    let dups: Vec<(i64, String, Option<uuid::Uuid>, Option<uuid::Uuid>)> = sqlx::query_as(
        "SELECT uid, skip_reason, duplicate_of, event_id FROM inbound_emails \
         WHERE account = 'dup' AND status = 'skipped' ORDER BY uid",
    )
    .fetch_all(&db.pool)
    .await?;
    let first = job_inbound_email_poller::inbound_email_id("dup", "INBOX", uidvalidity, 1);
    let second = job_inbound_email_poller::inbound_email_id("dup", "INBOX", uidvalidity, 2);
    assert_eq!((dups[0].0, dups[0].2, dups[0].3), (3, Some(first), None));
    assert!(
        dups[0].1.contains("a duplicate of")
            && dups[0].1.contains("the same Message-ID twice@test"),
        "{dups:?}"
    );
    assert!(
        dups[0]
            .1
            .contains(&format!("UIDVALIDITY {uidvalidity}, UID 1")),
        "{dups:?}"
    );
    assert_eq!((dups[1].0, dups[1].2, dups[1].3), (5, Some(second), None));
    assert!(dups[1].1.contains("the same content (SHA-256 "), "{dups:?}");
    assert_eq!(outbox_count(&db.pool).await?, 3, "one event a mail");
    assert_eq!(writing_transactions(&db.pool, "dup").await?.len(), 1);

    // The same across ticks, as before: the Message-ID again under a new UID.
    append(
        &u,
        "INBOX",
        &raw_mail("twice@test", "d@example.com", "third", "4"),
    )
    .await?;
    let report = poll(&poller).await;
    assert_eq!(report.accounts[0].counts.duplicates, 1, "{report:?}");
    assert_eq!(outbox_count(&db.pool).await?, 3);
    Ok(())
}

#[tokio::test]
async fn a_mail_that_does_not_parse_or_is_set_aside_does_not_sink_its_batch() -> anyhow::Result<()>
{
    let db = TestDb::create().await?;
    let u = user("batch-odd");
    append(
        &u,
        "INBOX",
        &raw_mail("good1@test", "a@example.com", "good one", "1"),
    )
    .await?;
    append_garbage_and_big(&u).await?;
    let parts: String = (0..5)
        .map(|i| format!("--b\r\nContent-Type: text/plain\r\n\r\npart {i}\r\n"))
        .collect();
    let complex = format!(
        "Message-ID: <complex@test>\r\nFrom: c@example.com\r\nSubject: many parts\r\n\
         MIME-Version: 1.0\r\nContent-Type: multipart/mixed; boundary=b\r\n\r\n{parts}--b--\r\n"
    );
    append(&u, "INBOX", complex.as_bytes()).await?;
    append(
        &u,
        "INBOX",
        &raw_mail("good2@test", "b@example.com", "good two", "2"),
    )
    .await?;
    let mut account = account("odd", &u, "secret");
    account.backfill = true;
    let mut cfg = config(vec![account]);
    cfg.mail_limits.max_parts = 3;
    let poller = poller(&db.pool, cfg);

    let report = poll(&poller).await;
    let a = &report.accounts[0];
    assert_eq!(a.failure, None, "{report:?}");
    assert_eq!(
        (
            a.counts.stored,
            a.counts.parse_errors,
            a.counts.too_large,
            a.counts.too_complex
        ),
        (3, 1, 1, 1),
        "{report:?}"
    );
    let r = rows(&db.pool, "odd").await?;
    let status: Vec<(i64, &str, bool)> = r
        .iter()
        .map(|r| (r.uid, r.status.as_str(), r.event_id.is_some()))
        .collect();
    assert_eq!(
        status,
        [
            (1, "stored", true),
            (2, "stored", true),
            (3, "skipped", false),
            (4, "skipped", false),
            (5, "stored", true)
        ]
    );
    assert!(r[1].parse_error.is_some());
    assert!(
        r[3].skip_reason
            .as_deref()
            .unwrap_or_default()
            .contains("mail limits"),
        "{:?}",
        r[3]
    );
    assert_eq!(outbox_count(&db.pool).await?, 3);
    assert_eq!(writing_transactions(&db.pool, "odd").await?.len(), 1);
    Ok(())
}

/// Makes every insert into the outbox fail with a serialization failure (a transient error)
/// until [`heal_outbox`].
async fn break_outbox(pool: &sqlx::PgPool) -> anyhow::Result<()> {
    sqlx::raw_sql(
        "CREATE FUNCTION refuse_outbox() RETURNS trigger LANGUAGE plpgsql AS $$ \
         BEGIN RAISE EXCEPTION 'the outbox refuses, for the test' USING ERRCODE = '40001'; END $$; \
         CREATE TRIGGER refuse_outbox BEFORE INSERT ON outbox \
         FOR EACH ROW EXECUTE FUNCTION refuse_outbox();",
    )
    .execute(pool)
    .await?;
    Ok(())
}

async fn heal_outbox(pool: &sqlx::PgPool) -> anyhow::Result<()> {
    sqlx::raw_sql("DROP TRIGGER refuse_outbox ON outbox; DROP FUNCTION refuse_outbox();")
        .execute(pool)
        .await?;
    Ok(())
}

#[tokio::test]
async fn a_batch_whose_write_fails_records_none_and_the_next_tick_records_each_once()
-> anyhow::Result<()> {
    let db = TestDb::create().await?;
    let u = user("batch-fail");
    for i in 0..4 {
        append(
            &u,
            "INBOX",
            &raw_mail(
                &format!("f{i}@test"),
                "a@example.com",
                &format!("n{i}"),
                "x",
            ),
        )
        .await?;
    }
    let mut account = account("fail", &u, "secret");
    account.backfill = true;
    let mut cfg = config(vec![account]);
    // A failure that is not the mail's fault is never held against it.
    cfg.max_message_attempts = 1;
    let poller = poller(&db.pool, cfg);
    break_outbox(&db.pool).await?;
    for _ in 0..3 {
        let report = poll(&poller).await;
        let failure = report.accounts[0].failure.clone().expect("the write fails");
        assert_eq!(
            failure.class(),
            worker_core::FailureClass::Transient,
            "{failure}"
        );
        assert!(
            failure.detail().contains("a batch of 4 messages"),
            "{failure}"
        );
        assert_eq!(report.accounts[0].counts, Default::default(), "{report:?}");
        // The rows were inserted by the statement before the outbox refused: none is left.
        assert!(rows(&db.pool, "fail").await?.is_empty());
        let last: i64 =
            sqlx::query_scalar("SELECT last_uid FROM imap_poll_state WHERE account = 'fail'")
                .fetch_one(&db.pool)
                .await?;
        assert_eq!(last, 0);
    }
    heal_outbox(&db.pool).await?;
    let report = poll(&poller).await;
    assert_eq!(report.accounts[0].failure, None, "{report:?}");
    assert_eq!(report.accounts[0].counts.stored, 4, "{report:?}");
    assert_eq!(poll(&poller).await.accounts[0].counts, Default::default());
    let r = rows(&db.pool, "fail").await?;
    assert!(r.iter().all(|r| r.status == "stored"), "{r:?}");
    assert_eq!(r.len(), 4);
    assert_eq!(outbox_count(&db.pool).await?, 4);
    Ok(())
}

#[tokio::test]
async fn a_row_the_database_refuses_is_found_and_held_against_its_mail_only() -> anyhow::Result<()>
{
    let db = TestDb::create().await?;
    let u = user("batch-refused");
    for subject in ["fine 1", "fine 2", "refused", "fine 3"] {
        let id = format!("{}@test", subject.replace(' ', ""));
        append(&u, "INBOX", &raw_mail(&id, "a@example.com", subject, "x")).await?;
    }
    let mut account = account("refused", &u, "secret");
    account.backfill = true;
    let mut cfg = config(vec![account]);
    cfg.max_message_attempts = 2;
    let poller = poller(&db.pool, cfg);
    // A row the database will not take (as a value past a column's bounds would be).
    sqlx::query(
        "ALTER TABLE inbound_emails ADD CONSTRAINT refused_for_the_test \
         CHECK (subject IS DISTINCT FROM 'refused')",
    )
    .execute(&db.pool)
    .await?;

    // The batch is refused; written again a mail at a time, the two before the refused one
    // are recorded, the refused one fails (a strike against it), the one after waits.
    let report = poll(&poller).await;
    let a = &report.accounts[0];
    assert_eq!(a.counts.stored, 2, "{report:?}");
    let failure = a.failure.clone().expect("the refused row fails the poll");
    assert_eq!(failure.reason(), "constraint-violation", "{failure}");
    assert!(failure.detail().contains("message UID 3"), "{failure}");
    assert_eq!(rows(&db.pool, "refused").await?.len(), 2);
    assert_eq!(outbox_count(&db.pool).await?, 2);

    // Its second strike: given up on, recorded skipped without its fields; the rest goes on.
    let report = poll(&poller).await;
    assert!(report.accounts[0].failure.is_some(), "{report:?}");
    let report = poll(&poller).await;
    let a = &report.accounts[0];
    assert_eq!(a.failure, None, "{report:?}");
    assert_eq!((a.counts.gave_up, a.counts.stored), (1, 1), "{report:?}");
    let r = rows(&db.pool, "refused").await?;
    let status: Vec<(i64, &str)> = r.iter().map(|r| (r.uid, r.status.as_str())).collect();
    assert_eq!(
        status,
        [(1, "stored"), (2, "stored"), (3, "skipped"), (4, "stored")]
    );
    assert_eq!(outbox_count(&db.pool).await?, 3, "one event a stored mail");
    Ok(())
}
