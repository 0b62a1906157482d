//! The fault suite's use of a private RabbitMQ node ([`worker_testkit::RabbitNode`]): one per
//! broker scenario, the scenario's vhost made on it and the host pointed at it.

pub use worker_testkit::RabbitNode;

use crate::run::{BrokerEndpoints, Setup};

/// How a scenario's host and vhost use a node.
pub trait ScenarioSetup {
    /// The vhost is made on the node, the host's `broker.port` is its AMQP port.
    fn setup(&self) -> Setup;
}

impl ScenarioSetup for RabbitNode {
    fn setup(&self) -> Setup {
        Setup {
            env: vec![(
                "WORKER_HOST__BROKER__PORT".into(),
                self.amqp_port.to_string(),
            )],
            broker: Some(BrokerEndpoints {
                api: self.api_url(),
                amqp: self.amqp_addr(),
            }),
            ..Setup::default()
        }
    }
}
