//! The one consume loop: takes a queue's deliveries through the supervisor's sessions, hands
//! each to a handler task (at most `concurrency` at once), and settles each as its handler
//! answers, with coalesced acks ([`AckBook`](super::acks::AckBook)). The
//! [`ConsumerRunner`](super::ConsumerRunner) and the dead-letter archiver both run on it.
//!
//! On shutdown it cancels its consumer (`basic.cancel`: the broker sends no more) and keeps
//! working through every delivery it already holds, the prefetched ones not yet started too,
//! until they are all settled or the settle deadline comes. Only then does it cancel the
//! handlers still running ([`Scope::cancel`]), give them [`CANCEL_WAIT`](super::CANCEL_WAIT),
//! and return what is left to the queue, before it closes its channel.
//!
//! When the channel or connection is lost, the handlers in flight are not cancelled: they
//! finish, and their settle is dropped, since the broker has already requeued the delivery
//! ([`Scope::orphaned`] tells a handler that wants to stop early). The loop resumes on the
//! next connection without waiting for them; they stay tracked, and shutdown waits for them
//! within the same settle deadline.
//!
//! With a [`Gate`], an operator's pause stops the loop as shutdown does, but without a
//! deadline and without returning anything (see `gate.rs`); while the gate is closed the loop
//! opens no consumer, on this connection or the next, and it consumes again once it opens.
//!
//! A handler that panics takes the loop down with it: the panic is resumed in the loop's own
//! task, as if the process died there, and its delivery is left to the broker.

use std::sync::Arc;
use std::time::Duration;

use lapin::options::{BasicConsumeOptions, BasicQosOptions};
use lapin::types::{FieldTable, ShortString};
use lapin::{Channel, Consumer};
use tokio_util::sync::CancellationToken;

use super::acks::Settle;
use super::gate::Gate;
use super::handlers::{Handlers, Scope};
use super::pump::{Pump, SessionEnd};
use super::settings::ConsumeSettings;
use crate::connection::{Session, Supervisor, next_session};
use crate::message::Delivery;

/// A consume loop over one queue; see the module docs.
#[derive(Debug, Clone)]
pub struct ConsumeLoop {
    settings: Arc<ConsumeSettings>,
    gate: Option<Gate>,
}

impl ConsumeLoop {
    pub fn new(settings: ConsumeSettings) -> Self {
        Self {
            settings: Arc::new(settings),
            gate: None,
        }
    }

    /// The loop, consuming only while `gate` is open.
    #[must_use]
    pub fn gated(mut self, gate: Gate) -> Self {
        self.gate = Some(gate);
        self
    }

    pub fn settings(&self) -> &ConsumeSettings {
        &self.settings
    }

    /// Consumes through the supervisor's sessions until `shutdown`, resuming on every new
    /// connection with a handler from `per_session`. Returns only on shutdown, once the
    /// deliveries it held are settled or, at the settle deadline, returned.
    pub async fn run<F, H, Fut>(
        &self,
        supervisor: &Supervisor,
        shutdown: CancellationToken,
        mut per_session: F,
    ) where
        F: FnMut(&Session) -> H,
        H: Fn(Delivery, Scope) -> Fut,
        Fut: Future<Output = Settle> + Send + 'static,
    {
        let handlers = Handlers::new();
        let mut sessions = supervisor.sessions();
        let mut failed_generation = None;
        let mut backoff =
            worker_core::Backoff::doubling(Duration::from_millis(100), Duration::from_secs(10));
        let mut gate = self.gate.clone();
        loop {
            if let Some(gate) = gate.as_mut()
                && gate.is_closed()
            {
                tracing::info!(queue = %self.settings.queue, "paused: not consuming until resumed");
                tokio::select! {
                    biased;
                    () = shutdown.cancelled() => break,
                    () = gate.opened() => {}
                }
                tracing::info!(queue = %self.settings.queue, "resumed: consuming again");
            }
            let session = tokio::select! {
                biased;
                () = shutdown.cancelled() => break,
                session = next_session(&mut sessions, failed_generation) => session,
            };
            let Some(session) = session else {
                // The supervisor is gone: nothing will ever come.
                shutdown.cancelled().await;
                break;
            };
            let hold = supervisor.hold();
            let handler = per_session(&session);
            let end = self.session(&session, &shutdown, &handlers, handler).await;
            drop(hold);
            let why = match end {
                SessionEnd::Lost(why) => why,
                SessionEnd::Paused => continue,
                SessionEnd::Shutdown => break,
            };
            tracing::warn!(queue = %self.settings.queue, error = %why, "consumer lost its channel; resuming on the next connection");
            if session.is_open() {
                // The connection is fine but the channel is not (a refused consume, say):
                // retry on the same connection after a pause.
                tokio::select! {
                    () = shutdown.cancelled() => break,
                    () = tokio::time::sleep(backoff.next_wait()) => {}
                }
            } else {
                failed_generation = Some(session.generation());
                backoff.reset();
            }
        }
        handlers.finish(self.settings.settle_deadline).await;
    }

    /// Consumes on one connection until shutdown or until the channel is lost. Handlers that
    /// outlive a lost channel are waited for (within the settle deadline) before it returns.
    pub async fn run_session<H, Fut>(
        &self,
        session: &Session,
        shutdown: &CancellationToken,
        handler: H,
    ) -> SessionEnd
    where
        H: Fn(Delivery, Scope) -> Fut,
        Fut: Future<Output = Settle> + Send + 'static,
    {
        let handlers = Handlers::new();
        let end = self.session(session, shutdown, &handlers, handler).await;
        handlers.finish(self.settings.settle_deadline).await;
        end
    }

    async fn session<H, Fut>(
        &self,
        session: &Session,
        shutdown: &CancellationToken,
        handlers: &Handlers,
        handler: H,
    ) -> SessionEnd
    where
        H: Fn(Delivery, Scope) -> Fut,
        Fut: Future<Output = Settle> + Send + 'static,
    {
        let settings = &*self.settings;
        let (channel, consumer) = match open(session, settings).await {
            Ok(opened) => opened,
            Err(e) => {
                return SessionEnd::Lost(format!(
                    "consuming from {}: {}",
                    settings.queue,
                    worker_core::error_chain(&e)
                ));
            }
        };
        tracing::info!(
            queue = %settings.queue,
            prefetch = settings.prefetch,
            concurrency = settings.concurrency,
            "consuming"
        );
        let mut pump = Pump::new(
            settings,
            handlers,
            handler,
            channel,
            consumer,
            self.gate.clone(),
        );
        let end = pump.pump(shutdown).await;
        pump.finish(end).await
    }
}

async fn open(
    session: &Session,
    settings: &ConsumeSettings,
) -> Result<(Channel, Consumer), lapin::Error> {
    let channel = session.connection().create_channel().await?;
    channel
        .basic_qos(settings.prefetch.max(1), BasicQosOptions::default())
        .await?;
    let tag = format!("{}@{}", settings.consumer_name, std::process::id());
    let consumer = channel
        .basic_consume(
            ShortString::try_new(settings.queue.as_str()).unwrap_or_default(),
            ShortString::try_new(tag).unwrap_or_default(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await?;
    Ok((channel, consumer))
}
