//! `worker-host mail-auth test` against the real Dovecot, Postfix and token endpoint: a good
//! setting prints each step and exits 0; a wrong secret and a mailbox the app may not open
//! each exit 69 naming why; neither the token nor the secret is ever printed.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

use std::process::Command;

use worker_testkit::oauth::{ClientSpec, OAuthClient};

fn settings(client: &OAuthClient, secret: &str, mailbox: &str) -> String {
    let smtp =
        std::env::var("WH_TEST_POSTFIX_STARTTLS").unwrap_or_else(|_| "127.0.0.1:10587".into());
    let port = smtp.rsplit_once(':').unwrap().1;
    format!(
        r#"
[database]
password = "x"
[broker]
password = "x"
[smtp]
host = "localhost"
port = {port}
security = "starttls"
ca_file = {ca:?}
username = "{mailbox}@localhost"
auth = "xoauth2"
oauth = "app"
[[imap.accounts]]
name = "support"
username = "{mailbox}@localhost"
auth = "xoauth2"
oauth = "app"
[oauth.app]
flow = "client_credentials"
token_url = {url:?}
scope = "https://outlook.office365.com/.default"
client_id = {id:?}
client_secret = {secret:?}
"#,
        ca = worker_testkit::mail_ca(),
        url = client.token_url(),
        id = client.client_id,
    )
}

fn mail_auth_test(text: &str, target: &str) -> (i32, String) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("worker-host.toml");
    std::fs::write(&path, text).unwrap();
    let output = Command::new(env!("CARGO_BIN_EXE_worker-host"))
        .args(["mail-auth", "test", target, "--config"])
        .arg(&path)
        .env_remove("WORKER_HOST_CONFIG")
        .env("RUST_LOG", "off")
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    (output.status.code().unwrap_or(-1), text)
}

#[tokio::test]
async fn a_good_setting_signs_in_over_imap_and_smtp_printing_each_step() -> anyhow::Result<()> {
    let spec = ClientSpec {
        mailboxes: vec!["mailauth-ok".into()],
        ..ClientSpec::default()
    };
    let client = OAuthClient::register("mail-auth-ok", &spec).await?;
    let text = settings(&client, &client.client_secret, "mailauth-ok");
    for target in ["support", "smtp"] {
        let (code, out) = mail_auth_test(&text, target);
        assert_eq!(code, 0, "{target}: {out}");
        assert!(out.contains("token    ok: 2000 characters"), "{out}");
        assert!(out.contains("sign in  ok: signed in"), "{out}");
        assert!(out.contains("XOAUTH2"), "{out}");
        assert!(out.contains("result: ok"), "{out}");
        assert!(!out.contains(&client.client_secret), "no secret: {out}");
    }
    Ok(())
}

#[tokio::test]
async fn a_wrong_secret_and_a_mailbox_the_app_may_not_open_exit_69_naming_why() -> anyhow::Result<()>
{
    let spec = ClientSpec {
        mailboxes: vec!["mailauth-allowed".into()],
        ..ClientSpec::default()
    };
    let client = OAuthClient::register("mail-auth-bad", &spec).await?;
    let (code, out) = mail_auth_test(
        &settings(&client, "not-the-secret", "mailauth-allowed"),
        "support",
    );
    assert_eq!(code, 69, "{out}");
    assert!(out.contains("token    FAILED"), "{out}");
    assert!(out.contains("invalid_client"), "{out}");
    assert!(out.contains("[permanent"), "{out}");
    assert!(out.contains("sign in  skipped"), "{out}");
    assert!(!out.contains("not-the-secret"), "{out}");

    let (code, out) = mail_auth_test(
        &settings(&client, &client.client_secret, "mailauth-denied"),
        "support",
    );
    assert_eq!(code, 69, "{out}");
    assert!(out.contains("token    ok"), "{out}");
    assert!(out.contains("sign in  FAILED: imap-auth-failed"), "{out}");
    assert!(out.contains("the server's challenge"), "{out}");
    Ok(())
}
