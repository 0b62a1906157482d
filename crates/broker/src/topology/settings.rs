//! The topology's settings: `[broker.topology]` and each consumer's `[jobs.<consumer>.queue]`.

use std::time::Duration;

use serde::{Deserialize, Serialize};

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
    fn settings_round_trip_through_toml() {
        let settings = QueueSettings {
            name: Some("q".into()),
            ..QueueSettings::default()
        };
        let text = toml::to_string(&settings).unwrap();
        let back: QueueSettings = toml::from_str(&text).unwrap();
        assert_eq!(back, settings);
    }
}
