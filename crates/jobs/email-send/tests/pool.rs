//! The SMTP connection pool never hands out a connection whose last command was cut off: a
//! late answer is never read as the answer to another mail. On a private SMTP sink.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use worker_core::ConsumerJob;
use worker_testkit::{SmtpSink, TestDb};

use common::{command, ctx, queue, row, sender_for};

#[tokio::test]
async fn a_late_answer_is_never_read_as_the_next_mails_answer() -> anyhow::Result<()> {
    let db = TestDb::create().await?;
    let sink = SmtpSink::start()?;
    // The first mail's end of DATA is answered 6 s late; every send gives up after 3 s.
    sink.delay_answer("slow@localhost", Duration::from_secs(6))?;
    let job = sender_for(&db.pool, &sink, 1, Duration::from_secs(3));

    let slow = queue(&db.pool, "slow@localhost", "slow").await;
    let err = job.handle(&ctx(), &command(slow)).await.unwrap_err();
    assert!(err.is_unknown(), "cut off after the final dot: {err}");
    assert!(err.detail().contains("3s"), "{err}");
    assert_eq!(row(&db.pool, slow).await.0, "unknown");

    // The late answer arrives meanwhile, into whatever connection is still open.
    tokio::time::sleep(Duration::from_secs(4)).await;

    let mut seen = Vec::new();
    for name in ["next1", "next2", "next3", "next4"] {
        let address = format!("{name}@localhost");
        let id = queue(&db.pool, &address, name).await;
        let outcome = job.handle(&ctx(), &command(id)).await;
        let (status, _, last_error, answer) = row(&db.pool, id).await;
        seen.push((name, address, status, answer, last_error, outcome));
    }
    for (name, address, status, answer, last_error, outcome) in &seen {
        assert_eq!(
            (status.as_str(), answer.as_deref()),
            (
                "sent",
                Some(format!("250 OK delivered to {address}").as_str())
            ),
            "{name}: {outcome:?}, last_error {last_error:?}; all: {seen:#?}"
        );
        assert_eq!(sink.delivered(name).len(), 1, "{name}: one mail");
    }
    assert_eq!(
        sink.delivered("slow").len(),
        1,
        "the slow mail went out once"
    );
    Ok(())
}

/// Twenty mails one after another over one pooled connection: each is a few round trips on
/// loopback. With Nagle's algorithm on, the final "." of every mail waited for the body's
/// acknowledgement, which Linux delays by 40 ms: 20 mails took at least 800 ms. The bound
/// here is half of that, far above what the round trips cost.
#[tokio::test]
async fn mails_over_one_connection_do_not_wait_for_delayed_acknowledgements() -> anyhow::Result<()>
{
    let db = TestDb::create().await?;
    let sink = SmtpSink::start()?;
    let job = sender_for(&db.pool, &sink, 1, Duration::from_secs(10));
    let mut ids = Vec::new();
    for i in 0..21 {
        ids.push(queue(&db.pool, &format!("quick{i}@localhost"), "quick").await);
    }
    // The first opens the connection; the twenty after it reuse it.
    job.handle(&ctx(), &command(ids[0])).await.unwrap();
    let started = std::time::Instant::now();
    for id in &ids[1..] {
        job.handle(&ctx(), &command(*id)).await.unwrap();
    }
    let took = started.elapsed();
    assert!(
        took < Duration::from_millis(400),
        "20 mails over one connection took {took:?}: the final dot waits for an acknowledgement"
    );
    Ok(())
}

