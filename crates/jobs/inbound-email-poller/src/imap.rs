//! The IMAP side: connecting (plain, STARTTLS or TLS), bounding every command, and the one
//! function that classifies what went wrong.
//!
//! async-imap has no command timeouts (chatmail/async-imap #63), so every call goes through
//! [`timed`]. A command cut by its timeout leaves the session in an unknown state (half a
//! response may still be on the wire): the caller drops the session after any error.

use std::fmt;
use std::io;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use async_imap::error::Error as ImapProtoError;
use async_imap::imap_proto::{Response, Status};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tokio_rustls::rustls;
use tokio_rustls::rustls::pki_types::pem::PemObject as _;
use tokio_rustls::rustls::pki_types::{CertificateDer, ServerName};
use worker_core::Failure;

use crate::ImapAccount;
use worker_mail_auth::TokenError;

/// The byte stream under a session: TCP, or TLS over TCP.
pub trait Io: AsyncRead + AsyncWrite + Unpin + Send + Sync + fmt::Debug {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send + Sync + fmt::Debug> Io for T {}

/// A logged-in IMAP session.
pub type Session = async_imap::Session<Box<dyn Io>>;

/// Where in the conversation a failure happened; part of the classification.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    Connect,
    Tls,
    Greeting,
    Starttls,
    Login,
    Authenticate,
    Select,
    Search,
    Fetch,
    Idle,
    Logout,
}

impl Stage {
    pub const fn as_str(&self) -> &'static str {
        match self {
            Self::Connect => "connecting",
            Self::Tls => "the TLS handshake",
            Self::Greeting => "the server greeting",
            Self::Starttls => "STARTTLS",
            Self::Login => "LOGIN",
            Self::Authenticate => "AUTHENTICATE",
            Self::Select => "SELECT",
            Self::Search => "UID SEARCH",
            Self::Fetch => "UID FETCH",
            Self::Idle => "IDLE",
            Self::Logout => "LOGOUT",
        }
    }
}

impl fmt::Display for Stage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Everything that can go wrong talking to an IMAP server.
#[derive(Debug, thiserror::Error)]
pub enum ImapError {
    #[error("{stage}: no answer within {}ms", limit.as_millis())]
    Timeout { stage: Stage, limit: Duration },
    #[error("{stage}: {source}")]
    Imap {
        stage: Stage,
        #[source]
        source: ImapProtoError,
    },
    #[error("{stage}: {source}")]
    Io {
        stage: Stage,
        #[source]
        source: io::Error,
    },
    /// The TLS handshake failed: the server named, the certificate problem in the source.
    #[error("the TLS handshake with {server}: {source}")]
    Handshake {
        server: String,
        #[source]
        source: io::Error,
    },
    /// The server answered something we cannot work with (no UIDVALIDITY, a BYE greeting).
    #[error("{stage}: {detail}")]
    Protocol { stage: Stage, detail: String },
    /// The account's token source has no token.
    #[error("{0}")]
    Token(TokenError),
}

impl ImapError {
    pub fn stage(&self) -> Stage {
        match self {
            Self::Timeout { stage, .. }
            | Self::Imap { stage, .. }
            | Self::Io { stage, .. }
            | Self::Protocol { stage, .. } => *stage,
            Self::Handshake { .. } => Stage::Tls,
            Self::Token(_) => Stage::Authenticate,
        }
    }
}

