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
