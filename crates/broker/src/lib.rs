//! RabbitMQ adapter (work in progress).
pub mod connection;
pub mod consumer;
pub mod publisher;
pub mod topology;
pub mod trace;

pub use connection::{
    BrokerStatus, ConnectError, ConnectionSettings, Hold, LinkState, Session, Supervisor,
};
pub use consumer::{
    ConsumerEvents, ConsumerRunner, ConsumerSettings, DeadReason, Outcome, Settled,
};
pub use publisher::{Outgoing, PublishError, Publisher, PublisherSettings};
pub use topology::{
    QueueDefaults, QueueSettings, QueueTopology, Topology, TopologyError, TopologySettings, declare,
};
