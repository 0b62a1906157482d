//! Exchanges and queues: their settings, the resolved [`Topology`] and an idempotent [`declare`].
//!
//! For each consumer queue `Q` the topology is:
//!
//! ```text
//!  events (topic) ──┐                          ┌──────────── Q.retry.10s  (ttl 10 s) ─┐
//!  commands (direct)┴─ bindings ─▶ Q (quorum) ─┤  park: published through "" to the   │
//!                                     ▲        │  tier queue, dead-letters back to Q  │
//!                                     │        │  ("" with routing key Q) on expiry   │
//!                                     └────────┼──────────────────────────────────────┘
//!                                              └─ dead: Q.dead (fanout) ─▶ Q.dead (queue)
//! ```
//!
//! - `Q` is a quorum queue with `x-delivery-limit`; what exceeds it is dead-lettered by the
//!   broker to `Q.dead` with the `at-least-once` strategy (which needs `reject-publish`).
//! - Each retry tier is its own quorum queue, because a quorum queue expires messages from its
//!   head only: one queue per delay keeps every message in a tier waiting the same time.
//!   Tier queues are named by their delay (`Q.retry.10s`, `Q.retry.2m`), so that changing the
//!   tiers in the settings declares new queues while the old ones drain into `Q` on their own,
//!   instead of failing on an inequivalent `x-message-ttl`.
//! - A parked copy is published to the tier through the default exchange, which replaces its
//!   routing key; the original one travels in [`ORIGINAL_ROUTING_KEY_HEADER`].
//! - On a cluster, every quorum queue (work, tier and dead queues alike) is placed as
//!   [`QuorumPlacement`] says: how many nodes hold a replica, and where its leader goes. Its
//!   arguments are sent only when they are set, because RabbitMQ compares them on every
//!   declare: adding one to queues that exist without it fails with PRECONDITION_FAILED.

use std::collections::BTreeSet;
use std::time::Duration;

use lapin::options::{ExchangeDeclareOptions, QueueBindOptions, QueueDeclareOptions};
use lapin::protocol::{AMQPErrorKind, AMQPSoftError};
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use lapin::{Channel, ExchangeKind};
use serde::{Deserialize, Serialize};

/// The header that keeps a parked message's original routing key, since parking goes through
/// the default exchange, whose routing key is the tier queue's name.
pub const ORIGINAL_ROUTING_KEY_HEADER: &str = "x-original-routing-key";

/// The broker-wide part of the topology: `[broker.topology]`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TopologySettings {
    /// The topic exchange domain events are published to.
    pub events_exchange: String,
    /// The direct exchange commands are published to.
    pub commands_exchange: String,
    /// Nodes that hold a replica of each quorum queue, from its declaration on
    /// (`x-quorum-initial-group-size`). Unset: the broker's default, every node of the
    /// cluster. Queues that exist keep theirs, and declaring them with another fails.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub quorum_initial_group_size: Option<u32>,
    /// Which node leads each new quorum queue (`x-queue-leader-locator`, RabbitMQ 3.10 and
    /// later): `balanced` spreads the leaders over the nodes, `client-local` puts each on the
    /// node that declares it. Unset: the broker's default (`client-local`). As with
    /// `quorum_initial_group_size`, queues that exist keep theirs.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub queue_leader_locator: Option<LeaderLocator>,
}

impl Default for TopologySettings {
    fn default() -> Self {
        Self {
            events_exchange: "events".into(),
            commands_exchange: "commands".into(),
            quorum_initial_group_size: None,
            queue_leader_locator: None,
        }
    }
}

/// `x-queue-leader-locator`: where RabbitMQ puts a new quorum queue's leader.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum LeaderLocator {
    /// On the node the declaring client is connected to.
    ClientLocal,
    /// On the node that leads the fewest queues, so that leaders (which do a queue's work)
    /// spread over the cluster.
    Balanced,
}

impl LeaderLocator {
    /// The argument's value as RabbitMQ spells it.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::ClientLocal => "client-local",
            Self::Balanced => "balanced",
        }
    }
}

