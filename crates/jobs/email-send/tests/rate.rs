//! The sending rate of the SMTP account (`[smtp.rate]`), shared by every replica through the
//! database, and a provider's quota answer taken as the relay's, never the mail's. On a
//! private SMTP sink.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

mod common;

use std::time::Duration;

use chrono::{DateTime, Utc};
use futures::future::join_all;
use job_email_send::{EmailSender, RateSettings, SmtpSettings};
use worker_core::circuit::CircuitSettings;
use worker_core::{ConsumerJob, Handled};
use worker_store::circuits::Circuits;
use worker_testkit::{SmtpSink, TestDb};

use common::{Delivery, command, ctx, eventually, queue, row, smtp_for};

const QUOTA_ANSWER: &str =
    "554 5.2.0 STOREDRV.Submission.Exception:SubmissionQuotaExceededException";

fn at_most_per_minute(sink: &SmtpSink, messages: u32) -> SmtpSettings {
    SmtpSettings {
        rate: RateSettings {
            messages_per_minute: Some(messages),
            ..RateSettings::default()
        },
        ..smtp_for(sink, 4)
    }
}

fn sender(pool: &sqlx::PgPool, smtp: &SmtpSettings) -> EmailSender {
    EmailSender::new(
        pool.clone(),
        smtp,
        "Worker Host <worker-host@localhost>",
        Duration::from_secs(10),
    )
    .unwrap()
}

/// The sends the shared budget holds for the sink's account.
async fn minute_sends(pool: &sqlx::PgPool) -> Vec<DateTime<Utc>> {
    sqlx::query_scalar("SELECT minute_sends FROM smtp_send_rate")
        .fetch_one(pool)
        .await
        .unwrap()
}

#[tokio::test]
async fn two_replicas_at_thirty_a_minute_send_thirty_between_them_and_park_the_rest_uncharged()
-> anyhow::Result<()> {
    let db = TestDb::create().await?;
    let sink = SmtpSink::start()?;
    let smtp = at_most_per_minute(&sink, 30);
    // Two replicas: two senders, each with its own database pool and SMTP pool.
    let replicas = [
        sender(&db.pool, &smtp),
        sender(&db.another_pool(5).await?, &smtp),
    ];
    let mut ids = Vec::new();
    for i in 0..45 {
        ids.push(queue(&db.pool, &format!("rate{i}@localhost"), "rate").await);
    }

    let started = std::time::Instant::now();
    let outcomes = join_all(ids.iter().enumerate().map(|(i, id)| {
        let job = &replicas[i % 2];
        async move { job.handle(&ctx(), &command(*id)).await }
    }))
    .await;
    let took = started.elapsed();

    let sent = outcomes
        .iter()
        .filter(|o| matches!(o, Ok(Handled::Done)))
        .count();
    assert_eq!(sent, 30, "{outcomes:#?}");
    let mut waits = Vec::new();
    for outcome in outcomes.iter().filter(|o| o.is_err()) {
        let failure = outcome.as_ref().unwrap_err();
        assert!(failure.is_unavailable(), "{failure}");
        assert!(
            failure.detail().contains("30 messages a minute"),
            "{failure}"
        );
        waits.push(failure.retry_after().expect("parked with its own wait"));
    }
    assert_eq!(waits.len(), 15);
    for wait in &waits {
        assert!(
            *wait > Duration::from_secs(50) && *wait <= Duration::from_secs(60),
            "waits for the first send of the minute to age out: {wait:?} (took {took:?})"
        );
    }
    let delivered: usize = (0..45)
        .map(|i| sink.delivered(&format!("rate{i}")).len())
        .sum();
    assert_eq!(delivered, 30, "the sink got 30");
    let sends = minute_sends(&db.pool).await;
    assert_eq!(sends.len(), 30, "the shared budget counted 30");
    let (first, last) = (sends[0], sends[sends.len() - 1]);
    assert!(
        last - first < chrono::TimeDelta::seconds(60),
        "all 30 within one minute"
    );

    let mut statuses = std::collections::BTreeMap::new();
    for id in &ids {
        let (status, attempts, last_error, _) = row(&db.pool, *id).await;
        if status == "queued" {
            assert_eq!(attempts, 0, "a mail over the rate is charged no try");
            let last_error = last_error.unwrap_or_default();
            assert!(last_error.contains("over the sending rate"), "{last_error}");
        }
        *statuses.entry(status).or_insert(0) += 1;
    }
    assert_eq!(
        statuses,
        [("queued".to_string(), 15), ("sent".to_string(), 30)].into(),
    );
    // What `/status` shows, once this replica has read the full minute: the rate in use, the
    // minute's 30 sends, the next send about a minute off.
    let one_more = queue(&db.pool, "rate45@localhost", "rate").await;
    let failure = replicas[0]
        .handle(&ctx(), &command(one_more))
        .await
        .unwrap_err();
    assert!(failure.is_unavailable(), "{failure}");
    let shown = replicas[0].sending_rate().expect("a rate is set");
    assert_eq!(shown.limits.messages_per_minute, Some(30));
    assert_eq!(shown.used.messages_this_minute, 30);
    assert!(
        (50..=60).contains(&shown.next_send_in_secs),
        "{}",
        shown.next_send_in_secs
    );
    assert_eq!(shown.account, format!("127.0.0.1:{}/", sink.port));

    Ok(())
}

