//! The AMQP connection cut during DATA costs no second mail: the runner lets the send finish
//! and record; the redelivery is a duplicate (or backs off on the fresh claim, then is one).

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use worker_testkit::{SmtpSink, TestDb};

use common::{Delivery, eventually, queue, row, sender_for};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_amqp_connection_cut_during_data_costs_no_second_mail() -> anyhow::Result<()> {
    let db = TestDb::create().await?;
    let sink = SmtpSink::start()?;
    sink.delay_answer("cut@localhost", Duration::from_secs(3))?;
    let job = sender_for(&db.pool, &sink, 2, Duration::from_secs(20));
    let delivery = Delivery::start(job, 3, Duration::from_secs(1), Duration::from_secs(30)).await?;
    let id = queue(&db.pool, "cut@localhost", "cut connection").await;
    delivery.publish(id).await?;
    eventually(
        Duration::from_secs(10),
        "the mail reaches the sink",
        || async { sink.delivered("cut").len() == 1 },
    )
    .await;
    let name = delivery.vhost.name.clone();
    let out = std::process::Command::new("rabbitmqctl")
        .args(["close_all_connections", "-p", &name, "amqp cut test"])
        .output()?;
    assert!(out.status.success(), "{out:?}");
    eventually(
        Duration::from_secs(20),
        "the row is recorded sent",
        || async { row(&db.pool, id).await.0 == "sent" },
    )
    .await;
    tokio::time::sleep(Duration::from_secs(6)).await;
    assert_eq!(sink.delivered("cut").len(), 1, "one mail");
    let (status, attempts, _, answer) = row(&db.pool, id).await;
    eprintln!("{status} {attempts} {answer:?}");
    assert_eq!(status, "sent");
    delivery.stop().await?;
    Ok(())
}
