//! The consumer pipeline: the recoverability pipeline, applied to every delivery of a queue,
//! on the one consume loop ([`ConsumeLoop`]) that the dead-letter archiver runs on too.
//!
//! For each delivery:
//!
//! 1. read `x-attempt` (missing: 1; any AMQP integer type; a string, a float, zero or a
//!    negative number is malformed), then `x-schema-version` (read the same way; missing: 1)
//!    and decode the body into the job's input (a failure is malformed). Malformed → dead
//!    letter at once, reason `malformed`. A version newer than the job reads
//!    ([`ConsumerJob::reads_version`](worker_core::ConsumerJob::reads_version)) is refused
//!    before the body is decoded: dead letter at once, reason `rejected`, class `permanent`,
//!    its error `schema-too-new: email.send schema version 3 is newer than this release reads
//!    (up to 1)`;
//! 2. run the handler under the job's [`RetryPolicy`](worker_core::RetryPolicy), each try
//!    under the per-try timeout;
//! 3. settle by the outcome ([`decide()`], a pure function): success or duplicate → ack;
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
//! started too, acking them as they complete, until they are all done or the settle deadline
//! ([`ConsumerSettings::settle_deadline`], shorter than the host's grace) comes. Only then does
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
//! tracked, and shutdown waits for them within the same settle deadline.
//!
//! A park or dead letter whose confirm is lost with the channel cannot be known to have
//! reached its queue, and the delivery cannot be acked on a dead channel: the broker requeues
//! it, and the message may then exist twice (the requeued delivery, and the parked copy one
//! attempt further). The runner keeps both rather than guess: dropping either could lose the
//! message. Both copies carry the same message id and body, so a guarded job answers whichever
//! comes second, after the other succeeded, as a duplicate: the guard's mark commits with the
//!
//! One file a concern: `settings` ([`ConsumerSettings`]), `headers` (their names, and
//! [`attempt_of`]), `decide` (the pure [`decide()`]), `dead_letter` (parking and
//! dead-lettering, each described by one verdict), `acks` (the coalescing ack book),
//! `events` ([`ConsumerEvents`]), `gate` ([`Gate`], an operator's pause), `runner` ([`ConsumerRunner`], the pipeline per delivery),
//! `session` ([`ConsumeLoop`], the consume loop), `pump` (one session of it: take, hand
//! out, settle, stop) and `handlers` (the handler tasks, their [`Scope`], and the wait for
//! them on shutdown).

mod acks;
mod dead_letter;
mod decide;
mod events;
mod gate;
mod handlers;
mod headers;
mod pump;
mod runner;
mod session;
mod settings;

pub use acks::Settle;
pub use decide::{DeadReason, Decision, Outcome, decide};
pub use events::{ConsumerEvents, DeliveryReport, NoEvents};
pub use gate::Gate;
pub use handlers::{CANCEL_WAIT, Scope};
pub use headers::{
    ATTEMPT_HEADER, DEAD_AT_HEADER, DEAD_ATTEMPTS_HEADER, DEAD_CLASS_HEADER, DEAD_ERROR_HEADER,
    DEAD_ERROR_MAX, DEAD_QUEUE_HEADER, DEAD_REASON_HEADER, SCHEMA_VERSION_HEADER, attempt_of,
    schema_version_of,
};
pub use pump::SessionEnd;
pub use runner::ConsumerRunner;
pub use session::ConsumeLoop;
pub use settings::{BROKER_CONSUMER_TIMEOUT, ConsumeSettings, ConsumerSettings};

/// Test builds only (`--features fault-injection`): a delivery carrying the header
/// `x-fault-inject` asks its handler for a fault inside its unit of work, on every try, so that
/// the fault suite and the host's tests can check what the host does with it:
/// - `panic`: the handler panics; the panic is retried by the queue's tiers and then
///   dead-lettered with its message, without a crash;
/// - `wedge`: the handler blocks its thread for an hour, out of its timeout's reach, so the
///   host's watchdog must see the unit overdue and stop feeding systemd's watchdog.
///
/// The shipped binary is built without the feature and has no such hook.
#[cfg(feature = "fault-injection")]
pub mod fault_injection {
    use lapin::types::{AMQPValue, FieldTable};

    /// The header that asks for a fault.
    pub const HEADER: &str = "x-fault-inject";
    /// The message the injected panic carries (it ends up in the dead letter's error).
    pub const PANIC_MESSAGE: &str = "fault injection: x-fault-inject: panic";
    /// How long a wedged handler blocks its thread.
    pub const WEDGE: std::time::Duration = std::time::Duration::from_secs(3600);

    /// The faults a delivery can ask for.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub enum Fault {
        Panic,
        Wedge,
    }

    /// The fault the delivery's headers ask for (`x-fault-inject` = `panic` or `wedge`, as a
    /// long or short string), if any.
    pub fn requested(headers: Option<&FieldTable>) -> Option<Fault> {
        let value: &[u8] = match headers.and_then(|h| h.inner().get(HEADER)) {
            Some(AMQPValue::LongString(value)) => value.as_bytes(),
            Some(AMQPValue::ShortString(value)) => value.as_str().as_bytes(),
            _ => return None,
        };
        match value {
            b"panic" => Some(Fault::Panic),
            b"wedge" => Some(Fault::Wedge),
            _ => None,
        }
    }

    /// Does what `fault` asks: panics with [`PANIC_MESSAGE`], or blocks the thread for
    /// [`WEDGE`].
    #[allow(clippy::panic)]
    pub fn inflict(fault: Fault) {
        match fault {
            Fault::Panic => panic!("{PANIC_MESSAGE}"),
            Fault::Wedge => {
                tracing::error!("fault injection: x-fault-inject: wedge; blocking this thread");
                std::thread::sleep(WEDGE);
            }
        }
    }

    #[cfg(test)]
    mod tests {
        use lapin::types::{AMQPValue, FieldTable, LongString};

        #[test]
        fn only_the_header_naming_a_fault_asks_for_one() {
            let mut headers = FieldTable::default();
            assert_eq!(super::requested(None), None);
            assert_eq!(super::requested(Some(&headers)), None);
            headers.insert(
                super::HEADER.into(),
                AMQPValue::LongString(LongString::from("later")),
            );
            assert_eq!(super::requested(Some(&headers)), None);
            headers.insert(
                super::HEADER.into(),
                AMQPValue::LongString(LongString::from("panic")),
            );
            assert_eq!(super::requested(Some(&headers)), Some(super::Fault::Panic));
            headers.insert(
                super::HEADER.into(),
                AMQPValue::LongString(LongString::from("wedge")),
            );
            assert_eq!(super::requested(Some(&headers)), Some(super::Fault::Wedge));
        }
    }
}
