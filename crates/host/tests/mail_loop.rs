//! The mail loop, end to end, with the real `worker-host` binary on the real services: a mail
//! delivered over SMTP to an IMAP account the host polls is picked up by the inbound poller,
//! matched by the automation trigger, turned into a reply by the action executor and sent by
//! the outbound email consumer; the sender reads exactly one reply over IMAP.
//!
//! Each test runs its own host, with its own database, vhost, admin port and IMAP accounts
//! (unique names), and stops it with SIGTERM (exit 0). The tests run one at a time (the
//! machine is small and shared, and the 4xx test depends on timing), and every wait is
//! bounded.
//!
//! - `the_loop_replies_once_and_a_republished_event_sends_nothing_more`: one reply with
//!   `Re: <subject>` and In-Reply-To; the same `email.received` event published again by hand
//!   is dropped by the executor's guard; `/metrics` shows the counts the test produced.
//! - `a_4xx_parks_the_reply_which_arrives_once_when_the_server_recovers`
//! - `a_5xx_dead_letters_the_send_as_rejected_and_fails_the_email_row`
//! - `a_host_that_idles_on_its_mailbox_logs_no_slow_statement`: the idle lease's waits on the
//!   server stay under the slow-statement threshold, so that its warning means a slow statement
//!
//! A failed wait prints the tail of the host's log; `MAIL_LOOP_SHOW_LOG=1` prints the whole
//! log of every host when it stops.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

mod support;

use std::time::{Duration, Instant};

use anyhow::bail;
use lapin::options::{BasicGetOptions, BasicNackOptions};
use lapin::types::AMQPValue;
use lapin::{BasicProperties, Connection, ConnectionProperties};
use support::{
    Host, SERIAL, SmtpFailSwitch, base_settings, inbox, keep_outbox_copies, mail_account_settings,
    publish_confirmed, send_mail, short_id, write_automation,
};
use worker_testkit::{TestDb, TestVhost};

/// How long "nothing more arrives" is watched for.
const QUIET: Duration = Duration::from_secs(3);

// ---------------------------------------------------------------------------------------------
// The host
// ---------------------------------------------------------------------------------------------

impl Host {
    /// Starts the host on the test's database and vhost, polling the IMAP account `account`
    /// every second, with short retry tiers for email.send, and waits until `/readyz` is 200.
    async fn start(db: &TestDb, vhost: &TestVhost, account: &str) -> anyhow::Result<Self> {
        Self::launch("MAIL_LOOP_SHOW_LOG", |dir, port| {
            let automations = write_automation(dir)?;
            let mut settings = base_settings("mail-loop-test", &automations, db, vhost, port);
            settings.push_str(&mail_account_settings(account));
            settings.push_str(
                r#"
[jobs.email_send]
max_attempts = 10

[jobs.email_send.queue]
retry_tiers = ["1s", "2s"]
"#,
            );
            Ok(settings)
        })
        .await
    }
}

// ---------------------------------------------------------------------------------------------
// Mail
// ---------------------------------------------------------------------------------------------

/// The addresses of one test: the account the host polls and the sender of the ping, whose
/// mailbox receives the reply. Both unique, so no test sees another's mail.
struct Mailboxes {
    account: String,
    sender: String,
}

impl Mailboxes {
    fn new(prefix: &str) -> Self {
        let id = short_id();
        Self {
            account: format!("loop-{prefix}-{id}"),
            sender: format!("sender-{prefix}-{id}"),
        }
    }

    fn account_address(&self) -> String {
        format!("{}@localhost", self.account)
    }

    fn sender_address(&self) -> String {
        format!("{}@localhost", self.sender)
    }
}

/// Sends the ping from `from` to `to` over the local SMTP server; returns its Message-ID
/// (without angle brackets).
async fn send_ping(from: &str, to: &str, subject: &str) -> anyhow::Result<String> {
    send_mail(from, to, subject, "mail-loop.test").await
}

// ---------------------------------------------------------------------------------------------
// Database and broker
// ---------------------------------------------------------------------------------------------

/// The outbound email rows: (status, attempts, last_error, in_reply_to, to).
type EmailRow = (String, i32, Option<String>, Option<String>, Vec<String>);

