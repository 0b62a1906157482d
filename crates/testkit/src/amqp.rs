//! A test's own look at its queues, on a plain lapin connection beside the code under test:
//! how many messages a queue holds now, taking them all, a header of a message, and
//! publishing with publisher confirms (mandatory, so an unroutable message fails the test).

use anyhow::{Context, bail};
use lapin::message::BasicGetMessage;
use lapin::options::{
    BasicGetOptions, BasicPublishOptions, ConfirmSelectOptions, QueueDeclareOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{BasicProperties, Channel, Connection, ConnectionProperties};

use crate::TestVhost;

/// Opens a connection to `vhost` as the management user.
pub async fn connect(vhost: &TestVhost) -> anyhow::Result<Connection> {
    Connection::connect(&vhost.amqp_url(), ConnectionProperties::default())
        .await
        .with_context(|| format!("connecting to vhost {}", vhost.name))
}

/// The messages ready in `queue` and its consumers, as the broker says now (a passive
/// declare: exact, unlike the management API's sampled figures). The queue must exist.
pub async fn counts(channel: &Channel, queue: &str) -> anyhow::Result<(u32, u32)> {
    let q = channel
        .queue_declare(
            queue.into(),
            QueueDeclareOptions {
                passive: true,
                ..QueueDeclareOptions::default()
            },
            FieldTable::default(),
        )
        .await
        .with_context(|| format!("declaring {queue} passively"))?;
    Ok((q.message_count(), q.consumer_count()))
}

/// The messages ready in `queue`, as the broker says now ([`counts`]).
pub async fn ready(channel: &Channel, queue: &str) -> anyhow::Result<u32> {
    Ok(counts(channel, queue).await?.0)
}

/// Takes every message ready in `queue` (auto-acked), in order; at most `limit`, so that a
/// queue something keeps filling cannot hold the test.
pub async fn take_all(
    channel: &Channel,
    queue: &str,
    limit: usize,
) -> anyhow::Result<Vec<BasicGetMessage>> {
    let mut out = Vec::new();
    while let Some(m) = channel
        .basic_get(queue.into(), BasicGetOptions { no_ack: true })
        .await?
    {
        out.push(m);
        if out.len() > limit {
            bail!("{queue} held more than {limit} messages");
        }
    }
    Ok(out)
}

/// The header `key` of a message, if it has one.
pub fn header<'a>(properties: &'a BasicProperties, key: &str) -> Option<&'a AMQPValue> {
    properties.headers().as_ref()?.inner().get(key)
}

/// Publishes `messages` (properties and body) to `exchange` with `routing_key` on a
/// connection of its own to `vhost`, each mandatory and confirmed; fails on a message
/// returned unroutable.
pub async fn publish_confirmed(
    vhost: &TestVhost,
    exchange: &str,
    routing_key: &str,
    messages: &[(BasicProperties, &[u8])],
) -> anyhow::Result<()> {
    let connection = connect(vhost).await?;
    let channel = connection.create_channel().await?;
    channel
        .confirm_select(ConfirmSelectOptions::default())
        .await?;
    for (properties, body) in messages {
        let confirm = channel
            .basic_publish(
                exchange.into(),
                routing_key.into(),
                BasicPublishOptions {
                    mandatory: true,
                    immediate: false,
                },
                body,
                properties.clone(),
            )
            .await?
            .await?;
        if confirm.take_message().is_some() {
            bail!("the message to {exchange}/{routing_key} was returned unroutable");
        }
    }
    let _ = connection.close(200, "done".into()).await;
    Ok(())
}
