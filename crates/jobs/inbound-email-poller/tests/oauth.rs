//! Signing in with a token against the real Dovecot, whose `passdb oauth2` asks the test
//! kit's token endpoint whether a token is good for the login: XOAUTH2 and OAUTHBEARER read
//! the mail; a revoked token costs one refused login and a fresh one signs in; a token for a
//! mailbox the app may not open is refused with the server's own reason; and an IDLE session
//! signs in again each time its token is renewed, one token request each, without missing or
//! repeating a mail.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

mod common;

use std::time::Duration;

use common::idling::{Host, rows_reach};
use common::*;
use job_inbound_email_poller::{IdleConfig, ImapAccount, RecheckWith};
use worker_mail_auth::{AuthMethod, TokenSources};
use worker_testkit::TestDb;
use worker_testkit::oauth::{ClientSpec, OAuthClient};

fn sources(client: &OAuthClient) -> TokenSources {
    client.sources("m365").unwrap()
}

fn signed_with(name: &str, user: &str, auth: AuthMethod) -> ImapAccount {
    ImapAccount {
        username: format!("{user}@localhost"),
        password: None,
        auth,
        oauth: Some("m365".into()),
        ..account(name, user, "")
    }
}

#[tokio::test]
async fn xoauth2_and_oauthbearer_read_the_mail() -> anyhow::Result<()> {
    let client = OAuthClient::register("poll-oauth", &ClientSpec::default()).await?;
    let db = TestDb::create().await?;
    let u = user("poll-oauth");
    append(
        &u,
        "INBOX",
        &raw_mail("oauth@test", "a@example.com", "t", "x"),
    )
    .await?;
    let mut config = config(vec![
        signed_with("xoauth2", &u, AuthMethod::Xoauth2),
        signed_with("oauthbearer", &u, AuthMethod::Oauthbearer),
    ]);
    config.oauth = sources(&client);
    let report = poll(&poller(&db.pool, config)).await;
    assert_eq!(report.failed().count(), 0, "{report:?}");
    assert_eq!(report.accounts[0].counts.stored, 1, "{report:?}");
    assert_eq!(report.accounts[1].counts.stored, 1, "{report:?}");
    assert_eq!(
        client.stats().await?.token_requests,
        1,
        "one token for both"
    );
    Ok(())
}

#[tokio::test]
async fn a_revoked_token_costs_one_refused_login_then_a_fresh_one_signs_in() -> anyhow::Result<()> {
    let client = OAuthClient::register("poll-revoked", &ClientSpec::default()).await?;
    let db = TestDb::create().await?;
    let u = user("poll-revoked");
    let mut config = config(vec![signed_with("revoked", &u, AuthMethod::Xoauth2)]);
    config.oauth = sources(&client);
    let poller = poller(&db.pool, config);
    assert_eq!(poll(&poller).await.failed().count(), 0);
    client.revoke_all().await?;
    append(
        &u,
        "INBOX",
        &raw_mail("revoked@test", "a@example.com", "t", "x"),
    )
    .await?;
    let report = poll(&poller).await;
    assert_eq!(report.failed().count(), 0, "{report:?}");
    assert_eq!(report.accounts[0].counts.stored, 1, "{report:?}");
    assert_eq!(client.stats().await?.token_requests, 2);
    Ok(())
}

#[tokio::test]
async fn a_mailbox_the_app_may_not_open_is_refused_with_the_servers_reason() -> anyhow::Result<()> {
    let spec = ClientSpec {
        mailboxes: vec!["someone-else".into()],
        ..ClientSpec::default()
    };
    let client = OAuthClient::register("poll-denied", &spec).await?;
    let db = TestDb::create().await?;
    let u = user("poll-denied");
    let mut config = config(vec![signed_with("denied", &u, AuthMethod::Xoauth2)]);
    config.oauth = sources(&client);
    let report = poll(&poller(&db.pool, config)).await;
    let (_, failure) = report.failed().next().expect("refused");
    assert_eq!(failure.reason(), "imap-auth-failed", "{failure}");
    assert!(
        failure.detail().contains("the server's challenge"),
        "the challenge's JSON is kept: {failure}"
    );
    assert_eq!(
        client.stats().await?.token_requests,
        2,
        "one retry with a fresh token, no more"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_session_signs_in_again_as_its_token_is_renewed_and_misses_no_mail()
-> anyhow::Result<()> {
    // 6 s tokens are renewed 2 s before they expire: every 4 s.
    let spec = ClientSpec {
        lifetime: 6,
        ..ClientSpec::default()
    };
    let client = OAuthClient::register("idle-oauth", &spec).await?;
    let db = TestDb::create().await?;
    let u = user("idle-oauth");
    let mut config = config(vec![signed_with("idle", &u, AuthMethod::Xoauth2)]);
    config.oauth = sources(&client);
    config.idle = IdleConfig {
        recheck: Some(Duration::from_millis(100)),
        recheck_with: RecheckWith::Noop,
        lease_retry: Duration::from_millis(200),
        reconnect_max: Duration::from_secs(1),
        ..IdleConfig::default()
    };
    // Run as the host runs it: the ticks its wakes ask for (the first poll, each reconnect's)
    // and the fetches on its IDLE sessions, across the sign-ins again.
    let host = Host::start(poller(&db.pool, config), &db);

    for i in 0..5 {
        tokio::time::sleep(Duration::from_millis(2500)).await;
        let subject = format!("across the renewals {i}");
        let id = format!("idle-oauth-{i}@test");
        append(&u, "INBOX", &raw_mail(&id, "a@example.com", &subject, "x")).await?;
        let stored = rows_reach(&db.pool, "idle", i + 1).await?;
        assert_eq!(stored.len(), i + 1, "mail {i} stored");
    }
    let ticks = host.ticks.lock().unwrap().clone();
    assert!(ticks.iter().all(|r| r.failed().count() == 0), "{ticks:?}");
    let stored = host.poller.stats().account("idle").unwrap().stored;
    host.end().await;
    assert_eq!(stored, 5, "each mail stored once");
    assert_eq!(rows(&db.pool, "idle").await?.len(), 5);
    assert_eq!(outbox_count(&db.pool).await?, 5);
    let requests = client.stats().await?.token_requests;
    // 12.5 s of renewals every 4 s: 3 or 4 tokens (the polls share them), not one per poll.
    assert!((3..=5).contains(&requests), "{requests} token requests");
    Ok(())
}
