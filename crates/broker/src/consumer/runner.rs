//! [`ConsumerRunner`]: one [`ConsumerJob`] on its queue, each delivery through the pipeline
//! (attempt header, decode, in-process retries, [`decide()`], then ack, park or dead letter).

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use lapin::types::{FieldTable, ShortString};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;
use worker_core::{ConsumerJob, Failure, Retry, RetryOutcome, RetryPolicy, WorkContext};

use super::dead_letter::{Fate, Mover, Verdict};
use super::events::TryForwarder;
use super::handlers::Scope;
use super::pump::SessionEnd;
use super::session::ConsumeLoop;
use super::settings::ConsumeSettings;
use super::{
    ConsumerEvents, ConsumerSettings, Decision, DeliveryReport, NoEvents, Outcome, Settle,
    attempt_of, decide, schema_version_of,
};
use crate::connection::{Session, Supervisor};
use crate::message::Delivery;
use crate::publisher::{Publisher, PublisherSettings};
use crate::topology::QueueTopology;
use crate::trace;

/// Runs one [`ConsumerJob`] on its queue; see the module docs. Cheap to clone.
pub struct ConsumerRunner<J: ConsumerJob> {
    shared: Arc<Shared<J>>,
    consume: ConsumeLoop,
}

impl<J: ConsumerJob> Clone for ConsumerRunner<J> {
    fn clone(&self) -> Self {
        Self {
            shared: self.shared.clone(),
            consume: self.consume.clone(),
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
        let consume = ConsumeLoop::new(ConsumeSettings {
            queue: queue.name.clone(),
            consumer_name: job_name.to_string(),
            prefetch: settings.prefetch,
            concurrency: settings.concurrency,
            ack_interval: settings.ack_interval,
            settle_deadline: settings.settle_deadline,
            cancel_timeout: settings.publish_timeout,
        });
        Self {
            shared: Arc::new(Shared {
                job,
                job_name,
                queue,
                settings,
                policy,
                events,
            }),
            consume,
        }
    }

    /// The runner, consuming only while `gate` is open (an operator's pause closes it).
    #[must_use]
    pub fn gated(mut self, gate: super::Gate) -> Self {
        self.consume = self.consume.gated(gate);
        self
    }

    pub fn queue(&self) -> &QueueTopology {
        &self.shared.queue
    }

    pub fn job(&self) -> &J {
        &self.shared.job
    }

    /// Consumes through the supervisor's sessions until `shutdown`, resuming on every new
    /// connection. Spawn it on the host's task tracker; it returns only on shutdown, once the
    /// deliveries it held are finished or, at the settle deadline, cancelled.
    pub async fn run(&self, supervisor: &Supervisor, shutdown: CancellationToken) {
        self.consume
            .run(supervisor, shutdown, |session| self.handler(session))
            .await;
    }

    /// Consumes on one connection until shutdown or until the channel is lost. Handlers that
    /// outlive a lost channel are waited for (within the settle deadline) before it returns.
    pub async fn run_session(&self, session: &Session, shutdown: &CancellationToken) -> SessionEnd {
        self.consume
            .run_session(session, shutdown, self.handler(session))
            .await
    }

    /// The pipeline for the deliveries of one session, whose parks and dead letters go
    /// through a publisher on that same connection.
    fn handler(
        &self,
        session: &Session,
    ) -> impl Fn(Delivery, Scope) -> BoxFuture<'static, Settle> + use<J> {
        let publisher = Publisher::new(
            session.clone().fixed(),
            PublisherSettings {
                channels: 2,
                confirm_timeout: self.shared.settings.publish_timeout,
                connect_wait: Duration::ZERO,
            },
        );
        let shared = self.shared.clone();
        move |delivery, scope| {
            Box::pin(process(
                shared.clone(),
                delivery,
                publisher.clone(),
                scope.cancel().clone(),
            ))
        }
    }
}

/// Runs the pipeline on one delivery, within its span; returns how to settle it.
async fn process<J: ConsumerJob>(
    shared: Arc<Shared<J>>,
    delivery: Delivery,
    publisher: Publisher,
    handlers: CancellationToken,
) -> Settle {
    let started = Instant::now();
    let span = consume_span(&shared, &delivery);
    trace::continue_amqp_trace(&span, delivery.amqp().properties.headers().as_ref());
    async move {
        let (attempt, tries, outcome) = pipeline(&shared, &delivery, &publisher, &handlers).await;
        let span = tracing::Span::current();
        span.record("attempt", attempt);
        span.record("outcome", outcome.as_str());
        shared.events.on_settled(&DeliveryReport {
            queue: &shared.queue.name,
            message_id: delivery.message_id(),
            attempt,
            tries,
            outcome: &outcome,
            elapsed: started.elapsed(),
        });
        match outcome {
            Outcome::Requeued | Outcome::Abandoned => Settle::Requeue,
            _ => Settle::Ack,
        }
    }
    .instrument(span)
    .await
}

