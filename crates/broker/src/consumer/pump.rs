//! One session of a consume loop: the [`Pump`] that takes deliveries, spawns their handlers,
//! books their answers and acks them, and on shutdown settles the deliveries in flight until
//! the settle deadline, returning what is left to the queue. When its [`Gate`] closes (an
//! operator's pause) it stops the consumer the same way but works off everything it holds with
//! no deadline but the handlers' own timeouts, and returns nothing.

use std::any::Any;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;

use futures::{FutureExt, StreamExt};
use lapin::options::{BasicCancelOptions, BasicNackOptions};
use lapin::{Channel, Consumer};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::acks::{AckBook, Settle};
use super::gate::{Gate, closing};
use super::handlers::{CANCEL_WAIT, Handlers, Scope};
use super::settings::ConsumeSettings;
use crate::message::Delivery;

/// Why one session of a consume loop ended.
#[derive(Debug)]
pub enum SessionEnd {
    /// Shutdown was asked for and done.
    Shutdown,
    /// The channel or connection was lost (or could not be opened), with why.
    Lost(String),
    /// The gate closed (the job is paused) and every delivery held was settled.
    Paused,
}

/// How the loop of one session ended.
pub(super) enum End {
    Lost(String),
    /// Shutdown, and every delivery held was settled.
    AllSettled,
    /// Shutdown, and the settle deadline came first.
    DeadlineOver,
    /// The gate closed, and every delivery held was settled.
    Paused,
}

/// A handler's answer, or its panic.
type Done = (u64, Result<Settle, Box<dyn Any + Send>>);

/// The state of one session's loop.
pub(super) struct Pump<'a, H> {
    settings: &'a ConsumeSettings,
    handlers: &'a Handlers,
    handler: H,
    orphaned: CancellationToken,
    channel: Channel,
    consumer: Consumer,
    semaphore: Arc<Semaphore>,
    done_tx: mpsc::UnboundedSender<Done>,
    done_rx: mpsc::UnboundedReceiver<Done>,
    acks: AckBook,
    permit: Option<OwnedSemaphorePermit>,
    flush_at: Option<Instant>,
    /// Set once shutdown starts: the settle deadline.
    settling: Option<Instant>,
    /// Whether the consumer may still yield deliveries (it ends after `basic.cancel`).
    consuming: bool,
    /// An operator's pause, when the loop has one.
    gate: Option<Gate>,
    /// Set once the gate closed: the consumer is cancelled, what it holds is worked off.
    pausing: bool,
}

