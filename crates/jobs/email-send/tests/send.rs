//! The outbound email consumer, one command at a time, on a real database and the local SMTP
//! and IMAP servers.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::type_complexity)]

use std::time::Duration;

use futures::TryStreamExt;
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;
use worker_core::{ConsumerJob, FailureClass, Handled, WorkContext, execute_once};
use worker_messages::EmailSendCommand;
use worker_testkit::TestDb;

use job_email_send::{EmailSender, GUARD_SCOPE, JOB_NAME, SmtpSettings};

fn ctx() -> WorkContext {
    WorkContext::new(JOB_NAME, CancellationToken::new())
}

fn smtp() -> SmtpSettings {
    let addr = worker_testkit::smtp_addr();
    let (host, port) = addr.rsplit_once(':').unwrap();
    SmtpSettings {
        host: host.into(),
        port: port.parse().unwrap(),
        security: worker_core::TlsMode::Plain,
        pool_size: 2,
        ..SmtpSettings::default()
    }
}

fn sender(pool: &PgPool) -> EmailSender {
    EmailSender::new(
        pool.clone(),
        &smtp(),
        "Worker Host <worker-host@localhost>",
        Duration::from_secs(30),
    )
    .unwrap()
}

/// Queues a reply to `to`, as the action executor would; returns (email id, Message-ID).
async fn queue(pool: &PgPool, to: &str, subject: &str) -> (Uuid, String) {
    let id = Uuid::new_v4();
    let message_id = format!("{id}@worker-host");
    sqlx::query(
        "INSERT INTO outbound_emails (id, message_id, to_addresses, subject, text_body, html_body, \
             in_reply_to, reference_ids) \
         VALUES ($1, $2, $3, $4, 'pong', '<p>pong</p>', $5, $6)",
    )
    .bind(id)
    .bind(&message_id)
    .bind(vec![to.to_string()])
    .bind(subject)
    .bind(format!("orig-{id}@example.com"))
    .bind(vec![
        "root@example.com".to_string(),
        format!("orig-{id}@example.com"),
    ])
    .execute(pool)
    .await
    .unwrap();
    (id, message_id)
}

async fn row(pool: &PgPool, id: Uuid) -> (String, i32, Option<String>, Option<String>, bool) {
    sqlx::query_as(
        "SELECT status, attempts, last_error, smtp_response, sent_at IS NOT NULL \
         FROM outbound_emails WHERE id = $1",
    )
    .bind(id)
    .fetch_one(pool)
    .await
    .unwrap()
}

async fn marked(pool: &PgPool, id: Uuid) -> bool {
    sqlx::query_scalar("SELECT count(*) = 1 FROM processed_messages WHERE scope = $1 AND id = $2")
        .bind(GUARD_SCOPE)
        .bind(id.to_string())
        .fetch_one(pool)
        .await
        .unwrap()
}

/// The raw mails in `user`'s INBOX whose Message-ID is `message_id`.
async fn inbox(user: &str, message_id: &str) -> Vec<Vec<u8>> {
    let stream = tokio::net::TcpStream::connect(worker_testkit::imap_addr())
        .await
        .unwrap();
    let mut client = async_imap::Client::new(stream);
    let _greeting = client.read_response().await.unwrap();
    let mut session = client
        .login(user, "secret")
        .await
        .map_err(|(e, _)| e)
        .unwrap();
    session.select("INBOX").await.unwrap();
    let found = session
        .search(format!("HEADER Message-ID \"<{message_id}>\""))
        .await
        .unwrap();
    let mut mails = Vec::new();
    for seq in found {
        let fetched: Vec<_> = session
            .fetch(seq.to_string(), "RFC822")
            .await
            .unwrap()
            .try_collect()
            .await
            .unwrap();
        mails.extend(fetched.iter().filter_map(|f| f.body().map(<[u8]>::to_vec)));
    }
    session.logout().await.unwrap();
    mails
}