/// How every quorum queue of the topology is spread over a cluster's nodes; `None` leaves
/// the choice to the broker and sends no argument.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct QuorumPlacement {
    /// `x-quorum-initial-group-size`: the nodes that hold a replica of each queue.
    pub initial_group_size: Option<u32>,
    /// `x-queue-leader-locator`: where each queue's leader goes.
    pub leader_locator: Option<LeaderLocator>,
}

/// One binding of a consumer queue: an exchange and the routing keys (or, on a topic exchange,
/// patterns) that route to the queue.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BindingSettings {
    pub exchange: String,
    pub routing_keys: Vec<String>,
}

/// The queue part of a consumer's section (`[jobs.<consumer>.queue]`).
///
/// `name`, `bindings`, `dead_exchange` and `dead_queue` default per consumer (see
/// [`QueueDefaults`]), which is why they are optional here: a section that sets only
/// `delivery_limit` must still get the consumer's own queue name.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct QueueSettings {
    pub name: Option<String>,
    pub bindings: Option<Vec<BindingSettings>>,
    /// Deliveries of one message before the broker dead-letters it (`x-delivery-limit`).
    pub delivery_limit: u32,
    /// The delay of each retry tier, in order (`["10s", "30s", "2m"]`).
    #[serde(with = "durations")]
    pub retry_tiers: Vec<Duration>,
    /// Defaults to `<name>.dead`.
    pub dead_exchange: Option<String>,
    /// Defaults to `<name>.dead`.
    pub dead_queue: Option<String>,
}

impl Default for QueueSettings {
    fn default() -> Self {
        Self {
            name: None,
            bindings: None,
            delivery_limit: 5,
            retry_tiers: [10, 30, 120, 600, 1800]
                .into_iter()
                .map(Duration::from_secs)
                .collect(),
            dead_exchange: None,
            dead_queue: None,
        }
    }
}

/// What a consumer's queue is called and bound to when its settings do not say.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueDefaults {
    pub name: String,
    pub bindings: Vec<BindingSettings>,
}

impl QueueDefaults {
    /// A command queue named `name`, bound to the commands exchange with `name`.
    pub fn command(name: &str, topology: &TopologySettings) -> Self {
        Self {
            name: name.into(),
            bindings: vec![BindingSettings {
                exchange: topology.commands_exchange.clone(),
                routing_keys: vec![name.into()],
            }],
        }
    }

    /// An event queue named `name`, bound to the events exchange with `routing_keys` (topic
    /// patterns: `#` takes every event).
    pub fn events(name: &str, routing_keys: &[&str], topology: &TopologySettings) -> Self {
        Self {
            name: name.into(),
            bindings: vec![BindingSettings {
                exchange: topology.events_exchange.clone(),
                routing_keys: routing_keys.iter().map(|key| (*key).to_string()).collect(),
            }],
        }
    }
}

/// A retry tier: a delay queue.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetryTier {
    pub delay: Duration,
    pub queue: String,
}

/// A consumer queue with everything around it, names resolved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueTopology {
    pub name: String,
    pub bindings: Vec<BindingSettings>,
    pub delivery_limit: u32,
    pub tiers: Vec<RetryTier>,
    pub dead_exchange: String,
    pub dead_queue: String,
}