#[tokio::test]
async fn a_wait_under_two_seconds_is_waited_in_the_handler() -> anyhow::Result<()> {
    let db = TestDb::create().await?;
    let sink = SmtpSink::start()?;
    // Two a minute, the minute made full by hand with its oldest send 59 s old: the next
    // mail's turn comes within a second, so the handler waits for it.
    let job = sender(&db.pool, &at_most_per_minute(&sink, 2));
    let first = queue(&db.pool, "early@localhost", "early").await;
    assert_eq!(job.handle(&ctx(), &command(first)).await?, Handled::Done);
    // Age the first send to 59 s ago, then fill the minute with a fresh one.
    sqlx::query(
        "UPDATE smtp_send_rate SET minute_sends = ARRAY[now() - interval '59 seconds', now()]",
    )
    .execute(&db.pool)
    .await?;
    let next = queue(&db.pool, "next@localhost", "next").await;
    let started = std::time::Instant::now();
    assert_eq!(job.handle(&ctx(), &command(next)).await?, Handled::Done);
    assert!(
        started.elapsed() >= Duration::from_millis(500),
        "it waited for the oldest send to age out: {:?}",
        started.elapsed()
    );
    assert_eq!(row(&db.pool, next).await.1, 1);
    Ok(())
}

#[tokio::test]
async fn a_submission_quota_answer_opens_the_relays_circuit_until_the_day_rolls_over_and_charges_nothing()
-> anyhow::Result<()> {
    let db = TestDb::create().await?;
    let sink = SmtpSink::start()?;
    sink.fail_recipient("quota@localhost", QUOTA_ANSWER)?;
    let circuits = Circuits::new(db.pool.clone(), CircuitSettings::default(), "replica-a");
    let job = sender(&db.pool, &at_most_per_minute(&sink, 30)).with_circuits(circuits.clone());
    let id = queue(&db.pool, "quota@localhost", "over quota").await;

    let failure = job.handle(&ctx(), &command(id)).await.unwrap_err();

    assert!(failure.is_unavailable(), "{failure}");
    assert_eq!(
        failure.retry_after(),
        None,
        "back to its queue; the consumers stop"
    );
    assert!(
        failure.detail().contains("SubmissionQuotaExceeded"),
        "{failure}"
    );
    let (status, attempts, _, _) = row(&db.pool, id).await;
    assert_eq!((status.as_str(), attempts), ("queued", 0), "charged no try");
    let open = circuits
        .open_circuit("smtp-relay")
        .expect("the relay's circuit is open");
    assert!(open.reason.contains("554 5.2.0"), "{}", open.reason);
    let probe_in = open.probe_in(Utc::now());
    assert!(
        probe_in > Duration::from_secs(23 * 3600),
        "open until our day's first send is a day old: {probe_in:?}"
    );
    let in_table: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM dependency_circuits WHERE dependency = 'smtp-relay' \
         AND probe_at > now() + interval '23 hours'",
    )
    .fetch_one(&db.pool)
    .await?;
    assert_eq!(in_table, 1, "every replica sees it open");

    // The next mail, even to another address, is not tried while it is open.
    let other = queue(&db.pool, "fine@localhost", "fine").await;
    let failure = job.handle(&ctx(), &command(other)).await.unwrap_err();
    assert!(failure.is_unavailable(), "{failure}");
    assert_eq!(sink.delivered("fine").len(), 0);
    assert_eq!(row(&db.pool, other).await.1, 0);
    Ok(())
}

