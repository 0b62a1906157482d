//! When the runner can neither park nor dead-letter, the delivery goes back to the queue and
//! the queue's own delivery limit dead-letters it: nothing is acked, nothing is lost.

// Helpers outside #[test] functions assert too: a failed expectation fails the test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::*;
use lapin::types::AMQPValue;
use worker_broker::consumer::Outcome;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_parking_and_dead_lettering_refused_the_delivery_limit_dead_letters_it()
-> anyhow::Result<()> {
    let delivery_limit = 2;
    let mut h = Harness::start(
        queue_settings(&[200, 500], delivery_limit),
        consumer_settings(5),
    )
    .await?;

    // Revoke the right to publish anywhere but `commands` (where the test publishes): parking
    // goes through the default exchange and dead letters through `orders.dead`, so both are
    // refused. The broker's own dead-lettering needs no permission.
    h.vhost
        .api(
            reqwest::Method::PUT,
            "permissions/{vhost}/guest",
            Some(serde_json::json!({"configure": ".*", "write": "^commands$", "read": ".*"})),
        )
        .await?;

    let conn = h.connection().await?;
    let ch = conn.create_channel().await?;
    ch.confirm_select(Default::default()).await?;
    let body = br#"{"id":"dl","behaviour":{"kind":"transient"}}"#;
    publish_raw(&ch, "commands", QUEUE, body, properties("dl")).await?;

    let dead = get_one(&ch, &h.queue().dead_queue, Duration::from_secs(30)).await?;
    assert_eq!(
        &dead.data[..],
        body,
        "the dead letter is the original message"
    );
    assert_eq!(
        header_str(&dead, "x-first-death-reason").as_deref(),
        Some("delivery_limit")
    );
    let Some(AMQPValue::FieldArray(deaths)) = header(&dead, "x-death") else {
        panic!("no x-death: {:?}", dead.properties.headers())
    };
    let Some(AMQPValue::FieldTable(death)) = deaths.as_slice().first() else {
        panic!("{deaths:?}")
    };
    let reason = match death.inner().get("reason") {
        Some(AMQPValue::LongString(s)) => s.to_string(),
        other => panic!("{other:?}"),
    };
    assert_eq!(reason, "delivery_limit");
    assert!(
        header(&dead, "x-dead-reason").is_none(),
        "the runner never managed to dead-letter it"
    );

    // Every delivery was returned, none acked: limit + 1 deliveries.
    let events = h
        .events
        .wait_for("dl", Duration::from_secs(5), |e| {
            e.len() as u32 > delivery_limit
        })
        .await?;
    assert!(
        events.iter().all(|e| e.outcome == Outcome::Requeued),
        "{events:?}"
    );
    assert_eq!(events.len() as u32, delivery_limit + 1);

    // Nothing left anywhere else: not in the queue, not in a tier.
    h.stop().await?;
    for queue in
        std::iter::once(QUEUE.to_string()).chain(h.queue().tiers.iter().map(|t| t.queue.clone()))
    {
        let q = ch
            .queue_declare(
                queue.as_str().into(),
                lapin::options::QueueDeclareOptions {
                    passive: true,
                    ..Default::default()
                },
                Default::default(),
            )
            .await?;
        assert_eq!(q.message_count(), 0, "{queue}");
    }
    Ok(())
}
