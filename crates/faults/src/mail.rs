//! The workload's mail: pings sent over SMTP to the polled account, and the replies read back
//! over IMAP from the sender's mailbox (read-only, headers only), as the host's own tests do
//! (`crates/host/tests/support/mod.rs`).

use std::time::{Duration, Instant};

use anyhow::Context;
use futures::TryStreamExt;
use lettre::message::Mailbox;
use lettre::transport::smtp::AsyncSmtpTransport;
use lettre::{AsyncTransport, Message, Tokio1Executor};

/// The mailboxes of one scenario: the account the host polls and the sender of the pings,
/// whose mailbox receives the replies. Unique names, so no scenario sees another's mail.
#[derive(Debug, Clone)]
pub struct Mailboxes {
    pub account: String,
    pub sender: String,
    /// Where the direct commands' mails go (see `direct.rs`), apart from the replies.
    pub direct: String,
}

impl Mailboxes {
    pub fn new(scenario: &str) -> Self {
        let id = &uuid::Uuid::new_v4().simple().to_string()[..8];
        Self {
            account: format!("faults-{scenario}-{id}"),
            sender: format!("pinger-{scenario}-{id}"),
            direct: format!("direct-{scenario}-{id}"),
        }
    }
}

/// Sends pings from the sender to the account over the local SMTP server.
#[derive(Debug, Clone)]
pub struct Pinger {
    smtp: AsyncSmtpTransport<Tokio1Executor>,
    from: Mailbox,
    to: Mailbox,
    label: String,
}

impl Pinger {
    pub fn new(boxes: &Mailboxes, label: &str) -> anyhow::Result<Self> {
        let addr = worker_testkit::smtp_addr();
        let (host, port) = addr.rsplit_once(':').context("WH_TEST_SMTP is host:port")?;
        let smtp = AsyncSmtpTransport::<Tokio1Executor>::builder_dangerous(host)
            .port(port.parse()?)
            .timeout(Some(Duration::from_secs(20)))
            .build();
        Ok(Self {
            smtp,
            from: format!("{}@localhost", boxes.sender).parse()?,
            to: format!("{}@localhost", boxes.account).parse()?,
            label: label.to_string(),
        })
    }

    /// Sends one ping (three tries); returns its Message-ID without angle brackets.
    pub async fn ping(&self, n: u64) -> anyhow::Result<String> {
        let message_id = format!("ping-{}@faults.test", uuid::Uuid::new_v4().simple());
        let mut last = None;
        for _ in 0..3 {
            let mail = Message::builder()
                .from(self.from.clone())
                .to(self.to.clone())
                .subject(format!("ping {} #{n}", self.label))
                .message_id(Some(format!("<{message_id}>")))
                .body("are you there?".to_string())?;
            match self.smtp.send(mail).await {
                Ok(_) => return Ok(message_id),
                Err(err) => last = Some(err),
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        Err(last
            .map(anyhow::Error::from)
            .unwrap_or_else(|| anyhow::anyhow!("no try")))
    }

    /// Sends `count` pings at `rate` a second (numbered from `first`); returns the Message-IDs
    /// the server accepted and the errors of those it did not.
    pub async fn steady(&self, first: u64, count: u64, rate: f64) -> (Vec<String>, Vec<String>) {
        let start = Instant::now();
        let mut sent = Vec::new();
        let mut errors = Vec::new();
        for i in 0..count {
            let due = start + Duration::from_secs_f64(i as f64 / rate);
            tokio::time::sleep_until(due.into()).await;
            match self.ping(first + i).await {
                Ok(id) => sent.push(id),
                Err(err) => errors.push(format!("{err:#}")),
            }
        }
        (sent, errors)
    }
}

async fn session(user: &str) -> anyhow::Result<async_imap::Session<tokio::net::TcpStream>> {
    let stream = tokio::net::TcpStream::connect(worker_testkit::imap_addr()).await?;
    let mut client = async_imap::Client::new(stream);
    let _greeting = client.read_response().await?;
    let mut session = client.login(user, "secret").await.map_err(|(err, _)| err)?;
    session.examine("INBOX").await?;
    Ok(session)
}

/// How many mails `user`'s INBOX holds.
pub async fn inbox_count(user: &str) -> anyhow::Result<usize> {
    tokio::time::timeout(Duration::from_secs(30), async {
        let mut session = session(user).await?;
        let n = session.search("ALL").await?.len();
        session.logout().await?;
        anyhow::Ok(n)
    })
    .await
    .with_context(|| format!("counting {user}'s INBOX timed out"))?
}

/// The In-Reply-To ids of every mail in `user`'s INBOX (headers only, read-only).
pub async fn replies(user: &str) -> anyhow::Result<Vec<Vec<String>>> {
    header_ids(user, "IN-REPLY-TO", in_reply_to).await
}

/// The Message-ID of every mail in `user`'s INBOX (headers only, read-only), without angle
/// brackets; a mail without one gives an empty list.
pub async fn message_ids(user: &str) -> anyhow::Result<Vec<Vec<String>>> {
    header_ids(user, "MESSAGE-ID", message_id).await
}

/// One header `field` of every mail in `user`'s INBOX, read by `ids` (read-only).
async fn header_ids(
    user: &str,
    field: &str,
    ids: fn(&[u8]) -> Vec<String>,
) -> anyhow::Result<Vec<Vec<String>>> {
    tokio::time::timeout(Duration::from_secs(120), async {
        let mut session = session(user).await?;
        let mut out = Vec::new();
        if !session.search("ALL").await?.is_empty() {
            let fetched: Vec<_> = session
                .fetch("1:*", format!("BODY.PEEK[HEADER.FIELDS ({field})]"))
                .await?
                .try_collect()
                .await?;
            out.extend(
                fetched
                    .iter()
                    .map(|mail| ids(mail.header().unwrap_or_default())),
            );
        }
        session.logout().await?;
        anyhow::Ok(out)
    })
    .await
    .with_context(|| format!("reading {user}'s INBOX timed out"))?
}

/// The Message-ID a header block gives, as a list of zero or one id.
fn message_id(header: &[u8]) -> Vec<String> {
    mail_parser::MessageParser::default()
        .parse_headers(header)
        .and_then(|message| message.message_id().map(str::to_string))
        .into_iter()
        .collect()
}

/// The message ids an In-Reply-To header block names.
fn in_reply_to(header: &[u8]) -> Vec<String> {
    let Some(message) = mail_parser::MessageParser::default().parse_headers(header) else {
        return Vec::new();
    };
    match message.in_reply_to() {
        mail_parser::HeaderValue::Text(id) => vec![id.to_string()],
        mail_parser::HeaderValue::TextList(ids) => ids.iter().map(|id| id.to_string()).collect(),
        _ => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn in_reply_to_is_read_without_brackets_and_folded_lines() {
        assert_eq!(
            in_reply_to(b"In-Reply-To: <ping-1@faults.test>\r\n\r\n"),
            vec!["ping-1@faults.test".to_string()]
        );
        assert_eq!(
            in_reply_to(b"In-Reply-To:\r\n <ping-2@faults.test>\r\n\r\n"),
            vec!["ping-2@faults.test".to_string()]
        );
        assert!(in_reply_to(b"\r\n").is_empty());
    }

    #[test]
    fn message_id_is_read_without_brackets() {
        assert_eq!(
            message_id(b"Message-ID: <direct-1@faults.test>\r\n\r\n"),
            vec!["direct-1@faults.test".to_string()]
        );
        assert!(message_id(b"\r\n").is_empty());
    }
}
