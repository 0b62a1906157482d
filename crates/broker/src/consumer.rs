//! The consumer runner: the recoverability pipeline, applied to every delivery of a queue.
//!
//! For each delivery:
//!
//! 1. read `x-attempt` (missing: 1; any AMQP integer type; a string, a float, zero or a
//!    negative number is malformed) and decode the body into the job's input (a failure is
//!    malformed). Malformed → dead letter at once, reason `malformed`;
//! 2. run the handler under the job's [`RetryPolicy`], each try under the per-try timeout;
//! 3. settle by the outcome ([`decide`], a pure function): success or duplicate → ack;
//!    permanent → dead letter `rejected`; transient → park in the tier for the next attempt
//!    with `x-attempt` one higher, or dead letter `gave-up` past `max_attempts`; throttled →
//!    park in the first tier that waits at least `retry_after`, or the longest tier when
//!    none waits that long (the message then comes back early, is throttled again and spends
//!    another attempt: it counts as an attempt, so an endless 429 also ends `gave-up`).
//!    In-process waits between tries get one budget per delivery,
//!    [`ConsumerSettings::in_process_wait`]: a wait past it (a 429 asking for an hour) is not
//!    waited out in memory, holding the delivery and a handler slot, but parked at once;
//! 4. the delivery is acked only once the park or dead letter is confirmed. A park that
//!    cannot be published falls back to a dead letter; when that fails too, the delivery is
//!    returned to the queue (nack, requeue) and the queue's `x-delivery-limit` dead-letters it
//!    after its deliveries.
//!
//! Acks are coalesced: completed deliveries are acked with `multiple` up to the highest
//! contiguous completed tag, on a short timer or once a quarter of the prefetch is ready, since
//! one ack per message costs most of a bare consumer's CPU. A completion stuck behind a slow
//! handler is acked on its own at the next timer, so that it never holds a prefetch slot.
//!
//! On shutdown the runner cancels its consumer (`basic.cancel`: the broker sends no more)
//! and keeps working through every delivery it already holds, the prefetched ones not yet
//! started too, acking them as they complete, until they are all done or the drain deadline
//! ([`ConsumerSettings::drain_deadline`], shorter than the host's grace) comes. Only then does
//! it cancel the handlers still running, give them a second, and return what is left to the
//! queue (nack, requeue), before it closes its channel. Each return counts against a quorum
//! queue's delivery limit, so a rolling restart with a backlog must not return deliveries
//! that were never tried.
//!
//! When the channel or connection is lost, the handlers in flight are not cancelled: they
//! finish within their own timeout and record their outcome (an SMTP send cut short would be
//! sent again by the redelivery). Their settle is dropped, since the broker has already
//! requeued the delivery; the redelivery meets the job's processed-message guard, which
//! answers it as a duplicate once the first handler recorded its outcome (a guarded job
//! whose redelivery arrives while the first handler still runs finds its claim and backs
//! off to a retry tier). The runner resumes consuming on the next connection without
//! waiting for them, so for a while more than `concurrency` handlers may run; they stay
//! tracked, and shutdown waits for them within the same drain deadline.
//!
//! A park or dead letter whose confirm is lost with the channel cannot be known to have
//! reached its queue, and the delivery cannot be acked on a dead channel: the broker requeues
//! it, and the message may then exist twice (the requeued delivery, and the parked copy one
//! attempt further). The runner keeps both rather than guess: dropping either could lose the
//! message. Both copies carry the same message id and body, so a guarded job answers whichever
//! comes second, after the other succeeded, as a duplicate: the guard's mark commits with the
//! effect, so it is there exactly when the effect is. While neither copy succeeds, each runs
//! its own attempts, and a message that never succeeds can end as two dead letters. A job
//! without a guard (the automation trigger) handles both; its next hop is guarded.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use chrono::SecondsFormat;
use futures::StreamExt;
use lapin::message::Delivery;
use lapin::options::{
    BasicAckOptions, BasicCancelOptions, BasicConsumeOptions, BasicNackOptions, BasicQosOptions,
};
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use lapin::{BasicProperties, Channel};
use serde::{Deserialize, Serialize};
use tokio::sync::{Semaphore, mpsc};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::Instrument;
use worker_core::{
    AttemptObserver, ConsumerJob, Failure, FailureClass, Handled, Retry, RetryOutcome, RetryPolicy,
    TryRecord, WorkContext,
};

use crate::connection::{Session, Supervisor, next_session};
use crate::publisher::{Outgoing, Publisher, PublisherSettings};
use crate::topology::{ORIGINAL_ROUTING_KEY_HEADER, QueueTopology};
use crate::trace;

/// The attempt across parks; absent on a first delivery, never on a dead letter.
pub const ATTEMPT_HEADER: &str = "x-attempt";
/// `malformed`, `rejected` or `gave-up`.
pub const DEAD_REASON_HEADER: &str = "x-dead-reason";
/// The attempts the message had when it died.
pub const DEAD_ATTEMPTS_HEADER: &str = "x-dead-attempts";
/// The last error, at most [`DEAD_ERROR_MAX`] bytes.
pub const DEAD_ERROR_HEADER: &str = "x-dead-error";
/// The failure class: `transient`, `permanent`, `throttled` or `malformed`.
pub const DEAD_CLASS_HEADER: &str = "x-dead-class";
/// The queue the message died in.
pub const DEAD_QUEUE_HEADER: &str = "x-dead-queue";
/// When it died, RFC 3339.
pub const DEAD_AT_HEADER: &str = "x-dead-at";
/// Bound on `x-dead-error`, so that a huge error cannot make a dead letter unpublishable.
pub const DEAD_ERROR_MAX: usize = 2048;

/// RabbitMQ's default `consumer_timeout`: a delivery unacked this long closes its channel.
pub const BROKER_CONSUMER_TIMEOUT: Duration = Duration::from_secs(30 * 60);

/// How long handlers still running at the drain deadline get, once cancelled, to return.
/// The host's grace must leave this, and closing, after the drain deadline.
pub const CANCEL_WAIT: Duration = Duration::from_secs(1);