#[tokio::test]
async fn a_mail_to_alice_is_sent_and_readable_over_imap_with_its_headers() -> anyhow::Result<()> {
    let db = TestDb::create().await?;
    let subject = format!("Re: ping {}", Uuid::new_v4());
    let (id, message_id) = queue(&db.pool, "alice@localhost", &subject).await;
    let body = serde_json::to_vec(&EmailSendCommand {
        outbound_email_id: id,
    })?;

    assert_eq!(
        execute_once(&sender(&db.pool), &ctx(), &body).await?,
        Handled::Done
    );

    let (status, attempts, last_error, response, sent_at) = row(&db.pool, id).await;
    assert_eq!(
        (status.as_str(), attempts, last_error, sent_at),
        ("sent", 1, None, true)
    );
    assert!(
        response.unwrap().starts_with("250"),
        "the server's answer is kept"
    );
    assert!(marked(&db.pool, id).await);

    let mails = inbox("alice", &message_id).await;
    assert_eq!(mails.len(), 1, "exactly one mail with that Message-ID");
    let mail = mail_parser::MessageParser::default()
        .parse(&mails[0])
        .unwrap();
    assert_eq!(mail.subject(), Some(subject.as_str()));
    assert_eq!(mail.message_id(), Some(message_id.as_str()));
    assert_eq!(
        mail.in_reply_to().as_text(),
        Some(format!("orig-{id}@example.com").as_str())
    );
    let references: Vec<&str> = mail
        .references()
        .as_text_list()
        .unwrap_or_default()
        .iter()
        .map(|r| r.as_ref())
        .collect();
    assert_eq!(
        references,
        [
            "root@example.com",
            format!("orig-{id}@example.com").as_str()
        ]
    );
    assert_eq!(
        mail.header_raw("Auto-Submitted").map(str::trim),
        Some("auto-replied")
    );
    assert_eq!(mail.body_text(0).as_deref().map(str::trim), Some("pong"));
    assert!(
        mail.body_html(0)
            .is_some_and(|html| html.contains("<p>pong</p>"))
    );
    assert_eq!(
        mail.from()
            .and_then(|f| f.first())
            .and_then(|a| a.address()),
        Some("worker-host@localhost")
    );
    Ok(())
}

#[tokio::test]
async fn a_duplicate_command_sends_nothing_the_second_time() -> anyhow::Result<()> {
    let db = TestDb::create().await?;
    let (id, message_id) = queue(
        &db.pool,
        "alice@localhost",
        &format!("dup {}", Uuid::new_v4()),
    )
    .await;
    let job = sender(&db.pool);
    let command = EmailSendCommand {
        outbound_email_id: id,
    };
    assert_eq!(job.handle(&ctx(), &command).await?, Handled::Done);
    assert_eq!(job.handle(&ctx(), &command).await?, Handled::Duplicate);

    // Concurrent duplicates of a fresh mail: one claims and sends, the other finds the fresh
    // claim and backs off (transient), and once the first recorded, it is a duplicate. The
    // SMTP server holds its answer back a second, so that the send is still in flight when
    // the duplicate comes.
    let slow = format!("dup2-{}", &Uuid::new_v4().simple().to_string()[..12]);
    let delay = worker_testkit::services_dir()
        .join("smtp-delay")
        .join(format!("{slow}@localhost"));
    std::fs::create_dir_all(delay.parent().unwrap())?;
    std::fs::write(&delay, "1\n")?;
    let (other, other_message_id) = queue(
        &db.pool,
        &format!("{slow}@localhost"),
        &format!("dup2 {}", Uuid::new_v4()),
    )
    .await;
    let command2 = EmailSendCommand {
        outbound_email_id: other,
    };
    let (c1, c2) = (ctx(), ctx());
    let (a, b) = tokio::join!(job.handle(&c1, &command2), job.handle(&c2, &command2));
    let (done, backed_off) = match (a, b) {
        (Ok(done), Err(backed_off)) | (Err(backed_off), Ok(done)) => (done, backed_off),
        other => panic!("one sends, one backs off: {other:?}"),
    };
    assert_eq!(done, Handled::Done);
    assert_eq!(backed_off.class(), FailureClass::Transient, "{backed_off}");
    assert!(
        backed_off.detail().contains("being sent by another worker"),
        "{backed_off}"
    );
    assert_eq!(job.handle(&ctx(), &command2).await?, Handled::Duplicate);

    let _ = std::fs::remove_file(&delay);
    assert_eq!(inbox("alice", &message_id).await.len(), 1);
    assert_eq!(inbox(&slow, &other_message_id).await.len(), 1);
    assert_eq!(row(&db.pool, id).await.1, 1, "one try counted");
    Ok(())
}