impl QueueTopology {
    /// Resolves a consumer's queue settings against its defaults, and checks them.
    pub fn from_settings(
        settings: &QueueSettings,
        defaults: QueueDefaults,
    ) -> Result<Self, TopologyError> {
        let name = settings.name.clone().unwrap_or(defaults.name);
        let invalid = |key: &str, problem: String| TopologyError::Invalid {
            queue: name.clone(),
            key: key.into(),
            problem,
        };
        check_name(&name).map_err(|p| invalid("name", p))?;
        let bindings = settings.bindings.clone().unwrap_or(defaults.bindings);
        for binding in &bindings {
            check_name(&binding.exchange).map_err(|p| invalid("bindings.exchange", p))?;
            if binding.routing_keys.is_empty() {
                return Err(invalid(
                    "bindings.routing_keys",
                    format!("the binding to {} has no routing key", binding.exchange),
                ));
            }
            for key in &binding.routing_keys {
                ShortString::try_new(key.as_str())
                    .map_err(|e| invalid("bindings.routing_keys", e.to_string()))?;
            }
        }
        if settings.delivery_limit == 0 {
            return Err(invalid("delivery_limit", "must be at least 1".into()));
        }
        if settings.retry_tiers.is_empty() {
            return Err(invalid("retry_tiers", "needs at least one delay".into()));
        }
        let mut tiers = Vec::with_capacity(settings.retry_tiers.len());
        let mut seen = BTreeSet::new();
        for &delay in &settings.retry_tiers {
            if delay.as_millis() == 0 || delay.as_millis() > u128::from(u32::MAX) {
                return Err(invalid(
                    "retry_tiers",
                    format!(
                        "{} is not between 1 ms and 49 days",
                        humantime::format_duration(delay)
                    ),
                ));
            }
            let queue = format!("{name}.retry.{}", compact_duration(delay));
            check_name(&queue).map_err(|p| invalid("retry_tiers", p))?;
            if !seen.insert(queue.clone()) {
                return Err(invalid(
                    "retry_tiers",
                    format!("{} appears twice", humantime::format_duration(delay)),
                ));
            }
            tiers.push(RetryTier { delay, queue });
        }
        let dead_exchange = settings
            .dead_exchange
            .clone()
            .unwrap_or_else(|| format!("{name}.dead"));
        let dead_queue = settings
            .dead_queue
            .clone()
            .unwrap_or_else(|| format!("{name}.dead"));
        check_name(&dead_exchange).map_err(|p| invalid("dead_exchange", p))?;
        check_name(&dead_queue).map_err(|p| invalid("dead_queue", p))?;
        if dead_queue == name || tiers.iter().any(|t| t.queue == dead_queue) {
            return Err(invalid(
                "dead_queue",
                format!("{dead_queue} is already the work queue or a retry tier"),
            ));
        }
        Ok(Self {
            name,
            bindings,
            delivery_limit: settings.delivery_limit,
            tiers,
            dead_exchange,
            dead_queue,
        })
    }

    /// The tier a message waits in before its attempt `attempt` (see [`tier_index_for_attempt`]).
    pub fn tier_for_attempt(&self, attempt: u32) -> Option<&RetryTier> {
        tier_index_for_attempt(attempt, self.tiers.len()).and_then(|i| self.tiers.get(i))
    }

    /// The first tier that waits at least `wait`, or the longest one.
    pub fn tier_for_delay(&self, wait: Duration) -> Option<&RetryTier> {
        self.tiers
            .iter()
            .find(|t| t.delay >= wait)
            .or_else(|| self.tiers.last())
    }
}

/// The tier (0-based) that attempt `attempt` (1-based) waits in: attempt n waits in tier n − 1
/// (attempt 2 in the first tier), or in the last tier once past it. Attempt 1 never waits.
pub fn tier_index_for_attempt(attempt: u32, tiers: usize) -> Option<usize> {
    if attempt < 2 || tiers == 0 {
        return None;
    }
    Some((attempt as usize - 2).min(tiers - 1))
}

/// The whole topology: the shared exchanges and every consumer queue.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Topology {
    pub events_exchange: String,
    pub commands_exchange: String,
    pub queues: Vec<QueueTopology>,
    /// How every quorum queue above is spread over a cluster's nodes.
    pub placement: QuorumPlacement,
}

