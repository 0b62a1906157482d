//! The audit-log consumer on the real broker and database: entries stored once each whatever
//! the broker repeats, a body that is not an entry dead-lettered, and the automation trigger,
//! bound `#` on the same exchange, leaving the entries alone.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::{Harness, entry, eventually, outgoing, stored};
use lapin::options::BasicGetOptions;
use worker_broker::Outgoing;
use worker_messages::{AUDIT_ENTRY, DomainEvent};
use worker_testkit::TestDb;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_entries_are_stored_once_each_when_one_is_published_twice_and_one_redelivered()
-> anyhow::Result<()> {
    let db = TestDb::create().await?;
    let mut h = Harness::start().await?;
    let entries: Vec<_> = (0..20).map(entry).collect();

    // The first delivery of entry 0 is stored, then its channel closes before the ack: the
    // broker delivers it again, to the consumer.
    h.publish(&outgoing(&entries[0])).await?;
    let connection = worker_testkit::amqp::connect(&h.vhost).await?;
    let channel = connection.create_channel().await?;
    let mut first = None;
    for _ in 0..50 {
        first = channel
            .basic_get(
                h.audit_queue.name.as_str().into(),
                BasicGetOptions { no_ack: false },
            )
            .await?;
        if first.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let first = first.expect("entry 0 reaches the audit queue");
    let decoded: worker_messages::AuditEntry = serde_json::from_slice(&first.delivery.data)?;
    assert!(job_audit_log::store::append(&db.pool, &decoded).await?);
    channel.close(200, "gone before the ack".into()).await?;
    connection.close(200, "done".into()).await?;

    h.consume(&db.pool);
    for entry in &entries[1..] {
        h.publish(&outgoing(entry)).await?;
    }
    h.publish(&outgoing(&entries[7])).await?;

    let settled = h.settled.clone();
    eventually(Duration::from_secs(30), "21 deliveries settled", || {
        let settled = settled.clone();
        async move {
            settled.count("audit.log", "succeeded") + settled.count("audit.log", "duplicate") >= 21
        }
    })
    .await;
    assert_eq!(stored(&db.pool).await, 20);
    assert_eq!(h.settled.count("audit.log", "succeeded"), 19);
    assert_eq!(h.settled.count("audit.log", "duplicate"), 2);
    let ids: Vec<uuid::Uuid> = sqlx::query_scalar("SELECT id FROM audit_log_entries ORDER BY id")
        .fetch_all(&db.pool)
        .await?;
    let mut expected: Vec<uuid::Uuid> = entries.iter().map(|e| e.id).collect();
    expected.sort();
    assert_eq!(ids, expected);
    assert_eq!(h.take_dead(&h.audit_queue.dead_queue).await?, None);
    h.stop().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_that_is_not_an_entry_is_dead_lettered_malformed() -> anyhow::Result<()> {
    let db = TestDb::create().await?;
    let mut h = Harness::start().await?;
    h.consume(&db.pool);
    let not_an_entry = Outgoing::json("events", AUDIT_ENTRY, &serde_json::json!({"hello": 1}))?
        .with_message_id("not-an-entry")
        .with_type(AUDIT_ENTRY);
    h.publish(&not_an_entry).await?;

    let mut dead = None;
    for _ in 0..100 {
        dead = h.take_dead(&h.audit_queue.dead_queue).await?;
        if dead.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let headers = dead.expect("the body is dead-lettered");
    assert_eq!(headers["x-dead-reason"], "malformed", "{headers}");
    assert_eq!(stored(&db.pool).await, 0);
    h.stop().await
}

/// The trigger's queue keeps its default binding `#` (old settings unchanged), so audit
/// entries reach it: it acks them as skipped `not-an-event`, dead-letters none, and still
/// reads a domain event.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_trigger_skips_audit_entries_on_the_shared_exchange_instead_of_dead_lettering_them()
-> anyhow::Result<()> {
    let db = TestDb::create().await?;
    let mut h = Harness::start().await?;
    h.consume(&db.pool);
    h.trigger(&db.pool);
    for n in 0..3 {
        h.publish(&outgoing(&entry(n))).await?;
    }
    // Published by a client that sets no `type`: the routing key names it.
    let untyped = entry(3);
    h.publish(
        &Outgoing::json("events", AUDIT_ENTRY, &untyped)?.with_message_id(&untyped.id.to_string()),
    )
    .await?;
    let event = DomainEvent {
        id: uuid::Uuid::new_v4(),
        event_type: "order.placed".into(),
        occurred_at: chrono::Utc::now(),
        data: serde_json::json!({"order": 1}),
    };
    h.publish(
        &Outgoing::json("events", "order.placed", &event)?
            .with_message_id(&event.id.to_string())
            .with_type("order.placed"),
    )
    .await?;

    let settled = h.settled.clone();
    eventually(Duration::from_secs(30), "every delivery settled", || {
        let settled = settled.clone();
        async move {
            settled.count("automation.trigger", "skipped") >= 5
                && settled.count("audit.log", "succeeded") >= 4
        }
    })
    .await;
    let mut reasons = h.settled.skip_reasons("automation.trigger");
    reasons.sort_unstable();
    assert_eq!(
        reasons,
        [
            "no-match",
            "not-an-event",
            "not-an-event",
            "not-an-event",
            "not-an-event"
        ]
    );
    assert_eq!(stored(&db.pool).await, 4);
    assert_eq!(h.take_dead(&h.trigger_queue.dead_queue).await?, None);
    assert_eq!(h.take_dead(&h.audit_queue.dead_queue).await?, None);
    // The audit queue is bound to `audit.entry` only: the domain event never reached it.
    assert_eq!(h.settled.count("audit.log", "dead-lettered:malformed"), 0);
    h.stop().await
}
