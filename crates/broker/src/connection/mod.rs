//! The connection to RabbitMQ and its supervision.
//!
//! lapin's own recovery has open defects (amqp-rs/lapin #450: no reconnection after a broker
//! restart; #434: acks sent during recovery), so it stays off and the [`Supervisor`] does the
//! job instead: it connects with a timeout, declares the topology, hands the live connection
//! out as a [`Session`], watches it (connection errors, missed heartbeats, `connection.blocked`,
//! and its state, polled, since a server-initiated close raises no event), and when it is lost,
//! withdraws the session, waits a capped, jittered backoff and starts again.
//!
//! A cluster is reached through the list of its nodes' addresses
//! ([`ConnectionSettings::addresses`]): each reconnect tries them in turn
//! ([`Rotation`](crate::Rotation)), starting after the node that failed or went away, so that
//! losing one node costs a reconnect to the next, not a wait for the lost one to return.
//! Quorum queues keep their messages on the nodes that remain.
//!
//! Consumers and publishers never keep a connection of their own: they take the current
//! session from [`Supervisor::sessions`] and, when it dies, wait for the next one. Unacked
//! deliveries of a lost channel return to their queue on the broker's side, and the dedup guard
//! absorbs the redelivered duplicates.
//!
//! One file a concern: `settings` ([`ConnectionSettings`] and the AMQP URI they describe),
//! `error` ([`ConnectError`]), `connect` (opening one connection, unsupervised), `session`
//! ([`Session`], a live connection, and [`next_session`]), `status` ([`BrokerStatus`]) and
//! `supervisor` ([`Supervisor`], the loop that keeps a connection up).

mod connect;
mod drain;
mod error;
mod session;
mod settings;
mod status;
mod supervisor;

pub use error::ConnectError;
pub use session::{Session, next_session};
pub use settings::{ConnectionSettings, DEFAULT_FRAME_MAX, FRAME_MAX_MIN};
pub use status::{BrokerStatus, LinkState};
pub use supervisor::{Hold, Supervisor};