impl<'a, H, Fut> Pump<'a, H>
where
    H: Fn(Delivery, Scope) -> Fut,
    Fut: Future<Output = Settle> + Send + 'static,
{
    pub(super) fn new(
        settings: &'a ConsumeSettings,
        handlers: &'a Handlers,
        handler: H,
        channel: Channel,
        consumer: Consumer,
        gate: Option<Gate>,
    ) -> Self {
        let (done_tx, done_rx) = mpsc::unbounded_channel();
        Self {
            settings,
            handlers,
            handler,
            orphaned: CancellationToken::new(),
            channel,
            consumer,
            semaphore: Arc::new(Semaphore::new(settings.concurrency.max(1))),
            done_tx,
            done_rx,
            acks: AckBook::new(usize::from(settings.prefetch).div_ceil(4).max(1)),
            permit: None,
            flush_at: None,
            settling: None,
            consuming: true,
            gate,
            pausing: false,
        }
    }

    pub(super) async fn pump(&mut self, shutdown: &CancellationToken) -> End {
        loop {
            if (self.settling.is_some() || self.pausing)
                && !self.consuming
                && self.acks.pending() == 0
            {
                return if self.settling.is_some() {
                    End::AllSettled
                } else {
                    End::Paused
                };
            }
            let step = tokio::select! {
                biased;
                Some(done) = self.done_rx.recv() => self.settled(done).await,
                () = sleep_until(self.flush_at), if self.flush_at.is_some() => self.flush_due().await,
                () = shutdown.cancelled(), if self.settling.is_none() => self.start_settling().await,
                () = closing(self.gate.as_mut()), if self.settling.is_none() && !self.pausing => self.start_pausing().await,
                () = sleep_until(self.settling), if self.settling.is_some() => Err(End::DeadlineOver),
                p = self.semaphore.clone().acquire_owned(), if self.permit.is_none() && self.consuming => {
                    self.permit = p.ok();
                    Ok(())
                }
                delivery = self.consumer.next(), if self.permit.is_some() && self.consuming => self.delivered(delivery),
            };
            if let Err(end) = step {
                return end;
            }
        }
    }

    /// Books a handler's answer and every other one already waiting, then acks them when
    /// enough are ready; completions left behind a slow handler are settled by the timer.
    async fn settled(&mut self, done: Done) -> Result<(), End> {
        complete(&mut self.acks, done);
        while let Ok(done) = self.done_rx.try_recv() {
            complete(&mut self.acks, done);
        }
        if self.acks.ready() || self.acks.idle() {
            self.acks
                .flush(&self.channel, false)
                .await
                .map_err(End::Lost)?;
        }
        if !self.acks.has_completed() {
            self.flush_at = None;
        } else if self.flush_at.is_none() {
            self.flush_at = Some(Instant::now() + self.settings.ack_interval);
        }
        Ok(())
    }

    async fn flush_due(&mut self) -> Result<(), End> {
        self.flush_at = None;
        self.acks
            .flush(&self.channel, true)
            .await
            .map_err(End::Lost)?;
        if self.acks.has_completed() {
            self.flush_at = Some(Instant::now() + self.settings.ack_interval);
        }
        Ok(())
    }

    /// The broker sends no more; the consumer yields what lapin already holds, then ends.
    async fn start_settling(&mut self) -> Result<(), End> {
        self.settling = Some(self.handlers.settle_until(self.settings.settle_deadline));
        tracing::info!(queue = %self.settings.queue, in_flight = self.acks.pending(), "stopping the consumer; finishing the deliveries it holds");
        if self.pausing {
            // Cancelled already, for the pause: only the deadline is new.
            return Ok(());
        }
        self.cancel_consumer().await
    }

    /// Paused: as on shutdown, the broker sends no more and what is held is worked off, but
    /// with no deadline (each handler has its timeout) and nothing returned to the queue.
    async fn start_pausing(&mut self) -> Result<(), End> {
        self.pausing = true;
        tracing::info!(queue = %self.settings.queue, in_flight = self.acks.pending(), "paused: stopping the consumer; finishing the deliveries it holds");
        self.cancel_consumer().await
    }

    async fn cancel_consumer(&mut self) -> Result<(), End> {
        let cancel = self
            .channel
            .basic_cancel(self.consumer.tag(), BasicCancelOptions::default());
        match tokio::time::timeout(self.settings.cancel_timeout, cancel).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(End::Lost(format!(
                "basic.cancel failed: {}",
                worker_core::error_chain(&e)
            ))),
            Err(_) => Err(End::Lost("basic.cancel got no answer".into())),
        }
    }

    fn delivered(
        &mut self,
        delivery: Option<Result<lapin::message::Delivery, lapin::Error>>,
    ) -> Result<(), End> {
        match delivery {
            Some(Ok(delivery)) => {
                self.spawn(Delivery::from(delivery));
                Ok(())
            }
            Some(Err(e)) => Err(End::Lost(format!(
                "the consumer failed: {}",
                worker_core::error_chain(&e)
            ))),
            None if self.settling.is_some() || self.pausing => {
                self.consuming = false;
                Ok(())
            }
            None => Err(End::Lost(
                "the broker cancelled the consumer (queue deleted?) or the channel closed".into(),
            )),
        }
    }

    fn spawn(&mut self, delivery: Delivery) {
        let tag = delivery.tag();
        self.acks.delivered(tag);
        let scope = Scope::new(self.handlers.cancel.clone(), self.orphaned.clone());
        let task = (self.handler)(delivery, scope);
        let done = self.done_tx.clone();
        let held = self.permit.take();
        self.handlers.tracker.spawn(async move {
            let settle = AssertUnwindSafe(task).catch_unwind().await;
            // After a lost channel nobody listens: the broker has requeued the delivery
            // already.
            let _ = done.send((tag, settle));
            drop(held);
        });
    }

    pub(super) async fn finish(self, end: End) -> SessionEnd {
        match end {
            End::Lost(why) => self.lost(why).await,
            End::AllSettled => self.all_settled().await,
            End::DeadlineOver => self.deadline_over().await,
            End::Paused => self.paused().await,
        }
    }

    /// Nothing can be settled on this channel any more: the broker requeues every unacked
    /// delivery. The handlers in flight are not cancelled (an SMTP send cut short would be
    /// sent again by the redelivery); their settle is dropped.
    async fn lost(self, why: String) -> SessionEnd {
        drop(self.done_rx);
        self.orphaned.cancel();
        let _ = tokio::time::timeout(CANCEL_WAIT, self.channel.close(200, "consumer lost".into()))
            .await;
        if self.settling.is_some() {
            tracing::warn!(queue = %self.settings.queue, error = %why, "the channel was lost while settling; the broker requeues what was not acked");
            return SessionEnd::Shutdown;
        }
        SessionEnd::Lost(why)
    }

    async fn all_settled(mut self) -> SessionEnd {
        let queue = &self.settings.queue;
        if let Err(e) = self.acks.flush(&self.channel, true).await {
            tracing::warn!(%queue, error = %e, "acking the last deliveries failed; the broker requeues them");
        }
        tracing::info!(%queue, "every delivery held was finished");
        self.close().await
    }

    /// Everything held was worked off for a pause: the last acks, then the channel closes
    /// (the loop opens another when the gate opens).
    async fn paused(mut self) -> SessionEnd {
        let queue = &self.settings.queue;
        if let Err(e) = self.acks.flush(&self.channel, true).await {
            tracing::warn!(%queue, error = %e, "acking the last deliveries before the pause failed; the broker requeues them");
        }
        tracing::info!(%queue, "paused: every delivery held was finished; consuming nothing until resumed");
        drop(self.consumer);
        self.orphaned.cancel();
        let _ = tokio::time::timeout(
            CANCEL_WAIT,
            self.channel.close(200, "consumer paused".into()),
        )
        .await;
        SessionEnd::Paused
    }

    /// Cancels the handlers in flight, settles what they answer within [`CANCEL_WAIT`], and
    /// returns the rest (handlers that ignored cancellation, deliveries prefetched but never
    /// started) to the queue.
    async fn deadline_over(mut self) -> SessionEnd {
        let queue = &self.settings.queue;
        tracing::warn!(
            %queue,
            in_flight = self.acks.pending(),
            "settle deadline over: cancelling the handlers in flight and returning the rest to the queue"
        );
        self.handlers.cancel.cancel();
        let wait = tokio::time::sleep(CANCEL_WAIT);
        tokio::pin!(wait);
        while self.acks.pending() > 0 {
            tokio::select! {
                Some(done) = self.done_rx.recv() => complete(&mut self.acks, done),
                () = &mut wait => break,
            }
        }
        let flushed = self.acks.flush(&self.channel, true).await;
        let requeued = self
            .channel
            .basic_nack(
                0,
                BasicNackOptions {
                    multiple: true,
                    requeue: true,
                },
            )
            .await;
        if let Err(e) = flushed
            .as_ref()
            .map_err(String::as_str)
            .and(requeued.as_ref().map_err(|_| "nack failed"))
        {
            tracing::warn!(%queue, error = %e, "settling the last deliveries on shutdown failed; the broker requeues them");
        }
        self.close().await
    }

    async fn close(self) -> SessionEnd {
        drop(self.consumer);
        self.orphaned.cancel();
        let _ = self
            .channel
            .close(200, "worker host shutting down".into())
            .await;
        SessionEnd::Shutdown
    }
}

/// Books one handler's answer; a handler's panic is resumed here (see the module docs).
fn complete(acks: &mut AckBook, (tag, settle): Done) {
    match settle {
        Ok(settle) => acks.complete(tag, settle),
        Err(panic) => std::panic::resume_unwind(panic),
    }
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}
