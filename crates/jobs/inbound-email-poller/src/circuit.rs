//! Each IMAP account as a dependency with a circuit (`worker_store::circuits`), named
//! `imap:<account name>`: which failures are the account's own ([`fault_of`]), and the one
//! way the tick and the IDLE sessions connect to an account (`connect`), which asks its
//! circuit first and tells it how the sign-in went.
//!
//! What the circuit watches is reaching the account and signing in: a refused or timed out
//! connection, a failed TLS handshake or greeting count toward opening it; a refused login
//! (a `NO` or `BAD` to LOGIN or AUTHENTICATE that does not say it is temporary), a token the
//! provider will not issue, a certificate that does not verify and a refused STARTTLS open it
//! at once, since the same settings cannot succeed. What happens after the sign-in (a mailbox
//! that cannot be selected, a message that does not fetch) is the tick's, never the circuit's.
//!
//! While an account's circuit is open, the tick skips it (its report says so, and no poll or
//! failure is counted for it) and its IDLE session waits for the probe instead of
//! reconnecting. After the cool-down the next tick's sign-in (or the IDLE session's) is the
//! probe: its success closes the circuit on every replica.

use std::time::Duration;

use async_imap::error::Error as ImapProtoError;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use worker_core::circuit::Fault;
use worker_store::circuits::{Admission, Circuits};

use crate::auth::{self, Access, SignedIn};
use crate::imap::{ImapError, Stage, classify_imap};
use crate::{ImapAccount, InboundEmailPoller};

/// The account's name among the dependencies (`/status`, the console, metrics).
pub fn dependency(account: &ImapAccount) -> String {
    format!("imap:{}", account.name)
}

/// An account skipped because its circuit is open.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CircuitOpen {
    /// Why it opened, in the server's words.
    pub reason: String,
    /// The time until its next probe.
    pub probe_in: Duration,
}

/// Whether a failed sign-in is the account's own failure, and how it counts (see the module
/// docs); `None` for failures after the sign-in, and for what the server refused as our
/// mistake (a password we could not send).
pub fn fault_of(err: &ImapError) -> Option<Fault> {
    match err {
        ImapError::Timeout { stage, .. } => signing_in(*stage).then_some(Fault::Counted),
        ImapError::Token(token) if token.is_permanent() => Some(Fault::AtOnce),
        ImapError::Token(_) => Some(Fault::Counted),
        // A server name that is no TLS name: the settings, which cannot succeed as they are.
        ImapError::Protocol {
            stage: Stage::Tls, ..
        } => Some(Fault::AtOnce),
        ImapError::Protocol { .. } => None,
        ImapError::Handshake { .. } | ImapError::Io { .. } | ImapError::Imap { .. }
            if !signing_in(err.stage()) =>
        {
            None
        }
        ImapError::Imap {
            source: ImapProtoError::Validate(_),
            ..
        } => None,
        // Classified permanent: a refused login or STARTTLS, a certificate that does not
        // verify. Trying again with the same settings cannot succeed.
        _ if classify_imap(err).is_permanent() => Some(Fault::AtOnce),
        _ => Some(Fault::Counted),
    }
}

/// The stages up to and including the sign-in: the ones the circuit watches.
fn signing_in(stage: Stage) -> bool {
    matches!(
        stage,
        Stage::Connect
            | Stage::Tls
            | Stage::Greeting
            | Stage::Starttls
            | Stage::Login
            | Stage::Authenticate
    )
}

/// Why [`connect`] gave no session.
#[derive(Debug)]
pub(crate) enum NotConnected {
    /// The account's circuit is open and this was not its probe: nothing was tried.
    CircuitOpen(CircuitOpen),
    /// Connecting or signing in failed (the circuit told, when there is one).
    Failed(ImapError),
}

