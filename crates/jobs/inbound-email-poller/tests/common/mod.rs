//! Test support for the poller: mailboxes of their own on the local Dovecot, mail put in
//! over SMTP or IMAP APPEND, and a poller on a fresh database.

#![allow(dead_code)]
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

pub mod bounces;
pub mod hostile;
pub mod idling;
pub mod statements;

use std::time::Duration;

use futures::TryStreamExt;
use job_inbound_email_poller::{ImapAccount, InboundEmailPoller, PollReport, PollerConfig};
use lettre::message::Mailbox;
use lettre::{AsyncSmtpTransport, AsyncTransport, Message, Tokio1Executor};
use sqlx::PgPool;
use tokio::net::TcpStream;
use tokio_util::sync::CancellationToken;
use worker_core::WorkContext;

pub const BOUND: Duration = Duration::from_secs(20);

/// A user of its own: any name logs in with `secret` and starts with an empty mailbox.
pub fn user(prefix: &str) -> String {
    let id = uuid::Uuid::new_v4().simple().to_string();
    format!("{prefix}-{}", &id[..10])
}

pub fn host_port(addr: &str) -> (String, u16) {
    let (host, port) = addr.rsplit_once(':').unwrap_or((addr, "143"));
    (host.to_string(), port.parse().unwrap_or(143))
}

/// A plain-IMAP account on the local Dovecot.
pub fn account(name: &str, user: &str, password: &str) -> ImapAccount {
    let (host, port) = host_port(&worker_testkit::imap_addr());
    ImapAccount {
        name: name.into(),
        host,
        port,
        security: worker_core::TlsMode::Plain,
        username: user.into(),
        password: Some(worker_core::Secret::new(password)),
        password_file: None,
        auth: worker_mail_auth::AuthMethod::Password,
        oauth: None,
        idle_recheck: None,
        mailbox: "INBOX".into(),
        backfill: false,
        ca_file: None,
        allow_plaintext: false,
    }
}

pub fn config(accounts: Vec<ImapAccount>) -> PollerConfig {
    PollerConfig {
        accounts,
        connect_timeout: Duration::from_secs(10),
        message_timeout: Duration::from_secs(10),
        max_message_bytes: 100 * 1024,
        max_body_chars: 10_000,
        events_exchange: "events".into(),
        ..PollerConfig::default()
    }
}

pub fn poller(pool: &PgPool, config: PollerConfig) -> InboundEmailPoller {
    InboundEmailPoller::new(pool.clone(), config).expect("a valid poller config")
}

pub fn ctx() -> WorkContext {
    WorkContext::new("inbound-email-poller", CancellationToken::new())
}

/// One poll, bounded.
pub async fn poll(poller: &InboundEmailPoller) -> PollReport {
    tokio::time::timeout(BOUND, poller.poll(&ctx()))
        .await
        .expect("a poll ends within its bound")
}

/// Sends a mail over SMTP to `<user>@localhost`; returns its Message-ID (without brackets).
pub async fn send(user: &str, from: &str, subject: &str, body: &str) -> anyhow::Result<String> {
    let (host, port) = host_port(&worker_testkit::smtp_addr());
    let message_id = format!("{}@test.local", uuid::Uuid::new_v4().simple());
    let mail = Message::builder()
        .from(from.parse::<Mailbox>()?)
        .to(format!("{user}@localhost").parse::<Mailbox>()?)
        .subject(subject)
        .message_id(Some(format!("<{message_id}>")))
        .body(body.to_string())?;
    let smtp = AsyncSmtpTransport::<Tokio1Executor>::builder_dangerous(host)
        .port(port)
        .timeout(Some(Duration::from_secs(10)))
        .build();
    tokio::time::timeout(BOUND, smtp.send(mail)).await??;
    Ok(message_id)
}

async fn session(user: &str) -> anyhow::Result<async_imap::Session<TcpStream>> {
    session_at(&worker_testkit::imap_addr(), user).await
}

/// A plain-IMAP session as `user` (password `secret`) on the server at `addr`.
async fn session_at(addr: &str, user: &str) -> anyhow::Result<async_imap::Session<TcpStream>> {
    let stream = TcpStream::connect(addr).await?;
    let mut client = async_imap::Client::new(stream);
    let _greeting = client.read_response().await?;
    Ok(client.login(user, "secret").await.map_err(|(e, _)| e)?)
}

/// Appends raw bytes to a mailbox of `user` (the way to plant a malformed or huge mail).
pub async fn append(user: &str, mailbox: &str, raw: &[u8]) -> anyhow::Result<()> {
    append_at(&worker_testkit::imap_addr(), user, mailbox, raw).await
}

/// [`append`] on the IMAP server at `addr` (another server than the local Dovecot).
pub async fn append_at(addr: &str, user: &str, mailbox: &str, raw: &[u8]) -> anyhow::Result<()> {
    append_dated_at(addr, user, mailbox, raw, None).await
}

/// Appends the two odd mails a poll must get past: bytes with no header at all, then a
/// mail of 200 KiB (over the tests' size limit).
pub async fn append_garbage_and_big(user: &str) -> anyhow::Result<()> {
    append(
        user,
        "INBOX",
        b"\x01\x02\xff\xfe garbage, no header at all\r\n\x80\x81 \x00 more\r\n",
    )
    .await?;
    let big_body = "x".repeat(200 * 1024);
    append(
        user,
        "INBOX",
        &raw_mail("big@test", "big@example.com", "a big one", &big_body),
    )
    .await
}

