//! Failure classification: every error a job returns says, once, whether trying again can help.
//!
//! A job classifies its own errors where it understands them (an SMTP 4xx is transient, a 5xx
//! permanent) and returns a [`Failure`]. Everything downstream — the in-process retry, the
//! broker action (ack, park, dead-letter), the timer loop's log line — decides from
//! [`Failure::class`] alone and never inspects error types again.

use std::error::Error;
use std::fmt;
use std::time::Duration;

/// What kind of failure a unit of work ended with, and so what should happen next.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FailureClass {
    /// May succeed if tried again later: a dropped connection, a lock timeout, a deadline.
    Transient,
    /// Will fail the same way every time: retrying only wastes work. Dead-lettered with why.
    Permanent,
    /// The other side asked us to slow down; retry no sooner than it said.
    Throttled,
    /// The input itself cannot be read (bad header, body that does not decode).
    /// Dead-lettered at once; never retried.
    Malformed,
    /// A dependency the work needs is out of service (its circuit is open): the work was not
    /// tried, so it is charged no try; it waits in its queue, or parked without a try, until
    /// the dependency is back.
    Unavailable,
}

impl FailureClass {
    /// The stable, lower-case name used in logs, metrics and dead-letter headers.
    pub const fn as_str(&self) -> &'static str {
        match self {
            Self::Transient => "transient",
            Self::Permanent => "permanent",
            Self::Throttled => "throttled",
            Self::Malformed => "malformed",
            Self::Unavailable => "unavailable",
        }
    }

    /// Whether trying the same input again can succeed.
    pub const fn is_retryable(&self) -> bool {
        matches!(self, Self::Transient | Self::Throttled | Self::Unavailable)
    }
}

impl fmt::Display for FailureClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The error type of every job: a classified failure with a human-readable detail.
///
/// Build one with [`Failure::transient`], [`Failure::permanent`], [`Failure::throttled`] or,
/// from an error with causes, [`Failure::transient_from`].
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Failure {
    /// May succeed if tried again.
    #[error("{detail}")]
    Transient { detail: String },
    /// Will never succeed for this input. `reason` is short and machine-readable
    /// (e.g. `smtp-5xx`) and ends up in the dead-letter headers.
    #[error("{reason}: {detail}")]
    Permanent { reason: String, detail: String },
    /// The remote side is rate-limiting us; wait at least `retry_after` before the next try.
    #[error("throttled, retry after {}: {detail}", humantime::format_duration(*retry_after))]
    Throttled {
        retry_after: Duration,
        detail: String,
    },
    /// The effect left the host and its outcome is unknown (an SMTP send that timed out after
    /// the final "." of DATA): the other side may have acted. Transient in class, so the
    /// message is parked for a later attempt, but never tried again in process, where a
    /// second try would most likely double the effect.
    #[error("outcome unknown: {detail}")]
    Unknown { detail: String },
    /// `dependency` is out of service: its circuit is open, or this failure opened it. The
    /// work was not done and is charged no try: the runner returns its message to its queue
    /// (`retry_after` none: the consumer stops while the circuit is open) or parks it for
    /// `retry_after` without counting an attempt. Never tried again in process.
    #[error("{dependency} is unavailable: {detail}")]
    Unavailable {
        dependency: String,
        detail: String,
        retry_after: Option<Duration>,
    },
}

impl Failure {
    /// A failure that may go away if the work is tried again.
    pub fn transient(detail: impl fmt::Display) -> Self {
        Self::Transient {
            detail: detail.to_string(),
        }
    }

    /// The effect's outcome cannot be known (see [`Failure::Unknown`]): parked, never retried
    /// in process.
    pub fn unknown(detail: impl fmt::Display) -> Self {
        Self::Unknown {
            detail: detail.to_string(),
        }
    }

    /// A failure that will not go away: `reason` is a short machine-readable tag
    /// (`smtp-5xx`, `constraint-violation`), `detail` the human-readable rest.
    pub fn permanent(reason: impl Into<String>, detail: impl fmt::Display) -> Self {
        Self::Permanent {
            reason: reason.into(),
            detail: detail.to_string(),
        }
    }