/// The runner part of a consumer's section (`[jobs.<consumer>]`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ConsumerSettings {
    /// Deliveries the broker may send ahead of the acks (`basic.qos`).
    pub prefetch: u16,
    /// Handlers running at once.
    pub concurrency: usize,
    /// Attempts across parks before a message is dead-lettered `gave-up`.
    pub max_attempts: u32,
    /// Per-try timeout of the handler.
    #[serde(with = "humantime_serde")]
    pub timeout: Duration,
    /// The in-process retry policy; `None` uses the core's default.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub retry: Option<RetryPolicy>,
    /// Longest time one delivery may spend waiting between in-process tries (a throttled
    /// failure's `retry_after` included). A longer wait is not waited out in memory, holding
    /// the delivery and a handler slot: the message is parked in a retry tier instead. Keep it
    /// well under the broker's consumer timeout (RabbitMQ's default: 30 min), which closes
    /// the channel of a delivery held longer.
    #[serde(with = "humantime_serde")]
    pub in_process_wait: Duration,
    /// How long, once shutdown starts, the runner keeps working through the deliveries it
    /// already holds (prefetched ones too) before it cancels what is left and returns it to
    /// the queue. Shorter than the host's shutdown grace. Not a key of a job's section: the
    /// host sets it for every consumer from its own shutdown settings.
    #[serde(skip)]
    pub drain_deadline: Duration,
    /// Longest wait before completed deliveries are acked. Tuned here, not in a job's section.
    #[serde(skip)]
    pub ack_interval: Duration,
    /// How long a park or dead-letter publish waits for its confirm. Tuned here, not in a
    /// job's section.
    #[serde(skip)]
    pub publish_timeout: Duration,
}

impl ConsumerSettings {
    /// Checks what an operator wrote; the message names the offending key.
    pub fn validate(&self) -> Result<(), String> {
        if self.prefetch == 0 {
            // In AMQP a prefetch of 0 means "unlimited": the whole queue into memory.
            return Err("`prefetch` must be at least 1".into());
        }
        if self.concurrency == 0 {
            return Err("`concurrency` must be at least 1".into());
        }
        if self.max_attempts == 0 {
            return Err("`max_attempts` must be at least 1".into());
        }
        if self.timeout.is_zero() {
            return Err("`timeout` must be longer than zero".into());
        }
        if let Some(retry) = &self.retry {
            retry.validate().map_err(|e| format!("`retry`: {e}"))?;
        }
        if self.in_process_wait >= BROKER_CONSUMER_TIMEOUT {
            return Err(format!(
                "`in_process_wait` must be shorter than RabbitMQ's consumer timeout ({}), which closes the channel of a delivery held that long",
                humantime::format_duration(BROKER_CONSUMER_TIMEOUT)
            ));
        }
        if self.drain_deadline.is_zero() {
            return Err("`drain_deadline` must be longer than zero".into());
        }
        Ok(())
    }
}

impl Default for ConsumerSettings {
    fn default() -> Self {
        Self {
            prefetch: 50,
            concurrency: 8,
            max_attempts: 5,
            timeout: Duration::from_secs(30),
            retry: None,
            in_process_wait: Duration::from_secs(30),
            drain_deadline: Duration::from_secs(20),
            ack_interval: Duration::from_millis(10),
            publish_timeout: Duration::from_secs(10),
        }
    }
}

/// Why a message was dead-lettered by the runner.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DeadReason {
    Malformed,
    Rejected,
    GaveUp,
}

impl DeadReason {
    pub const fn as_str(&self) -> &'static str {
        match self {
            Self::Malformed => "malformed",
            Self::Rejected => "rejected",
            Self::GaveUp => "gave-up",
        }
    }
}

/// How one delivery was settled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Succeeded,
    Duplicate,
    /// Parked in a retry tier, to come back as attempt `next_attempt`.
    Parked {
        next_attempt: u32,
        tier: String,
        class: FailureClass,
    },
    DeadLettered {
        reason: DeadReason,
        class: FailureClass,
    },
    /// Returned to the queue: neither park nor dead letter could be published.
    Requeued,
    /// Returned to the queue: the handler was cancelled at the drain deadline.
    Abandoned,
}

impl Outcome {
    /// A stable name for logs and metrics.
    pub fn as_str(&self) -> &'static str {
        match self {
            Self::Succeeded => "succeeded",
            Self::Duplicate => "duplicate",
            Self::Parked { .. } => "parked",
            Self::DeadLettered { reason, .. } => match reason {
                DeadReason::Malformed => "dead-lettered:malformed",
                DeadReason::Rejected => "dead-lettered:rejected",
                DeadReason::GaveUp => "dead-lettered:gave-up",
            },
            Self::Requeued => "requeued",
            Self::Abandoned => "abandoned",
        }
    }
}

/// One settled delivery, as reported to [`ConsumerEvents`].
#[derive(Debug, Clone)]
pub struct Settled<'a> {
    pub queue: &'a str,
    pub message_id: Option<&'a str>,
    pub attempt: u32,
    /// In-process tries made for this delivery.
    pub tries: u32,
    pub outcome: &'a Outcome,
    pub elapsed: Duration,
}

/// The host's hook for metrics: every in-process try and every settled delivery.
pub trait ConsumerEvents: Send + Sync {
    fn on_try(&self, _queue: &str, _record: &TryRecord<'_>) {}
    /// Every in-process try, with the delivery it belongs to: its message id and its attempt
    /// across parks (for the attempt log). The runner calls this one; by default it calls
    /// [`on_try`](Self::on_try).
    fn on_delivery_try(
        &self,
        queue: &str,
        _message_id: Option<&str>,
        _attempt: u32,
        record: &TryRecord<'_>,
    ) {
        self.on_try(queue, record);
    }
    fn on_settled(&self, _settled: &Settled<'_>) {}
}

/// Events that go nowhere.
#[derive(Debug, Default, Clone, Copy)]
pub struct NoEvents;

impl ConsumerEvents for NoEvents {}

/// What to do with a delivery whose handler has run: the pipeline's one decision, pure.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    Ack(Outcome),
    /// Park in tier `tier` (an index into the queue's tiers) as attempt `next_attempt`.
    Park {
        tier: usize,
        next_attempt: u32,
        class: FailureClass,
    },
    DeadLetter {
        reason: DeadReason,
        class: FailureClass,
    },
    Requeue,
}

/// Maps the handler's outcome to a [`Decision`] (see the module docs).
pub fn decide(
    outcome: &RetryOutcome<Handled>,
    attempt: u32,
    max_attempts: u32,
    queue: &QueueTopology,
) -> Decision {
    let failure = match outcome {
        RetryOutcome::Succeeded {
            value: Handled::Done,
            ..
        } => return Decision::Ack(Outcome::Succeeded),
        RetryOutcome::Succeeded {
            value: Handled::Duplicate,
            ..
        } => return Decision::Ack(Outcome::Duplicate),
        RetryOutcome::Cancelled { .. } => return Decision::Requeue,
        RetryOutcome::Failed { failure, .. } => failure,
    };
    let class = failure.class();
    if failure.is_permanent() {
        return Decision::DeadLetter {
            reason: DeadReason::Rejected,
            class,
        };
    }
    if attempt >= max_attempts.max(1) {
        return Decision::DeadLetter {
            reason: DeadReason::GaveUp,
            class,
        };
    }
    let next_attempt = attempt.saturating_add(1);
    let tier = match failure.retry_after() {
        Some(wait) => queue
            .tiers
            .iter()
            .position(|t| t.delay >= wait)
            .unwrap_or(queue.tiers.len().saturating_sub(1)),
        None => {
            crate::topology::tier_index_for_attempt(next_attempt, queue.tiers.len()).unwrap_or(0)
        }
    };
    if queue.tiers.is_empty() {
        return Decision::DeadLetter {
            reason: DeadReason::GaveUp,
            class,
        };
    }
    Decision::Park {
        tier,
        next_attempt,
        class,
    }
}

/// Reads `x-attempt`: missing is attempt 1; any AMQP integer type is read; anything else,
/// zero or a negative number is malformed, with why.
pub fn attempt_of(headers: Option<&FieldTable>) -> Result<u32, String> {
    let Some(value) = headers.and_then(|h| h.inner().get(ATTEMPT_HEADER)) else {
        return Ok(1);
    };
    let n: i64 = match value {
        AMQPValue::ShortShortInt(v) => i64::from(*v),
        AMQPValue::ShortShortUInt(v) => i64::from(*v),
        AMQPValue::ShortInt(v) => i64::from(*v),
        AMQPValue::ShortUInt(v) => i64::from(*v),
        AMQPValue::LongInt(v) => i64::from(*v),
        AMQPValue::LongUInt(v) => i64::from(*v),
        AMQPValue::LongLongInt(v) => *v,
        other => {
            return Err(format!(
                "its {ATTEMPT_HEADER} is a {:?}, not an integer",
                other.get_type()
            ));
        }
    };
    if n < 1 {
        return Err(format!("its {ATTEMPT_HEADER} is {n}, not positive"));
    }
    u32::try_from(n).map_err(|_| format!("its {ATTEMPT_HEADER} is {n}, beyond any attempt count"))
}

/// Test builds only (`--features fault-injection`): a delivery carrying
/// `x-fault-inject: panic` makes its handler panic inside its unit of work, on every try, so
/// that the fault suite can check that a panicking handler is retried by the queue's tiers and
/// then dead-lettered with the panic's message, without a crash. The shipped binary is built
/// without the feature and has no such hook.
#[cfg(feature = "fault-injection")]
pub mod fault_injection {
    use lapin::types::{AMQPValue, FieldTable};

