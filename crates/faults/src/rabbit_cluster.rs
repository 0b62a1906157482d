//! The fault suite's use of a private RabbitMQ cluster ([`worker_testkit::RabbitCluster`]):
//! the host is given the first nodes as its `broker.addresses`, and the harness makes the
//! scenario's vhost, reads the queues and publishes its direct commands through the last
//! node's management API, a node the scenario never stops, so that the harness keeps its
//! view of the cluster (and no count) while a node the host uses is down.

pub use worker_testkit::RabbitCluster;

use crate::run::{BrokerEndpoints, Setup};

/// How a scenario's host and vhost use a cluster.
pub trait ClusterSetup {
    /// The host's `broker.addresses` are every node but the last, in order; the vhost is
    /// made through the last, whose AMQP and management API the harness uses. `extra` are
    /// further `WORKER_HOST__…` overrides.
    fn setup(&self, extra: &[(&str, &str)]) -> anyhow::Result<Setup>;
}

impl ClusterSetup for RabbitCluster {
    fn setup(&self, extra: &[(&str, &str)]) -> anyhow::Result<Setup> {
        let (observer, host_nodes) = self
            .nodes
            .split_last()
            .filter(|(_, rest)| !rest.is_empty())
            .ok_or_else(|| anyhow::anyhow!("a cluster scenario needs at least two nodes"))?;
        let addresses: Vec<String> = host_nodes
            .iter()
            .map(|node| format!("\"{}\"", node.amqp_addr()))
            .collect();
        let mut env = vec![(
            "WORKER_HOST__BROKER__ADDRESSES".to_string(),
            format!("[{}]", addresses.join(", ")),
        )];
        env.extend(extra.iter().map(|(k, v)| (k.to_string(), v.to_string())));
        Ok(Setup {
            env,
            broker: Some(BrokerEndpoints {
                api: observer.api_url(),
                amqp: observer.amqp_addr(),
            }),
            ..Setup::default()
        })
    }
}