async fn outbound_emails(db: &TestDb) -> anyhow::Result<Vec<EmailRow>> {
    Ok(sqlx::query_as(
        "SELECT status, attempts, last_error, in_reply_to, to_addresses \
         FROM outbound_emails ORDER BY created_at",
    )
    .fetch_all(&db.pool)
    .await?)
}

async fn count_rows(db: &TestDb, sql: &str) -> anyhow::Result<i64> {
    Ok(sqlx::query_scalar(sql).fetch_one(&db.pool).await?)
}

/// An outbox row as published: (message_id, message_type, content_type, exchange, body).
type OutboxRow = (String, Option<String>, Option<String>, String, Vec<u8>);

/// Publishes the `email.received` event of the outbox row a second time, by hand, to the
/// events exchange of the test's vhost, with the properties the outbox drain gives it. The
/// drain deleted the row once it was published: its copy is read ([`keep_outbox_copies`]).
async fn republish_email_received(db: &TestDb, vhost: &TestVhost) -> anyhow::Result<()> {
    let rows: Vec<OutboxRow> = sqlx::query_as(
        "SELECT message_id, message_type, content_type, exchange, body FROM outbox_copy \
         WHERE routing_key = 'email.received' ORDER BY id",
    )
    .fetch_all(&db.pool)
    .await?;
    let [(message_id, message_type, content_type, exchange, body)] = rows.as_slice() else {
        bail!(
            "expected one email.received outbox row, found {}",
            rows.len()
        );
    };
    assert_eq!(exchange, "events");
    let properties = BasicProperties::default()
        .with_delivery_mode(2)
        .with_message_id(message_id.as_str().into())
        .with_type(message_type.as_deref().unwrap_or("email.received").into())
        .with_content_type(content_type.as_deref().unwrap_or("application/json").into());
    publish_confirmed(
        vhost,
        "events",
        "email.received",
        &[(properties, body.as_slice())],
    )
    .await?;
    Ok(())
}

/// How a dead letter of email.send was seen: (reason, error), from the archive table when an
/// archiver took it there, else from the message in `email.send.dead` (left in place).
async fn email_send_dead_letter(
    db: &TestDb,
    channel: &lapin::Channel,
) -> anyhow::Result<Option<(String, String)>> {
    let archived: Option<(String, Option<String>)> = sqlx::query_as(
        "SELECT reason, last_error FROM dead_letters WHERE queue = 'email.send' ORDER BY id LIMIT 1",
    )
    .fetch_optional(&db.pool)
    .await?;
    if let Some((reason, error)) = archived {
        return Ok(Some((reason, error.unwrap_or_default())));
    }
    let Some(message) = channel
        .basic_get("email.send.dead".into(), BasicGetOptions { no_ack: false })
        .await?
    else {
        return Ok(None);
    };
    let delivery = message.delivery;
    let header = |key: &str| -> String {
        match delivery
            .properties
            .headers()
            .as_ref()
            .and_then(|h| h.inner().get(key))
        {
            Some(AMQPValue::LongString(s)) => s.to_string(),
            Some(AMQPValue::ShortString(s)) => s.to_string(),
            Some(other) => format!("{other:?}"),
            None => String::new(),
        }
    };
    let found = (header("x-dead-reason"), header("x-dead-error"));
    // Back where it was: the dead letter is for operators, not for this test to take.
    channel
        .basic_nack(
            delivery.delivery_tag,
            BasicNackOptions {
                multiple: false,
                requeue: true,
            },
        )
        .await?;
    Ok(Some(found))
}

// ---------------------------------------------------------------------------------------------
// The tests
// ---------------------------------------------------------------------------------------------

