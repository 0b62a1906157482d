//! [`Session`]: a live connection handed out by the supervisor, and what is done on one.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use lapin::Connection;
use tokio::sync::watch;

use crate::topology::{self, Topology, TopologyError};

/// A live connection handed out by the [`Supervisor`](super::Supervisor), numbered so that
/// users can tell a new connection from the one they lost.
#[derive(Clone)]
pub struct Session {
    connection: Arc<Connection>,
    generation: u64,
}

impl fmt::Debug for Session {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Session")
            .field("generation", &self.generation)
            .field("connected", &self.is_open())
            .finish()
    }
}

impl Session {
    /// A session over a connection opened elsewhere (tests, tools).
    pub fn new(connection: Connection) -> Self {
        static NEXT: AtomicU64 = AtomicU64::new(1_000_000);
        Self {
            connection: Arc::new(connection),
            generation: NEXT.fetch_add(1, Ordering::Relaxed),
        }
    }

    /// The supervisor's `generation`-th connection.
    pub(super) fn numbered(connection: Connection, generation: u64) -> Self {
        Self {
            connection: Arc::new(connection),
            generation,
        }
    }

    pub fn connection(&self) -> &Connection {
        &self.connection
    }

    pub fn generation(&self) -> u64 {
        self.generation
    }

    pub fn is_open(&self) -> bool {
        self.connection.status().connected()
    }

    /// Declares `topology` on a channel of its own (see [`topology::declare`]), closed again
    /// once the declare succeeded: a failed declare has closed it already.
    pub async fn declare(&self, topology: &Topology) -> Result<(), TopologyError> {
        let channel =
            self.connection
                .create_channel()
                .await
                .map_err(|source| TopologyError::Broker {
                    what: "the topology (no channel opened)".into(),
                    source,
                })?;
        topology::declare(&channel, topology).await?;
        // Closed before the connection, so that lapin does not report a channel torn down
        // under it as a connection error.
        let _ = channel.close(200, "topology declared".into()).await;
        Ok(())
    }

    /// Closes the connection (a session opened for one command, say).
    pub async fn close(&self, reason: &str) -> Result<(), lapin::Error> {
        self.connection.close(200, reason.into()).await
    }

    /// The broker's count of ready messages in each of `queues`, through passive declares on
    /// a short-lived channel. A queue that does not exist fails its passive declare, which
    /// closes the channel: the counts stop there, with what was read. `None` when no channel
    /// opens.
    pub async fn queue_depths<'a>(
        &self,
        queues: impl IntoIterator<Item = &'a str>,
    ) -> Option<std::collections::BTreeMap<String, u64>> {
        use lapin::options::QueueDeclareOptions;
        use lapin::types::{FieldTable, ShortString};
        let channel = self.connection.create_channel().await.ok()?;
        let mut depths = std::collections::BTreeMap::new();
        let options = QueueDeclareOptions {
            passive: true,
            ..QueueDeclareOptions::default()
        };
        for name in queues {
            let Ok(queue) = ShortString::try_new(name) else {
                continue;
            };
            match channel
                .queue_declare(queue, options, FieldTable::default())
                .await
            {
                Ok(declared) => {
                    depths.insert(name.to_owned(), u64::from(declared.message_count()));
                }
                Err(_) => return Some(depths),
            }
        }
        let _ = channel.close(200, "sampled".into()).await;
        Some(depths)
    }

    /// A source of sessions that only ever holds this one (a publisher or consumer bound to
    /// one connection).
    pub fn fixed(self) -> watch::Receiver<Option<Session>> {
        let (tx, rx) = watch::channel(Some(self));
        // The receiver keeps the last value after the sender is gone, which is all we need.
        drop(tx);
        rx
    }
}

/// Waits for an open session other than generation `not` (the one just lost); `None` once the
/// supervisor is gone. What a consume loop calls to resume on the next connection.
pub async fn next_session(
    sessions: &mut watch::Receiver<Option<Session>>,
    not: Option<u64>,
) -> Option<Session> {
    loop {
        if let Some(s) = sessions.borrow_and_update().clone()
            && s.is_open()
            && Some(s.generation()) != not
        {
            return Some(s);
        }
        if sessions.changed().await.is_err() {
            return None;
        }
    }
}
