//! Confirmed publishing and topology declaration on the real broker.
// Helpers outside #[test] functions assert too: a failed expectation fails the test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::*;
use worker_broker::{
    ConnectionSettings, Outgoing, PublishError, Publisher, PublisherSettings, Session,
    TopologyError, declare,
};
use worker_testkit::TestVhost;

async fn setup() -> anyhow::Result<(TestVhost, ConnectionSettings, Session)> {
    let vhost = TestVhost::create().await?;
    let settings = connection_settings(&vhost)?;
    let session = Session::new(settings.connect().await?);
    let channel = session.connection().create_channel().await?;
    declare(&channel, &topology(&queue_settings(&[200, 500], 5))?).await?;
    Ok((vhost, settings, session))
}

fn publisher(session: &Session) -> Publisher {
    Publisher::new(
        session.clone().fixed(),
        PublisherSettings {
            channels: 2,
            confirm_timeout: Duration::from_secs(5),
            connect_wait: Duration::from_secs(1),
        },
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unroutable_publish_is_an_error_not_a_success() -> anyhow::Result<()> {
    let (vhost, _, session) = setup().await?;
    let publisher = publisher(&session);

    publisher
        .publish(&Outgoing::json(
            "commands",
            QUEUE,
            &serde_json::json!({"id": "1"}),
        )?)
        .await?;
    let err = publisher
        .publish(&Outgoing::json(
            "commands",
            "nobody.listens",
            &serde_json::json!({"id": "2"}),
        )?)
        .await
        .unwrap_err();
    assert!(
        matches!(&err, PublishError::Unroutable { exchange, routing_key } if exchange == "commands" && routing_key == "nobody.listens"),
        "{err:?}"
    );
    assert!(!err.is_transient());
    assert_eq!(err.to_failure().reason(), "unroutable");
    let conn = connection_settings(&vhost)?.connect().await?;
    let ch = conn.create_channel().await?;
    assert_eq!(
        get_all(&ch, QUEUE, 2, Duration::from_millis(500))
            .await?
            .len(),
        1
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_is_pipelined_and_each_entry_gets_its_own_result() -> anyhow::Result<()> {
    let (_vhost, settings, session) = setup().await?;
    let publisher = publisher(&session);
    let mut batch = Vec::new();
    for i in 0..500 {
        let key = if i % 100 == 42 { "nowhere" } else { QUEUE };
        batch.push(
            Outgoing::json("commands", key, &serde_json::json!({"id": i}))?
                .with_message_id(&format!("m{i}")),
        );
    }
    let results = publisher.publish_many(&batch).await;
    assert_eq!(results.len(), 500);
    for (i, r) in results.iter().enumerate() {
        if i % 100 == 42 {
            assert!(
                matches!(r, Err(PublishError::Unroutable { .. })),
                "{i}: {r:?}"
            );
        } else {
            assert!(r.is_ok(), "{i}: {r:?}");
        }
    }
    let conn = settings.connect().await?;
    let ch = conn.create_channel().await?;
    let got = get_all(&ch, QUEUE, 495, Duration::from_secs(10)).await?;
    assert_eq!(got.len(), 495);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_publish_is_an_error_and_the_next_one_works() -> anyhow::Result<()> {
    let (_vhost, _, session) = setup().await?;
    let publisher = publisher(&session);
    let err = publisher
        .publish(&Outgoing::new("no-such-exchange", "k", b"x".to_vec()))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, PublishError::Refused { code, .. } if code.contains("NOTFOUND")),
        "{err:?}"
    );
    // The channel the broker closed is replaced.
    for _ in 0..3 {
        publisher
            .publish(&Outgoing::new("commands", QUEUE, b"{}".to_vec()))
            .await?;
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publishing_while_disconnected_is_a_transient_error() -> anyhow::Result<()> {
    let (_vhost, _, session) = setup().await?;
    let publisher = publisher(&session);
    let _ = session.connection().close(200, "test".into()).await;
    let err = publisher
        .publish(&Outgoing::new("commands", QUEUE, b"{}".to_vec()))
        .await
        .unwrap_err();
    assert!(err.is_transient(), "{err:?}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn declaring_twice_changes_nothing_and_a_conflict_says_how_to_resolve_it()
-> anyhow::Result<()> {
    let (_vhost, _, session) = setup().await?;
    let channel = session.connection().create_channel().await?;
    declare(&channel, &topology(&queue_settings(&[200, 500], 5))?).await?;

    let err = declare(&channel, &topology(&queue_settings(&[200, 500], 3))?)
        .await
        .unwrap_err();
    let TopologyError::Conflict(conflict) = &err else {
        panic!("{err:?}")
    };
    assert_eq!(conflict.kind, "queue");
    assert_eq!(conflict.name, QUEUE);
    assert_eq!(conflict.argument, "x-delivery-limit");
    assert_eq!(conflict.wanted, "3");
    assert_eq!(conflict.existing, "5");
    let text = err.to_string();
    assert!(
        text.contains("delete_queue orders") && text.contains("set the setting back"),
        "{text}"
    );
    assert!(!err.is_transient());

    // A classic queue in the way of a quorum one.
    let channel = session.connection().create_channel().await?;
    channel
        .queue_declare(
            "other".into(),
            lapin::options::QueueDeclareOptions {
                durable: true,
                ..Default::default()
            },
            Default::default(),
        )
        .await?;
    let mut settings = queue_settings(&[200], 5);
    settings.name = Some("other".into());
    let err = declare(&channel, &topology(&settings)?).await.unwrap_err();
    let TopologyError::Conflict(conflict) = &err else {
        panic!("{err:?}")
    };
    assert!(conflict.argument.starts_with("x-"), "{err}");
    assert!(text_of(&err).contains("'other'"));
    Ok(())
}

fn text_of(err: &TopologyError) -> String {
    err.to_string()
}
