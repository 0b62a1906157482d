//! `ENVID` where the relay offers DSN (RFC 3461), never where it does not: Postfix (which
//! offers it) gets each mail's Message-ID as its envelope id and gives it back in its own
//! report (`Original-Envelope-Id`), which the poller links by; the test kit's SMTP sink (which
//! does not, and refuses a MAIL FROM parameter it does not know) takes the mail as before.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

mod common;

use std::time::Duration;

use job_email_send::{EmailSender, SmtpSettings};
use worker_core::{ConsumerJob, Secret, TlsMode};
use worker_mail_auth::{AuthMethod, TokenSources};
use worker_testkit::TestDb;

use common::{command, ctx, eventually, queue, row};

fn unique(prefix: &str) -> String {
    format!(
        "{prefix}-{}",
        &uuid::Uuid::new_v4().simple().to_string()[..10]
    )
}

/// The mails the sink delivered to `local`'s Maildir, as text.
fn mailbox(local: &str) -> Vec<String> {
    let dir = worker_testkit::services_dir().join(format!("mail/{local}/Maildir/new"));
    std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .filter_map(|e| std::fs::read_to_string(e.ok()?.path()).ok())
                .collect()
        })
        .unwrap_or_default()
}

#[tokio::test]
async fn a_relay_offering_dsn_gets_the_message_id_as_envid_and_reports_it_back()
-> anyhow::Result<()> {
    let db = TestDb::create().await?;
    let sender_box = unique("dsn-sender");
    let from = format!("{sender_box}@localhost");
    let addr = std::env::var("WH_TEST_POSTFIX_STARTTLS").unwrap_or("127.0.0.1:10587".into());
    let (_, port) = addr.rsplit_once(':').unwrap();
    let settings = SmtpSettings {
        // The certificate names localhost and 127.0.0.1.
        host: "localhost".into(),
        port: port.parse()?,
        security: TlsMode::Starttls,
        ca_file: Some(worker_testkit::mail_ca()),
        username: Some(from.clone()),
        password: Some(Secret::new("secret")),
        auth: AuthMethod::Password,
        pool_size: 1,
        connect_timeout: Duration::from_secs(10),
        ..SmtpSettings::default()
    };
    let sender = EmailSender::signing_in_with(
        db.pool.clone(),
        &settings,
        &from,
        Duration::from_secs(20),
        &TokenSources::default(),
    )?;
    // Postfix takes mail for bounce.test, then bounces it itself, to the sender.
    let id = queue(&db.pool, &format!("{}@bounce.test", unique("ann")), "dsn").await;
    sender.handle(&ctx(), &command(id)).await.unwrap();
    assert_eq!(row(&db.pool, id).await.0, "sent");

    eventually(
        Duration::from_secs(20),
        "Postfix's report delivered",
        || {
            let sender_box = sender_box.clone();
            async move { !mailbox(&sender_box).is_empty() }
        },
    )
    .await;
    let report = mailbox(&sender_box).remove(0);
    assert!(
        report.contains(&format!("Original-Envelope-Id: {id}@worker-host")),
        "{report}"
    );
    Ok(())
}

#[tokio::test]
async fn a_relay_without_dsn_gets_no_envid_and_takes_the_mail() -> anyhow::Result<()> {
    let db = TestDb::create().await?;
    let addr = worker_testkit::smtp_addr();
    let (host, port) = addr.rsplit_once(':').unwrap();
    let settings = SmtpSettings {
        host: host.into(),
        port: port.parse()?,
        security: TlsMode::Plain,
        pool_size: 1,
        connect_timeout: Duration::from_secs(10),
        ..SmtpSettings::default()
    };
    let sender = EmailSender::new(
        db.pool.clone(),
        &settings,
        "worker-host@localhost",
        Duration::from_secs(20),
    )?;
    let to = unique("plain");
    let id = queue(&db.pool, &format!("{to}@localhost"), "no dsn").await;
    sender.handle(&ctx(), &command(id)).await.unwrap();
    // The sink refuses MAIL FROM parameters it does not know (555): sent means none went.
    assert_eq!(row(&db.pool, id).await.0, "sent");
    assert_eq!(mailbox(&to).len(), 1);
    Ok(())
}