    /// The header that asks for a fault.
    pub const HEADER: &str = "x-fault-inject";
    /// The message the injected panic carries (it ends up in the dead letter's error).
    pub const PANIC_MESSAGE: &str = "fault injection: x-fault-inject: panic";

    /// Whether the delivery's headers ask for a panic (`x-fault-inject` = `panic`, as a long
    /// or short string).
    pub fn wants_panic(headers: Option<&FieldTable>) -> bool {
        match headers.and_then(|h| h.inner().get(HEADER)) {
            Some(AMQPValue::LongString(value)) => value.as_bytes() == b"panic",
            Some(AMQPValue::ShortString(value)) => value.as_str() == "panic",
            _ => false,
        }
    }

    /// Panics with [`PANIC_MESSAGE`].
    #[allow(clippy::panic)]
    pub fn panic_now() {
        panic!("{PANIC_MESSAGE}");
    }

    #[cfg(test)]
    mod tests {
        use lapin::types::{AMQPValue, FieldTable, LongString};

        #[test]
        fn only_the_header_with_panic_asks_for_one() {
            let mut headers = FieldTable::default();
            assert!(!super::wants_panic(None));
            assert!(!super::wants_panic(Some(&headers)));
            headers.insert(
                super::HEADER.into(),
                AMQPValue::LongString(LongString::from("later")),
            );
            assert!(!super::wants_panic(Some(&headers)));
            headers.insert(
                super::HEADER.into(),
                AMQPValue::LongString(LongString::from("panic")),
            );
            assert!(super::wants_panic(Some(&headers)));
        }
    }
}

/// Runs one [`ConsumerJob`] on its queue; see the module docs. Cheap to clone.
pub struct ConsumerRunner<J: ConsumerJob> {
    shared: Arc<Shared<J>>,
}

impl<J: ConsumerJob> Clone for ConsumerRunner<J> {
    fn clone(&self) -> Self {
        Self {
            shared: self.shared.clone(),
        }
    }
}

struct Shared<J> {
    job: J,
    job_name: Arc<str>,
    queue: QueueTopology,
    settings: ConsumerSettings,
    policy: RetryPolicy,
    events: Arc<dyn ConsumerEvents>,
}

impl<J: ConsumerJob> fmt::Debug for ConsumerRunner<J> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ConsumerRunner")
            .field("job", &self.shared.job_name)
            .field("queue", &self.shared.queue.name)
            .field("settings", &self.shared.settings)
            .finish_non_exhaustive()
    }
}

/// Why a session of the runner ended.
#[derive(Debug)]
pub enum SessionEnd {
    /// Shutdown was asked for and done.
    Shutdown,
    /// The channel or connection was lost (or could not be opened), with why.
    Lost(String),
}

enum Settle {
    Ack,
    Requeue,
}

impl<J: ConsumerJob> ConsumerRunner<J> {
    pub fn new(job: J, queue: QueueTopology, settings: ConsumerSettings) -> Self {
        Self::observed(job, queue, settings, Arc::new(NoEvents))
    }

    /// A runner that reports every try and every settled delivery to `events`.
    pub fn observed(
        job: J,
        queue: QueueTopology,
        settings: ConsumerSettings,
        events: Arc<dyn ConsumerEvents>,
    ) -> Self {
        let policy = settings.retry.clone().unwrap_or_default();
        let job_name: Arc<str> = job.name().into();
        Self {
            shared: Arc::new(Shared {
                job,
                job_name,
                queue,
                settings,
                policy,
                events,
            }),
        }
    }

    pub fn queue(&self) -> &QueueTopology {
        &self.shared.queue
    }

    pub fn job(&self) -> &J {
        &self.shared.job
    }

    /// Consumes through the supervisor's sessions until `shutdown`, resuming on every new
    /// connection. Spawn it on the host's task tracker; it returns only on shutdown, once the
    /// deliveries it held are finished or, at the drain deadline, cancelled.
    pub async fn run(&self, supervisor: &Supervisor, shutdown: CancellationToken) {
        let handlers = Handlers::new();
        self.consume(supervisor, &shutdown, &handlers).await;
        handlers.finish(self.shared.settings.drain_deadline).await;
    }