impl Topology {
    pub fn from_settings(
        settings: &TopologySettings,
        queues: impl IntoIterator<Item = QueueTopology>,
    ) -> Result<Self, TopologyError> {
        for (key, name) in [
            ("events_exchange", &settings.events_exchange),
            ("commands_exchange", &settings.commands_exchange),
        ] {
            check_name(name).map_err(|problem| TopologyError::Invalid {
                queue: String::new(),
                key: key.into(),
                problem,
            })?;
        }
        if settings.quorum_initial_group_size == Some(0) {
            return Err(TopologyError::Invalid {
                queue: String::new(),
                key: "quorum_initial_group_size".into(),
                problem: "expected at least 1 node, found 0 (leave it unset for every node)".into(),
            });
        }
        let queues: Vec<QueueTopology> = queues.into_iter().collect();
        let mut names = BTreeSet::new();
        for q in &queues {
            if !names.insert(q.name.as_str()) {
                return Err(TopologyError::Invalid {
                    queue: q.name.clone(),
                    key: "name".into(),
                    problem: "two consumers share this queue".into(),
                });
            }
        }
        Ok(Self {
            events_exchange: settings.events_exchange.clone(),
            commands_exchange: settings.commands_exchange.clone(),
            queues,
            placement: QuorumPlacement {
                initial_group_size: settings.quorum_initial_group_size,
                leader_locator: settings.queue_leader_locator,
            },
        })
    }

    pub fn queue(&self, name: &str) -> Option<&QueueTopology> {
        self.queues.iter().find(|q| q.name == name)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum TopologyError {
    #[error("queue settings{}: `{key}` {problem}", if queue.is_empty() { String::new() } else { format!(" of {queue}") })]
    Invalid {
        queue: String,
        key: String,
        problem: String,
    },

    #[error("{0}")]
    Conflict(Box<DeclareConflict>),

    #[error("declaring {what}: {source}")]
    Broker {
        what: String,
        #[source]
        source: lapin::Error,
    },
}

/// A queue or exchange that exists with other arguments than the settings want.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeclareConflict {
    /// `queue` or `exchange`.
    pub kind: &'static str,
    pub name: String,
    /// The argument that differs (`x-delivery-limit`), as the broker named it.
    pub argument: String,
    pub wanted: String,
    pub existing: String,
    /// The broker's own words.
    pub raw: String,
}

impl std::fmt::Display for DeclareConflict {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let Self {
            kind,
            name,
            argument,
            wanted,
            existing,
            raw,
        } = self;
        let delete = if *kind == "queue" {
            format!("`rabbitmqctl delete_queue {name} --vhost <vhost>`, after draining it")
        } else {
            format!("the management UI or `rabbitmqadmin delete exchange name={name}`")
        };
        write!(
            f,
            "the {kind} '{name}' already exists with {argument} = {existing}, but the settings want {wanted}. \
             To resolve it, either set the setting back to match the existing {kind}, or delete the {kind} \
             ({delete}) so that the next start declares it anew. (broker said: {raw})"
        )
    }
}

impl TopologyError {
    /// Whether trying again after reconnecting may succeed (the broker was unreachable), as
    /// opposed to a conflict or bad settings that need an operator.
    pub fn is_transient(&self) -> bool {
        match self {
            Self::Broker { source, .. } => !matches!(
                source.kind(),
                lapin::ErrorKind::ProtocolError(e) if matches!(e.kind(), AMQPErrorKind::Soft(AMQPSoftError::PRECONDITIONFAILED | AMQPSoftError::ACCESSREFUSED))
            ),
            _ => false,
        }
    }
}

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

fn check_name(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err("is empty".into());
    }
    if name.len() > 200 {
        // 255 is the protocol limit; tier suffixes need room.
        return Err(format!("{name} is longer than 200 bytes"));
    }
    Ok(())
}