/// Checks the sender's INBOX holds exactly one mail, the reply to `subject` threaded on
/// `message_id`, now and after [`QUIET`].
async fn assert_one_reply(host: &Host, boxes: &Mailboxes, subject: &str, message_id: &str) {
    let sender = boxes.sender.as_str();
    let mails = host
        .wait_for("the reply in the sender's INBOX", || async move {
            let mails = inbox(sender).await?;
            Ok((!mails.is_empty()).then_some(mails))
        })
        .await;
    assert_eq!(mails.len(), 1, "exactly one reply: {mails:?}");
    let reply = &mails[0];
    assert_eq!(
        reply.subject.as_deref(),
        Some(format!("Re: {subject}").as_str())
    );
    assert_eq!(reply.in_reply_to, vec![message_id.to_string()], "{reply:?}");
    assert_eq!(reply.to, vec![boxes.sender_address()], "{reply:?}");

    tokio::time::sleep(QUIET).await;
    let mails = inbox(sender).await.unwrap();
    assert_eq!(mails.len(), 1, "still exactly one reply: {mails:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_loop_replies_once_and_a_republished_event_sends_nothing_more() -> anyhow::Result<()> {
    let _serial = SERIAL.lock().await;
    let started = Instant::now();
    let db = TestDb::create_empty().await?;
    let vhost = TestVhost::create().await?;
    let boxes = Mailboxes::new("ok");
    let host = Host::start(&db, &vhost, &boxes.account).await?;
    eprintln!("host ready after {:?}", started.elapsed());
    keep_outbox_copies(&db).await?;

    let subject = format!("ping from the loop test {}", short_id());
    let message_id = send_ping(&boxes.sender_address(), &boxes.account_address(), &subject).await?;
    let sent_at = Instant::now();
    assert_one_reply(&host, &boxes, &subject, &message_id).await;
    eprintln!(
        "reply read (and {QUIET:?} of quiet) {:?} after the ping",
        sent_at.elapsed()
    );

    // What the loop left in the database: one inbound mail, one execution, one sent email.
    let inbound: Vec<(Option<String>, Option<String>)> =
        sqlx::query_as("SELECT message_id, from_address FROM inbound_emails")
            .fetch_all(&db.pool)
            .await?;
    assert_eq!(
        inbound,
        vec![(Some(message_id.clone()), Some(boxes.sender_address()))]
    );
    let emails = outbound_emails(&db).await?;
    assert_eq!(emails.len(), 1, "{emails:?}");
    assert_eq!(emails[0].0, "sent", "{emails:?}");
    assert_eq!(emails[0].3.as_deref(), Some(message_id.as_str()));

    // Metrics: the three consumers each settled one delivery as succeeded, the poller ran.
    let host_ref = &host;
    let metrics = host
        .wait_for("the succeeded counts on /metrics", || async move {
            let m = host_ref.metrics().await?;
            let done = m.messages("automation-trigger", "succeeded") >= 1.0
                && m.messages("automation-action", "succeeded") >= 1.0
                && m.messages("email-send", "succeeded") >= 1.0;
            Ok(done.then_some(m))
        })
        .await;
    assert_eq!(metrics.messages("automation-trigger", "succeeded"), 1.0);
    assert_eq!(metrics.messages("automation-action", "succeeded"), 1.0);
    assert_eq!(metrics.messages("email-send", "succeeded"), 1.0);
    for job in ["automation-trigger", "automation-action", "email-send"] {
        for outcome in ["duplicate", "parked", "dead-lettered"] {
            assert_eq!(
                metrics.messages(job, outcome),
                0.0,
                "{job} {outcome}:\n{}",
                metrics.0
            );
        }
    }
    let ran = metrics.sum(
        "worker_ticks_total",
        &[("job", "inbound-email-poller"), ("outcome", "ran")],
    );
    assert!(ran > 0.0, "the poller's ticks:\n{}", metrics.0);

    // The same email.received event once more, by hand: the trigger matches it again, the
    // executor's guard drops the command, and no second reply goes out.
    republish_email_received(&db, &vhost).await?;
    host.wait_for(
        "the republished event handled (trigger 2 succeeded, executor 1 duplicate)",
        || async move {
            let m = host_ref.metrics().await?;
            Ok((m.messages("automation-trigger", "succeeded") >= 2.0
                && m.messages("automation-action", "duplicate") >= 1.0)
                .then_some(()))
        },
    )
    .await;
    tokio::time::sleep(QUIET).await;
    let mails = inbox(&boxes.sender).await?;
    assert_eq!(mails.len(), 1, "no second reply: {mails:?}");
    let metrics = host.metrics().await?;
    assert_eq!(metrics.messages("automation-trigger", "succeeded"), 2.0);
    assert_eq!(metrics.messages("automation-action", "succeeded"), 1.0);
    assert_eq!(metrics.messages("automation-action", "duplicate"), 1.0);
    assert_eq!(metrics.messages("email-send", "succeeded"), 1.0);
    assert_eq!(metrics.messages("email-send", "duplicate"), 0.0);
    assert_eq!(outbound_emails(&db).await?.len(), 1);
    assert_eq!(
        count_rows(&db, "SELECT count(*) FROM action_executions").await?,
        1
    );
    assert_eq!(
        count_rows(&db, "SELECT count(*) FROM automation_trigger_log").await?,
        2,
        "the duplicate event logs its match again"
    );
    // /status agrees with /metrics.
    assert_eq!(host.count("automation-trigger", "succeeded").await?, 2);
    assert_eq!(host.count("automation-action", "duplicate").await?, 1);
    assert_eq!(host.count("email-send", "succeeded").await?, 1);

    host.stop_cleanly().await;
    eprintln!("test done in {:?}", started.elapsed());
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_4xx_parks_the_reply_which_arrives_once_when_the_server_recovers() -> anyhow::Result<()> {
    let _serial = SERIAL.lock().await;
    let started = Instant::now();
    let db = TestDb::create_empty().await?;
    let vhost = TestVhost::create().await?;
    let boxes = Mailboxes::new("4xx");
    let switch = SmtpFailSwitch::set(&boxes.sender_address(), "451 4.3.0 try later")?;
    let host = Host::start(&db, &vhost, &boxes.account).await?;

    let subject = format!("ping while the server says later {}", short_id());
    let message_id = send_ping(&boxes.sender_address(), &boxes.account_address(), &subject).await?;
    let sent_at = Instant::now();

    // The send is refused with 451, tried again in process, then parked in a retry tier.
    let host_ref = &host;
    host.wait_for("email-send parked at least once", || async move {
        let parked = host_ref.count("email-send", "parked").await?;
        Ok((parked >= 1).then_some(()))
    })
    .await;
    eprintln!("parked {:?} after the ping", sent_at.elapsed());
    let metrics = host.metrics().await?;
    assert!(
        metrics.messages("email-send", "parked") >= 1.0,
        "{}",
        metrics.0
    );
    let emails = outbound_emails(&db).await?;
    assert_eq!(emails.len(), 1, "{emails:?}");
    let (status, attempts, last_error, _, _) = &emails[0];
    assert_eq!(status, "queued", "{emails:?}");
    assert!(*attempts >= 1, "{emails:?}");
    assert!(
        last_error.as_deref().unwrap_or_default().contains("451"),
        "the row keeps the server's answer: {emails:?}"
    );
    assert!(
        inbox(&boxes.sender).await?.is_empty(),
        "nothing delivered while refused"
    );

    // The server recovers: the next attempt out of the retry tier sends the reply, once.
    std::fs::remove_file(switch.path())?;
    drop(switch);
    let recovered_at = Instant::now();
    assert_one_reply(&host, &boxes, &subject, &message_id).await;
    eprintln!(
        "reply read (and {QUIET:?} of quiet) {:?} after the server recovered",
        recovered_at.elapsed()
    );

    let emails = outbound_emails(&db).await?;
    assert_eq!(emails.len(), 1, "{emails:?}");
    assert_eq!(emails[0].0, "sent", "{emails:?}");
    assert!(
        emails[0].1 >= 2,
        "a failed try and the one that worked: {emails:?}"
    );
    let metrics = host
        .wait_for("email-send succeeded on /metrics", || async move {
            let m = host_ref.metrics().await?;
            Ok((m.messages("email-send", "succeeded") >= 1.0).then_some(m))
        })
        .await;
    assert_eq!(metrics.messages("email-send", "succeeded"), 1.0);
    assert_eq!(metrics.messages("email-send", "dead-lettered"), 0.0);
    assert_eq!(vhost.queue_depth("email.send.dead").await?, 0);

    host.stop_cleanly().await;
    eprintln!("test done in {:?}", started.elapsed());
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_5xx_dead_letters_the_send_as_rejected_and_fails_the_email_row() -> anyhow::Result<()> {
    let _serial = SERIAL.lock().await;
    let started = Instant::now();
    let db = TestDb::create_empty().await?;
    let vhost = TestVhost::create().await?;
    let boxes = Mailboxes::new("5xx");
    let answer = "550 5.1.1 no such user";
    let _switch = SmtpFailSwitch::set(&boxes.sender_address(), answer)?;
    let host = Host::start(&db, &vhost, &boxes.account).await?;

    let subject = format!("ping to a sender who does not exist {}", short_id());
    send_ping(&boxes.sender_address(), &boxes.account_address(), &subject).await?;
    let sent_at = Instant::now();

    // The command is dead-lettered as `rejected`, with the server's answer.
    let connection =
        Connection::connect(&vhost.amqp_url(), ConnectionProperties::default()).await?;
    let channel = connection.create_channel().await?;
    let (db_ref, channel_ref) = (&db, &channel);
    let (reason, error) = host
        .wait_for("the email.send command dead-lettered", || async move {
            email_send_dead_letter(db_ref, channel_ref).await
        })
        .await;
    eprintln!("dead-lettered {:?} after the ping", sent_at.elapsed());
    assert_eq!(reason, "rejected", "error: {error}");
    assert!(error.contains(answer), "the dead letter's error: {error}");

    // The email row is `failed` with the server's answer.
    let emails = host
        .wait_for("the outbound email row failed", || async move {
            let emails = outbound_emails(db_ref).await?;
            Ok(emails.iter().any(|e| e.0 == "failed").then_some(emails))
        })
        .await;
    assert_eq!(emails.len(), 1, "{emails:?}");
    let (status, attempts, last_error, _, to) = &emails[0];
    assert_eq!(status, "failed");
    assert!(*attempts >= 1, "{emails:?}");
    assert_eq!(to, &vec![boxes.sender_address()]);
    assert!(
        last_error.as_deref().unwrap_or_default().contains(answer),
        "last_error keeps the server's answer: {emails:?}"
    );

    // Counted as dead-lettered `rejected`, never parked, never sent.
    let host_ref = &host;
    let metrics = host
        .wait_for("email-send dead-lettered on /metrics", || async move {
            let m = host_ref.metrics().await?;
            Ok((m.messages("email-send", "dead-lettered") >= 1.0).then_some(m))
        })
        .await;
    assert_eq!(
        metrics.sum(
            "worker_messages_total",
            &[
                ("job", "email-send"),
                ("outcome", "dead-lettered"),
                ("reason", "rejected"),
            ],
        ),
        1.0,
        "{}",
        metrics.0
    );
    assert_eq!(metrics.messages("email-send", "parked"), 0.0);
    assert_eq!(metrics.messages("email-send", "succeeded"), 0.0);
    assert_eq!(host.count("email-send", "dead_lettered").await?, 1);

    tokio::time::sleep(QUIET).await;
    let mails = inbox(&boxes.sender).await?;
    assert!(mails.is_empty(), "no reply arrives: {mails:?}");
    let _ = connection.close(200, "done".into()).await;

    host.stop_cleanly().await;
    eprintln!("test done in {:?}", started.elapsed());
    Ok(())
}

#[tokio::test]
async fn a_host_that_idles_on_its_mailbox_logs_no_slow_statement() -> anyhow::Result<()> {
    let _serial = SERIAL.lock().await;
    let db = TestDb::create_empty().await?;
    let vhost = TestVhost::create().await?;
    let boxes = Mailboxes::new("quiet");
    let host = Host::start(&db, &vhost, &boxes.account).await?;
    // Long enough for the idle lease's session to wait, and be checked, several times.
    tokio::time::sleep(Duration::from_secs(12)).await;
    let slow: Vec<String> = host
        .log_text()
        .lines()
        .filter(|line| line.contains("slow statement"))
        .map(str::to_string)
        .collect();
    host.stop_cleanly().await;
    assert!(
        slow.is_empty(),
        "an idle host with nothing slow warned of slow statements:\n{}",
        slow.join("\n")
    );
    Ok(())
}