    async fn consume(
        &self,
        supervisor: &Supervisor,
        shutdown: &CancellationToken,
        handlers: &Handlers,
    ) {
        let mut sessions = supervisor.sessions();
        let mut failed_generation = None;
        let mut backoff = Duration::from_millis(100);
        loop {
            let session = tokio::select! {
                biased;
                () = shutdown.cancelled() => return,
                session = next_session(&mut sessions, failed_generation) => session,
            };
            let Some(session) = session else {
                // The supervisor is gone: nothing will ever come.
                shutdown.cancelled().await;
                return;
            };
            let hold = supervisor.hold();
            let end = self.session(&session, shutdown, handlers).await;
            drop(hold);
            match end {
                SessionEnd::Shutdown => return,
                SessionEnd::Lost(why) => {
                    tracing::warn!(queue = %self.shared.queue.name, error = %why, "consumer lost its channel; resuming on the next connection");
                    if session.is_open() {
                        // The connection is fine but the channel is not (a refused consume,
                        // say): retry on the same connection after a pause.
                        tokio::select! {
                            () = shutdown.cancelled() => return,
                            () = tokio::time::sleep(backoff) => {}
                        }
                        backoff = (backoff * 2).min(Duration::from_secs(10));
                    } else {
                        failed_generation = Some(session.generation());
                        backoff = Duration::from_millis(100);
                    }
                }
            }
        }
    }

    /// Consumes on one connection until shutdown or until the channel is lost. Handlers that
    /// outlive a lost channel are waited for (within the drain deadline) before it returns.
    pub async fn run_session(&self, session: &Session, shutdown: &CancellationToken) -> SessionEnd {
        let handlers = Handlers::new();
        let end = self.session(session, shutdown, &handlers).await;
        handlers.finish(self.shared.settings.drain_deadline).await;
        end
    }

    async fn session(
        &self,
        session: &Session,
        shutdown: &CancellationToken,
        handlers: &Handlers,
    ) -> SessionEnd {
        let shared = &self.shared;
        let queue = shared.queue.name.as_str();
        let channel = match open_consumer_channel(session, shared).await {
            Ok(c) => c,
            Err(e) => {
                return SessionEnd::Lost(format!(
                    "consuming from {queue}: {}",
                    worker_core::error_chain(&e)
                ));
            }
        };
        let (channel, mut consumer) = channel;
        let publisher = Publisher::new(
            session.clone().fixed(),
            PublisherSettings {
                channels: 2,
                confirm_timeout: shared.settings.publish_timeout,
                connect_wait: Duration::ZERO,
            },
        );
        let semaphore = Arc::new(Semaphore::new(shared.settings.concurrency.max(1)));
        let (done_tx, mut done_rx) = mpsc::unbounded_channel::<(u64, Settle)>();
        let mut acks = AckBook::new(usize::from(shared.settings.prefetch).div_ceil(4).max(1));
        let mut permit = None;
        let mut flush_at: Option<Instant> = None;
        // Set once shutdown starts: the end of the drain.
        let mut draining: Option<Instant> = None;
        // Whether the consumer may still yield deliveries (it ends after basic.cancel).
        let mut consuming = true;
        tracing::info!(
            queue,
            prefetch = shared.settings.prefetch,
            concurrency = shared.settings.concurrency,
            "consuming"
        );

        let end = loop {
            if draining.is_some() && !consuming && acks.pending() == 0 {
                break End::Drained;
            }
            tokio::select! {
                biased;
                Some((tag, settle)) = done_rx.recv() => {
                    acks.complete(tag, settle);
                    while let Ok((tag, settle)) = done_rx.try_recv() {
                        acks.complete(tag, settle);
                    }
                    if (acks.ready() || acks.idle())
                        && let Err(e) = acks.flush(&channel, false).await
                    {
                        break End::Lost(e);
                    }
                    // Completions left behind a slow handler are settled by the timer.
                    if !acks.has_completed() {
                        flush_at = None;
                    } else if flush_at.is_none() {
                        flush_at = Some(Instant::now() + shared.settings.ack_interval);
                    }
                }
                () = sleep_until(flush_at), if flush_at.is_some() => {
                    flush_at = None;
                    if let Err(e) = acks.flush(&channel, true).await { break End::Lost(e) }
                    if acks.has_completed() {
                        flush_at = Some(Instant::now() + shared.settings.ack_interval);
                    }
                }
                () = shutdown.cancelled(), if draining.is_none() => {
                    draining = Some(handlers.drain_until(shared.settings.drain_deadline));
                    tracing::info!(queue, in_flight = acks.pending(), "stopping the consumer; finishing the deliveries it holds");
                    // The broker sends no more; the consumer yields what lapin already holds,
                    // then ends.
                    let cancel = channel.basic_cancel(consumer.tag(), BasicCancelOptions::default());
                    match tokio::time::timeout(shared.settings.publish_timeout, cancel).await {
                        Ok(Ok(())) => {}
                        Ok(Err(e)) => break End::Lost(format!("basic.cancel failed: {}", worker_core::error_chain(&e))),
                        Err(_) => break End::Lost("basic.cancel got no answer".into()),
                    }
                }
                () = sleep_until(draining), if draining.is_some() => break End::DeadlineOver,
                p = semaphore.clone().acquire_owned(), if permit.is_none() && consuming => {
                    permit = p.ok();
                }
                delivery = consumer.next(), if permit.is_some() && consuming => match delivery {
                    Some(Ok(delivery)) => {
                        acks.delivered(delivery.delivery_tag);
                        let task = process(shared.clone(), delivery, publisher.clone(), handlers.cancel.clone());
                        let done = done_tx.clone();
                        let held = permit.take();
                        handlers.tracker.spawn(async move {
                            let (tag, settle) = task.await;
                            // After a lost channel nobody listens: the broker has requeued
                            // the delivery already, and its redelivery meets the job's guard.
                            let _ = done.send((tag, settle));
                            drop(held);
                        });
                    }
                    Some(Err(e)) => break End::Lost(format!("the consumer failed: {}", worker_core::error_chain(&e))),
                    None if draining.is_some() => consuming = false,
                    None => break End::Lost("the broker cancelled the consumer (queue deleted?) or the channel closed".into()),
                }
            }
        };

        match end {
            End::Lost(why) => {
                // Nothing can be settled on this channel any more: the broker requeues every
                // unacked delivery. The handlers in flight are not cancelled: they finish
                // within their own timeout and record their outcome (an SMTP send cut short
                // would be sent again by the redelivery), and their settle is dropped.
                drop(done_rx);
                let _ =
                    tokio::time::timeout(CANCEL_WAIT, channel.close(200, "consumer lost".into()))
                        .await;
                if draining.is_some() {
                    tracing::warn!(queue, error = %why, "the channel was lost while draining; the broker requeues what was not acked");
                    return SessionEnd::Shutdown;
                }
                SessionEnd::Lost(why)
            }
            End::Drained => {
                if let Err(e) = acks.flush(&channel, true).await {
                    tracing::warn!(queue, error = %e, "acking the last deliveries failed; the broker requeues them");
                }
                tracing::info!(queue, "every delivery held was finished");
                drop(consumer);
                let _ = channel.close(200, "worker host shutting down".into()).await;
                SessionEnd::Shutdown
            }
            End::DeadlineOver => {
                tracing::warn!(
                    queue,
                    in_flight = acks.pending(),
                    "drain deadline over: cancelling the handlers in flight and returning the rest to the queue"
                );
                handlers.cancel.cancel();
                let wait = tokio::time::sleep(CANCEL_WAIT);
                tokio::pin!(wait);
                while acks.pending() > 0 {
                    tokio::select! {
                        Some((tag, settle)) = done_rx.recv() => acks.complete(tag, settle),
                        () = &mut wait => break,
                    }
                }
                let flushed = acks.flush(&channel, true).await;
                // Whatever is left (handlers that ignored cancellation, deliveries prefetched
                // but never started) goes back to the queue.
                let requeued = channel
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
                    tracing::warn!(queue, error = %e, "settling the last deliveries on shutdown failed; the broker requeues them");
                }
                drop(consumer);
                let _ = channel.close(200, "worker host shutting down".into()).await;
                SessionEnd::Shutdown
            }
        }
    }
}

