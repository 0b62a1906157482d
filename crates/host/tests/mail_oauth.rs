//! The mail loop with OAuth2 on both sides, with the real `worker-host` binary: the host
//! polls (and idles on) a Dovecot account signing in with AUTHENTICATE XOAUTH2, and sends its
//! replies through Postfix (STARTTLS, the test kit's CA) with AUTH XOAUTH2, each with a
//! token source of its own at the test kit's token endpoint, whose tokens are 2,000
//! characters and short-lived.
//!
//! Pings go in one after another while the tokens expire and are renewed under the IDLE
//! session and the SMTP pool: each is answered exactly once, none is missed across the
//! reconnects, and each source asks for about one token per renewal, not one per poll.
//! `OAUTH_LOOP_TOKEN_SECS` (default 20) and `OAUTH_LOOP_SECS` (default 50) set the tokens'
//! lifetime and how long pings go in; the issue's run is `OAUTH_LOOP_TOKEN_SECS=90
//! OAUTH_LOOP_SECS=300` (docs/MAIL-SERVERS.md has its figures).

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

mod support;

use std::time::{Duration, Instant};

use support::{Host, SERIAL, base_settings, inbox, send_mail, short_id, write_automation};
use worker_testkit::oauth::{ClientSpec, OAuthClient};
use worker_testkit::{TestDb, TestVhost};

fn env_secs(name: &str, default: u64) -> Duration {
    Duration::from_secs(
        std::env::var(name)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(default),
    )
}

fn postfix_starttls() -> (String, u16) {
    let addr =
        std::env::var("WH_TEST_POSTFIX_STARTTLS").unwrap_or_else(|_| "127.0.0.1:10587".into());
    let (host, port) = addr.rsplit_once(':').expect("host:port");
    (host.to_string(), port.parse().expect("a port"))
}

/// The settings of a host whose IMAP account and SMTP server both sign in with XOAUTH2.
fn oauth_settings(account: &str, imap: &OAuthClient, smtp: &OAuthClient) -> String {
    let (smtp_host, smtp_port) = postfix_starttls();
    let source = |name: &str, client: &OAuthClient| {
        format!(
            "[oauth.{name}]\nflow = \"client_credentials\"\ntoken_url = {:?}\nscope = \"https://outlook.office365.com/.default\"\nclient_id = {:?}\nclient_secret = {:?}\n",
            client.token_url(),
            client.client_id,
            client.client_secret
        )
    };
    format!(
        r#"
[[imap.accounts]]
name = "loop"
username = "{account}@localhost"
auth = "xoauth2"
oauth = "imap"

[smtp]
host = {smtp_host:?}
port = {smtp_port}
security = "starttls"
ca_file = {ca:?}
username = "worker-host@localhost"
auth = "xoauth2"
oauth = "smtp"

[jobs.inbound_email_poller]
schedule = "every 10s"

{imap_source}
{smtp_source}
"#,
        ca = worker_testkit::mail_ca(),
        imap_source = source("imap", imap),
        smtp_source = source("smtp", smtp),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pings_are_answered_once_each_while_the_tokens_expire_on_both_sides() -> anyhow::Result<()>
{
    let _serial = SERIAL.lock().await;
    let lifetime = env_secs("OAUTH_LOOP_TOKEN_SECS", 20);
    let span = env_secs("OAUTH_LOOP_SECS", 50);
    let spec = ClientSpec {
        lifetime: lifetime.as_secs(),
        ..ClientSpec::default()
    };
    let imap = OAuthClient::register("loop-imap", &spec).await?;
    let smtp = OAuthClient::register("loop-smtp", &spec).await?;
    let db = TestDb::create_empty().await?;
    let vhost = TestVhost::create().await?;
    let id = short_id();
    let account = format!("oauth-loop-{id}");
    let host = Host::launch("MAIL_LOOP_SHOW_LOG", |dir, port| {
        let automations = write_automation(dir)?;
        let mut settings = base_settings("oauth-loop-test", &automations, &db, &vhost, port);
        settings.push_str(&oauth_settings(&account, &imap, &smtp));
        Ok(settings)
    })
    .await?;

    let started = Instant::now();
    // A sender per ping: the reply limit allows one address 10 replies an hour.
    let mut senders = Vec::new();
    while started.elapsed() < span {
        let sender = format!("oauth-sender-{id}-{}", senders.len());
        let subject = format!("oauth ping {} {id}", senders.len());
        send_mail(
            &format!("{sender}@localhost"),
            &format!("{account}@localhost"),
            &subject,
            "oauth-loop.test",
        )
        .await?;
        let sender_ref = sender.as_str();
        host.wait_for(&format!("the reply to {subject}"), || async move {
            Ok((!inbox(sender_ref).await?.is_empty()).then_some(()))
        })
        .await;
        senders.push((sender, subject));
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    for (sender, subject) in &senders {
        let replies = inbox(sender).await?;
        let subjects: Vec<Option<String>> = replies.iter().map(|m| m.subject.clone()).collect();
        assert_eq!(
            subjects,
            vec![Some(format!("Re: {subject}"))],
            "exactly one reply"
        );
    }

    // One token per renewal (a third of the lifetime before expiry), and one more at most for
    // a session that signed in just before a renewal: not one per poll or per mail.
    let renewals = span.as_secs_f64() / (lifetime.as_secs_f64() * 2.0 / 3.0);
    let most = renewals.ceil() as u64 + 2;
    for (side, client) in [("imap", &imap), ("smtp", &smtp)] {
        let stats = client.stats().await?;
        eprintln!(
            "{side}: {} token requests over {:?} of {:?} tokens ({} pings)",
            stats.token_requests,
            started.elapsed(),
            lifetime,
            senders.len()
        );
        assert!(
            stats.token_requests >= 2 && stats.token_requests <= most,
            "{side}: {} token requests, expected 2..={most}",
            stats.token_requests
        );
        assert_eq!(stats.refused, 0, "{side}: no token was refused");
        let metrics = host.metrics().await?;
        let requests = metrics.sum("worker_oauth_token_requests_total", &[("source", side)]);
        assert_eq!(
            requests as u64, stats.token_requests,
            "{side}: /metrics agrees"
        );
        let failing = metrics.sum("worker_oauth_token_failing", &[("source", side)]);
        assert_eq!(failing, 0.0, "{side}: not failing");
    }
    host.stop_cleanly().await;
    Ok(())
}