    /// The other side asked us to wait at least `retry_after` before trying again.
    pub fn throttled(retry_after: Duration, detail: impl fmt::Display) -> Self {
        Self::Throttled {
            retry_after,
            detail: detail.to_string(),
        }
    }

    /// `dependency` is out of service (see [`Failure::Unavailable`]): the message goes back to
    /// its queue uncharged, or waits `retry_after` uncharged.
    pub fn unavailable(
        dependency: impl Into<String>,
        detail: impl fmt::Display,
        retry_after: Option<Duration>,
    ) -> Self {
        Self::Unavailable {
            dependency: dependency.into(),
            detail: detail.to_string(),
            retry_after,
        }
    }

    /// A transient failure whose detail is `err` with its whole `source()` chain
    /// (see [`error_chain`]).
    pub fn transient_from(err: &(dyn Error + 'static)) -> Self {
        Self::Transient {
            detail: error_chain(err),
        }
    }

    /// The class that decides what happens next.
    pub fn class(&self) -> FailureClass {
        match self {
            Self::Transient { .. } | Self::Unknown { .. } => FailureClass::Transient,
            Self::Permanent { .. } => FailureClass::Permanent,
            Self::Throttled { .. } => FailureClass::Throttled,
            Self::Unavailable { .. } => FailureClass::Unavailable,
        }
    }

    /// Whether this failure must not be retried.
    pub fn is_permanent(&self) -> bool {
        matches!(self, Self::Permanent { .. })
    }

    /// Whether another try in the same process may follow: not for a permanent failure, nor
    /// for an unknown outcome (see [`Failure::Unknown`]).
    pub fn retries_in_process(&self) -> bool {
        !matches!(
            self,
            Self::Permanent { .. } | Self::Unknown { .. } | Self::Unavailable { .. }
        )
    }

    /// Whether the work was not tried because a dependency is out of service (see
    /// [`Failure::Unavailable`]): no attempt is charged for it.
    pub fn is_unavailable(&self) -> bool {
        matches!(self, Self::Unavailable { .. })
    }

    /// Whether the effect's outcome is unknown (see [`Failure::Unknown`]).
    pub fn is_unknown(&self) -> bool {
        matches!(self, Self::Unknown { .. })
    }

    /// The least time to wait before the next try, when the failure says so.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            Self::Throttled { retry_after, .. } => Some(*retry_after),
            Self::Unavailable { retry_after, .. } => *retry_after,
            Self::Transient { .. } | Self::Permanent { .. } | Self::Unknown { .. } => None,
        }
    }

    /// The human-readable detail, without the reason or class.
    pub fn detail(&self) -> &str {
        match self {
            Self::Transient { detail }
            | Self::Unknown { detail }
            | Self::Permanent { detail, .. }
            | Self::Throttled { detail, .. }
            | Self::Unavailable { detail, .. } => detail,
        }
    }

    /// A short machine-readable reason: the permanent failure's own reason, otherwise the
    /// class name (`transient`, `throttled`).
    pub fn reason(&self) -> &str {
        match self {
            Self::Permanent { reason, .. } => reason,
            Self::Unknown { .. } => "unknown-outcome",
            Self::Transient { .. } | Self::Throttled { .. } | Self::Unavailable { .. } => {
                self.class().as_str()
            }
        }
    }

    /// The same failure with `context` put in front of its detail (`"{context}: {detail}"`).
    #[must_use]
    pub fn context(mut self, context: impl fmt::Display) -> Self {
        let detail = match &mut self {
            Self::Transient { detail }
            | Self::Unknown { detail }
            | Self::Permanent { detail, .. }
            | Self::Throttled { detail, .. }
            | Self::Unavailable { detail, .. } => detail,
        };
        *detail = format!("{context}: {detail}");
        self
    }
}