/// A bare SMTP server for the pool's tests: it answers every command, counts the NOOPs and
/// connections it had, and drops a connection after each mail's answer when told to (as a
/// server that closes idle clients would, seen from a client that has not used it since).
struct Scripted {
    port: u16,
    noops: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    connections: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    drop_after_mail: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl Scripted {
    async fn start() -> anyhow::Result<Self> {
        use std::sync::atomic::Ordering;
        use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let port = listener.local_addr()?.port();
        let server = Self {
            port,
            noops: Default::default(),
            connections: Default::default(),
            drop_after_mail: Default::default(),
        };
        let (noops, connections, drop_after_mail) = (
            server.noops.clone(),
            server.connections.clone(),
            server.drop_after_mail.clone(),
        );
        tokio::spawn(async move {
            while let Ok((socket, _)) = listener.accept().await {
                connections.fetch_add(1, Ordering::SeqCst);
                let (noops, drop_after_mail) = (noops.clone(), drop_after_mail.clone());
                tokio::spawn(async move {
                    let (read, mut write) = socket.into_split();
                    let mut lines = BufReader::new(read).lines();
                    write.write_all(b"220 scripted ESMTP\r\n").await?;
                    let mut in_data = false;
                    while let Some(line) = lines.next_line().await? {
                        let answer: &[u8] = if in_data {
                            if line != "." {
                                continue;
                            }
                            in_data = false;
                            write.write_all(b"250 OK queued\r\n").await?;
                            if drop_after_mail.load(Ordering::SeqCst) {
                                return anyhow::Ok(());
                            }
                            continue;
                        } else {
                            let verb = line.get(..4).unwrap_or("").to_ascii_uppercase();
                            match verb.as_str() {
                                "EHLO" => b"250-scripted\r\n250 8BITMIME\r\n",
                                "NOOP" => {
                                    noops.fetch_add(1, Ordering::SeqCst);
                                    b"250 OK\r\n"
                                }
                                "DATA" => {
                                    in_data = true;
                                    b"354 go ahead\r\n"
                                }
                                "QUIT" => b"221 bye\r\n",
                                _ => b"250 OK\r\n",
                            }
                        };
                        write.write_all(answer).await?;
                    }
                    anyhow::Ok(())
                });
            }
        });
        Ok(server)
    }

    fn sender(&self, pool: &sqlx::PgPool) -> job_email_send::EmailSender {
        let smtp = job_email_send::SmtpSettings {
            host: "127.0.0.1".into(),
            port: self.port,
            security: worker_core::TlsMode::Plain,
            pool_size: 1,
            connect_timeout: Duration::from_secs(5),
            ..job_email_send::SmtpSettings::default()
        };
        job_email_send::EmailSender::new(
            pool.clone(),
            &smtp,
            "Worker Host <worker-host@localhost>",
            Duration::from_secs(10),
        )
        .unwrap()
    }
}

/// Mails a moment apart reuse the pooled connection as it is: no NOOP before each (issue 41:
/// it was a round trip on every mail).
#[tokio::test]
async fn a_connection_used_a_moment_ago_is_reused_without_a_noop() -> anyhow::Result<()> {
    use std::sync::atomic::Ordering;
    let db = TestDb::create().await?;
    let server = Scripted::start().await?;
    let job = server.sender(&db.pool);
    for i in 0..5 {
        let id = queue(&db.pool, &format!("soon{i}@localhost"), "soon").await;
        job.handle(&ctx(), &command(id)).await.unwrap();
        assert_eq!(row(&db.pool, id).await.0, "sent");
    }
    assert_eq!(
        server.connections.load(Ordering::SeqCst),
        1,
        "one connection"
    );
    assert_eq!(
        server.noops.load(Ordering::SeqCst),
        0,
        "a NOOP before a connection used a moment ago"
    );
    Ok(())
}

/// The server drops the connection after each mail, unseen by the pool until its next use:
/// each next mail, sent on it without a NOOP, fails before its final "." and is sent once
/// more on a new connection, with no attempt charged.
#[tokio::test]
async fn a_mail_on_a_reused_connection_the_server_dropped_goes_out_on_a_new_one()
-> anyhow::Result<()> {
    use std::sync::atomic::Ordering;
    let db = TestDb::create().await?;
    let server = Scripted::start().await?;
    server.drop_after_mail.store(true, Ordering::SeqCst);
    let job = server.sender(&db.pool);
    for i in 0..3 {
        let id = queue(&db.pool, &format!("dropped{i}@localhost"), "dropped").await;
        let outcome = job.handle(&ctx(), &command(id)).await;
        let (status, attempts, last_error, _) = row(&db.pool, id).await;
        assert_eq!(
            status, "sent",
            "mail {i}: {outcome:?}, attempts {attempts}, last error {last_error:?}"
        );
    }
    assert_eq!(
        server.connections.load(Ordering::SeqCst),
        3,
        "a new connection for each mail after the first"
    );
    Ok(())
}
