//! The SMTP relay as a dependency with a circuit (`worker_store::circuits`): which failed
//! sends are the relay's own ([`fault_of`]), the handler's check before a claim, and the
//! probe that a host runs while the circuit is open ([`RelayProbe`]).
//!
//! While the relay's circuit is open the host stops this job's consumers on every replica,
//! as a pause does; a reply the consumer still held when it opened goes back to its queue
//! without a try counted (`Failure::Unavailable`, no wait), and the probe is a sign-in on a
//! fresh connection, never a mail.

use std::sync::Arc;

use worker_core::circuit::Fault;

use crate::error::SendError;
use crate::smtp::SmtpPool;

/// The relay's name among the dependencies (metrics, `/status`, the console).
pub const RELAY: &str = "smtp-relay";

/// Whether a failed send is the relay's own failure, and how it counts (see
/// `worker_core::circuit`): no connection, a TLS failure or a 421 count; a refused login
/// (535, 534, 530, 454), a token the provider will not issue and a certificate that does not
/// verify open the circuit at once. A refusal of one recipient, of one mail's content, a
/// timeout after the connection stood, and an unknown outcome are the mail's.
pub fn fault_of(err: &SendError) -> Option<Fault> {
    match err {
        SendError::Connection(_) => Some(Fault::Counted),
        SendError::Certificate(_) | SendError::Auth(_) => Some(Fault::AtOnce),
        SendError::Token(token) if token.is_permanent() => Some(Fault::AtOnce),
        SendError::Token(_) => Some(Fault::Counted),
        SendError::Smtp(smtp) => match smtp.status().map(u16::from) {
            Some(535 | 534 | 530 | 454) => Some(Fault::AtOnce),
            Some(421) => Some(Fault::Counted),
            Some(_) => None,
            None if smtp.is_tls() || smtp.is_timeout() => Some(Fault::Counted),
            None if smtp.is_client() || smtp.is_response() => None,
            // A connection or network error, or the transport gone.
            None => Some(Fault::Counted),
        },
        SendError::TimedOut(_) | SendError::Client(_) | SendError::AnswerLost(_) => None,
    }
}

/// The relay's probe: a sign-in on a fresh connection, quit at once.
#[derive(Clone)]
pub struct RelayProbe {
    pub(crate) pool: Arc<SmtpPool>,
}

impl std::fmt::Debug for RelayProbe {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RelayProbe").finish_non_exhaustive()
    }
}

impl RelayProbe {
    /// Signs in to the relay: the relay's answer when it refused.
    pub async fn probe(&self) -> Result<(), String> {
        let (mut connection, _) = self.pool.connect().await.map_err(|e| e.to_string())?;
        connection.quit().await.ok();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_connection_counts_and_a_timeout_after_it_stood_does_not() {
        assert_eq!(
            fault_of(&SendError::Connection("refused".into())),
            Some(Fault::Counted)
        );
        assert_eq!(
            fault_of(&SendError::TimedOut(std::time::Duration::from_secs(1))),
            None
        );
        assert_eq!(fault_of(&SendError::AnswerLost("lost".into())), None);
    }

    #[test]
    fn a_refused_sign_in_or_certificate_opens_at_once() {
        assert_eq!(
            fault_of(&SendError::Auth("535 5.7.8".into())),
            Some(Fault::AtOnce)
        );
        assert_eq!(
            fault_of(&SendError::Certificate("unknown issuer".into())),
            Some(Fault::AtOnce)
        );
    }
}