/// How the loop of one session ended.
enum End {
    Lost(String),
    /// Shutdown, and every delivery held was finished.
    Drained,
    /// Shutdown, and the drain deadline came first.
    DeadlineOver,
}

/// The handlers of one [`ConsumerRunner::run`]: they outlive a lost channel, and shutdown
/// waits for them, within the drain deadline.
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

async fn open_consumer_channel<J>(
    session: &Session,
    shared: &Shared<J>,
) -> Result<(Channel, lapin::Consumer), lapin::Error> {
    let channel = session.connection().create_channel().await?;
    channel
        .basic_qos(shared.settings.prefetch, BasicQosOptions::default())
        .await?;
    let tag = format!("{}@{}", shared.job_name, std::process::id());
    let consumer = channel
        .basic_consume(
            ShortString::try_new(shared.queue.name.as_str()).unwrap_or_default(),
            ShortString::try_new(tag).unwrap_or_default(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await?;
    Ok((channel, consumer))
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// Delivered tags and how each was settled, in tag order; turns completions into as few
/// acks as possible.
struct AckBook {
    entries: BTreeMap<u64, Option<Settle>>,
    /// Completed entries to gather before flushing without waiting for the timer.
    batch: usize,
    completed: usize,
}

impl AckBook {
    fn new(batch: usize) -> Self {
        Self {
            entries: BTreeMap::new(),
            batch,
            completed: 0,
        }
    }

    fn delivered(&mut self, tag: u64) {
        self.entries.insert(tag, None);
    }

    fn complete(&mut self, tag: u64, settle: Settle) {
        if let Some(slot) = self.entries.get_mut(&tag)
            && slot.is_none()
        {
            *slot = Some(settle);
            self.completed += 1;
        }
    }

    fn pending(&self) -> usize {
        self.entries.len() - self.completed
    }

    fn has_completed(&self) -> bool {
        self.completed > 0
    }

    /// Enough completed to be worth a flush now.
    fn ready(&self) -> bool {
        self.completed >= self.batch
    }

    /// Nothing is in flight: flush at once rather than keep the last few waiting.
    fn idle(&self) -> bool {
        self.completed > 0 && self.pending() == 0
    }

    /// Acks the contiguous completed prefix with one `multiple` ack (nacking requeued ones
    /// on the way); with `stragglers`, also settles completed entries behind a pending one,
    /// one by one, so that a slow handler never holds the others' prefetch slots.
    async fn flush(&mut self, channel: &Channel, stragglers: bool) -> Result<(), String> {
        let mut ack_upto: Option<u64> = None;
        while let Some(entry) = self.entries.first_entry() {
            let Some(settle) = entry.get() else { break };
            let tag = *entry.key();
            match settle {
                Settle::Ack => ack_upto = Some(tag),
                Settle::Requeue => {
                    if let Some(upto) = ack_upto.take() {
                        ack(channel, upto, true).await?;
                    }
                    nack(channel, tag).await?;
                }
            }
            entry.remove();
            self.completed -= 1;
        }
        if let Some(upto) = ack_upto {
            ack(channel, upto, true).await?;
        }
        if stragglers && self.completed > 0 {
            let done: Vec<u64> = self
                .entries
                .iter()
                .filter(|(_, s)| s.is_some())
                .map(|(t, _)| *t)
                .collect();
            for tag in done {
                if let Some(Some(settle)) = self.entries.remove(&tag) {
                    self.completed -= 1;
                    match settle {
                        Settle::Ack => ack(channel, tag, false).await?,
                        Settle::Requeue => nack(channel, tag).await?,
                    }
                }
            }
        }
        Ok(())
    }
}

async fn ack(channel: &Channel, tag: u64, multiple: bool) -> Result<(), String> {
    channel
        .basic_ack(tag, BasicAckOptions { multiple })
        .await
        .map_err(|e| format!("ack failed: {}", worker_core::error_chain(&e)))
}

async fn nack(channel: &Channel, tag: u64) -> Result<(), String> {
    channel
        .basic_nack(
            tag,
            BasicNackOptions {
                multiple: false,
                requeue: true,
            },
        )
        .await
        .map_err(|e| format!("nack failed: {}", worker_core::error_chain(&e)))
}

struct TryForwarder<'a> {
    events: &'a dyn ConsumerEvents,
    queue: &'a str,
    message_id: Option<&'a str>,
    attempt: u32,
}

impl AttemptObserver for TryForwarder<'_> {
    fn on_try(&self, record: &TryRecord<'_>) {
        self.events
            .on_delivery_try(self.queue, self.message_id, self.attempt, record);
    }
}

/// Runs the pipeline on one delivery; returns its tag and how to settle it.
async fn process<J: ConsumerJob>(
    shared: Arc<Shared<J>>,
    delivery: Delivery,
    publisher: Publisher,
    handlers: CancellationToken,
) -> (u64, Settle) {
    let started = Instant::now();
    let tag = delivery.delivery_tag;
    let headers = delivery.properties.headers().as_ref();
    let message_id = delivery
        .properties
        .message_id()
        .as_ref()
        .map(ShortString::as_str);
    let span = tracing::info_span!(
        "consume",
        otel.name = %format_args!("consume {}", shared.queue.name),
        otel.kind = "consumer",
        messaging.system = "rabbitmq",
        messaging.operation = "process",
        messaging.destination.name = %shared.queue.name,
        messaging.rabbitmq.destination.routing_key = %delivery.routing_key,
        messaging.message.id = message_id.unwrap_or(""),
        job = %shared.job_name,
        attempt = tracing::field::Empty,
        outcome = tracing::field::Empty,
    );
    trace::continue_trace(&span, headers);
    async move {
        let (attempt, tries, outcome) = pipeline(&shared, &delivery, &publisher, &handlers).await;
        let span = tracing::Span::current();
        span.record("attempt", attempt);
        span.record("outcome", outcome.as_str());
        let message_id = delivery
            .properties
            .message_id()
            .as_ref()
            .map(ShortString::as_str);
        shared.events.on_settled(&Settled {
            queue: &shared.queue.name,
            message_id,
            attempt,
            tries,
            outcome: &outcome,
            elapsed: started.elapsed(),
        });
        let settle = match outcome {
            Outcome::Requeued | Outcome::Abandoned => Settle::Requeue,
            _ => Settle::Ack,
        };
        (tag, settle)
    }
    .instrument(span)
    .await
}

/// Returns the attempt, the tries made and the outcome.
async fn pipeline<J: ConsumerJob>(
    shared: &Shared<J>,
    delivery: &Delivery,
    publisher: &Publisher,
    handlers: &CancellationToken,
) -> (u32, u32, Outcome) {
    let headers = delivery.properties.headers().as_ref();
    let attempt = match attempt_of(headers) {
        Ok(attempt) => attempt,
        Err(why) => {
            let why = format!("malformed: {why}");
            tracing::warn!(error = %why, "dead-lettering a malformed message");
            return (
                1,
                0,
                dead_letter(
                    shared,
                    delivery,
                    publisher,
                    DeadReason::Malformed,
                    FailureClass::Malformed,
                    1,
                    &why,
                )
                .await,
            );
        }
    };
    let input: J::Input = match worker_core::decode(&delivery.data) {
        Ok(input) => input,
        Err(err) => {
            let why = format!("malformed: {err}");
            tracing::warn!(error = %why, "dead-lettering a malformed message");
            return (
                attempt,
                0,
                dead_letter(
                    shared,
                    delivery,
                    publisher,
                    DeadReason::Malformed,
                    FailureClass::Malformed,
                    attempt,
                    &why,
                )
                .await,
            );
        }
    };
    let mut ctx = WorkContext::new(shared.job_name.clone(), handlers.clone()).with_attempt(attempt);
    if let Some(id) = delivery.properties.message_id() {
        ctx = ctx.with_message_id(id.as_str());
    }
    if let Some(id) = delivery.properties.correlation_id() {
        ctx = ctx.with_correlation_id(id.as_str());
    }
    let observer = TryForwarder {
        events: shared.events.as_ref(),
        queue: &shared.queue.name,
        message_id: ctx.message_id.as_deref(),
        attempt,
    };
    let job = &shared.job;
    let input = &input;
    #[cfg(feature = "fault-injection")]
    let inject_panic = fault_injection::wants_panic(headers);
    let result = Retry::new(
        &shared.job_name,
        &shared.policy,
        shared.settings.timeout,
        handlers,
    )
    .wait_budget(shared.settings.in_process_wait)
    .observer(&observer)
    .run(&ctx, |ctx| async move {
        #[cfg(feature = "fault-injection")]
        if inject_panic {
            fault_injection::panic_now();
        }
        job.handle(&ctx, input).await
    })
    .await;
    let tries = result.attempts();
    let decision = decide(
        &result,
        attempt,
        shared.settings.max_attempts,
        &shared.queue,
    );
    let failure = match &result {
        RetryOutcome::Failed { failure, .. } => Some(failure),
        _ => None,
    };
    let outcome = match decision {
        Decision::Ack(outcome) => outcome,
        Decision::Requeue => Outcome::Abandoned,
        Decision::DeadLetter { reason, class } => {
            let why = failure.map(Failure::to_string).unwrap_or_default();
            tracing::warn!(reason = reason.as_str(), class = class.as_str(), error = %why, "dead-lettering");
            dead_letter(shared, delivery, publisher, reason, class, attempt, &why).await
        }
        Decision::Park {
            tier,
            next_attempt,
            class,
        } => {
            let why = failure.map(Failure::to_string).unwrap_or_default();
            park(
                shared,
                delivery,
                publisher,
                tier,
                next_attempt,
                class,
                attempt,
                &why,
            )
            .await
        }
    };
    (attempt, tries, outcome)
}

#[allow(clippy::too_many_arguments)]
async fn park<J>(
    shared: &Shared<J>,
    delivery: &Delivery,
    publisher: &Publisher,
    tier: usize,
    next_attempt: u32,
    class: FailureClass,
    attempt: u32,
    why: &str,
) -> Outcome {
    let Some(tier) = shared.queue.tiers.get(tier) else {
        return dead_letter(
            shared,
            delivery,
            publisher,
            DeadReason::GaveUp,
            class,
            attempt,
            why,
        )
        .await;
    };
    let mut headers = copied_headers(delivery);
    headers.insert(
        ATTEMPT_HEADER.into(),
        AMQPValue::LongLongInt(i64::from(next_attempt)),
    );
    if !headers.contains_key(ORIGINAL_ROUTING_KEY_HEADER) {
        headers.insert(
            ORIGINAL_ROUTING_KEY_HEADER.into(),
            AMQPValue::LongString(LongString::from(delivery.routing_key.as_str())),
        );
    }
    let message = Outgoing {
        exchange: String::new(),
        routing_key: tier.queue.clone(),
        body: delivery.data.clone(),
        properties: copied_properties(delivery).with_headers(headers),
    };
    match publisher.publish(&message).await {
        Ok(()) => {
            tracing::info!(tier = %tier.queue, next_attempt, class = class.as_str(), error = %why, "parked for a later attempt");
            Outcome::Parked {
                next_attempt,
                tier: tier.queue.clone(),
                class,
            }
        }
        Err(err) => {
            // When the confirm was lost with the channel, the copy may have reached the
            // tier all the same: the message may then exist twice (see the module docs).
            tracing::error!(tier = %tier.queue, error = %err, "parking failed (its copy may have reached the tier all the same; a later copy then meets the job's guard); dead-lettering instead");
            let why = format!(
                "parking in {} failed ({err}); last error: {why}",
                tier.queue
            );
            dead_letter(
                shared,
                delivery,
                publisher,
                DeadReason::GaveUp,
                class,
                attempt,
                &why,
            )
            .await
        }
    }
}

async fn dead_letter<J>(
    shared: &Shared<J>,
    delivery: &Delivery,
    publisher: &Publisher,
    reason: DeadReason,
    class: FailureClass,
    attempts: u32,
    why: &str,
) -> Outcome {
    let mut headers = copied_headers(delivery);
    let remove = [ATTEMPT_HEADER];
    let mut map = headers.inner().clone();
    for key in remove {
        map.remove(key);
    }
    headers = FieldTable::from(map);
    let text = |s: &str| AMQPValue::LongString(LongString::from(s));
    headers.insert(DEAD_REASON_HEADER.into(), text(reason.as_str()));
    headers.insert(
        DEAD_ATTEMPTS_HEADER.into(),
        AMQPValue::LongLongInt(i64::from(attempts)),
    );
    headers.insert(DEAD_ERROR_HEADER.into(), text(bounded(why, DEAD_ERROR_MAX)));
    headers.insert(DEAD_CLASS_HEADER.into(), text(class.as_str()));
    headers.insert(DEAD_QUEUE_HEADER.into(), text(&shared.queue.name));
    headers.insert(
        DEAD_AT_HEADER.into(),
        text(&chrono::Utc::now().to_rfc3339_opts(SecondsFormat::Millis, true)),
    );
    let routing_key = match headers.inner().get(ORIGINAL_ROUTING_KEY_HEADER) {
        Some(AMQPValue::LongString(s)) => String::from_utf8_lossy(s.as_bytes()).into_owned(),
        _ => delivery.routing_key.to_string(),
    };
    let message = Outgoing {
        exchange: shared.queue.dead_exchange.clone(),
        routing_key,
        body: delivery.data.clone(),
        properties: copied_properties(delivery).with_headers(headers),
    };
    match publisher.publish(&message).await {
        Ok(()) => Outcome::DeadLettered { reason, class },
        Err(err) => {
            tracing::error!(
                dead_exchange = %shared.queue.dead_exchange,
                error = %err,
                "dead-lettering failed; returning the delivery to the queue, whose delivery limit will dead-letter it"
            );
            Outcome::Requeued
        }
    }
}

/// The delivery's headers minus the broker's own per-delivery bookkeeping.
fn copied_headers(delivery: &Delivery) -> FieldTable {
    let mut map = delivery
        .properties
        .headers()
        .as_ref()
        .map(|h| h.inner().clone())
        .unwrap_or_default();
    map.remove("x-delivery-count");
    FieldTable::from(map)
}

/// The properties a copy keeps. `expiration` would expire a parked copy early or a dead
/// letter at all, and `user-id` must match the publishing connection's user, so both go.
fn copied_properties(delivery: &Delivery) -> BasicProperties {
    let p = &delivery.properties;
    let mut out = BasicProperties::default().with_delivery_mode(2);
    if let Some(v) = p.content_type() {
        out = out.with_content_type(v.clone());
    }
    if let Some(v) = p.content_encoding() {
        out = out.with_content_encoding(v.clone());
    }
    if let Some(v) = p.priority() {
        out = out.with_priority(*v);
    }
    if let Some(v) = p.correlation_id() {
        out = out.with_correlation_id(v.clone());
    }
    if let Some(v) = p.reply_to() {
        out = out.with_reply_to(v.clone());
    }
    if let Some(v) = p.message_id() {
        out = out.with_message_id(v.clone());
    }
    if let Some(v) = p.timestamp() {
        out = out.with_timestamp(*v);
    }
    if let Some(v) = p.kind() {
        out = out.with_type(v.clone());
    }
    if let Some(v) = p.app_id() {
        out = out.with_app_id(v.clone());
    }
    if let Some(v) = p.cluster_id() {
        out = out.with_cluster_id(v.clone());
    }
    out
}

/// `s` cut to at most `max` bytes on a character boundary, with an ellipsis when cut.
fn bounded(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::topology::{QueueDefaults, QueueSettings, TopologySettings};

    fn queue() -> QueueTopology {
        let settings = QueueSettings {
            retry_tiers: vec![
                Duration::from_secs(10),
                Duration::from_secs(60),
                Duration::from_secs(600),
            ],
            ..QueueSettings::default()
        };
        QueueTopology::from_settings(
            &settings,
            QueueDefaults::command("email.send", &TopologySettings::default()),
        )
        .unwrap()
    }

    fn headers(value: AMQPValue) -> FieldTable {
        let mut h = FieldTable::default();
        h.insert(ATTEMPT_HEADER.into(), value);
        h
    }

    /// Any AMQP value an `x-attempt` header can carry: every integer type at any value, and
    /// the other types with arbitrary contents.
    fn any_attempt_value() -> impl proptest::strategy::Strategy<Value = AMQPValue> {
        use proptest::prelude::*;
        prop_oneof![
            any::<i8>().prop_map(AMQPValue::ShortShortInt),
            any::<u8>().prop_map(AMQPValue::ShortShortUInt),
            any::<i16>().prop_map(AMQPValue::ShortInt),
            any::<u16>().prop_map(AMQPValue::ShortUInt),
            any::<i32>().prop_map(AMQPValue::LongInt),
            any::<u32>().prop_map(AMQPValue::LongUInt),
            any::<i64>().prop_map(AMQPValue::LongLongInt),
            any::<bool>().prop_map(AMQPValue::Boolean),
            any::<f32>().prop_map(AMQPValue::Float),
            any::<f64>().prop_map(AMQPValue::Double),
            ".*".prop_map(|s: String| AMQPValue::LongString(LongString::from(s))),
            proptest::collection::vec(any::<u8>(), 0..64)
                .prop_map(|b| AMQPValue::ByteArray(b.into())),
            Just(AMQPValue::Void),
        ]
    }

    /// The integer an AMQP value holds, if it is of an integer type.
    fn integer(value: &AMQPValue) -> Option<i64> {
        Some(match value {
            AMQPValue::ShortShortInt(v) => i64::from(*v),
            AMQPValue::ShortShortUInt(v) => i64::from(*v),
            AMQPValue::ShortInt(v) => i64::from(*v),
            AMQPValue::ShortUInt(v) => i64::from(*v),
            AMQPValue::LongInt(v) => i64::from(*v),
            AMQPValue::LongUInt(v) => i64::from(*v),
            AMQPValue::LongLongInt(v) => *v,
            _ => return None,
        })
    }

    proptest::proptest! {
        #![proptest_config(proptest::test_runner::Config::with_cases(512))]

        /// Any header value: an attempt exactly when it is an integer from 1 to u32::MAX,
        /// otherwise a refusal that names the header; never a panic.
        #[test]
        fn any_attempt_header_is_an_attempt_or_a_refusal_with_a_reason(value in any_attempt_value()) {
            let read = attempt_of(Some(&headers(value.clone())));
            match integer(&value).filter(|n| (1..=i64::from(u32::MAX)).contains(n)) {
                Some(n) => proptest::prop_assert_eq!(read, Ok(u32::try_from(n).unwrap())),
                None => {
                    let why = read.unwrap_err();
                    proptest::prop_assert!(why.contains(ATTEMPT_HEADER), "{}", why);
                }
            }
        }

        /// What a park writes (`LongLongInt` of the next attempt) reads back as that attempt,
        /// whatever other headers the delivery carries.
        #[test]
        fn the_attempt_a_park_writes_reads_back(
            attempt in 1u32..,
            others in proptest::collection::btree_map("[a-z-]{1,12}", ".{0,20}", 0..8),
        ) {
            let mut h = FieldTable::default();
            for (key, value) in others {
                h.insert(key.into(), AMQPValue::LongString(LongString::from(value)));
            }
            h.insert(ATTEMPT_HEADER.into(), AMQPValue::LongLongInt(i64::from(attempt)));
            proptest::prop_assert_eq!(attempt_of(Some(&h)), Ok(attempt));
        }
    }

    #[test]
    fn every_integer_type_is_an_attempt() {
        assert_eq!(attempt_of(None), Ok(1));
        assert_eq!(attempt_of(Some(&FieldTable::default())), Ok(1));
        for v in [
            AMQPValue::ShortShortInt(3),
            AMQPValue::ShortShortUInt(3),
            AMQPValue::ShortInt(3),
            AMQPValue::ShortUInt(3),
            AMQPValue::LongInt(3),
            AMQPValue::LongUInt(3),
            AMQPValue::LongLongInt(3),
        ] {
            assert_eq!(attempt_of(Some(&headers(v.clone()))), Ok(3), "{v:?}");
        }
    }

    #[test]
    fn strings_floats_zero_and_negatives_are_malformed() {
        for v in [
            AMQPValue::LongString("2".into()),
            AMQPValue::Float(2.0),
            AMQPValue::Double(2.0),
            AMQPValue::Boolean(true),
            AMQPValue::LongLongInt(0),
            AMQPValue::LongInt(-3),
            AMQPValue::LongLongInt(i64::MAX),
        ] {
            let err = attempt_of(Some(&headers(v.clone()))).unwrap_err();
            assert!(err.contains(ATTEMPT_HEADER), "{v:?}: {err}");
        }
    }

    fn failed(failure: Failure) -> RetryOutcome<Handled> {
        RetryOutcome::Failed {
            failure,
            attempts: 3,
        }
    }

    #[test]
    fn decisions_follow_the_pipeline() {
        let q = queue();
        let ok = RetryOutcome::Succeeded {
            value: Handled::Done,
            attempts: 1,
        };
        assert_eq!(decide(&ok, 1, 5, &q), Decision::Ack(Outcome::Succeeded));
        let dup = RetryOutcome::Succeeded {
            value: Handled::Duplicate,
            attempts: 1,
        };
        assert_eq!(decide(&dup, 1, 5, &q), Decision::Ack(Outcome::Duplicate));
        assert_eq!(
            decide(&RetryOutcome::Cancelled { attempts: 1 }, 1, 5, &q),
            Decision::Requeue
        );

        let permanent = failed(Failure::permanent("smtp-5xx", "550"));
        assert_eq!(
            decide(&permanent, 1, 5, &q),
            Decision::DeadLetter {
                reason: DeadReason::Rejected,
                class: FailureClass::Permanent
            }
        );

        let transient = failed(Failure::transient("reset"));
        assert_eq!(
            decide(&transient, 1, 5, &q),
            Decision::Park {
                tier: 0,
                next_attempt: 2,
                class: FailureClass::Transient
            }
        );
        assert_eq!(
            decide(&transient, 2, 5, &q),
            Decision::Park {
                tier: 1,
                next_attempt: 3,
                class: FailureClass::Transient
            }
        );
        assert_eq!(
            decide(&transient, 4, 5, &q),
            Decision::Park {
                tier: 2,
                next_attempt: 5,
                class: FailureClass::Transient
            }
        );
        assert_eq!(
            decide(&transient, 5, 5, &q),
            Decision::DeadLetter {
                reason: DeadReason::GaveUp,
                class: FailureClass::Transient
            }
        );
        assert_eq!(
            decide(&transient, 9, 5, &q),
            Decision::DeadLetter {
                reason: DeadReason::GaveUp,
                class: FailureClass::Transient
            }
        );

        let throttled = failed(Failure::throttled(Duration::from_secs(30), "429"));
        assert_eq!(
            decide(&throttled, 1, 5, &q),
            Decision::Park {
                tier: 1,
                next_attempt: 2,
                class: FailureClass::Throttled
            }
        );
        let long = failed(Failure::throttled(Duration::from_secs(3600), "429"));
        assert_eq!(
            decide(&long, 1, 5, &q),
            Decision::Park {
                tier: 2,
                next_attempt: 2,
                class: FailureClass::Throttled
            }
        );
        assert_eq!(
            decide(&long, 5, 5, &q),
            Decision::DeadLetter {
                reason: DeadReason::GaveUp,
                class: FailureClass::Throttled
            }
        );
    }

    #[test]
    fn the_dead_error_is_bounded_on_a_char_boundary() {
        let s = "é".repeat(2000);
        let b = bounded(&s, DEAD_ERROR_MAX);
        assert!(b.len() <= DEAD_ERROR_MAX);
        assert!(b.len() >= DEAD_ERROR_MAX - 1);
        assert_eq!(bounded("short", DEAD_ERROR_MAX), "short");
    }

    #[test]
    fn settings_defaults_and_toml() {
        let s: ConsumerSettings =
            toml::from_str("prefetch = 100\ntimeout = \"5s\"\n[retry]\nmax_attempts = 2").unwrap();
        assert_eq!(s.prefetch, 100);
        assert_eq!(s.concurrency, 8);
        assert_eq!(s.max_attempts, 5);
        assert_eq!(s.timeout, Duration::from_secs(5));
        assert_eq!(s.retry.unwrap().max_attempts, 2);
        assert!(toml::from_str::<ConsumerSettings>("prefech = 1").is_err());
        assert_eq!(ConsumerSettings::default().validate(), Ok(()));
        let zero = ConsumerSettings {
            prefetch: 0,
            ..ConsumerSettings::default()
        };
        assert!(zero.validate().unwrap_err().contains("prefetch"));
        let held = ConsumerSettings {
            in_process_wait: BROKER_CONSUMER_TIMEOUT,
            ..ConsumerSettings::default()
        };
        assert!(held.validate().unwrap_err().contains("in_process_wait"));
        let no_drain = ConsumerSettings {
            drain_deadline: Duration::ZERO,
            ..ConsumerSettings::default()
        };
        assert!(no_drain.validate().unwrap_err().contains("drain_deadline"));
    }

    #[tokio::test]
    async fn acks_coalesce_into_one_multiple_for_a_contiguous_prefix() {
        // Pure bookkeeping part: which tags a flush would settle, without a channel.
        let mut book = AckBook::new(4);
        for t in 1..=6 {
            book.delivered(t);
        }
        for t in [2, 1, 3, 5] {
            book.complete(t, Settle::Ack);
        }
        assert_eq!(book.pending(), 2);
        assert!(book.ready());
        // Prefix 1..=3 is contiguous; 5 waits behind 4.
        let prefix: Vec<u64> = book
            .entries
            .iter()
            .take_while(|(_, s)| s.is_some())
            .map(|(t, _)| *t)
            .collect();
        assert_eq!(prefix, [1, 2, 3]);
    }
}
