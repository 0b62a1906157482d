//! Claim, send, record: no database connection is held while the SMTP server takes its
//! time, a lost database session costs no second mail, no answer after the final "." is an
//! unknown outcome tried once, and a duplicate backs off while the first is sending. On a
//! private SMTP sink that holds back its answers, the real database and, where the test is
//! about a whole delivery, the real consumer runner on RabbitMQ.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use sqlx::Connection;
use sqlx::postgres::PgPoolOptions;
use worker_core::{ConsumerJob, FailureClass, Handled};
use worker_testkit::{SmtpSink, TestDb};

use common::{Delivery, command, ctx, eventually, queue, row, sender_for};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_database_connection_is_held_while_the_server_takes_its_time() -> anyhow::Result<()> {
    let db = TestDb::create().await?;
    let sink = SmtpSink::start()?;
    sink.delay_answer("slow@localhost", Duration::from_secs(5))?;
    // A small pool: two connections, a short wait for one.
    let pool = PgPoolOptions::new()
        .max_connections(2)
        .acquire_timeout(Duration::from_secs(3))
        .connect(&db.url)
        .await?;
    let job = sender_for(&pool, &sink, 8, Duration::from_secs(20));
    let mut ids = Vec::new();
    for i in 0..8 {
        ids.push(queue(&db.pool, "slow@localhost", &format!("slow {i}")).await);
    }

    let sends = futures::future::join_all(ids.iter().map(|&id| {
        let job = job.clone();
        async move { job.handle(&ctx(), &command(id)).await }
    }));
    let probes = async {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let mut took = Vec::new();
        for _ in 0..6 {
            let started = tokio::time::Instant::now();
            let probe = tokio::time::timeout(
                Duration::from_secs(2),
                sqlx::query("SELECT 1").execute(&pool),
            )
            .await;
            took.push((probe.map(|r| r.map(|_| ())), started.elapsed()));
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        took
    };
    let (outcomes, probes) = tokio::join!(sends, probes);

    for (probe, took) in &probes {
        assert!(
            matches!(probe, Ok(Ok(()))),
            "a query on the same pool during the sends: {probe:?} after {took:?}; all: {probes:?}"
        );
    }
    for outcome in &outcomes {
        assert!(
            matches!(outcome, Ok(Handled::Done)),
            "every send: {outcomes:?}"
        );
    }
    for &id in &ids {
        assert_eq!(row(&db.pool, id).await.0, "sent");
    }
    assert_eq!(sink.delivered("slow").len(), 8);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_session_lost_during_data_costs_no_second_mail() -> anyhow::Result<()> {
    let db = TestDb::create().await?;
    let sink = SmtpSink::start()?;
    sink.delay_answer("lost@localhost", Duration::from_secs(3))?;
    let job = sender_for(&db.pool, &sink, 2, Duration::from_secs(20));
    let delivery =
        Delivery::start(job, 3, Duration::from_secs(60), Duration::from_secs(30)).await?;
    let id = queue(&db.pool, "lost@localhost", "lost session").await;
    delivery.publish(id).await?;

    // The mail is in the sink and its answer held back: the client waits after the ".".
    eventually(
        Duration::from_secs(10),
        "the mail reaches the sink",
        || async { sink.delivered("lost").len() == 1 },
    )
    .await;
    let mut admin = sqlx::PgConnection::connect(&worker_testkit::database_url()).await?;
    let killed: i64 = sqlx::query_scalar(
        "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity \
         WHERE datname = $1 AND pid <> pg_backend_pid()",
    )
    .bind(&db.name)
    .fetch_one(&mut admin)
    .await?;
    eprintln!("terminated {killed} sessions of the test database during DATA");

    eventually(
        Duration::from_secs(20),
        "the row is recorded sent",
        || async {
            sqlx::query_scalar::<_, String>("SELECT status FROM outbound_emails WHERE id = $1")
                .bind(id)
                .fetch_one(&db.pool)
                .await
                .is_ok_and(|s| s == "sent")
        },
    )
    .await;
    // Anything sent again would be in the sink by now.
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert_eq!(sink.delivered("lost").len(), 1, "one mail");
    let (status, attempts, _, answer) = row(&db.pool, id).await;
    assert_eq!((status.as_str(), attempts), ("sent", 1));
    assert_eq!(
        answer.as_deref(),
        Some("250 OK delivered to lost@localhost")
    );
    delivery.stop().await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_answer_after_the_final_dot_is_unknown_and_tried_once() -> anyhow::Result<()> {
    let db = TestDb::create().await?;
    let sink = SmtpSink::start()?;
    sink.delay_answer("late@localhost", Duration::from_secs(8))?;
    let job = sender_for(&db.pool, &sink, 2, Duration::from_secs(2));
    let counter = job.clone();
    let delivery =
        Delivery::start(job, 3, Duration::from_secs(60), Duration::from_secs(10)).await?;
    let id = queue(&db.pool, "late@localhost", "late answer").await;
    delivery.publish(id).await?;

    eventually(Duration::from_secs(15), "the message is parked", || async {
        delivery.parked().await.unwrap_or(0) == 1
    })
    .await;
    let (status, attempts, last_error, _) = row(&db.pool, id).await;
    assert_eq!(
        (status.as_str(), attempts),
        ("unknown", 1),
        "{last_error:?}"
    );
    let last_error = last_error.unwrap_or_default();
    assert!(last_error.contains("end of DATA"), "{last_error}");
    assert_eq!(counter.unknown_outcomes(), 1);
    // The server's late answers would have come by now for any second or third try.
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert_eq!(sink.delivered("late").len(), 1, "one try, one mail");
    delivery.stop().await?;
    Ok(())
}

#[tokio::test]
async fn a_duplicate_backs_off_while_the_first_is_sending_then_is_a_duplicate() -> anyhow::Result<()>
{
    let db = TestDb::create().await?;
    let sink = SmtpSink::start()?;
    sink.delay_answer("dup@localhost", Duration::from_secs(3))?;
    let job = sender_for(&db.pool, &sink, 2, Duration::from_secs(20));
    let id = queue(&db.pool, "dup@localhost", "dup").await;

    let first = tokio::spawn({
        let job = job.clone();
        async move { job.handle(&ctx(), &command(id)).await }
    });
    eventually(Duration::from_secs(10), "the first is in DATA", || async {
        sink.delivered("dup").len() == 1
    })
    .await;
    let started = tokio::time::Instant::now();
    let err = job.handle(&ctx(), &command(id)).await.unwrap_err();
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "backs off at once, took {:?}",
        started.elapsed()
    );
    assert_eq!(err.class(), FailureClass::Transient, "{err}");
    assert!(
        err.detail().contains("being sent by another worker"),
        "{err}"
    );
    assert_eq!(row(&db.pool, id).await.0, "sending");

    assert_eq!(first.await??, Handled::Done);
    assert_eq!(job.handle(&ctx(), &command(id)).await?, Handled::Duplicate);
    assert_eq!(sink.delivered("dup").len(), 1);
    Ok(())
}

#[tokio::test]
async fn a_cancelled_send_leaves_its_claim_which_a_later_try_takes_over_once_stale()
-> anyhow::Result<()> {
    let db = TestDb::create().await?;
    let sink = SmtpSink::start()?;
    sink.delay_answer("cut@localhost", Duration::from_secs(2))?;
    let job = sender_for(&db.pool, &sink, 1, Duration::from_secs(20))
        .with_claim_stale_after(Duration::from_secs(3));
    let id = queue(&db.pool, "cut@localhost", "cut").await;

    // Shutdown cancels the handler in the middle of DATA.
    let cut = tokio::time::timeout(
        Duration::from_millis(1500),
        job.handle(&ctx(), &command(id)),
    )
    .await;
    assert!(cut.is_err(), "cancelled: {cut:?}");
    assert_eq!(row(&db.pool, id).await.0, "sending", "the claim stays");

    // A redelivery right away backs off; the connection was dropped, not reused.
    let err = job.handle(&ctx(), &command(id)).await.unwrap_err();
    assert!(
        err.detail().contains("being sent by another worker"),
        "{err}"
    );
    sink.answer_at_once("cut@localhost")?;

    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(job.handle(&ctx(), &command(id)).await?, Handled::Done);
    let (status, attempts, _, answer) = row(&db.pool, id).await;
    assert_eq!((status.as_str(), attempts), ("sent", 1));
    assert_eq!(answer.as_deref(), Some("250 OK delivered to cut@localhost"));
    assert_eq!(
        job.unknown_outcomes(),
        1,
        "the stale claim counts as unknown"
    );
    // The documented window: the cancelled send had reached the server too.
    assert_eq!(sink.delivered("cut").len(), 2);
    Ok(())
}

#[tokio::test]
async fn an_accepted_mail_is_recorded_sent_even_if_the_database_refuses_for_a_while()
-> anyhow::Result<()> {
    let db = TestDb::create().await?;
    let sink = SmtpSink::start()?;
    sink.delay_answer("refused@localhost", Duration::from_secs(2))?;
    // While `refuse` has a row, marking an email sent fails with an internal error (XX000),
    // a class no list calls transient: what the server says of a bug or a half-done
    // migration.
    for sql in [
        "CREATE TABLE refuse (on_purpose boolean)",
        "INSERT INTO refuse VALUES (true)",
        "CREATE FUNCTION refuse_sent() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN \
             IF NEW.status = 'sent' AND EXISTS (SELECT 1 FROM refuse) THEN \
                 RAISE EXCEPTION 'refused for the test' USING ERRCODE = 'XX000'; \
             END IF; RETURN NEW; END $$",
        "CREATE TRIGGER refuse_sent BEFORE UPDATE ON outbound_emails \
             FOR EACH ROW EXECUTE FUNCTION refuse_sent()",
    ] {
        sqlx::query(sql).execute(&db.pool).await?;
    }
    let job = sender_for(&db.pool, &sink, 1, Duration::from_secs(20));
    let id = queue(&db.pool, "refused@localhost", "refused").await;

    let send = tokio::spawn({
        let job = job.clone();
        async move { job.handle(&ctx(), &command(id)).await }
    });
    eventually(Duration::from_secs(10), "the mail is in DATA", || async {
        sink.delivered("refused").len() == 1 || send.is_finished()
    })
    .await;
    assert!(!send.is_finished(), "{:?}", send.await?);
    // The answer comes 2 s after; the database refuses the record for 2 s more.
    tokio::time::sleep(Duration::from_secs(4)).await;
    sqlx::query("DELETE FROM refuse").execute(&db.pool).await?;

    let outcome = send.await?;
    let (status, attempts, last_error, answer) = row(&db.pool, id).await;
    assert_eq!(
        (status.as_str(), attempts, last_error.as_deref()),
        ("sent", 1, None),
        "{outcome:?}"
    );
    assert_eq!(outcome?, Handled::Done);
    assert_eq!(
        answer.as_deref(),
        Some("250 OK delivered to refused@localhost")
    );
    let marked: bool = sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM processed_messages WHERE scope = 'email.send' AND id = $1)",
    )
    .bind(id.to_string())
    .fetch_one(&db.pool)
    .await?;
    assert!(marked, "the guard is marked with the record");
    assert_eq!(sink.delivered("refused").len(), 1);
    Ok(())
}
