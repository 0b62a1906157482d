//! Exchanges and queues: their settings, the resolved [`Topology`] and an idempotent [`declare()`].
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
//!
//! One file a concern: `settings` (what `[broker.topology]` and `[jobs.<consumer>.queue]`
//! say), `model` (the resolved [`Topology`] and the tier arithmetic), `error`
//! ([`TopologyError`]), `declare` (the idempotent [`declare()`]) and `conflict` (reading the
//! broker's refusal of a declare into a [`DeclareConflict`]).

mod conflict;
mod declare;
mod error;
mod model;
mod settings;

pub use declare::declare;
pub use error::{DeclareConflict, TopologyError};
pub use model::{
    QueueTopology, QuorumPlacement, RetryTier, Topology, compact_duration, tier_index_for_attempt,
};
pub use settings::{
    BindingSettings, LeaderLocator, QueueDefaults, QueueSettings, TopologySettings,
};

/// The header that keeps a parked message's original routing key, since parking goes through
/// the default exchange, whose routing key is the tier queue's name.
pub const ORIGINAL_ROUTING_KEY_HEADER: &str = "x-original-routing-key";
