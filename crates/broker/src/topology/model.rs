//! The resolved topology: every queue's name, bindings, tiers and dead letters, checked,
//! and the arithmetic that picks a retry tier.

use std::collections::BTreeSet;
use std::time::Duration;

use lapin::types::ShortString;

use super::error::TopologyError;
use super::settings::{
    BindingSettings, LeaderLocator, QueueDefaults, QueueSettings, TopologySettings,
};

/// How every quorum queue of the topology is spread over a cluster's nodes; `None` leaves
/// the choice to the broker and sends no argument.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct QuorumPlacement {
    /// `x-quorum-initial-group-size`: the nodes that hold a replica of each queue.
    pub initial_group_size: Option<u32>,
    /// `x-queue-leader-locator`: where each queue's leader goes.
    pub leader_locator: Option<LeaderLocator>,
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
    fn compact_durations() {
        assert_eq!(compact_duration(Duration::from_secs(10)), "10s");
        assert_eq!(compact_duration(Duration::from_secs(120)), "2m");
        assert_eq!(compact_duration(Duration::from_secs(90)), "90s");
        assert_eq!(compact_duration(Duration::from_secs(7200)), "2h");
        assert_eq!(compact_duration(Duration::from_millis(200)), "200ms");
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
}
