//! The sender against relays we did not write: Postfix (STARTTLS required on one port,
//! implicit TLS on another, SASL through Dovecot's auth: PLAIN and XOAUTH2) and Dovecot's
//! submission service, both relaying to the test kit's SMTP sink, which delivers to the
//! Maildirs Dovecot serves. Tokens come from the test kit's token endpoint, each test with a
//! client of its own, and are 2,000 characters long: too long for the AUTH line, so they go
//! after the server's 334.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

mod common;

use std::time::Duration;

use job_email_send::{EmailSender, SmtpSettings};
use worker_core::{ConsumerJob, Secret, TlsMode};
use worker_mail_auth::{AuthMethod, TokenSources};
use worker_testkit::TestDb;
use worker_testkit::oauth::{ClientSpec, OAuthClient};

use common::{command, ctx, eventually, queue, row};

fn addr(var: &str, default: &str) -> (String, u16) {
    let addr = std::env::var(var).unwrap_or_else(|_| default.into());
    let (host, port) = addr.rsplit_once(':').expect("host:port");
    (host.to_string(), port.parse().expect("a port"))
}

/// The relays: (name, address variable, default, security).
const POSTFIX_STARTTLS: (&str, &str, &str, TlsMode) = (
    "postfix starttls",
    "WH_TEST_POSTFIX_STARTTLS",
    "127.0.0.1:10587",
    TlsMode::Starttls,
);
const POSTFIX_TLS: (&str, &str, &str, TlsMode) = (
    "postfix tls",
    "WH_TEST_POSTFIX_TLS",
    "127.0.0.1:10465",
    TlsMode::Tls,
);
const DOVECOT_SUBMISSION: (&str, &str, &str, TlsMode) = (
    "dovecot submission",
    "WH_TEST_SUBMISSION",
    "127.0.0.1:10588",
    TlsMode::Plain,
);
const DOVECOT_STARTTLS: (&str, &str, &str, TlsMode) = (
    "dovecot submission starttls",
    "WH_TEST_SUBMISSION",
    "127.0.0.1:10588",
    TlsMode::Starttls,
);
const DOVECOT_TLS: (&str, &str, &str, TlsMode) = (
    "dovecot submission tls",
    "WH_TEST_SUBMISSION_TLS",
    "127.0.0.1:10466",
    TlsMode::Tls,
);

/// Every path runs against both relays, STARTTLS and TLS from the first byte.
const SECURED: [(&str, &str, &str, TlsMode); 4] =
    [POSTFIX_STARTTLS, POSTFIX_TLS, DOVECOT_STARTTLS, DOVECOT_TLS];

fn relay(
    (_, var, default, security): (&str, &str, &str, TlsMode),
    auth: AuthMethod,
) -> SmtpSettings {
    let (_, port) = addr(var, default);
    SmtpSettings {
        // The certificate names localhost and 127.0.0.1.
        host: "localhost".into(),
        port,
        security,
        ca_file: (security != TlsMode::Plain).then(worker_testkit::mail_ca),
        username: Some("wh-sender@localhost".into()),
        auth,
        oauth: auth.uses_token().then(|| "relay".to_string()),
        pool_size: 1,
        connect_timeout: Duration::from_secs(10),
        ..SmtpSettings::default()
    }
}

fn sources(client: &OAuthClient) -> TokenSources {
    client.sources("relay").unwrap()
}

/// How many mails the sink delivered to `local`'s Maildir.
fn delivered(local: &str) -> usize {
    let dir = worker_testkit::services_dir().join(format!("mail/{local}/Maildir/new"));
    std::fs::read_dir(dir).map(|d| d.count()).unwrap_or(0)
}

fn unique(prefix: &str) -> String {
    format!(
        "{prefix}-{}",
        &uuid::Uuid::new_v4().simple().to_string()[..10]
    )
}

/// Sends one mail through `settings` and waits until the sink has it.
async fn send_through(
    db: &TestDb,
    settings: &SmtpSettings,
    oauth: &TokenSources,
    what: &str,
) -> anyhow::Result<()> {
    let sender = EmailSender::signing_in_with(
        db.pool.clone(),
        settings,
        "wh-sender@localhost",
        Duration::from_secs(20),
        oauth,
    )?;
    let to = unique("relay");
    let id = queue(&db.pool, &format!("{to}@localhost"), what).await;
    sender
        .handle(&ctx(), &command(id))
        .await
        .map_err(|f| anyhow::anyhow!("{what}: {f}"))?;
    assert_eq!(row(&db.pool, id).await.0, "sent", "{what}");
    eventually(
        Duration::from_secs(10),
        &format!("{what}: delivered"),
        || {
            let to = to.clone();
            async move { delivered(&to) == 1 }
        },
    )
    .await;
    Ok(())
}