/// Connects to `account` and signs in within `limit`, after asking its circuit (when there
/// are `circuits`), and tells the circuit how it went.
pub(crate) async fn connect(
    circuits: Option<&Circuits>,
    account: &ImapAccount,
    access: &Access,
    limit: Duration,
) -> Result<SignedIn, NotConnected> {
    let dependency = dependency(account);
    let admission = match circuits {
        Some(circuits) => circuits.admit(&dependency).await,
        None => Admission::Go,
    };
    if let Admission::Wait { reason, probe_in } = admission {
        return Err(NotConnected::CircuitOpen(CircuitOpen { reason, probe_in }));
    }
    let connected = match tokio::time::timeout(limit, auth::connect(account, access)).await {
        Err(_) => Err(ImapError::Timeout {
            stage: Stage::Connect,
            limit,
        }),
        Ok(connected) => connected,
    };
    let Some(circuits) = circuits else {
        return connected.map_err(NotConnected::Failed);
    };
    match &connected {
        Ok(_) => circuits.succeeded(&dependency, &admission).await,
        Err(err) => match fault_of(err) {
            Some(fault) => {
                let detail = classify_imap(err).detail().to_string();
                circuits
                    .failed(&dependency, fault, &detail, &admission)
                    .await;
            }
            // The server answered: as far as the circuit goes, it is there.
            None => circuits.succeeded(&dependency, &admission).await,
        },
    }
    connected.map_err(NotConnected::Failed)
}

/// Waits until `dependency`'s probe is due (`probe_in`) or its circuit changes (a probe
/// elsewhere closed it), or `cancel`: how an IDLE session waits instead of reconnecting.
/// Whether it was cancelled.
pub(crate) async fn wait_for_probe(
    mut changes: watch::Receiver<u64>,
    probe_in: Duration,
    cancel: &CancellationToken,
) -> bool {
    // At least a beat, so that a probe just taken elsewhere is not asked for in a loop.
    let wait = probe_in.max(Duration::from_secs(1));
    tokio::select! {
        () = cancel.cancelled() => true,
        () = tokio::time::sleep(wait) => false,
        _ = changes.changed() => false,
    }
}

impl InboundEmailPoller {
    /// Signs in to each account only while its circuit is closed (or for its probe), and
    /// counts each account's own failures toward opening it (see the module docs).
    #[must_use]
    pub fn with_circuits(mut self, circuits: Circuits) -> Self {
        self.circuits = Some(circuits);
        self
    }
}

#[cfg(test)]
mod tests {
    use std::io;

    use super::*;

    fn imap(stage: Stage, source: ImapProtoError) -> ImapError {
        ImapError::Imap { stage, source }
    }

    #[test]
    fn a_refused_login_opens_at_once_and_a_temporary_one_counts() {
        let refused = imap(
            Stage::Login,
            ImapProtoError::No("[AUTHENTICATIONFAILED] Authentication failed.".into()),
        );
        assert_eq!(fault_of(&refused), Some(Fault::AtOnce));
        let disabled = imap(Stage::Login, ImapProtoError::Bad("LOGIN disabled".into()));
        assert_eq!(fault_of(&disabled), Some(Fault::AtOnce));
        let temporary = imap(
            Stage::Authenticate,
            ImapProtoError::No("[UNAVAILABLE] Temporary authentication failure".into()),
        );
        assert_eq!(fault_of(&temporary), Some(Fault::Counted));
    }

    #[test]
    fn no_connection_counts() {
        let refused = ImapError::Io {
            stage: Stage::Connect,
            source: io::Error::from(io::ErrorKind::ConnectionRefused),
        };
        assert_eq!(fault_of(&refused), Some(Fault::Counted));
        let timed_out = ImapError::Timeout {
            stage: Stage::Connect,
            limit: Duration::from_secs(10),
        };
        assert_eq!(fault_of(&timed_out), Some(Fault::Counted));
        let lost = imap(Stage::Greeting, ImapProtoError::ConnectionLost);
        assert_eq!(fault_of(&lost), Some(Fault::Counted));
    }

    #[test]
    fn what_fails_after_the_sign_in_is_not_the_circuits() {
        let cases = [
            imap(Stage::Select, ImapProtoError::No("no such mailbox".into())),
            imap(Stage::Fetch, ImapProtoError::ConnectionLost),
            ImapError::Timeout {
                stage: Stage::Fetch,
                limit: Duration::from_secs(10),
            },
            ImapError::Protocol {
                stage: Stage::Select,
                detail: "no UIDVALIDITY".into(),
            },
        ];
        for err in cases {
            assert_eq!(fault_of(&err), None, "{err}");
        }
    }

    #[test]
    fn a_password_we_could_not_send_is_not_the_servers_failure() {
        let invalid = imap(
            Stage::Login,
            ImapProtoError::Validate(async_imap::error::ValidateError('\n')),
        );
        assert_eq!(fault_of(&invalid), None);
    }
}
