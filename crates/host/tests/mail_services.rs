//! The local mail services work together: a mail sent over the local SMTP server can be read
//! over the local IMAP server, and the SMTP server answers chosen recipients with 4xx or 5xx.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

use futures::TryStreamExt;
use lettre::message::Mailbox;
use lettre::transport::smtp::AsyncSmtpTransport;
use lettre::{AsyncTransport, Message, Tokio1Executor};

fn smtp() -> AsyncSmtpTransport<Tokio1Executor> {
    let addr = worker_testkit::smtp_addr();
    let (host, port) = addr.rsplit_once(':').unwrap();
    AsyncSmtpTransport::<Tokio1Executor>::builder_dangerous(host)
        .port(port.parse().unwrap())
        .build()
}

fn mail(to: &str, subject: &str) -> Message {
    Message::builder()
        .from("tester@example.com".parse::<Mailbox>().unwrap())
        .to(to.parse::<Mailbox>().unwrap())
        .subject(subject)
        .body("hello over loopback".to_string())
        .unwrap()
}

#[tokio::test]
async fn a_mail_sent_over_smtp_is_read_over_imap() -> anyhow::Result<()> {
    let subject = format!("services check {}", uuid::Uuid::new_v4());
    smtp().send(mail("alice@localhost", &subject)).await?;

    let stream = tokio::net::TcpStream::connect(worker_testkit::imap_addr()).await?;
    let mut client = async_imap::Client::new(stream);
    let _greeting = client.read_response().await?;
    let mut session = client.login("alice", "secret").await.map_err(|(e, _)| e)?;
    session.select("INBOX").await?;
    let found = session.search(format!("SUBJECT \"{subject}\"")).await?;
    assert_eq!(found.len(), 1, "the mail is in alice's INBOX exactly once");
    let uid = found.iter().next().copied().unwrap();
    let fetched: Vec<_> = session
        .fetch(uid.to_string(), "RFC822")
        .await?
        .try_collect()
        .await?;
    let body = String::from_utf8_lossy(fetched[0].body().unwrap_or_default()).into_owned();
    assert!(body.contains(&subject));
    assert!(body.contains("hello over loopback"));
    session.logout().await?;
    Ok(())
}

#[tokio::test]
async fn chosen_recipients_get_a_4xx_or_a_5xx() -> anyhow::Result<()> {
    let transient = smtp()
        .send(mail("fail4xx-test@localhost", "x"))
        .await
        .unwrap_err();
    assert!(transient.is_transient(), "{transient}");
    let permanent = smtp()
        .send(mail("fail5xx-test@localhost", "x"))
        .await
        .unwrap_err();
    assert!(permanent.is_permanent(), "{permanent}");
    Ok(())
}
