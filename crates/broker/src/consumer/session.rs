//! The one consume loop: takes a queue's deliveries through the supervisor's sessions, hands
//! each to a handler task (at most `concurrency` at once), and settles each as its handler
//! answers, with coalesced acks ([`AckBook`]). The [`ConsumerRunner`](super::ConsumerRunner)
//! and the dead-letter archiver both run on it.
//!
//! On shutdown it cancels its consumer (`basic.cancel`: the broker sends no more) and keeps
//! working through every delivery it already holds, the prefetched ones not yet started too,
//! until they are all settled or the drain deadline comes. Only then does it cancel the
//! handlers still running ([`Scope::cancel`]), give them [`CANCEL_WAIT`], and return what is
//! left to the queue, before it closes its channel.
//!
//! When the channel or connection is lost, the handlers in flight are not cancelled: they
//! finish, and their settle is dropped, since the broker has already requeued the delivery
//! ([`Scope::orphaned`] tells a handler that wants to stop early). The loop resumes on the
//! next connection without waiting for them; they stay tracked, and shutdown waits for them
//! within the same drain deadline.
//!
//! A handler that panics takes the loop down with it: the panic is resumed in the loop's own
//! task, as if the process died there, and its delivery is left to the broker.

use std::any::Any;
use std::panic::AssertUnwindSafe;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use futures::{FutureExt, StreamExt};
use lapin::options::{BasicCancelOptions, BasicConsumeOptions, BasicNackOptions, BasicQosOptions};
use lapin::types::{FieldTable, ShortString};
use lapin::{Channel, Consumer};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::acks::{AckBook, Settle};
use crate::connection::{Session, Supervisor, next_session};
use crate::message::Delivery;

/// How long handlers still running at the drain deadline get, once cancelled, to return.
/// The host's grace must leave this, and closing, after the drain deadline.
pub const CANCEL_WAIT: Duration = Duration::from_secs(1);

/// How a consume loop runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConsumeSettings {
    pub queue: String,
    /// Names the consumer in the management UI; the process id is appended.
    pub consumer_name: String,
    /// Deliveries the broker may send ahead of the acks (`basic.qos`).
    pub prefetch: u16,
    /// Handlers running at once.
    pub concurrency: usize,
    /// Longest wait before completed deliveries are acked.
    pub ack_interval: Duration,
    /// How long, once shutdown starts, the loop keeps settling what it holds.
    pub drain_deadline: Duration,
    /// How long `basic.cancel` waits for its answer.
    pub cancel_timeout: Duration,
}

/// Why one session of a consume loop ended.
#[derive(Debug)]
pub enum SessionEnd {
    /// Shutdown was asked for and done.
    Shutdown,
    /// The channel or connection was lost (or could not be opened), with why.
    Lost(String),
}

/// What a handler is told besides its delivery.
#[derive(Debug, Clone)]
pub struct Scope {
    cancel: CancellationToken,
    orphaned: CancellationToken,
}

impl Scope {
    /// Cancelled at the drain deadline: stop, the delivery goes back to the queue.
    pub fn cancel(&self) -> &CancellationToken {
        &self.cancel
    }

    /// Cancelled once the session that took the delivery is over: its settle can no longer
    /// reach the broker, which redelivers it.
    pub fn orphaned(&self) -> &CancellationToken {
        &self.orphaned
    }
}

/// A consume loop over one queue; see the module docs.
#[derive(Debug, Clone)]
pub struct ConsumeLoop {
    settings: Arc<ConsumeSettings>,
}

impl ConsumeLoop {
    pub fn new(settings: ConsumeSettings) -> Self {
        Self {
            settings: Arc::new(settings),
        }
    }

    pub fn settings(&self) -> &ConsumeSettings {
        &self.settings
    }

    /// Consumes through the supervisor's sessions until `shutdown`, resuming on every new
    /// connection with a handler from `per_session`. Returns only on shutdown, once the
    /// deliveries it held are settled or, at the drain deadline, returned.
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
        loop {
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
            let SessionEnd::Lost(why) = end else { break };
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
        handlers.finish(self.settings.drain_deadline).await;
    }

    /// Consumes on one connection until shutdown or until the channel is lost. Handlers that
    /// outlive a lost channel are waited for (within the drain deadline) before it returns.
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
        handlers.finish(self.settings.drain_deadline).await;
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
        let mut pump = Pump::new(settings, handlers, handler, channel, consumer);
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

/// How the loop of one session ended.
enum End {
    Lost(String),
    /// Shutdown, and every delivery held was settled.
    Drained,
    /// Shutdown, and the drain deadline came first.
    DeadlineOver,
}

/// A handler's answer, or its panic.
type Done = (u64, Result<Settle, Box<dyn Any + Send>>);

/// The state of one session's loop.
struct Pump<'a, H> {
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
    /// Set once shutdown starts: the end of the drain.
    draining: Option<Instant>,
    /// Whether the consumer may still yield deliveries (it ends after `basic.cancel`).
    consuming: bool,
}