/// Appends raw bytes to a mailbox of `user` with the INTERNALDATE `date`
/// (`01-Jan-2020 10:00:00 +0000`): mail that arrived then.
pub async fn append_dated(user: &str, mailbox: &str, raw: &[u8], date: &str) -> anyhow::Result<()> {
    append_dated_at(&worker_testkit::imap_addr(), user, mailbox, raw, Some(date)).await
}

/// [`append_dated`] on the IMAP server at `addr`; no `date`: the server's time of arrival.
pub async fn append_dated_at(
    addr: &str,
    user: &str,
    mailbox: &str,
    raw: &[u8],
    date: Option<&str>,
) -> anyhow::Result<()> {
    tokio::time::timeout(BOUND, async {
        let mut s = session_at(addr, user).await?;
        let date = date.map(|d| format!("\"{d}\""));
        s.append(mailbox, None, date.as_deref(), raw).await?;
        s.logout().await?;
        anyhow::Ok(())
    })
    .await?
}

/// Moves every message of `user`'s `from` to `to` (UID MOVE): they get new UIDs there.
pub async fn move_all(user: &str, from: &str, to: &str) -> anyhow::Result<()> {
    tokio::time::timeout(BOUND, async {
        let mut s = session(user).await?;
        s.select(from).await?;
        s.uid_mv("1:*", to).await?;
        s.logout().await?;
        anyhow::Ok(())
    })
    .await?
}

/// Runs plain IMAP commands as `user` (CREATE, DELETE ...).
pub async fn command(user: &str, command: &str) -> anyhow::Result<()> {
    command_at(&worker_testkit::imap_addr(), user, command).await
}

/// [`command`] on the IMAP server at `addr` (e.g. as Cyrus's admin `cyrus`).
pub async fn command_at(addr: &str, user: &str, command: &str) -> anyhow::Result<()> {
    tokio::time::timeout(BOUND, async {
        let mut s = session_at(addr, user).await?;
        s.run_command_and_check_ok(command).await?;
        s.logout().await?;
        anyhow::Ok(())
    })
    .await?
}

/// The mailbox's UIDVALIDITY and message count.
pub async fn examine(user: &str, mailbox: &str) -> anyhow::Result<(u32, u32)> {
    examine_at(&worker_testkit::imap_addr(), user, mailbox).await
}

/// [`examine`] on the IMAP server at `addr`.
pub async fn examine_at(addr: &str, user: &str, mailbox: &str) -> anyhow::Result<(u32, u32)> {
    tokio::time::timeout(BOUND, async {
        let mut s = session_at(addr, user).await?;
        let m = s.examine(mailbox).await?;
        let uids: Vec<_> = s
            .uid_fetch("1:*", "UID")
            .await?
            .try_collect()
            .await
            .unwrap_or_default();
        drop(uids);
        s.logout().await?;
        anyhow::Ok((m.uid_validity.unwrap_or(0), m.exists))
    })
    .await?
}

/// Waits (bounded) until `user`'s mailbox holds `n` messages.
pub async fn wait_for_messages(user: &str, mailbox: &str, n: u32) -> anyhow::Result<()> {
    let deadline = tokio::time::Instant::now() + BOUND;
    loop {
        let (_, exists) = examine(user, mailbox).await?;
        if exists >= n {
            return Ok(());
        }
        if tokio::time::Instant::now() > deadline {
            anyhow::bail!("{user}/{mailbox} holds {exists} messages, not {n}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A mail without a Message-ID (its identity is its content), as raw bytes.
pub fn raw_mail_without_id(from: &str, subject: &str, body: &str) -> Vec<u8> {
    format!(
        "From: {from}\r\nTo: someone@localhost\r\nSubject: {subject}\r\n\
         Date: Tue, 1 Dec 2026 10:00:00 +0000\r\n\r\n{body}\r\n"
    )
    .into_bytes()
}

/// A mail with headers, as raw bytes.
pub fn raw_mail(message_id: &str, from: &str, subject: &str, body: &str) -> Vec<u8> {
    format!(
        "Message-ID: <{message_id}>\r\nFrom: {from}\r\nTo: someone@localhost\r\nSubject: {subject}\r\n\
         Date: Tue, 1 Dec 2026 10:00:00 +0000\r\nMIME-Version: 1.0\r\n\
         Content-Type: text/plain; charset=utf-8\r\n\r\n{body}\r\n"
    )
    .into_bytes()
}

#[derive(Debug, sqlx::FromRow)]
pub struct Row {
    pub uid: i64,
    pub uidvalidity: i64,
    pub status: String,
    pub skip_reason: Option<String>,
    pub message_id: Option<String>,
    pub from_address: Option<String>,
    pub subject: Option<String>,
    pub text_body: Option<String>,
    pub raw_size: i64,
    pub parse_error: Option<String>,
    pub event_id: Option<uuid::Uuid>,
}

pub async fn rows(pool: &PgPool, account: &str) -> anyhow::Result<Vec<Row>> {
    Ok(sqlx::query_as(
        "SELECT uid, uidvalidity, status, skip_reason, message_id, from_address, subject, text_body, \
                raw_size, parse_error, event_id \
         FROM inbound_emails WHERE account = $1 ORDER BY uidvalidity, uid",
    )
    .bind(account)
    .fetch_all(pool)
    .await?)
}

pub async fn outbox_count(pool: &PgPool) -> anyhow::Result<i64> {
    Ok(sqlx::query_scalar("SELECT count(*) FROM outbox")
        .fetch_one(pool)
        .await?)
}
