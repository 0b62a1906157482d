//! The pipeline's one decision, pure: what a handler's outcome does to its delivery.

use worker_core::{FailureClass, Handled, RetryOutcome};

use crate::topology::{QueueTopology, tier_index_for_attempt};

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
    /// Settled with nothing to do, for this reason ([`Handled::Skipped`]).
    Skipped {
        reason: &'static str,
    },
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
    /// Put back at the end of its own queue, charged no attempt: a dependency it needs is
    /// out of service ([`worker_core::Failure::Unavailable`]).
    Returned,
    /// Returned to the queue: neither park nor dead letter could be published.
    Requeued,
    /// Returned to the queue: the handler was cancelled at the settle deadline.
    Abandoned,
}

impl Outcome {
    /// A stable name for logs and metrics.
    pub fn as_str(&self) -> &'static str {
        match self {
            Self::Succeeded => "succeeded",
            Self::Duplicate => "duplicate",
            Self::Skipped { .. } => "skipped",
            Self::Parked { .. } => "parked",
            Self::DeadLettered { reason, .. } => match reason {
                DeadReason::Malformed => "dead-lettered:malformed",
                DeadReason::Rejected => "dead-lettered:rejected",
                DeadReason::GaveUp => "dead-lettered:gave-up",
            },
            Self::Returned => "returned",
            Self::Requeued => "requeued",
            Self::Abandoned => "abandoned",
        }
    }
}

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
    /// Back to the end of its own queue, charged no attempt.
    Return,
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
        RetryOutcome::Succeeded {
            value: Handled::Skipped(reason),
            ..
        } => return Decision::Ack(Outcome::Skipped { reason }),
        RetryOutcome::Cancelled { .. } => return Decision::Requeue,
        RetryOutcome::Failed { failure, .. } => failure,
    };
    let class = failure.class();
    if failure.is_unavailable() {
        // Not tried, so not charged: its attempt stays as it was.
        return match failure.retry_after() {
            Some(wait) if !queue.tiers.is_empty() => Decision::Park {
                tier: tier_for_wait(queue, wait),
                next_attempt: attempt,
                class,
            },
            _ => Decision::Return,
        };
    }
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
        Some(wait) => tier_for_wait(queue, wait),
        None => tier_index_for_attempt(next_attempt, queue.tiers.len()).unwrap_or(0),
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

/// The first tier that waits at least `wait`, else the longest.
fn tier_for_wait(queue: &QueueTopology, wait: std::time::Duration) -> usize {
    queue
        .tiers
        .iter()
        .position(|t| t.delay >= wait)
        .unwrap_or(queue.tiers.len().saturating_sub(1))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use worker_core::Failure;

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

    fn failed(failure: Failure) -> RetryOutcome<Handled> {
        RetryOutcome::Failed { failure, tries: 3 }
    }

    #[test]
    fn a_skip_is_acked_with_its_reason() {
        let skipped = RetryOutcome::Succeeded {
            value: Handled::Skipped("reply-limit"),
            tries: 1,
        };
        let decision = decide(&skipped, 1, 5, &queue());
        assert_eq!(
            decision,
            Decision::Ack(Outcome::Skipped {
                reason: "reply-limit"
            })
        );
        assert_eq!(
            Outcome::Skipped {
                reason: "reply-limit"
            }
            .as_str(),
            "skipped"
        );
    }

    #[test]
    fn an_unavailable_dependency_charges_no_attempt() {
        let q = queue();
        let back = failed(Failure::unavailable("smtp-relay", "535 5.7.8", None));
        assert_eq!(
            decide(&back, 5, 5, &q),
            Decision::Return,
            "even at the last try"
        );
        let wait = failed(Failure::unavailable(
            "webhook:hooks.example",
            "connection refused",
            Some(Duration::from_secs(30)),
        ));
        assert_eq!(
            decide(&wait, 3, 5, &q),
            Decision::Park {
                tier: 1,
                next_attempt: 3,
                class: FailureClass::Unavailable
            }
        );
    }

    #[test]
    fn decisions_follow_the_pipeline() {
        let q = queue();
        let ok = RetryOutcome::Succeeded {
            value: Handled::Done,
            tries: 1,
        };
        assert_eq!(decide(&ok, 1, 5, &q), Decision::Ack(Outcome::Succeeded));
        let dup = RetryOutcome::Succeeded {
            value: Handled::Duplicate,
            tries: 1,
        };
        assert_eq!(decide(&dup, 1, 5, &q), Decision::Ack(Outcome::Duplicate));
        assert_eq!(
            decide(&RetryOutcome::Cancelled { tries: 1 }, 1, 5, &q),
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
}