#[tokio::test]
async fn xoauth2_with_a_long_token_goes_through_both_relays_with_starttls_and_with_tls()
-> anyhow::Result<()> {
    let client = OAuthClient::register("relay-xoauth2", &ClientSpec::default()).await?;
    let oauth = sources(&client);
    let db = TestDb::create().await?;
    for relay_of in SECURED {
        let settings = relay(relay_of, AuthMethod::Xoauth2);
        send_through(&db, &settings, &oauth, relay_of.0).await?;
    }
    assert_eq!(client.stats().await?.token_requests, 1, "one token for all");
    Ok(())
}

#[tokio::test]
async fn plain_with_a_password_goes_through_both_relays_with_starttls_and_with_tls()
-> anyhow::Result<()> {
    let db = TestDb::create().await?;
    for relay_of in SECURED {
        let settings = SmtpSettings {
            username: Some("alice".into()),
            password: Some(Secret::new("secret")),
            ..relay(relay_of, AuthMethod::Password)
        };
        send_through(&db, &settings, &TokenSources::default(), relay_of.0).await?;
    }
    Ok(())
}

#[tokio::test]
async fn a_long_token_goes_through_dovecots_submission_with_xoauth2_and_oauthbearer()
-> anyhow::Result<()> {
    let client = OAuthClient::register("relay-submission", &ClientSpec::default()).await?;
    let oauth = sources(&client);
    let db = TestDb::create().await?;
    for auth in [AuthMethod::Xoauth2, AuthMethod::Oauthbearer] {
        let settings = relay(DOVECOT_SUBMISSION, auth);
        send_through(&db, &settings, &oauth, auth.mechanism()).await?;
    }
    Ok(())
}

#[tokio::test]
async fn a_refused_recipient_fails_the_mail_permanently_with_the_relays_answer()
-> anyhow::Result<()> {
    let client = OAuthClient::register("relay-refused", &ClientSpec::default()).await?;
    let oauth = sources(&client);
    let db = TestDb::create().await?;
    // Postfix refuses it itself; Dovecot's submission passes on the sink's refusal.
    for relay_of in [POSTFIX_STARTTLS, DOVECOT_STARTTLS] {
        let sender = EmailSender::signing_in_with(
            db.pool.clone(),
            &relay(relay_of, AuthMethod::Xoauth2),
            "wh-sender@localhost",
            Duration::from_secs(20),
            &oauth,
        )?;
        let id = queue(&db.pool, &format!("{}@localhost", unique("fail5xx")), "no").await;
        let failure = sender.handle(&ctx(), &command(id)).await.unwrap_err();
        assert!(failure.is_permanent(), "{}: {failure}", relay_of.0);
        assert!(
            failure.detail().contains("550"),
            "{}: {failure}",
            relay_of.0
        );
    }
    Ok(())
}

#[tokio::test]
async fn a_revoked_token_costs_one_refused_login_then_a_fresh_one_signs_in() -> anyhow::Result<()> {
    let client = OAuthClient::register("relay-revoked", &ClientSpec::default()).await?;
    let oauth = sources(&client);
    let db = TestDb::create().await?;
    let settings = relay(DOVECOT_SUBMISSION, AuthMethod::Xoauth2);
    send_through(&db, &settings, &oauth, "before the revocation").await?;
    client.revoke_all().await?;
    // A new sender (a new connection) with the same sources: the cached token is refused.
    send_through(&db, &settings, &oauth, "after the revocation").await?;
    assert_eq!(client.stats().await?.token_requests, 2);
    Ok(())
}

#[tokio::test]
async fn a_wrong_client_secret_parks_the_mail_and_says_so_without_a_dead_letter()
-> anyhow::Result<()> {
    let client = OAuthClient::register("relay-wrong", &ClientSpec::default()).await?;
    let mut wrong = client.clone();
    wrong.client_secret = "not-the-secret".into();
    let db = TestDb::create().await?;
    let sender = EmailSender::signing_in_with(
        db.pool.clone(),
        &relay(DOVECOT_SUBMISSION, AuthMethod::Xoauth2),
        "wh-sender@localhost",
        Duration::from_secs(20),
        &sources(&wrong),
    )?;
    let id = queue(&db.pool, &format!("{}@localhost", unique("wrong")), "x").await;
    let failure = sender.handle(&ctx(), &command(id)).await.unwrap_err();
    assert!(
        !failure.is_permanent(),
        "the relay's failure, not the mail's: {failure}"
    );
    assert!(failure.detail().contains("invalid_client"), "{failure}");
    assert!(!failure.detail().contains("not-the-secret"), "{failure}");
    Ok(())
}
