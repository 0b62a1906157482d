//! A password that is not ASCII signs in: IMAP LOGIN's quoted strings are 7-bit (RFC 3501),
//! so the poller sends such a password with AUTHENTICATE PLAIN, whose SASL message is UTF-8
//! (RFC 4616). Against a private Dovecot that knows one user with such a password.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

mod common;

use worker_testkit::{Dovecot, TestDb};

use common::{account, config, poll, poller, user};

const PASSWORD: &str = "pässwörd-€-日本";

#[tokio::test]
async fn a_password_with_non_ascii_characters_signs_in() -> anyhow::Result<()> {
    let db = TestDb::create().await?;
    let dir = tempfile::tempdir()?;
    let mut server = Dovecot::configure(dir.path())?;
    let name = user("umlaut");
    // Tried after the shared passdbs, which refuse this password (and go on to the next).
    server.add_setting(&format!(
        "passdb {{\n  driver = static\n  args = password={PASSWORD}\n  username_filter = {name}\n}}"
    ))?;
    server.start().await?;
    let mut signed = account("umlaut", &name, PASSWORD);
    signed.port = server.port;
    let mut wrong = account("umlaut-wrong", &name, "pässwörd-€-日");
    wrong.port = server.port;
    let report = poll(&poller(&db.pool, config(vec![signed, wrong]))).await;
    assert!(report.accounts[0].failure.is_none(), "{report:?}");
    let refused = report.accounts[1]
        .failure
        .as_ref()
        .expect("a wrong password");
    assert_eq!(refused.reason(), "imap-auth-failed", "{refused}");
    Ok(())
}
