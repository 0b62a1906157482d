//! Declaring the topology on a channel: exchanges, quorum queues with their arguments, and
//! bindings.

use lapin::options::{ExchangeDeclareOptions, QueueBindOptions, QueueDeclareOptions};
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use lapin::{Channel, ExchangeKind};

use super::conflict::classify_declare_error;
use super::error::TopologyError;
use super::model::{QueueTopology, QuorumPlacement, Topology};

/// Declares every exchange, queue and binding of `topology`. Idempotent: declaring what exists
/// with the same arguments changes nothing. Stops at the first failure, since a refused
/// declare closes the channel.
pub async fn declare(channel: &Channel, topology: &Topology) -> Result<(), TopologyError> {
    declare_exchange(channel, &topology.events_exchange, ExchangeKind::Topic).await?;
    declare_exchange(channel, &topology.commands_exchange, ExchangeKind::Direct).await?;
    for queue in &topology.queues {
        declare_queue_topology(channel, queue, topology.placement).await?;
    }
    Ok(())
}

async fn declare_queue_topology(
    channel: &Channel,
    q: &QueueTopology,
    placement: QuorumPlacement,
) -> Result<(), TopologyError> {
    declare_exchange(channel, &q.dead_exchange, ExchangeKind::Fanout).await?;
    declare_queue(channel, &q.dead_queue, quorum_args(placement)).await?;
    bind(channel, &q.dead_queue, &q.dead_exchange, "").await?;

    let mut args = quorum_args(placement);
    args.insert(
        "x-delivery-limit".into(),
        AMQPValue::LongLongInt(i64::from(q.delivery_limit)),
    );
    args.insert(
        "x-dead-letter-exchange".into(),
        long_string(&q.dead_exchange),
    );
    args.insert(
        "x-dead-letter-strategy".into(),
        long_string("at-least-once"),
    );
    args.insert("x-overflow".into(), long_string("reject-publish"));
    declare_queue(channel, &q.name, args).await?;
    for binding in &q.bindings {
        for key in &binding.routing_keys {
            bind(channel, &q.name, &binding.exchange, key).await?;
        }
    }

    for tier in &q.tiers {
        let mut args = quorum_args(placement);
        let ttl = i64::try_from(tier.delay.as_millis()).unwrap_or(i64::MAX);
        args.insert("x-message-ttl".into(), AMQPValue::LongLongInt(ttl));
        args.insert("x-dead-letter-exchange".into(), long_string(""));
        args.insert("x-dead-letter-routing-key".into(), long_string(&q.name));
        args.insert(
            "x-dead-letter-strategy".into(),
            long_string("at-least-once"),
        );
        args.insert("x-overflow".into(), long_string("reject-publish"));
        declare_queue(channel, &tier.queue, args).await?;
    }
    Ok(())
}

/// A quorum queue's own arguments: its type, and its placement where the settings give one
/// (only then: see the module docs).
fn quorum_args(placement: QuorumPlacement) -> FieldTable {
    let mut args = FieldTable::default();
    args.insert("x-queue-type".into(), long_string("quorum"));
    if let Some(size) = placement.initial_group_size {
        args.insert(
            "x-quorum-initial-group-size".into(),
            AMQPValue::LongLongInt(i64::from(size)),
        );
    }
    if let Some(locator) = placement.leader_locator {
        args.insert(
            "x-queue-leader-locator".into(),
            long_string(locator.as_str()),
        );
    }
    args
}

fn long_string(s: &str) -> AMQPValue {
    AMQPValue::LongString(LongString::from(s))
}

async fn declare_exchange(
    channel: &Channel,
    name: &str,
    kind: ExchangeKind,
) -> Result<(), TopologyError> {
    let options = ExchangeDeclareOptions {
        durable: true,
        ..ExchangeDeclareOptions::default()
    };
    channel
        .exchange_declare(short(name)?, kind.clone(), options, FieldTable::default())
        .await
        .map_err(|source| classify_declare_error("exchange", name, source))
}

async fn declare_queue(
    channel: &Channel,
    name: &str,
    args: FieldTable,
) -> Result<(), TopologyError> {
    let options = QueueDeclareOptions {
        durable: true,
        ..QueueDeclareOptions::default()
    };
    channel
        .queue_declare(short(name)?, options, args)
        .await
        .map(|_| ())
        .map_err(|source| classify_declare_error("queue", name, source))
}

async fn bind(
    channel: &Channel,
    queue: &str,
    exchange: &str,
    key: &str,
) -> Result<(), TopologyError> {
    channel
        .queue_bind(
            short(queue)?,
            short(exchange)?,
            short(key)?,
            QueueBindOptions::default(),
            FieldTable::default(),
        )
        .await
        .map_err(|source| TopologyError::Broker {
            what: format!("the binding {exchange} → {queue} ({key})"),
            source,
        })
}

fn short(name: &str) -> Result<ShortString, TopologyError> {
    ShortString::try_new(name).map_err(|e| TopologyError::Invalid {
        queue: name.into(),
        key: "name".into(),
        problem: e.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::topology::LeaderLocator;

    #[test]
    fn placement_arguments_are_sent_only_when_set() {
        let unset = quorum_args(QuorumPlacement::default());
        assert_eq!(unset.inner().len(), 1, "{unset:?}");
        let set = quorum_args(QuorumPlacement {
            initial_group_size: Some(3),
            leader_locator: Some(LeaderLocator::Balanced),
        });
        assert_eq!(
            set.inner().get("x-quorum-initial-group-size"),
            Some(&AMQPValue::LongLongInt(3))
        );
        assert_eq!(
            set.inner().get("x-queue-leader-locator"),
            Some(&long_string("balanced"))
        );
    }
}