fn consume_span<J>(shared: &Shared<J>, delivery: &Delivery) -> tracing::Span {
    tracing::info_span!(
        "consume",
        otel.name = %format_args!("consume {}", shared.queue.name),
        otel.kind = "consumer",
        messaging.system = "rabbitmq",
        messaging.operation = "process",
        messaging.destination.name = %shared.queue.name,
        messaging.rabbitmq.destination.routing_key = %delivery.routing_key(),
        messaging.message.id = delivery.message_id().unwrap_or(""),
        job = %shared.job_name,
        attempt = tracing::field::Empty,
        outcome = tracing::field::Empty,
    )
}

/// Returns the attempt, the tries made and the outcome.
async fn pipeline<J: ConsumerJob>(
    shared: &Shared<J>,
    delivery: &Delivery,
    publisher: &Publisher,
    handlers: &CancellationToken,
) -> (u32, u32, Outcome) {
    let mover = Mover {
        queue: &shared.queue,
        delivery: delivery.amqp(),
        publisher,
    };
    if let Some(reason) = shared.job.skips(message_type_of(delivery)) {
        let attempt = attempt_of(delivery.amqp().properties.headers().as_ref()).unwrap_or(1);
        tracing::debug!(
            reason,
            "skipping a message of a type this job does not read"
        );
        return (attempt, 0, Outcome::Skipped { reason });
    }
    let (attempt, input) = match read(&shared.job, delivery) {
        Ok(read) => read,
        Err(Unread::Malformed { attempt, why }) => {
            tracing::warn!(error = %why, "dead-lettering a malformed message");
            let outcome = mover.apply(Verdict::malformed(attempt, why)).await;
            return (attempt, 0, outcome);
        }
        Err(Unread::Refused { attempt, failure }) => {
            tracing::warn!(error = %failure, "dead-lettering a message this release cannot read");
            let outcome = mover.apply(Verdict::refused(attempt, &failure)).await;
            return (attempt, 0, outcome);
        }
    };
    let result = handle(shared, delivery, &input, attempt, handlers).await;
    let decision = decide(
        &result,
        attempt,
        shared.settings.max_attempts,
        &shared.queue,
    );
    let why = match &result {
        RetryOutcome::Failed { failure, .. } => failure.to_string(),
        _ => String::new(),
    };
    let (fate, class) = match decision {
        Decision::Ack(outcome) => return (attempt, result.tries(), outcome),
        Decision::Requeue => return (attempt, result.tries(), Outcome::Abandoned),
        Decision::Return => (Fate::Return, worker_core::FailureClass::Unavailable),
        Decision::DeadLetter { reason, class } => {
            tracing::warn!(reason = reason.as_str(), class = class.as_str(), error = %why, "dead-lettering");
            (Fate::Dead(reason), class)
        }
        Decision::Park {
            tier,
            next_attempt,
            class,
        } => (Fate::Park { tier, next_attempt }, class),
    };
    let verdict = Verdict {
        fate,
        class,
        attempt,
        why: why.into(),
    };
    (attempt, result.tries(), mover.apply(verdict).await)
}

/// Why a delivery's body is not handed to the job.
#[derive(Debug, PartialEq)]
enum Unread {
    /// A header or the body cannot be read: `attempt` is 1 when the attempt header itself is
    /// the problem.
    Malformed { attempt: u32, why: String },
    /// Well formed, but of a schema version newer than the job reads: a permanent failure.
    Refused { attempt: u32, failure: Failure },
}

/// The attempt and the decoded input, or why there is none.
fn read<J: ConsumerJob>(job: &J, delivery: &Delivery) -> Result<(u32, J::Input), Unread> {
    let properties = &delivery.amqp().properties;
    let message_type = message_type_of(delivery);
    let attempt = admit(properties.headers().as_ref(), message_type, |kind| {
        job.reads_version(kind)
    })?;
    let input = worker_core::decode(delivery.body()).map_err(|err| Unread::Malformed {
        attempt,
        why: format!("malformed: {err}"),
    })?;
    Ok((attempt, input))
}

/// The `type` property names the message (the outbox sets it); the routing key is the best
/// name left when a client did not.
fn message_type_of(delivery: &Delivery) -> &str {
    delivery
        .amqp()
        .properties
        .kind()
        .as_ref()
        .map_or(delivery.routing_key(), ShortString::as_str)
}

