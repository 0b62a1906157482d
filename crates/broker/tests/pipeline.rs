//! The recoverability pipeline on the real broker: malformed, parked, gave up, rejected.
// Helpers outside #[test] functions assert too: a failed expectation fails the test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::*;
use lapin::types::AMQPValue;
use worker_broker::consumer::{DeadReason, Outcome};
use worker_core::FailureClass;

const WAIT: Duration = Duration::from_secs(20);

/// The headers and properties every copy must keep.
fn assert_kept(d: &lapin::message::Delivery, id: &str) {
    let p = &d.properties;
    assert_eq!(p.message_id().as_ref().map(|s| s.as_str()), Some(id));
    assert_eq!(
        p.correlation_id().as_ref().map(|s| s.to_string()),
        Some(format!("corr-{id}"))
    );
    assert_eq!(p.kind().as_ref().map(|s| s.as_str()), Some("order.placed"));
    assert_eq!(
        p.content_type().as_ref().map(|s| s.as_str()),
        Some("application/json")
    );
    assert_eq!(p.timestamp(), &Some(1_700_000_000));
    assert_eq!(header_str(d, "app-header").as_deref(), Some("kept"));
    assert_eq!(
        header_str(d, "traceparent").as_deref(),
        Some("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
    );
    assert_eq!(
        d.routing_key.as_str(),
        QUEUE,
        "a dead letter keeps the original routing key"
    );
}

fn assert_dead(d: &lapin::message::Delivery, reason: &str, class: &str, attempts: i64) {
    assert_eq!(header_str(d, "x-dead-reason").as_deref(), Some(reason));
    assert_eq!(header_str(d, "x-dead-class").as_deref(), Some(class));
    assert_eq!(header_int(d, "x-dead-attempts"), Some(attempts));
    assert_eq!(header_str(d, "x-dead-queue").as_deref(), Some(QUEUE));
    let at = header_str(d, "x-dead-at").expect("x-dead-at");
    chrono::DateTime::parse_from_rfc3339(&at).expect("x-dead-at is RFC 3339");
    let error = header_str(d, "x-dead-error").expect("x-dead-error");
    assert!(!error.is_empty() && error.len() <= 2048);
    assert!(
        header(d, "x-attempt").is_none(),
        "a dead letter carries no x-attempt"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_malformed_message_is_dead_lettered_and_the_consumer_goes_on() -> anyhow::Result<()> {
    let mut h = Harness::start(queue_settings(&[200, 500], 5), consumer_settings(5)).await?;
    let conn = h.connection().await?;
    let ch = conn.create_channel().await?;
    ch.confirm_select(Default::default()).await?;

    let good = br#"{"id":"x"}"#;
    let cases: Vec<(&str, &[u8], Option<AMQPValue>)> = vec![
        ("missing-field", br#"{"name":"no id here"}"#, None),
        ("not-json", b"this is not json", None),
        (
            "attempt-string",
            good,
            Some(AMQPValue::LongString("2".into())),
        ),
        ("attempt-float", good, Some(AMQPValue::Double(2.0))),
        ("attempt-zero", good, Some(AMQPValue::LongLongInt(0))),
        ("attempt-negative", good, Some(AMQPValue::LongInt(-3))),
    ];
    for (id, body, attempt) in &cases {
        let mut props = properties(id);
        if let Some(v) = attempt {
            props = with_header(props, "x-attempt", v.clone());
        }
        publish_raw(&ch, "commands", QUEUE, body, props).await?;
    }
    publish_raw(
        &ch,
        "commands",
        QUEUE,
        br#"{"id":"after"}"#,
        properties("after"),
    )
    .await?;

    h.events
        .wait_for("after", WAIT, |e| {
            e.iter().any(|e| e.outcome == Outcome::Succeeded)
        })
        .await?;
    let dead = get_all(&ch, &h.queue().dead_queue, cases.len(), WAIT).await?;
    assert_eq!(
        dead.len(),
        cases.len(),
        "every malformed message is dead-lettered"
    );
    for (id, body, _) in &cases {
        let d = dead
            .iter()
            .find(|d| d.properties.message_id().as_ref().map(|s| s.as_str()) == Some(*id))
            .expect(id);
        assert_dead(d, "malformed", "malformed", 1);
        assert_kept(d, id);
        assert_eq!(&d.data[..], *body, "the body is kept as it was");
        let error = header_str(d, "x-dead-error").unwrap();
        if id.starts_with("attempt") {
            assert!(error.contains("x-attempt"), "{id}: {error}");
        } else {
            assert!(error.contains("Order"), "{id}: {error}");
        }
    }
    // The handler never saw a malformed message.
    assert_eq!(
        h.job
            .calls
            .lock()
            .unwrap()
            .iter()
            .map(|c| c.id.as_str())
            .collect::<Vec<_>>(),
        ["after"]
    );
    assert_eq!(h.vhost.queue_depth(QUEUE).await?, 0);
    h.stop().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transient_failure_is_parked_with_the_next_attempt_and_comes_back() -> anyhow::Result<()>
{
    // A long first tier, so that the parked copy can be looked at before it comes back.
    let mut h = Harness::start(queue_settings(&[1500, 3000], 5), consumer_settings(5)).await?;
    let conn = h.connection().await?;
    let ch = conn.create_channel().await?;
    ch.confirm_select(Default::default()).await?;
    let body = br#"{"id":"t1","behaviour":{"kind":"transient","until_attempt":2}}"#;
    publish_raw(&ch, "commands", QUEUE, body, properties("t1")).await?;

    let events = h.events.wait_for("t1", WAIT, |e| !e.is_empty()).await?;
    let tier = h.queue().tiers[0].queue.clone();
    assert_eq!(
        events[0].outcome,
        Outcome::Parked {
            next_attempt: 2,
            tier: tier.clone(),
            class: FailureClass::Transient
        }
    );
    assert_eq!(events[0].tries, 2, "the in-process retry ran first");

    // Look at the parked copy, then put it back for the tier to expire.
    let parked = ch
        .basic_get(
            tier.as_str().into(),
            lapin::options::BasicGetOptions { no_ack: false },
        )
        .await?
        .expect("parked copy");
    assert_eq!(header_int(&parked.delivery, "x-attempt"), Some(2));
    assert_eq!(
        header_str(&parked.delivery, "x-original-routing-key").as_deref(),
        Some(QUEUE)
    );
    assert_eq!(&parked.delivery.data[..], body);
    assert_kept_but_routing(&parked.delivery, "t1");
    ch.basic_reject(
        parked.delivery.delivery_tag,
        lapin::options::BasicRejectOptions { requeue: true },
    )
    .await?;

    let events = h
        .events
        .wait_for("t1", WAIT, |e| {
            e.iter().any(|e| e.outcome == Outcome::Succeeded)
        })
        .await?;
    let done = events
        .iter()
        .find(|e| e.outcome == Outcome::Succeeded)
        .unwrap();
    assert_eq!(done.attempt, 2);
    let attempts: Vec<u32> = h.job.calls_for("t1").iter().map(|c| c.attempt).collect();
    assert_eq!(attempts, [1, 1, 2]);
    assert_eq!(h.vhost.queue_depth(&h.queue().dead_queue).await?, 0);
    h.stop().await
}

fn assert_kept_but_routing(d: &lapin::message::Delivery, id: &str) {
    assert_eq!(
        d.properties.message_id().as_ref().map(|s| s.as_str()),
        Some(id)
    );
    assert_eq!(
        d.properties.kind().as_ref().map(|s| s.as_str()),
        Some("order.placed")
    );
    assert_eq!(header_str(d, "app-header").as_deref(), Some("kept"));
    assert!(header_str(d, "traceparent").is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failure_that_never_clears_gives_up_with_its_attempts_counted() -> anyhow::Result<()> {
    let mut h = Harness::start(queue_settings(&[200, 400], 5), consumer_settings(3)).await?;
    let conn = h.connection().await?;
    let ch = conn.create_channel().await?;
    ch.confirm_select(Default::default()).await?;
    publish_raw(
        &ch,
        "commands",
        QUEUE,
        br#"{"id":"g1","behaviour":{"kind":"transient"}}"#,
        properties("g1"),
    )
    .await?;

    let events = h
        .events
        .wait_for("g1", WAIT, |e| {
            e.iter()
                .any(|e| matches!(e.outcome, Outcome::DeadLettered { .. }))
        })
        .await?;
    let outcomes: Vec<_> = events
        .iter()
        .map(|e| (e.attempt, e.outcome.clone()))
        .collect();
    let q = h.queue();
    assert_eq!(
        outcomes,
        [
            (
                1,
                Outcome::Parked {
                    next_attempt: 2,
                    tier: q.tiers[0].queue.clone(),
                    class: FailureClass::Transient
                }
            ),
            (
                2,
                Outcome::Parked {
                    next_attempt: 3,
                    tier: q.tiers[1].queue.clone(),
                    class: FailureClass::Transient
                }
            ),
            (
                3,
                Outcome::DeadLettered {
                    reason: DeadReason::GaveUp,
                    class: FailureClass::Transient
                }
            ),
        ]
    );
    let dead = get_one(&ch, &q.dead_queue, WAIT).await?;
    assert_dead(&dead, "gave-up", "transient", 3);
    assert_kept(&dead, "g1");
    assert!(
        header_str(&dead, "x-dead-error")
            .unwrap()
            .contains("flaky dependency")
    );
    assert_eq!(
        h.job.calls_for("g1").len(),
        6,
        "three attempts of two tries each"
    );
    h.stop().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_permanent_failure_is_rejected_at_once() -> anyhow::Result<()> {
    let mut h = Harness::start(queue_settings(&[200, 400], 5), consumer_settings(5)).await?;
    let conn = h.connection().await?;
    let ch = conn.create_channel().await?;
    ch.confirm_select(Default::default()).await?;
    publish_raw(
        &ch,
        "commands",
        QUEUE,
        br#"{"id":"p1","behaviour":{"kind":"permanent"}}"#,
        properties("p1"),
    )
    .await?;

    let dead = get_one(&ch, &h.queue().dead_queue, WAIT).await?;
    assert_dead(&dead, "rejected", "permanent", 1);
    assert_kept(&dead, "p1");
    assert!(
        header_str(&dead, "x-dead-error")
            .unwrap()
            .contains("bad-order")
    );
    assert_eq!(
        h.job.calls_for("p1").len(),
        1,
        "a permanent failure is not retried"
    );
    let events = h.events.for_message("p1");
    assert_eq!(events.len(), 1);
    assert_eq!(
        events[0].outcome,
        Outcome::DeadLettered {
            reason: DeadReason::Rejected,
            class: FailureClass::Permanent
        }
    );
    h.stop().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_throttled_failure_waits_in_the_first_tier_long_enough() -> anyhow::Result<()> {
    let mut h = Harness::start(queue_settings(&[100, 300, 600], 5), consumer_settings(2)).await?;
    let conn = h.connection().await?;
    let ch = conn.create_channel().await?;
    ch.confirm_select(Default::default()).await?;
    // The in-process retry honours retry_after too: keep it short so the test stays fast.
    publish_raw(
        &ch,
        "commands",
        QUEUE,
        br#"{"id":"th","behaviour":{"kind":"throttled","ms":250}}"#,
        properties("th"),
    )
    .await?;

    let events = h
        .events
        .wait_for("th", WAIT, |e| {
            e.iter()
                .any(|e| matches!(e.outcome, Outcome::DeadLettered { .. }))
        })
        .await?;
    assert_eq!(
        events[0].outcome,
        Outcome::Parked {
            next_attempt: 2,
            tier: h.queue().tiers[1].queue.clone(),
            class: FailureClass::Throttled
        }
    );
    assert_eq!(
        events[1].outcome,
        Outcome::DeadLettered {
            reason: DeadReason::GaveUp,
            class: FailureClass::Throttled
        }
    );
    let dead = get_one(&ch, &h.queue().dead_queue, WAIT).await?;
    assert_dead(&dead, "gave-up", "throttled", 2);
    h.stop().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_lets_handlers_finish_and_leaves_nothing_unacked() -> anyhow::Result<()> {
    let mut h = Harness::start(queue_settings(&[200], 5), consumer_settings(5)).await?;
    let conn = h.connection().await?;
    let ch = conn.create_channel().await?;
    ch.confirm_select(Default::default()).await?;
    for i in 0..200 {
        publish_raw(
            &ch,
            "commands",
            QUEUE,
            format!(r#"{{"id":"s{i}","behaviour":{{"kind":"sleep","ms":50}}}}"#).as_bytes(),
            properties(&format!("s{i}")),
        )
        .await?;
    }
    h.events.wait_for("s0", WAIT, |e| !e.is_empty()).await?;
    h.stop().await?;
    let settled = h.events.settled.lock().unwrap().len();
    // What was settled was acked; the rest is back in the queue, ready: nothing in between.
    // (The requeue goes through the quorum queue's log, so give it a moment.)
    let mut ready = 0;
    for _ in 0..100 {
        let q = ch
            .queue_declare(
                QUEUE.into(),
                lapin::options::QueueDeclareOptions {
                    passive: true,
                    ..Default::default()
                },
                Default::default(),
            )
            .await?;
        ready = q.message_count() as usize;
        if ready + settled >= 200 {
            break;
        }
        tokio::time::sleep(ms(50)).await;
    }
    assert_eq!(ready + settled, 200, "settled {settled}, ready {ready}");
    assert!(settled < 200, "the test stopped too late to show anything");
    assert!(
        h.events
            .settled
            .lock()
            .unwrap()
            .iter()
            .all(|e| e.outcome == Outcome::Succeeded)
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_handler_does_not_hold_the_other_deliveries_prefetch_slots() -> anyhow::Result<()> {
    let settings = worker_broker::ConsumerSettings {
        prefetch: 5,
        concurrency: 5,
        ..consumer_settings(5)
    };
    let mut h = Harness::start(queue_settings(&[200], 5), settings).await?;
    let conn = h.connection().await?;
    let ch = conn.create_channel().await?;
    ch.confirm_select(Default::default()).await?;
    publish_raw(
        &ch,
        "commands",
        QUEUE,
        br#"{"id":"slow","behaviour":{"kind":"sleep","ms":4000}}"#,
        properties("slow"),
    )
    .await?;
    for i in 0..50 {
        publish_raw(
            &ch,
            "commands",
            QUEUE,
            format!(r#"{{"id":"q{i}"}}"#).as_bytes(),
            properties(&format!("q{i}")),
        )
        .await?;
    }
    // Were the quick ones' acks held back behind the slow one, the broker would stop at five
    // unacked deliveries until the slow one ends.
    h.events
        .wait_for("q49", Duration::from_secs(3), |e| {
            e.iter().any(|e| e.outcome == Outcome::Succeeded)
        })
        .await?;
    assert!(
        h.events.for_message("slow").is_empty(),
        "the slow one is still running"
    );
    h.events
        .wait_for("slow", Duration::from_secs(10), |e| !e.is_empty())
        .await?;
    h.stop().await
}