#[tokio::test]
async fn a_4xx_recipient_is_transient_and_the_mail_stays_queued() -> anyhow::Result<()> {
    let db = TestDb::create().await?;
    let (id, _) = queue(&db.pool, "fail4xx-later@localhost", "x").await;
    let err = sender(&db.pool)
        .handle(
            &ctx(),
            &EmailSendCommand {
                outbound_email_id: id,
            },
        )
        .await
        .unwrap_err();
    assert_eq!(err.class(), FailureClass::Transient, "{err}");
    assert!(err.detail().contains("451"), "{err}");
    let (status, attempts, last_error, _, _) = row(&db.pool, id).await;
    assert_eq!((status.as_str(), attempts), ("queued", 1));
    assert!(last_error.unwrap().contains("451 4.3.0 try later"));
    assert!(
        !marked(&db.pool, id).await,
        "no mark before the server accepts"
    );
    Ok(())
}

#[tokio::test]
async fn a_5xx_recipient_is_permanent_and_the_row_fails_with_the_answer() -> anyhow::Result<()> {
    let db = TestDb::create().await?;
    let (id, _) = queue(&db.pool, "fail5xx-never@localhost", "x").await;
    let err = sender(&db.pool)
        .handle(
            &ctx(),
            &EmailSendCommand {
                outbound_email_id: id,
            },
        )
        .await
        .unwrap_err();
    assert_eq!(
        (err.class(), err.reason()),
        (FailureClass::Permanent, "smtp-5xx")
    );
    assert_eq!(err.detail(), "550 5.1.1 no such user");
    let (status, attempts, last_error, _, sent_at) = row(&db.pool, id).await;
    assert_eq!((status.as_str(), attempts, sent_at), ("failed", 1, false));
    assert_eq!(last_error.as_deref(), Some("550 5.1.1 no such user"));
    assert!(!marked(&db.pool, id).await);
    Ok(())
}

/// Removes the SMTP failure switch when dropped, even if the test fails.
struct Switch(std::path::PathBuf);

impl Drop for Switch {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

#[tokio::test]
async fn a_server_answering_4xx_for_a_while_gets_the_mail_once_it_recovers() -> anyhow::Result<()> {
    let db = TestDb::create().await?;
    let address = format!("switch-{}@localhost", Uuid::new_v4().simple());
    let dir = worker_testkit::services_dir().join("smtp-fail");
    std::fs::create_dir_all(&dir)?;
    let switch = Switch(dir.join(&address));
    std::fs::write(&switch.0, "421 4.7.0 try again later\n")?;

    let (id, _) = queue(&db.pool, &address, "switch").await;
    let job = sender(&db.pool);
    let command = EmailSendCommand {
        outbound_email_id: id,
    };
    let err = job.handle(&ctx(), &command).await.unwrap_err();
    assert_eq!(err.class(), FailureClass::Transient, "{err}");

    drop(switch);
    assert_eq!(
        job.handle(&ctx().with_attempt(2), &command).await?,
        Handled::Done
    );
    let (status, attempts, last_error, _, _) = row(&db.pool, id).await;
    assert_eq!((status.as_str(), attempts, last_error), ("sent", 2, None));
    Ok(())
}

#[tokio::test]
async fn no_server_is_transient() -> anyhow::Result<()> {
    let db = TestDb::create().await?;
    let closed = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await?
        .local_addr()?;
    let config = SmtpSettings {
        port: closed.port(),
        ..smtp()
    };
    let job = EmailSender::new(
        db.pool.clone(),
        &config,
        "wh@localhost",
        Duration::from_secs(5),
    )?;
    let (id, _) = queue(&db.pool, "alice@localhost", "x").await;
    let err = job
        .handle(
            &ctx(),
            &EmailSendCommand {
                outbound_email_id: id,
            },
        )
        .await
        .unwrap_err();
    assert_eq!(err.class(), FailureClass::Transient, "{err}");
    assert_eq!(row(&db.pool, id).await.0, "queued");
    Ok(())
}

#[tokio::test]
async fn a_server_that_never_answers_is_cut_off_by_the_send_timeout() -> anyhow::Result<()> {
    let db = TestDb::create().await?;
    // Accepts connections and says nothing, not even the greeting.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let port = listener.local_addr()?.port();
    let server = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((socket, _)) = listener.accept().await {
            held.push(socket);
        }
    });
    let config = SmtpSettings {
        port,
        connect_timeout: Duration::from_secs(60),
        ..smtp()
    };
    let job = EmailSender::new(
        db.pool.clone(),
        &config,
        "wh@localhost",
        Duration::from_millis(300),
    )?;
    let (id, _) = queue(&db.pool, "alice@localhost", "x").await;

    let started = tokio::time::Instant::now();
    let err = job
        .handle(
            &ctx(),
            &EmailSendCommand {
                outbound_email_id: id,
            },
        )
        .await
        .unwrap_err();
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(err.class(), FailureClass::Transient, "{err}");
    assert!(
        err.detail().contains("did not finish within 300ms"),
        "{err}"
    );
    server.abort();
    Ok(())
}