/// Maps an IMAP failure to a failure class, once for the whole poller.
///
/// * Timeouts, lost connections, refused connects, a BYE, and I/O errors are **transient**.
/// * A `NO` to LOGIN is **permanent** (`imap-auth-failed`) unless the server says it is
///   temporary (`[UNAVAILABLE]`, "temporary"), which is transient. A `BAD` to LOGIN
///   (LOGIN disabled) is permanent (`imap-login-refused`).
/// * A mailbox that cannot be selected is permanent (`imap-mailbox`); a server that refuses
///   STARTTLS is permanent (`imap-starttls-refused`); a certificate that does not verify is
///   permanent (`imap-tls`); anything we cannot send (a password with a newline) is permanent
///   (`imap-invalid-input`); an answer we cannot work with is permanent (`imap-protocol`).
/// * Other `NO` answers (a FETCH racing an expunge) are transient, other `BAD` answers
///   permanent (`imap-bad-command`).
///
/// Permanent here means "for this account, until an operator changes something": the poller
/// still goes on with the other accounts, and tries this one again at the next tick.
pub fn classify_imap(err: &ImapError) -> Failure {
    let mut detail = worker_core::error_chain(err);
    if let Some(advice) = worker_core::certificate_advice(&format!("{detail} {err:?}")) {
        detail = format!("{detail}: {advice}");
    }
    match err {
        ImapError::Timeout { .. } => Failure::transient(detail),
        ImapError::Token(err) if err.is_permanent() => {
            Failure::permanent(TokenError::REASON, detail)
        }
        ImapError::Token(err) => match err.retry_after() {
            Some(wait) => Failure::throttled(wait, detail),
            None => Failure::transient(detail),
        },
        ImapError::Protocol { .. } => Failure::permanent("imap-protocol", detail),
        ImapError::Handshake { source, .. } if is_certificate_error(source) => {
            Failure::permanent("imap-tls", detail)
        }
        ImapError::Handshake { .. } => Failure::transient(detail),
        ImapError::Io { stage, source } => {
            if *stage == Stage::Tls && is_certificate_error(source) {
                Failure::permanent("imap-tls", detail)
            } else {
                Failure::transient(detail)
            }
        }
        ImapError::Imap { stage, source } => match source {
            ImapProtoError::Io(io) if *stage == Stage::Tls && is_certificate_error(io) => {
                Failure::permanent("imap-tls", detail)
            }
            ImapProtoError::Io(_) | ImapProtoError::ConnectionLost | ImapProtoError::Parse(_) => {
                Failure::transient(detail)
            }
            ImapProtoError::Validate(_) => Failure::permanent("imap-invalid-input", detail),
            ImapProtoError::No(text) => match stage {
                Stage::Login | Stage::Authenticate if says_temporary(text) => {
                    Failure::transient(detail)
                }
                Stage::Login | Stage::Authenticate => {
                    Failure::permanent("imap-auth-failed", detail)
                }
                Stage::Select => Failure::permanent("imap-mailbox", detail),
                Stage::Starttls => Failure::permanent("imap-starttls-refused", detail),
                _ => Failure::transient(detail),
            },
            ImapProtoError::Bad(_) => match stage {
                Stage::Login | Stage::Authenticate => {
                    Failure::permanent("imap-login-refused", detail)
                }
                Stage::Select => Failure::permanent("imap-mailbox", detail),
                Stage::Starttls => Failure::permanent("imap-starttls-refused", detail),
                _ => Failure::permanent("imap-bad-command", detail),
            },
            _ => Failure::transient(detail),
        },
    }
}

fn says_temporary(text: &str) -> bool {
    let text = text.to_ascii_lowercase();
    text.contains("unavailable") || text.contains("temporar") || text.contains("try again")
}

fn is_certificate_error(err: &io::Error) -> bool {
    err.get_ref()
        .and_then(|inner| inner.downcast_ref::<rustls::Error>())
        .is_some_and(|e| {
            matches!(
                e,
                rustls::Error::InvalidCertificate(_) | rustls::Error::NoCertificatesPresented
            )
        })
}

/// Runs one IMAP call under `limit`; the one way this crate talks to a server.
pub async fn timed<T>(
    stage: Stage,
    limit: Duration,
    call: impl Future<Output = Result<T, ImapProtoError>>,
) -> Result<T, ImapError> {
    match tokio::time::timeout(limit, call).await {
        Err(_) => Err(ImapError::Timeout { stage, limit }),
        Ok(Err(source)) => Err(ImapError::Imap { stage, source }),
        Ok(Ok(value)) => Ok(value),
    }
}

/// The TLS client configuration: the webpki root certificates and those of `ca_file` (a
/// private CA), ring as the provider. A CA file that cannot be read or holds no certificate
/// is refused here, with why.
pub fn tls_config(ca_file: Option<&Path>) -> Result<Arc<rustls::ClientConfig>, String> {
    let mut roots = rustls::RootCertStore {
        roots: webpki_roots::TLS_SERVER_ROOTS.to_vec(),
    };
    if let Some(path) = ca_file {
        let shown = path.display();
        let certs = CertificateDer::pem_file_iter(path)
            .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
            .map_err(|e| format!("the CA file {shown} cannot be read as PEM: {e}"))?;
        if certs.is_empty() {
            return Err(format!("the CA file {shown} holds no PEM certificate"));
        }
        for cert in certs {
            roots
                .add(cert)
                .map_err(|e| format!("the CA file {shown} holds a bad certificate: {e}"))?;
        }
    }
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|e| format!("the TLS client cannot be set up: {e}"))?
    .with_root_certificates(roots)
    .with_no_client_auth();
    Ok(Arc::new(config))
}

pub(crate) async fn handshake(
    tcp: TcpStream,
    account: &ImapAccount,
    tls: &Arc<rustls::ClientConfig>,
) -> Result<tokio_rustls::client::TlsStream<TcpStream>, ImapError> {
    let host = account.host.as_str();
    let name = ServerName::try_from(host.to_string()).map_err(|e| ImapError::Protocol {
        stage: Stage::Tls,
        detail: format!("`{host}` is not a valid TLS server name: {e}"),
    })?;
    TlsConnector::from(tls.clone())
        .connect(name, tcp)
        .await
        .map_err(|source| ImapError::Handshake {
            server: format!("{host}:{}", account.port),
            source,
        })
}