/// Renders an error and its whole `source()` chain as `"outer: cause: root"`.
///
/// A cause whose message the previous link already ends with (a wrapper that prints its
/// source itself) is not repeated, and empty messages are left out.
pub fn error_chain(err: &(dyn Error + 'static)) -> String {
    let mut out = err.to_string();
    let mut previous = out.clone();
    let mut next = err.source();
    while let Some(cause) = next {
        let message = cause.to_string();
        if !message.is_empty() && !previous.ends_with(&message) {
            if !out.is_empty() {
                out.push_str(": ");
            }
            out.push_str(&message);
        }
        previous = message;
        next = cause.source();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("{message}")]
    struct Layer {
        message: &'static str,
        #[source]
        source: Option<Box<Layer>>,
    }

    fn layer(message: &'static str, source: Option<Layer>) -> Layer {
        Layer {
            message,
            source: source.map(Box::new),
        }
    }

    #[test]
    fn class_names_are_stable() {
        let names: Vec<_> = [
            FailureClass::Transient,
            FailureClass::Permanent,
            FailureClass::Throttled,
            FailureClass::Malformed,
            FailureClass::Unavailable,
        ]
        .iter()
        .map(|c| (c.as_str(), c.to_string()))
        .collect();
        assert_eq!(
            names,
            [
                ("transient", "transient".to_string()),
                ("permanent", "permanent".to_string()),
                ("throttled", "throttled".to_string()),
                ("malformed", "malformed".to_string()),
                ("unavailable", "unavailable".to_string()),
            ]
        );
        assert!(FailureClass::Transient.is_retryable());
        assert!(FailureClass::Throttled.is_retryable());
        assert!(!FailureClass::Permanent.is_retryable());
        assert!(!FailureClass::Malformed.is_retryable());
    }

    #[test]
    fn constructors_classify_and_display() {
        let t = Failure::transient("connection reset");
        assert_eq!(t.class(), FailureClass::Transient);
        assert_eq!(t.to_string(), "connection reset");
        assert_eq!(t.detail(), "connection reset");
        assert_eq!(t.reason(), "transient");
        assert!(!t.is_permanent());
        assert_eq!(t.retry_after(), None);

        let p = Failure::permanent("smtp-5xx", "550 mailbox unavailable");
        assert_eq!(p.class(), FailureClass::Permanent);
        assert_eq!(p.to_string(), "smtp-5xx: 550 mailbox unavailable");
        assert_eq!(p.detail(), "550 mailbox unavailable");
        assert_eq!(p.reason(), "smtp-5xx");
        assert!(p.is_permanent());
        assert_eq!(p.retry_after(), None);

        let th = Failure::throttled(Duration::from_secs(5), "429 too many requests");
        assert_eq!(th.class(), FailureClass::Throttled);
        assert_eq!(
            th.to_string(),
            "throttled, retry after 5s: 429 too many requests"
        );
        assert_eq!(th.detail(), "429 too many requests");
        assert_eq!(th.reason(), "throttled");
        assert!(!th.is_permanent());
        assert_eq!(th.retry_after(), Some(Duration::from_secs(5)));
    }

    #[test]
    fn context_prefixes_the_detail_and_keeps_the_class() {
        let p = Failure::permanent("smtp-5xx", "550").context("sending to a@b");
        assert_eq!(p, Failure::permanent("smtp-5xx", "sending to a@b: 550"));
        let th = Failure::throttled(Duration::from_millis(1500), "slow down").context("webhook");
        assert_eq!(th.retry_after(), Some(Duration::from_millis(1500)));
        assert_eq!(th.detail(), "webhook: slow down");
    }

    #[test]
    fn error_chain_joins_every_cause() {
        let err = layer(
            "sending mail",
            Some(layer(
                "connecting to smtp",
                Some(layer("connection refused", None)),
            )),
        );
        assert_eq!(
            error_chain(&err),
            "sending mail: connecting to smtp: connection refused"
        );
        assert_eq!(
            Failure::transient_from(&err),
            Failure::transient("sending mail: connecting to smtp: connection refused")
        );
        // transient(err) only takes the outer message; transient_from takes the chain.
        assert_eq!(Failure::transient(&err).detail(), "sending mail");
    }

    #[test]
    fn error_chain_does_not_repeat_a_cause_the_wrapper_already_printed() {
        let err = layer("query failed: timeout", Some(layer("timeout", None)));
        assert_eq!(error_chain(&err), "query failed: timeout");
        let io = std::io::Error::other("disk full");
        assert_eq!(error_chain(&io), "disk full");
    }

    #[test]
    fn error_chain_skips_empty_messages() {
        let err = layer("outer", Some(layer("", Some(layer("root", None)))));
        assert_eq!(error_chain(&err), "outer: root");
    }
}
