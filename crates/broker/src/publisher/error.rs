//! [`PublishError`]: why a publish did not succeed, and its one classification.

use std::time::Duration;

use lapin::protocol::{AMQPErrorKind, AMQPSoftError};
use worker_core::Failure;

use super::outgoing::Outgoing;

/// Why a publish did not succeed.
#[derive(Debug, Clone, thiserror::Error)]
pub enum PublishError {
    #[error("not connected to RabbitMQ (waited {})", humantime::format_duration(*waited))]
    NotConnected { waited: Duration },

    #[error("the connection or channel was lost while publishing to '{exchange}': {detail}")]
    Lost { exchange: String, detail: String },

    #[error("no confirm from RabbitMQ within {} for the publish to '{exchange}'", humantime::format_duration(*after))]
    ConfirmTimeout { exchange: String, after: Duration },

    #[error("RabbitMQ refused the publish to '{exchange}' ({code}): {detail}")]
    Refused {
        exchange: String,
        code: String,
        detail: String,
    },

    #[error(
        "unroutable: no queue is bound to exchange '{exchange}' for routing key '{routing_key}'"
    )]
    Unroutable {
        exchange: String,
        routing_key: String,
    },

    #[error(
        "RabbitMQ nacked the publish to '{exchange}' (routing key '{routing_key}'): a queue refused it"
    )]
    Nacked {
        exchange: String,
        routing_key: String,
    },

    #[error("cannot publish to '{exchange}': {detail}")]
    Invalid { exchange: String, detail: String },
}

impl PublishError {
    /// Transient: the link, a timeout or a nack (`reject-publish` on a full queue), which may
    /// clear. Permanent: nothing routes the message, the broker refuses the exchange or the
    /// permission, or the message itself cannot be sent; trying again changes nothing until
    /// an operator acts.
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            Self::NotConnected { .. }
                | Self::Lost { .. }
                | Self::ConfirmTimeout { .. }
                | Self::Nacked { .. }
        )
    }

    /// The failure this error is, classified once.
    pub fn to_failure(&self) -> Failure {
        match self {
            Self::NotConnected { .. }
            | Self::Lost { .. }
            | Self::ConfirmTimeout { .. }
            | Self::Nacked { .. } => Failure::transient(self),
            Self::Refused { .. } => Failure::permanent("publish-refused", self),
            Self::Unroutable { .. } => Failure::permanent("unroutable", self),
            Self::Invalid { .. } => Failure::permanent("publish-invalid", self),
        }
    }
}

impl From<PublishError> for Failure {
    fn from(err: PublishError) -> Self {
        err.to_failure()
    }
}

pub(super) fn lost(message: &Outgoing, detail: &str) -> PublishError {
    PublishError::Lost {
        exchange: message.exchange.clone(),
        detail: detail.to_string(),
    }
}

pub(super) fn classify_lapin(message: &Outgoing, err: &lapin::Error) -> PublishError {
    if let lapin::ErrorKind::ProtocolError(e) = err.kind()
        && let AMQPErrorKind::Soft(soft) = e.kind()
        && matches!(
            soft,
            AMQPSoftError::NOTFOUND
                | AMQPSoftError::ACCESSREFUSED
                | AMQPSoftError::PRECONDITIONFAILED
        )
    {
        return PublishError::Refused {
            exchange: message.exchange.clone(),
            code: format!("{soft:?}"),
            detail: e.get_message().to_string(),
        };
    }
    lost(message, &worker_core::error_chain(err))
}

#[cfg(test)]
mod tests {
    use worker_core::FailureClass;

    use super::*;
    #[test]
    fn errors_are_classified_once() {
        let unroutable = PublishError::Unroutable {
            exchange: "commands".into(),
            routing_key: "nowhere".into(),
        };
        assert_eq!(unroutable.to_failure().class(), FailureClass::Permanent);
        assert_eq!(unroutable.to_failure().reason(), "unroutable");
        assert!(unroutable.to_string().contains("'nowhere'"));
        let lost = PublishError::Lost {
            exchange: "x".into(),
            detail: "reset".into(),
        };
        assert_eq!(Failure::from(lost).class(), FailureClass::Transient);
        let timeout = PublishError::ConfirmTimeout {
            exchange: "x".into(),
            after: Duration::from_secs(1),
        };
        assert!(timeout.is_transient());
        let nack = PublishError::Nacked {
            exchange: "x".into(),
            routing_key: "k".into(),
        };
        assert!(nack.is_transient());
        let refused = PublishError::Refused {
            exchange: "x".into(),
            code: "NOTFOUND".into(),
            detail: "no exchange".into(),
        };
        assert!(!refused.is_transient());
    }
}
