//! Parking and dead-lettering: a failed delivery's copy, published to a retry tier or to the
//! dead exchange, and acked only once that publish is confirmed.
//!
//! A copy keeps the body, routing key, content type, message id, correlation id, type,
//! timestamp and every application header (trace context included). `expiration` would
//! expire a parked copy early or a dead letter at all, and `user-id` must match the
//! publishing connection's user, so both go; the broker's `x-delivery-count` is its own
//! per-delivery bookkeeping and goes too.

use std::borrow::Cow;

use chrono::SecondsFormat;
use lapin::message::Delivery;
use worker_core::FailureClass;

use super::{
    ATTEMPT_HEADER, DEAD_AT_HEADER, DEAD_ATTEMPTS_HEADER, DEAD_CLASS_HEADER, DEAD_ERROR_HEADER,
    DEAD_ERROR_MAX, DEAD_QUEUE_HEADER, DEAD_REASON_HEADER, DeadReason, Outcome,
};
use crate::message::{HeaderValue, PERSISTENT, Properties};
use crate::publisher::{Outgoing, Publisher};
use crate::topology::{ORIGINAL_ROUTING_KEY_HEADER, QueueTopology, RetryTier};

/// Where a failed delivery goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Fate {
    /// Into tier `tier` (an index into the queue's tiers), to come back as `next_attempt`.
    Park {
        tier: usize,
        next_attempt: u32,
    },
    /// Back to the end of its own queue, with its attempt as it was.
    Return,
    Dead(DeadReason),
}

/// What is parked or dead-lettered, and why: the failure's class, the attempt the delivery
/// had, and the error that a dead letter carries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Verdict<'a> {
    pub fate: Fate,
    pub class: FailureClass,
    pub attempt: u32,
    pub why: Cow<'a, str>,
}

impl<'a> Verdict<'a> {
    /// A dead letter `malformed`: the delivery never reached its handler.
    pub fn malformed(attempt: u32, why: String) -> Self {
        Self {
            fate: Fate::Dead(DeadReason::Malformed),
            class: FailureClass::Malformed,
            attempt,
            why: Cow::Owned(why),
        }
    }

    /// A delivery refused before it was handled (a schema version newer than the job reads):
    /// dead-lettered `rejected` with the failure's class and text, never retried.
    pub fn refused(attempt: u32, failure: &worker_core::Failure) -> Self {
        Self {
            fate: Fate::Dead(DeadReason::Rejected),
            class: failure.class(),
            attempt,
            why: Cow::Owned(failure.to_string()),
        }
    }

    /// The same failure, dead-lettered `gave-up` instead, with why.
    fn gave_up(self, why: String) -> Self {
        Self {
            fate: Fate::Dead(DeadReason::GaveUp),
            why: Cow::Owned(why),
            ..self
        }
    }
}

/// Carries out verdicts on one delivery of `queue`, through a confirmed publisher.
pub(crate) struct Mover<'a> {
    pub queue: &'a QueueTopology,
    pub delivery: &'a Delivery,
    pub publisher: &'a Publisher,
}

