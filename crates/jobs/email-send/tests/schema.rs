//! The schema version on the broker: a command of a newer version than this release reads is
//! dead-lettered at once, permanent and named, and nothing is sent; a command that says
//! version 1 (or nothing) is sent as always.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use worker_testkit::{SmtpSink, TestDb};

use common::{Delivery, eventually, queue, row, sender_for};

/// The publishers name the header through `worker-messages`, the pipeline through
/// `worker-broker`, which knows no message type: the two must be one name.
#[test]
fn publishers_and_the_pipeline_name_the_same_header() {
    assert_eq!(
        worker_messages::SCHEMA_VERSION_HEADER,
        worker_broker::consumer::SCHEMA_VERSION_HEADER
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_of_a_newer_schema_version_is_dead_lettered_and_not_sent() -> anyhow::Result<()> {
    let db = TestDb::create().await?;
    let sink = SmtpSink::start()?;
    let job = sender_for(&db.pool, &sink, 1, Duration::from_secs(10));
    let delivery = Delivery::start(job, 3, Duration::from_secs(1), Duration::from_secs(10)).await?;

    let newer = queue(&db.pool, "newer@localhost", "from a later release").await;
    delivery.publish_version(newer, 3).await?;
    let current = queue(&db.pool, "current@localhost", "from this release").await;
    delivery.publish_version(current, 1).await?;

    eventually(
        Duration::from_secs(15),
        "the current command is sent",
        || async { row(&db.pool, current).await.0 == "sent" },
    )
    .await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    let dead = loop {
        if let Some(headers) = delivery.take_dead().await? {
            break headers;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the newer command is not dead-lettered"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let headers = dead;
    assert_eq!(headers["x-dead-reason"], "rejected", "{headers}");
    assert_eq!(headers["x-dead-class"], "permanent", "{headers}");
    assert_eq!(headers["x-dead-attempts"], 1, "{headers}");
    let error = headers["x-dead-error"].as_str().unwrap_or_default();
    assert!(
        error.contains("email.send schema version 3 is newer than this release reads (up to 1)"),
        "{error}"
    );
    assert_eq!(delivery.parked().await?, 0, "never parked for a retry");
    assert!(
        sink.delivered("newer").is_empty(),
        "the newer command sent nothing"
    );
    let (status, attempts, _, _) = row(&db.pool, newer).await;
    assert_eq!(
        (status.as_str(), attempts),
        ("queued", 0),
        "its row is untouched"
    );
    delivery.stop().await?;
    Ok(())
}
