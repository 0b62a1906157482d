//! "Send parked now" on a real broker: what waits in a queue's retry tiers is counted
//! without moving, and moved back to the work queue with its headers (the attempt count
//! included), at most as many as asked (issue 39).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::*;
use lapin::types::AMQPValue;
use worker_broker::parked::{parked, send_parked_now};
use worker_broker::{Publisher, PublisherSettings, Session};
use worker_testkit::TestVhost;

/// A vhost with `orders` and two tiers long enough that nothing expires during the test.
async fn parked_vhost() -> anyhow::Result<(TestVhost, Session, worker_broker::QueueTopology)> {
    let vhost = TestVhost::create().await?;
    let topology = topology(&queue_settings(&[600_000, 1_200_000], 5))?;
    let session = Session::new(worker_testkit::amqp::connect(&vhost).await?);
    session.declare(&topology).await?;
    let queue = topology.queue(QUEUE).unwrap().clone();
    Ok((vhost, session, queue))
}

/// Parks `count` messages in tier `tier` as the consumer does: through the default exchange,
/// with their next attempt in `x-attempt`.
async fn park(
    session: &Session,
    queue: &worker_broker::QueueTopology,
    tier: usize,
    ids: &[&str],
) -> anyhow::Result<()> {
    let channel = session.connection().create_channel().await?;
    channel.confirm_select(Default::default()).await?;
    let attempt = i64::try_from(tier).unwrap() + 2;
    for id in ids {
        let props = with_header(properties(id), "x-attempt", AMQPValue::LongLongInt(attempt));
        publish_raw(&channel, "", &queue.tiers[tier].queue, id.as_bytes(), props).await?;
    }
    Ok(())
}

#[tokio::test]
async fn parked_messages_are_counted_per_tier_and_counting_moves_nothing() -> anyhow::Result<()> {
    let (_vhost, session, queue) = parked_vhost().await?;
    park(&session, &queue, 0, &["a", "b", "c"]).await?;
    park(&session, &queue, 1, &["d"]).await?;

    let first = parked(&session, QUEUE, &queue.tiers).await?;
    let waiting: Vec<_> = first.tiers.iter().map(|t| t.waiting).collect();
    assert_eq!(waiting, [Some(3), Some(1)]);
    assert_eq!(first.total(), 4);
    assert_eq!(
        parked(&session, QUEUE, &queue.tiers).await?,
        first,
        "counting moved nothing"
    );
    let channel = session.connection().create_channel().await?;
    assert_eq!(worker_testkit::amqp::counts(&channel, QUEUE).await?.0, 0);
    Ok(())
}

#[tokio::test]
async fn send_now_moves_at_most_the_cap_back_to_the_work_queue_with_its_attempt_kept()
-> anyhow::Result<()> {
    let (_vhost, session, queue) = parked_vhost().await?;
    park(&session, &queue, 0, &["a", "b"]).await?;
    park(&session, &queue, 1, &["c", "d"]).await?;
    let publisher = Publisher::new(session.clone().fixed(), PublisherSettings::default());

    let sent = send_parked_now(&session, &publisher, QUEUE, &queue.tiers, 3).await?;
    assert_eq!(sent.moved, 3, "{sent:?}");
    assert_eq!(sent.stopped, None);
    assert_eq!(
        sent.from_tiers,
        [
            (queue.tiers[0].queue.clone(), 2),
            (queue.tiers[1].queue.clone(), 1)
        ]
    );

    let left = parked(&session, QUEUE, &queue.tiers).await?;
    assert_eq!(left.total(), 1, "the cap held: one stays parked");
    let channel = session.connection().create_channel().await?;
    let moved = get_all(&channel, QUEUE, 3, Duration::from_secs(5)).await?;
    let mut seen: Vec<_> = moved
        .iter()
        .map(|d| {
            (
                String::from_utf8_lossy(&d.data).into_owned(),
                header_int(d, "x-attempt"),
                header_str(d, "app-header"),
            )
        })
        .collect();
    seen.sort();
    assert_eq!(
        seen,
        [
            ("a".into(), Some(2), Some("kept".into())),
            ("b".into(), Some(2), Some("kept".into())),
            ("c".into(), Some(3), Some("kept".into())),
        ]
    );
    let first = &moved[0];
    assert_eq!(
        first
            .properties
            .correlation_id()
            .as_ref()
            .map(|c| c.as_str().to_owned()),
        Some(format!("corr-{}", String::from_utf8_lossy(&first.data)))
    );
    Ok(())
}

#[tokio::test]
async fn a_refused_publish_leaves_the_message_in_its_tier_and_stops() -> anyhow::Result<()> {
    let (vhost, session, queue) = parked_vhost().await?;
    park(&session, &queue, 0, &["a", "b"]).await?;
    // The move publishes through the default exchange: refused, nothing may leave a tier.
    vhost
        .api(
            reqwest::Method::PUT,
            "permissions/{vhost}/guest",
            Some(serde_json::json!({"configure": ".*", "write": "^commands$", "read": ".*"})),
        )
        .await?;
    let mover = Session::new(worker_testkit::amqp::connect(&vhost).await?);
    let publisher = Publisher::new(mover.clone().fixed(), PublisherSettings::default());

    let sent = send_parked_now(&mover, &publisher, QUEUE, &queue.tiers, 10).await?;
    assert_eq!(sent.moved, 0, "{sent:?}");
    assert!(sent.stopped.is_some(), "{sent:?}");
    // The nacked message is back in its tier once the broker settled the nack.
    let channel = session.connection().create_channel().await?;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while worker_testkit::amqp::counts(&channel, &queue.tiers[0].queue)
        .await?
        .0
        < 2
    {
        assert!(tokio::time::Instant::now() < deadline, "a message was lost");
        tokio::time::sleep(ms(25)).await;
    }
    assert_eq!(worker_testkit::amqp::counts(&channel, QUEUE).await?.0, 0);
    Ok(())
}