impl<'a, H, Fut> Pump<'a, H>
where
    H: Fn(Delivery, Scope) -> Fut,
    Fut: Future<Output = Settle> + Send + 'static,
{
    fn new(
        settings: &'a ConsumeSettings,
        handlers: &'a Handlers,
        handler: H,
        channel: Channel,
        consumer: Consumer,
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
            draining: None,
            consuming: true,
        }
    }

    async fn pump(&mut self, shutdown: &CancellationToken) -> End {
        loop {
            if self.draining.is_some() && !self.consuming && self.acks.pending() == 0 {
                return End::Drained;
            }
            let step = tokio::select! {
                biased;
                Some(done) = self.done_rx.recv() => self.settled(done).await,
                () = sleep_until(self.flush_at), if self.flush_at.is_some() => self.flush_due().await,
                () = shutdown.cancelled(), if self.draining.is_none() => self.start_drain().await,
                () = sleep_until(self.draining), if self.draining.is_some() => Err(End::DeadlineOver),
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
    async fn start_drain(&mut self) -> Result<(), End> {
        self.draining = Some(self.handlers.drain_until(self.settings.drain_deadline));
        tracing::info!(queue = %self.settings.queue, in_flight = self.acks.pending(), "stopping the consumer; finishing the deliveries it holds");
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
            None if self.draining.is_some() => {
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
        let scope = Scope {
            cancel: self.handlers.cancel.clone(),
            orphaned: self.orphaned.clone(),
        };
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

    async fn finish(self, end: End) -> SessionEnd {
        match end {
            End::Lost(why) => self.lost(why).await,
            End::Drained => self.drained().await,
            End::DeadlineOver => self.deadline_over().await,
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
        if self.draining.is_some() {
            tracing::warn!(queue = %self.settings.queue, error = %why, "the channel was lost while draining; the broker requeues what was not acked");
            return SessionEnd::Shutdown;
        }
        SessionEnd::Lost(why)
    }

    async fn drained(mut self) -> SessionEnd {
        let queue = &self.settings.queue;
        if let Err(e) = self.acks.flush(&self.channel, true).await {
            tracing::warn!(%queue, error = %e, "acking the last deliveries failed; the broker requeues them");
        }
        tracing::info!(%queue, "every delivery held was finished");
        self.close().await
    }

    /// Cancels the handlers in flight, settles what they answer within [`CANCEL_WAIT`], and
    /// returns the rest (handlers that ignored cancellation, deliveries prefetched but never
    /// started) to the queue.
    async fn deadline_over(mut self) -> SessionEnd {
        let queue = &self.settings.queue;
        tracing::warn!(
            %queue,
            in_flight = self.acks.pending(),
            "drain deadline over: cancelling the handlers in flight and returning the rest to the queue"
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

/// The handlers of one consume loop: they outlive a lost channel, and shutdown waits for
/// them, within the drain deadline.
struct Handlers {
    /// Not a child of the shutdown token: handlers in flight finish within the drain.
    cancel: CancellationToken,
    tracker: TaskTracker,
    drain_until: OnceLock<Instant>,
}

impl Handlers {
    fn new() -> Self {
        Self {
            cancel: CancellationToken::new(),
            tracker: TaskTracker::new(),
            drain_until: OnceLock::new(),
        }
    }

    /// The end of the drain, fixed by the first to ask once shutdown starts.
    fn drain_until(&self, deadline: Duration) -> Instant {
        *self.drain_until.get_or_init(|| Instant::now() + deadline)
    }

    /// After the last session: waits for the handlers still running (those that outlived a
    /// lost channel) until the drain deadline, then cancels them and gives them a moment.
    /// When the session already did so at the deadline, what is left ignored cancellation:
    /// it is not waited for again.
    async fn finish(&self, deadline: Duration) {
        self.tracker.close();
        if self.cancel.is_cancelled() {
            return;
        }
        let until = self.drain_until(deadline);
        if tokio::time::timeout_at(until, self.tracker.wait())
            .await
            .is_err()
        {
            tracing::warn!(
                in_flight = self.tracker.len(),
                "drain deadline over: cancelling the handlers still running"
            );
            self.cancel.cancel();
            let _ = tokio::time::timeout(CANCEL_WAIT, self.tracker.wait()).await;
        }
        self.cancel.cancel();
    }
}
