//! A mailbox whose name is not ASCII is polled by the name as people write it: the poller
//! sends it in modified UTF-7 (RFC 3501 §5.1.3), as Dovecot requires.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

mod common;

use job_inbound_email_poller::ImapAccount;
use worker_testkit::TestDb;

use common::{account, append, command, config, poll, poller, raw_mail, user};

#[tokio::test]
async fn a_folder_named_with_accents_is_polled_by_its_written_name() -> anyhow::Result<()> {
    let db = TestDb::create().await?;
    let u = user("poll-utf7");
    command(&u, "CREATE \"Entw&APw-rfe\"").await?;
    let mail = raw_mail("utf7@test", "a@example.com", "im Ordner", "x");
    append(&u, "Entw&APw-rfe", &mail).await?;
    let account = ImapAccount {
        mailbox: "Entwürfe".into(),
        backfill: true,
        ..account("utf7", &u, "secret")
    };
    let report = poll(&poller(&db.pool, config(vec![account]))).await;
    assert_eq!(report.failed().count(), 0, "{report:?}");
    assert_eq!(report.accounts[0].counts.stored, 1, "{report:?}");
    Ok(())
}