/// What the headers decide before the body is read: the attempt, unless a header is malformed
/// or the schema version is newer than `reads` says the job reads. The version is checked
/// before the body is decoded: a newer message may well decode, into something it does not
/// mean, and a newer one that does not decode must be named as newer, not as malformed.
fn admit(
    headers: Option<&FieldTable>,
    message_type: &str,
    reads: impl FnOnce(&str) -> u32,
) -> Result<u32, Unread> {
    let attempt = attempt_of(headers).map_err(|why| Unread::Malformed {
        attempt: 1,
        why: format!("malformed: {why}"),
    })?;
    let version = schema_version_of(headers).map_err(|why| Unread::Malformed {
        attempt,
        why: format!("malformed: {why}"),
    })?;
    worker_core::refuse_newer(message_type, version, reads(message_type))
        .map_err(|failure| Unread::Refused { attempt, failure })?;
    Ok(attempt)
}

/// The handler under the job's retry policy, each try under the per-try timeout, the waits
/// between tries within the in-process budget.
async fn handle<J: ConsumerJob>(
    shared: &Shared<J>,
    delivery: &Delivery,
    input: &J::Input,
    attempt: u32,
    handlers: &CancellationToken,
) -> RetryOutcome<worker_core::Handled> {
    let properties = &delivery.amqp().properties;
    let mut ctx = WorkContext::new(shared.job_name.clone(), handlers.clone()).with_attempt(attempt);
    if let Some(liveness) = shared.events.liveness() {
        ctx = ctx.with_liveness(liveness.clone());
    }
    if let Some(id) = properties.message_id() {
        ctx = ctx.with_message_id(id.as_str());
    }
    if let Some(id) = properties
        .correlation_id()
        .as_ref()
        .map(ShortString::as_str)
    {
        ctx = ctx.with_correlation_id(id);
    }
    let observer = TryForwarder {
        events: shared.events.as_ref(),
        queue: &shared.queue.name,
        message_id: ctx.message_id.as_deref(),
        attempt,
    };
    let job = &shared.job;
    #[cfg(feature = "fault-injection")]
    let fault = super::fault_injection::requested(properties.headers().as_ref());
    Retry::new(
        &shared.job_name,
        &shared.policy,
        shared.settings.timeout,
        handlers,
    )
    .wait_budget(shared.settings.in_process_wait)
    .observer(&observer)
    .run(&ctx, |ctx| async move {
        #[cfg(feature = "fault-injection")]
        if let Some(fault) = fault {
            super::fault_injection::inflict(fault);
        }
        job.handle(&ctx, input).await
    })
    .await
}

#[cfg(test)]
mod tests {
    use lapin::types::AMQPValue;
    use worker_core::FailureClass;

    use super::*;
    use crate::consumer::{ATTEMPT_HEADER, SCHEMA_VERSION_HEADER};

    fn headers(attempt: Option<i64>, version: Option<AMQPValue>) -> FieldTable {
        let mut h = FieldTable::default();
        if let Some(attempt) = attempt {
            h.insert(ATTEMPT_HEADER.into(), AMQPValue::LongLongInt(attempt));
        }
        if let Some(version) = version {
            h.insert(SCHEMA_VERSION_HEADER.into(), version);
        }
        h
    }

    #[test]
    fn a_newer_schema_version_is_refused_as_permanent_before_the_body_is_read() {
        let h = headers(Some(2), Some(AMQPValue::LongLongInt(3)));
        let Err(Unread::Refused { attempt, failure }) = admit(Some(&h), "email.send", |_| 1) else {
            panic!("not refused")
        };
        assert_eq!(attempt, 2);
        assert_eq!(failure.class(), FailureClass::Permanent);
        assert_eq!(
            failure.to_string(),
            "schema-too-new: email.send schema version 3 is newer than this release reads (up to 1)"
        );
    }

    #[test]
    fn a_known_or_missing_schema_version_is_read() {
        assert_eq!(
            admit(None, "email.send", |_| 1),
            Ok(1),
            "no header is version 1"
        );
        let h = headers(Some(4), Some(AMQPValue::LongInt(2)));
        assert_eq!(admit(Some(&h), "email.send", |_| 2), Ok(4));
        let mut asked = String::new();
        let h = headers(None, Some(AMQPValue::ShortShortUInt(1)));
        let read = admit(Some(&h), "email.received", |kind| {
            asked = kind.to_string();
            1
        });
        assert_eq!(read, Ok(1));
        assert_eq!(
            asked, "email.received",
            "the job is asked about the message's type"
        );
    }

    #[test]
    fn a_schema_version_that_is_not_a_positive_integer_is_malformed() {
        let h = headers(Some(2), Some(AMQPValue::LongString("3".into())));
        let Err(Unread::Malformed { attempt, why }) = admit(Some(&h), "email.send", |_| 1) else {
            panic!("not malformed")
        };
        assert_eq!(attempt, 2);
        assert!(why.contains(SCHEMA_VERSION_HEADER), "{why}");
    }
}