#[tokio::test]
async fn a_quota_answer_under_the_runner_dead_letters_nothing() -> anyhow::Result<()> {
    let db = TestDb::create().await?;
    let sink = SmtpSink::start()?;
    sink.fail_recipient("quota@localhost", QUOTA_ANSWER)?;
    // No circuits (no host): the mail is parked for its window, charged no try.
    let job = sender(&db.pool, &smtp_for(&sink, 2));
    let delivery =
        Delivery::start(job, 3, Duration::from_secs(60), Duration::from_secs(20)).await?;
    let id = queue(&db.pool, "quota@localhost", "over quota").await;
    delivery.publish(id).await?;

    eventually(Duration::from_secs(15), "parked", || async {
        delivery.parked().await.unwrap_or(0) == 1
    })
    .await;
    assert_eq!(delivery.take_dead().await?, None, "nothing dead-lettered");
    let (status, attempts, last_error, _) = row(&db.pool, id).await;
    assert_eq!((status.as_str(), attempts), ("queued", 0), "charged no try");
    assert!(last_error.unwrap_or_default().contains("sending limit"));
    delivery.stop().await?;
    Ok(())
}

#[tokio::test]
async fn a_mail_over_the_rate_under_the_runner_is_parked_for_its_wait_uncharged()
-> anyhow::Result<()> {
    let db = TestDb::create().await?;
    let sink = SmtpSink::start()?;
    let job = sender(&db.pool, &at_most_per_minute(&sink, 1));
    let delivery =
        Delivery::start(job, 3, Duration::from_secs(60), Duration::from_secs(20)).await?;
    let first = queue(&db.pool, "first@localhost", "first").await;
    let second = queue(&db.pool, "second@localhost", "second").await;
    delivery.publish(first).await?;
    delivery.publish(second).await?;

    eventually(Duration::from_secs(15), "one sent, one parked", || async {
        let statuses = [row(&db.pool, first).await.0, row(&db.pool, second).await.0];
        statuses.contains(&"sent".to_string()) && delivery.parked().await.unwrap_or(0) == 1
    })
    .await;
    assert_eq!(delivery.take_dead().await?, None, "nothing dead-lettered");
    let (over, attempts, last_error, _) = if row(&db.pool, first).await.0 == "sent" {
        row(&db.pool, second).await
    } else {
        row(&db.pool, first).await
    };
    assert_eq!((over.as_str(), attempts), ("queued", 0), "charged no try");
    assert!(
        last_error
            .unwrap_or_default()
            .contains("1 message a minute"),
        "the limit is named"
    );
    delivery.stop().await?;
    Ok(())
}

#[tokio::test]
async fn a_second_quota_answer_keeps_the_circuit_open_to_the_later_roll_over_counting_one_opening()
-> anyhow::Result<()> {
    let db = TestDb::create().await?;
    let circuits = Circuits::new(db.pool.clone(), CircuitSettings::default(), "replica-a");
    let hour = Utc::now() + chrono::TimeDelta::hours(1);
    let day = Utc::now() + chrono::TimeDelta::hours(24);

    assert!(
        circuits
            .open_until("smtp-relay", QUOTA_ANSWER, day)
            .await
            .is_some()
    );
    let later = circuits
        .open_until(
            "smtp-relay",
            "432 4.3.2 Concurrent connections limit exceeded",
            hour,
        )
        .await
        .expect("still open");

    assert!(
        later > Duration::from_secs(23 * 3600),
        "not shortened: {later:?}"
    );
    let open = circuits.open_circuit("smtp-relay").unwrap();
    assert!(
        open.reason.starts_with("432 4.3.2"),
        "the latest answer: {}",
        open.reason
    );
    let opened_here: Vec<u64> = circuits.report().iter().map(|r| r.opened_here).collect();
    assert_eq!(opened_here, [1], "opened once, then kept open");
    Ok(())
}