/// Turns a refused declare into a [`TopologyError::Conflict`] when the broker said which
/// argument differs (RabbitMQ: "inequivalent arg 'x-…' for queue 'q' in vhost 'v': received
/// the value '3' of type 'long' but current is none").
fn classify_declare_error(kind: &'static str, name: &str, source: lapin::Error) -> TopologyError {
    if let lapin::ErrorKind::ProtocolError(e) = source.kind()
        && matches!(
            e.kind(),
            AMQPErrorKind::Soft(AMQPSoftError::PRECONDITIONFAILED)
        )
    {
        let raw = e.get_message().to_string();
        let (argument, wanted, existing) = parse_inequivalent(&raw).unwrap_or_else(|| {
            (
                "its arguments or type".into(),
                "other arguments".into(),
                "different ones".into(),
            )
        });
        return TopologyError::Conflict(Box::new(DeclareConflict {
            kind,
            name: name.into(),
            argument,
            wanted,
            existing,
            raw,
        }));
    }
    TopologyError::Broker {
        what: format!("the {kind} {name}"),
        source,
    }
}

fn parse_inequivalent(text: &str) -> Option<(String, String, String)> {
    let rest = text.split_once("inequivalent arg '")?.1;
    let (argument, rest) = rest.split_once('\'')?;
    let rest = rest.split_once("received ")?.1;
    let (received, current) = rest.split_once(" but current is ")?;
    Some((
        argument.to_string(),
        describe_value(received),
        describe_value(current),
    ))
}

/// "the value '3' of type 'long'" → "3"; "none" → "none (not set)".
fn describe_value(text: &str) -> String {
    let text = text.trim();
    if text == "none" {
        return "none (not set)".into();
    }
    text.split_once('\'')
        .and_then(|(_, rest)| rest.split_once('\''))
        .map(|(value, _)| value.to_string())
        .unwrap_or_else(|| text.to_string())
}

/// `10s`, `2m`, `1h`, `250ms`: short enough for a queue name, exact for any whole millisecond.
pub fn compact_duration(d: Duration) -> String {
    let ms = d.as_millis();
    if ms.is_multiple_of(3_600_000) {
        format!("{}h", ms / 3_600_000)
    } else if ms.is_multiple_of(60_000) {
        format!("{}m", ms / 60_000)
    } else if ms.is_multiple_of(1000) {
        format!("{}s", ms / 1000)
    } else {
        format!("{ms}ms")
    }
}