/// Reads the server's greeting: `OK` (or `PREAUTH`) goes on, `BYE` is a refusal.
pub(crate) async fn greeting<T: AsyncRead + AsyncWrite + Unpin + Send + fmt::Debug>(
    client: &mut async_imap::Client<T>,
) -> Result<(), ImapError> {
    let response = client
        .read_response()
        .await
        .map_err(|source| ImapError::Io {
            stage: Stage::Greeting,
            source,
        })?;
    let Some(response) = response else {
        return Err(ImapError::Imap {
            stage: Stage::Greeting,
            source: ImapProtoError::ConnectionLost,
        });
    };
    match response.parsed() {
        Response::Data {
            status: Status::Bye,
            outcome,
        } => Err(ImapError::Io {
            stage: Stage::Greeting,
            source: io::Error::new(
                io::ErrorKind::ConnectionAborted,
                format!(
                    "the server said BYE: {}",
                    outcome.information.as_deref().unwrap_or("")
                ),
            ),
        }),
        _ => Ok(()),
    }
}

/// A compact UID set (`1:3,7,9:10`) for sorted, distinct `uids`.
pub fn uid_set(uids: &[u32]) -> String {
    let mut out = String::new();
    let mut i = 0;
    while i < uids.len() {
        let start = uids[i];
        let mut end = start;
        while i + 1 < uids.len() && uids[i + 1] == end.wrapping_add(1) {
            i += 1;
            end = uids[i];
        }
        if !out.is_empty() {
            out.push(',');
        }
        if start == end {
            out.push_str(&start.to_string());
        } else {
            out.push_str(&format!("{start}:{end}"));
        }
        i += 1;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use worker_core::FailureClass;

    fn imap(stage: Stage, source: ImapProtoError) -> ImapError {
        ImapError::Imap { stage, source }
    }

    #[test]
    fn uid_sets_are_compact() {
        assert_eq!(uid_set(&[]), "");
        assert_eq!(uid_set(&[5]), "5");
        assert_eq!(uid_set(&[1, 2, 3, 7, 9, 10]), "1:3,7,9:10");
        assert_eq!(
            uid_set(&[u32::MAX - 1, u32::MAX]),
            format!("{}:{}", u32::MAX - 1, u32::MAX)
        );
    }

    #[test]
    fn connection_trouble_is_transient() {
        let cases = [
            ImapError::Timeout {
                stage: Stage::Connect,
                limit: Duration::from_secs(60),
            },
            ImapError::Io {
                stage: Stage::Connect,
                source: io::Error::from(io::ErrorKind::ConnectionRefused),
            },
            imap(Stage::Fetch, ImapProtoError::ConnectionLost),
            imap(
                Stage::Select,
                ImapProtoError::Io(io::Error::from(io::ErrorKind::ConnectionReset)),
            ),
            imap(Stage::Fetch, ImapProtoError::No("message expunged".into())),
            imap(
                Stage::Login,
                ImapProtoError::No(
                    "code: None, info: Some(\"[UNAVAILABLE] Temporary authentication failure\")"
                        .into(),
                ),
            ),
        ];
        for err in cases {
            assert_eq!(
                classify_imap(&err).class(),
                FailureClass::Transient,
                "{err}"
            );
        }
    }

    #[test]
    fn what_an_operator_must_fix_is_permanent() {
        let cases = [
            (
                imap(
                    Stage::Login,
                    ImapProtoError::No("[AUTHENTICATIONFAILED] Authentication failed.".into()),
                ),
                "imap-auth-failed",
            ),
            (
                imap(Stage::Login, ImapProtoError::Bad("LOGIN disabled".into())),
                "imap-login-refused",
            ),
            (
                imap(
                    Stage::Select,
                    ImapProtoError::No("Mailbox doesn't exist".into()),
                ),
                "imap-mailbox",
            ),
            (
                imap(
                    Stage::Starttls,
                    ImapProtoError::Bad("TLS support isn't enabled".into()),
                ),
                "imap-starttls-refused",
            ),
            (
                ImapError::Protocol {
                    stage: Stage::Select,
                    detail: "no UIDVALIDITY".into(),
                },
                "imap-protocol",
            ),
        ];
        for (err, reason) in cases {
            let failure = classify_imap(&err);
            assert!(failure.is_permanent(), "{err}");
            assert_eq!(failure.reason(), reason, "{err}");
        }
    }
}