impl Mover<'_> {
    /// Parks or dead-letters the delivery. A park that cannot be published falls back to a
    /// dead letter; a dead letter that cannot be published returns the delivery to the queue
    /// ([`Outcome::Requeued`]), whose delivery limit then dead-letters it.
    pub async fn apply(&self, verdict: Verdict<'_>) -> Outcome {
        match verdict.fate {
            Fate::Park { tier, next_attempt } => match self.queue.tiers.get(tier) {
                Some(tier) => self.park(tier, next_attempt, verdict).await,
                None => self.dead_letter(DeadReason::GaveUp, &verdict).await,
            },
            Fate::Return => self.put_back(&verdict).await,
            Fate::Dead(reason) => self.dead_letter(reason, &verdict).await,
        }
    }

    /// Publishes a copy to the end of the queue, attempt unchanged, and acks the delivery once
    /// it is confirmed. A copy that cannot be published returns the delivery itself, which
    /// counts against the delivery limit, but only when the broker cannot take a publish.
    async fn put_back(&self, verdict: &Verdict<'_>) -> Outcome {
        let mut properties = copied_properties(self.delivery);
        properties.headers.insert(
            ATTEMPT_HEADER,
            HeaderValue::I64(i64::from(verdict.attempt.max(1))),
        );
        if !properties.headers.contains_key(ORIGINAL_ROUTING_KEY_HEADER) {
            properties.headers.insert(
                ORIGINAL_ROUTING_KEY_HEADER,
                HeaderValue::text(self.delivery.routing_key.as_str()),
            );
        }
        let message = Outgoing {
            exchange: String::new(),
            routing_key: self.queue.name.clone(),
            body: self.delivery.data.clone(),
            properties,
        };
        match self.publisher.publish(&message).await {
            Ok(()) => {
                tracing::info!(queue = %self.queue.name, attempt = verdict.attempt, error = %verdict.why, "returned to its queue, charged no attempt");
                Outcome::Returned
            }
            Err(err) => {
                tracing::warn!(queue = %self.queue.name, error = %err, "returning a copy to the queue failed; returning the delivery itself");
                Outcome::Requeued
            }
        }
    }

    async fn park(&self, tier: &RetryTier, next_attempt: u32, verdict: Verdict<'_>) -> Outcome {
        let message = self.parked_copy(tier, next_attempt);
        let class = verdict.class;
        match self.publisher.publish(&message).await {
            Ok(()) => {
                tracing::info!(tier = %tier.queue, next_attempt, class = class.as_str(), error = %verdict.why, "parked for a later attempt");
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
                    "parking in {} failed ({err}); last error: {}",
                    tier.queue, verdict.why
                );
                self.dead_letter(DeadReason::GaveUp, &verdict.gave_up(why))
                    .await
            }
        }
    }

    async fn dead_letter(&self, reason: DeadReason, verdict: &Verdict<'_>) -> Outcome {
        let message = self.dead_copy(reason, verdict);
        match self.publisher.publish(&message).await {
            Ok(()) => Outcome::DeadLettered {
                reason,
                class: verdict.class,
            },
            Err(err) => {
                tracing::error!(
                    dead_exchange = %self.queue.dead_exchange,
                    error = %err,
                    "dead-lettering failed; returning the delivery to the queue, whose delivery limit will dead-letter it"
                );
                Outcome::Requeued
            }
        }
    }

    /// Through the default exchange to the tier's queue, so the original routing key travels
    /// in `x-original-routing-key`.
    fn parked_copy(&self, tier: &RetryTier, next_attempt: u32) -> Outgoing {
        let mut properties = copied_properties(self.delivery);
        let headers = &mut properties.headers;
        headers.insert(ATTEMPT_HEADER, HeaderValue::I64(i64::from(next_attempt)));
        if !headers.contains_key(ORIGINAL_ROUTING_KEY_HEADER) {
            headers.insert(
                ORIGINAL_ROUTING_KEY_HEADER,
                HeaderValue::text(self.delivery.routing_key.as_str()),
            );
        }
        Outgoing {
            exchange: String::new(),
            routing_key: tier.queue.clone(),
            body: self.delivery.data.clone(),
            properties,
        }
    }

    /// To the dead exchange under the original routing key, with the `x-dead-*` headers and
    /// without `x-attempt`.
    fn dead_copy(&self, reason: DeadReason, verdict: &Verdict<'_>) -> Outgoing {
        let mut properties = copied_properties(self.delivery);
        let headers = &mut properties.headers;
        headers.remove(ATTEMPT_HEADER);
        headers.insert(DEAD_REASON_HEADER, reason.as_str());
        headers.insert(
            DEAD_ATTEMPTS_HEADER,
            HeaderValue::I64(i64::from(verdict.attempt)),
        );
        headers.insert(
            DEAD_ERROR_HEADER,
            worker_core::truncate(&verdict.why, DEAD_ERROR_MAX),
        );
        headers.insert(DEAD_CLASS_HEADER, verdict.class.as_str());
        headers.insert(DEAD_QUEUE_HEADER, self.queue.name.as_str());
        headers.insert(
            DEAD_AT_HEADER,
            chrono::Utc::now().to_rfc3339_opts(SecondsFormat::Millis, true),
        );
        let routing_key = match headers.get(ORIGINAL_ROUTING_KEY_HEADER) {
            Some(HeaderValue::LongString(s)) => String::from_utf8_lossy(s).into_owned(),
            _ => self.delivery.routing_key.to_string(),
        };
        Outgoing {
            exchange: self.queue.dead_exchange.clone(),
            routing_key,
            body: self.delivery.data.clone(),
            properties,
        }
    }
}

/// The properties and headers a copy keeps (see the module docs).
fn copied_properties(delivery: &Delivery) -> Properties {
    let mut properties = Properties::from(&delivery.properties);
    properties.delivery_mode = Some(PERSISTENT);
    properties.expiration = None;
    properties.user_id = None;
    properties.headers.remove("x-delivery-count");
    properties
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_park_becomes_a_dead_letter_that_gave_up() {
        let verdict = Verdict {
            fate: Fate::Park {
                tier: 1,
                next_attempt: 3,
            },
            class: FailureClass::Transient,
            attempt: 2,
            why: "reset".into(),
        };
        let dead = verdict.gave_up("parking failed".into());
        assert_eq!(dead.fate, Fate::Dead(DeadReason::GaveUp));
        assert_eq!((dead.attempt, dead.class), (2, FailureClass::Transient));
        assert_eq!(dead.why, "parking failed");
    }
}
