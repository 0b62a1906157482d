//! Confirmed publishing.
//!
//! Every publish is `mandatory` on a channel in confirm mode, and only a confirm without a
//! `basic.return` counts as success: RabbitMQ confirms an unroutable message (it was handled:
//! dropped), so the return is the only sign it went nowhere. [`Publisher::publish_many`] sends
//! a whole batch before it awaits the confirms, one round trip instead of one per message.
//!
//! lapin attaches a `basic.return` to whichever pending confirm the next ack resolves, not
//! to the publish it belongs to, and resolves a multiple-ack in no particular order. So a batch
//! owns its channel until all its confirms are in (a small pool of channels serves concurrent
//! batches), and returned messages are matched back to the batch's entries by content.
//!
//! Beside the [`Publisher`] here, one file a concern: `outgoing` (the message, [`Outgoing`],
//! and [`headers_from_json`]), `error` ([`PublishError`], classified once), `settings`
//! ([`PublisherSettings`]) and `batch` (one batch on one channel: publish, await the confirms,
//! match the returns).

mod batch;
mod error;
mod outgoing;
mod settings;

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use lapin::Channel;
use lapin::options::ConfirmSelectOptions;
use tokio::sync::{Mutex, watch};

pub use error::PublishError;
pub use outgoing::{Outgoing, headers_from_json};
pub use settings::PublisherSettings;

use crate::connection::{Session, Supervisor};

/// A confirmed publisher over the current session; cheap to clone.
#[derive(Clone)]
pub struct Publisher {
    inner: Arc<Inner>,
}

struct Inner {
    sessions: watch::Receiver<Option<Session>>,
    slots: Vec<Mutex<Option<Slot>>>,
    next: AtomicUsize,
    settings: PublisherSettings,
}

struct Slot {
    generation: u64,
    channel: Channel,
}

impl fmt::Debug for Publisher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Publisher")
            .field("settings", &self.inner.settings)
            .finish_non_exhaustive()
    }
}

impl Publisher {
    /// A publisher over `sessions` (from [`Supervisor::sessions`](crate::Supervisor::sessions)
    /// or [`Session::fixed`]).
    pub fn new(sessions: watch::Receiver<Option<Session>>, settings: PublisherSettings) -> Self {
        let slots = (0..settings.channels.max(1))
            .map(|_| Mutex::new(None))
            .collect();
        Self {
            inner: Arc::new(Inner {
                sessions,
                slots,
                next: AtomicUsize::new(0),
                settings,
            }),
        }
    }

    /// The connection it publishes on, waited for as a publish waits: for work beside its
    /// publishes on the same connection (moving parked messages, say).
    pub async fn current_session(&self) -> Result<Session, PublishError> {
        self.session().await
    }

    /// Publishes one message and waits for its confirm.
    pub async fn publish(&self, message: &Outgoing) -> Result<(), PublishError> {
        let mut results = self.publish_many(std::slice::from_ref(message)).await;
        results.pop().unwrap_or(Ok(()))
    }

    /// Publishes every message, then awaits all their confirms; one result per message, in
    /// order. Each message gets the current trace context unless it carries one already.
    pub async fn publish_many(&self, messages: &[Outgoing]) -> Vec<Result<(), PublishError>> {
        if messages.is_empty() {
            return Vec::new();
        }
        let session = match self.session().await {
            Ok(session) => session,
            Err(err) => return vec![Err(err); messages.len()],
        };
        let mut slot = self.slot().await;
        let channel = match open_channel(&mut slot, &session).await {
            Ok(channel) => channel,
            Err(err) => {
                let detail = worker_core::error_chain(&err);
                return messages
                    .iter()
                    .map(|m| Err(error::lost(m, &detail)))
                    .collect();
            }
        };
        let (results, healthy) =
            batch::publish_batch(&channel, messages, self.inner.settings.confirm_timeout).await;
        if !healthy {
            // The channel's state is unknown or closed: the next batch opens a fresh one.
            *slot = None;
            let _ = channel
                .close(200, "discarded after a failed publish".into())
                .await;
        }
        results
    }

    async fn session(&self) -> Result<Session, PublishError> {
        let mut sessions = self.inner.sessions.clone();
        let waited = self.inner.settings.connect_wait;
        let found = tokio::time::timeout(waited, async {
            loop {
                if let Some(session) = sessions
                    .borrow_and_update()
                    .clone()
                    .filter(Session::is_open)
                {
                    return Some(session);
                }
                if sessions.changed().await.is_err() {
                    // A fixed source whose connection died will never change again.
                    return None;
                }
            }
        })
        .await;
        found
            .ok()
            .flatten()
            .ok_or(PublishError::NotConnected { waited })
    }

    async fn slot(&self) -> tokio::sync::MutexGuard<'_, Option<Slot>> {
        let slots = &self.inner.slots;
        let start = self.inner.next.fetch_add(1, Ordering::Relaxed);
        for i in 0..slots.len() {
            if let Ok(guard) = slots[(start + i) % slots.len()].try_lock() {
                return guard;
            }
        }
        slots[start % slots.len()].lock().await
    }
}

async fn open_channel(slot: &mut Option<Slot>, session: &Session) -> Result<Channel, lapin::Error> {
    if let Some(s) = slot.as_ref()
        && s.generation == session.generation()
        && s.channel.status().connected()
    {
        return Ok(s.channel.clone());
    }
    *slot = None;
    let channel = session.connection().create_channel().await?;
    channel
        .confirm_select(ConfirmSelectOptions::default())
        .await?;
    *slot = Some(Slot {
        generation: session.generation(),
        channel: channel.clone(),
    });
    Ok(channel)
}

// Here rather than beside the supervisor: a publisher is built on sessions, so the
// connection module knows nothing of publishers.
impl Supervisor {
    /// A confirmed publisher over this supervisor's connections: it waits (up to its
    /// `connect_wait`) for a connection while there is none.
    pub fn publisher(&self, settings: PublisherSettings) -> Publisher {
        Publisher::new(self.sessions(), settings)
    }
}