/// `Vec<Duration>` as humantime strings.
mod durations {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    pub fn serialize<S: Serializer>(value: &[Duration], s: S) -> Result<S::Ok, S::Error> {
        value
            .iter()
            .map(|d| humantime::format_duration(*d).to_string())
            .collect::<Vec<_>>()
            .serialize(s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<Duration>, D::Error> {
        let raw: Vec<humantime_serde::Serde<Duration>> = Vec::deserialize(d)?;
        Ok(raw.into_iter().map(|d| d.into_inner()).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attempt_n_waits_in_tier_n_minus_one_then_the_last() {
        assert_eq!(tier_index_for_attempt(1, 5), None);
        assert_eq!(tier_index_for_attempt(0, 5), None);
        assert_eq!(tier_index_for_attempt(2, 5), Some(0));
        assert_eq!(tier_index_for_attempt(3, 5), Some(1));
        assert_eq!(tier_index_for_attempt(6, 5), Some(4));
        assert_eq!(tier_index_for_attempt(7, 5), Some(4));
        assert_eq!(tier_index_for_attempt(u32::MAX, 5), Some(4));
        assert_eq!(tier_index_for_attempt(3, 0), None);
    }

    proptest::proptest! {
        #[test]
        fn tier_is_monotonic_and_in_range(attempt in 2u32..10_000, tiers in 1usize..20) {
            let i = tier_index_for_attempt(attempt, tiers).unwrap();
            proptest::prop_assert!(i < tiers);
            let next = tier_index_for_attempt(attempt + 1, tiers).unwrap();
            proptest::prop_assert!(next == i || next == i + 1);
        }
    }

    /// The host's three queues, named and bound as their jobs name them.
    fn three_queues() -> Topology {
        let settings = TopologySettings::default();
        let queues = [
            QueueDefaults::events("automation.trigger", &["#"], &settings),
            QueueDefaults::command("automation.action", &settings),
            QueueDefaults::command("email.send", &settings),
        ]
        .into_iter()
        .map(|d| QueueTopology::from_settings(&QueueSettings::default(), d).unwrap());
        Topology::from_settings(&settings, queues).unwrap()
    }

    #[test]
    fn defaults_name_everything_after_the_queue() {
        let topo = three_queues();
        let q = topo.queue("email.send").unwrap();
        assert_eq!(q.delivery_limit, 5);
        assert_eq!(q.dead_exchange, "email.send.dead");
        assert_eq!(q.dead_queue, "email.send.dead");
        let tiers: Vec<_> = q.tiers.iter().map(|t| t.queue.as_str()).collect();
        assert_eq!(
            tiers,
            [
                "email.send.retry.10s",
                "email.send.retry.30s",
                "email.send.retry.2m",
                "email.send.retry.10m",
                "email.send.retry.30m"
            ]
        );
        assert_eq!(
            q.bindings,
            vec![BindingSettings {
                exchange: "commands".into(),
                routing_keys: vec!["email.send".into()]
            }]
        );
        let trigger = topo.queue("automation.trigger").unwrap();
        assert_eq!(
            trigger.bindings,
            vec![BindingSettings {
                exchange: "events".into(),
                routing_keys: vec!["#".into()]
            }]
        );
    }

    #[test]
    fn tiers_by_attempt_and_by_delay() {
        let q = three_queues().queues.remove(2);
        assert_eq!(
            q.tier_for_attempt(2).unwrap().delay,
            Duration::from_secs(10)
        );
        assert_eq!(
            q.tier_for_attempt(4).unwrap().delay,
            Duration::from_secs(120)
        );
        assert_eq!(
            q.tier_for_attempt(40).unwrap().delay,
            Duration::from_secs(1800)
        );
        assert_eq!(
            q.tier_for_delay(Duration::from_secs(1)).unwrap().delay,
            Duration::from_secs(10)
        );
        assert_eq!(
            q.tier_for_delay(Duration::from_secs(10)).unwrap().delay,
            Duration::from_secs(10)
        );
        assert_eq!(
            q.tier_for_delay(Duration::from_secs(11)).unwrap().delay,
            Duration::from_secs(30)
        );
        assert_eq!(
            q.tier_for_delay(Duration::from_secs(7200)).unwrap().delay,
            Duration::from_secs(1800)
        );
    }

    #[test]
    fn a_partial_section_keeps_the_consumer_defaults() {
        let settings: QueueSettings =
            toml::from_str("delivery_limit = 3\nretry_tiers = [\"200ms\", \"1s\"]").unwrap();
        let q = QueueTopology::from_settings(
            &settings,
            QueueDefaults::command("email.send", &TopologySettings::default()),
        )
        .unwrap();
        assert_eq!(q.name, "email.send");
        assert_eq!(q.delivery_limit, 3);
        let tiers: Vec<_> = q.tiers.iter().map(|t| t.queue.as_str()).collect();
        assert_eq!(tiers, ["email.send.retry.200ms", "email.send.retry.1s"]);
    }

    #[test]
    fn unknown_keys_and_bad_values_are_refused() {
        assert!(toml::from_str::<QueueSettings>("delivery_limt = 3").is_err());
        assert!(toml::from_str::<QueueSettings>("retry_tiers = [\"soon\"]").is_err());
        assert!(toml::from_str::<TopologySettings>("event_exchange = \"e\"").is_err());
        let d = || QueueDefaults::command("email.send", &TopologySettings::default());
        let no_tiers = QueueSettings {
            retry_tiers: vec![],
            ..QueueSettings::default()
        };
        assert!(QueueTopology::from_settings(&no_tiers, d()).is_err());
        let twice = QueueSettings {
            retry_tiers: vec![Duration::from_secs(60), Duration::from_secs(60)],
            ..QueueSettings::default()
        };
        let err = QueueTopology::from_settings(&twice, d())
            .unwrap_err()
            .to_string();
        assert!(err.contains("retry_tiers"), "{err}");
        let zero = QueueSettings {
            delivery_limit: 0,
            ..QueueSettings::default()
        };
        assert!(QueueTopology::from_settings(&zero, d()).is_err());
    }

    #[test]
    fn settings_round_trip_through_toml() {
        let settings = QueueSettings {
            name: Some("q".into()),
            ..QueueSettings::default()
        };
        let text = toml::to_string(&settings).unwrap();
        let back: QueueSettings = toml::from_str(&text).unwrap();
        assert_eq!(back, settings);
    }

    #[test]
    fn compact_durations() {
        assert_eq!(compact_duration(Duration::from_secs(10)), "10s");
        assert_eq!(compact_duration(Duration::from_secs(120)), "2m");
        assert_eq!(compact_duration(Duration::from_secs(90)), "90s");
        assert_eq!(compact_duration(Duration::from_secs(7200)), "2h");
        assert_eq!(compact_duration(Duration::from_millis(200)), "200ms");
    }

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

    #[test]
    fn placement_settings_are_read_and_a_group_of_none_is_refused() {
        let settings: TopologySettings =
            toml::from_str("quorum_initial_group_size = 3\nqueue_leader_locator = \"balanced\"")
                .unwrap();
        let topology = Topology::from_settings(&settings, []).unwrap();
        assert_eq!(
            topology.placement,
            QuorumPlacement {
                initial_group_size: Some(3),
                leader_locator: Some(LeaderLocator::Balanced),
            }
        );
        assert!(toml::from_str::<TopologySettings>("queue_leader_locator = \"random\"").is_err());
        let none = TopologySettings {
            quorum_initial_group_size: Some(0),
            ..TopologySettings::default()
        };
        let err = Topology::from_settings(&none, []).unwrap_err().to_string();
        assert!(err.contains("quorum_initial_group_size"), "{err}");
        // Unset stays out of the printed settings, as it stays out of the declare.
        let printed = toml::to_string(&TopologySettings::default()).unwrap();
        assert!(!printed.contains("quorum"), "{printed}");
    }

    #[test]
    fn inequivalent_arg_messages_are_parsed() {
        let raw = "PRECONDITION_FAILED - inequivalent arg 'x-delivery-limit' for queue 'email.send' in vhost 'v': received the value '3' of type 'long' but current is the value '5' of type 'long'";
        let (arg, wanted, existing) = parse_inequivalent(raw).unwrap();
        assert_eq!(
            (arg.as_str(), wanted.as_str(), existing.as_str()),
            ("x-delivery-limit", "3", "5")
        );
        let raw = "PRECONDITION_FAILED - inequivalent arg 'x-queue-type' for queue 'q' in vhost 'v': received the value 'quorum' of type 'longstr' but current is none";
        let (arg, wanted, existing) = parse_inequivalent(raw).unwrap();
        assert_eq!(
            (arg.as_str(), wanted.as_str(), existing.as_str()),
            ("x-queue-type", "quorum", "none (not set)")
        );
        // What 3.10.8 answers when a placement setting is added to (or taken from, or changed
        // on) a queue that exists.
        let raw = "PRECONDITION_FAILED - inequivalent arg 'x-queue-leader-locator' for queue 'q' in vhost 'v': received the value 'balanced' of type 'longstr' but current is none";
        let (arg, wanted, existing) = parse_inequivalent(raw).unwrap();
        assert_eq!(
            (arg.as_str(), wanted.as_str(), existing.as_str()),
            ("x-queue-leader-locator", "balanced", "none (not set)")
        );
        let raw = "PRECONDITION_FAILED - inequivalent arg 'x-quorum-initial-group-size' for queue 'q' in vhost 'v': received '3' but current is '2'";
        let (arg, wanted, existing) = parse_inequivalent(raw).unwrap();
        assert_eq!(
            (arg.as_str(), wanted.as_str(), existing.as_str()),
            ("x-quorum-initial-group-size", "3", "2")
        );
    }
}