#[tokio::test]
async fn a_bad_address_or_an_unknown_email_is_permanent() -> anyhow::Result<()> {
    let db = TestDb::create().await?;
    let (id, _) = queue(&db.pool, "not an address", "x").await;
    let job = sender(&db.pool);
    let err = job
        .handle(
            &ctx(),
            &EmailSendCommand {
                outbound_email_id: id,
            },
        )
        .await
        .unwrap_err();
    assert_eq!(err.reason(), "bad-address", "{err}");
    assert_eq!(row(&db.pool, id).await.0, "failed");

    let err = job
        .handle(
            &ctx(),
            &EmailSendCommand {
                outbound_email_id: Uuid::new_v4(),
            },
        )
        .await
        .unwrap_err();
    assert_eq!(err.reason(), "unknown-email");
    Ok(())
}

#[tokio::test]
async fn bad_settings_are_refused_at_construction() {
    let pool = sqlx::PgPool::connect_lazy("postgres://x@127.0.0.1/x").unwrap();
    let err =
        EmailSender::new(pool.clone(), &smtp(), "no at sign", Duration::from_secs(1)).unwrap_err();
    assert!(err.to_string().contains("not a sender address"), "{err}");
    let no_password = SmtpSettings {
        username: Some("u".into()),
        ..smtp()
    };
    assert!(EmailSender::new(pool.clone(), &no_password, "a@b", Duration::from_secs(1)).is_err());
    let empty = SmtpSettings {
        pool_size: 0,
        ..smtp()
    };
    assert!(EmailSender::new(pool, &empty, "a@b", Duration::from_secs(1)).is_err());
}

#[tokio::test]
async fn tls_modes_and_credentials_are_used_when_connecting() -> anyhow::Result<()> {
    // The local sink speaks plain SMTP, offers no STARTTLS and no AUTH without TLS: each mode
    // fails the way its handshake does, which shows the connection went through it.
    let db = TestDb::create().await?;
    let attempt = |config: SmtpSettings| {
        let pool = db.pool.clone();
        async move {
            let (id, _) = queue(&pool, "alice@localhost", "tls").await;
            let job = EmailSender::new(
                pool.clone(),
                &config,
                "wh@localhost",
                Duration::from_secs(5),
            )
            .unwrap();
            let err = job
                .handle(
                    &ctx(),
                    &EmailSendCommand {
                        outbound_email_id: id,
                    },
                )
                .await
                .unwrap_err();
            (err, row(&pool, id).await.0)
        }
    };

    let (err, status) = attempt(SmtpSettings {
        security: worker_core::TlsMode::Starttls,
        ..smtp()
    })
    .await;
    assert_eq!(err.reason(), "smtp-client", "{err}");
    assert!(err.detail().contains("STARTTLS"), "{err}");
    assert_eq!(status, "failed");

    let (err, status) = attempt(SmtpSettings {
        username: Some("wh".into()),
        password: Some(worker_core::Secret::new("secret")),
        ..smtp()
    })
    .await;
    assert_eq!(err.reason(), "smtp-client", "{err}");
    assert!(err.detail().contains("authentication"), "{err}");
    assert_eq!(status, "failed");

    let (err, status) = attempt(SmtpSettings {
        security: worker_core::TlsMode::Tls,
        ..smtp()
    })
    .await;
    assert_eq!(
        err.class(),
        FailureClass::Transient,
        "a TLS handshake failure: {err}"
    );
    assert_eq!(status, "queued");
    Ok(())
}
