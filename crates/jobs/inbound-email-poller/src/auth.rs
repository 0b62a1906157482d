//! Connecting to an account and signing in: LOGIN with a password, or AUTHENTICATE XOAUTH2 / OAUTHBEARER with a token of
//! the account's `[oauth.NAME]`. A token the server refuses is dropped and the exchange tried
//! once more with a fresh one (revoked, or its permissions changed); a second refusal is the
//! account's failure. When the server answers with an error challenge, the client sends the
//! empty response, so that the server's own reason ends the exchange and is recorded with
//! the challenge's text.

use std::sync::Arc;

use async_imap::Client;
use async_imap::error::Error as ImapProtoError;
use tokio::net::TcpStream;
use tokio::time::Instant;
use tokio_rustls::rustls;
use worker_core::TlsMode;
use worker_mail_auth::{AccessToken, AuthMethod, TokenSource, sasl};

use crate::ImapAccount;
use crate::imap::{ImapError, Io, Session, Stage, greeting, handshake};

/// How an account signs in, as the poller runs it.
#[derive(Debug, Clone)]
pub enum Login {
    Password,
    Token {
        method: AuthMethod,
        source: Arc<TokenSource>,
    },
}

/// A session, and when to sign in again: servers such as Microsoft's end a session when its
/// token expires, so a long one (IDLE) signs in again when the source renews the token.
pub(crate) struct SignedIn {
    pub session: Session,
    pub renew_at: Option<Instant>,
}

/// How the poller reaches one account: its TLS client (its own CA file, if any) and how it
/// signs in.
#[derive(Debug, Clone)]
pub struct Access {
    pub tls: Arc<rustls::ClientConfig>,
    pub login: Login,
}

/// Connects, secures the connection as the account says, reads the greeting and signs in.
/// The caller bounds the whole of it by the connect timeout.
pub(crate) async fn connect(account: &ImapAccount, access: &Access) -> Result<SignedIn, ImapError> {
    let tls = &access.tls;
    let tcp = TcpStream::connect((account.host.as_str(), account.port))
        .await
        .map_err(|source| ImapError::Io {
            stage: Stage::Connect,
            source,
        })?;
    // Latency matters more than throughput for a command-response protocol.
    let _ = tcp.set_nodelay(true);
    let client = match account.security {
        TlsMode::Plain => {
            let mut client = async_imap::Client::new(Box::new(tcp) as Box<dyn Io>);
            greeting(&mut client).await?;
            client
        }
        TlsMode::Tls => {
            let stream = handshake(tcp, account, tls).await?;
            let mut client = async_imap::Client::new(Box::new(stream) as Box<dyn Io>);
            greeting(&mut client).await?;
            client
        }
        TlsMode::Starttls => {
            let mut plain = async_imap::Client::new(tcp);
            greeting(&mut plain).await?;
            plain
                .run_command_and_check_ok("STARTTLS", None)
                .await
                .map_err(|source| ImapError::Imap {
                    stage: Stage::Starttls,
                    source,
                })?;
            let stream = handshake(plain.into_inner(), account, tls).await?;
            // No second greeting after STARTTLS (RFC 3501 6.2.1).
            async_imap::Client::new(Box::new(stream) as Box<dyn Io>)
        }
    };
    sign_in(client, account, &access.login).await
}

pub(crate) async fn sign_in(
    client: Client<Box<dyn Io>>,
    account: &ImapAccount,
    login: &Login,
) -> Result<SignedIn, ImapError> {
    let (method, source) = match login {
        // LOGIN's quoted strings are 7-bit (RFC 3501); SASL PLAIN carries UTF-8 (RFC 4616).
        Login::Password if !account.password().is_ascii() => {
            let first = format!("\0{}\0{}", account.username, account.password());
            let session = sasl_exchange(client, "PLAIN", first)
                .await
                .map_err(|(err, _client)| err)?;
            return Ok(SignedIn {
                session,
                renew_at: None,
            });
        }
        Login::Password => {
            let session = client
                .login(&account.username, account.password())
                .await
                .map_err(|(source, _client)| ImapError::Imap {
                    stage: Stage::Login,
                    source,
                })?;
            return Ok(SignedIn {
                session,
                renew_at: None,
            });
        }
        Login::Token { method, source } => (*method, source),
    };
    let token = source.token().await.map_err(ImapError::Token)?;
    match authenticate(client, method, account, &token).await {
        Ok(session) => Ok(SignedIn {
            session,
            renew_at: Some(token.renew_at()),
        }),
        Err((
            ImapError::Imap {
                source: ImapProtoError::No(reason),
                ..
            },
            client,
        )) => {
            tracing::info!(account = %account.name, source = %source.name(), %reason, "the server refused the token: trying once with a fresh one");
            source.invalidate(&token);
            let fresh = source.token().await.map_err(ImapError::Token)?;
            let session = authenticate(client, method, account, &fresh)
                .await
                .map_err(|(err, _client)| err)?;
            Ok(SignedIn {
                session,
                renew_at: Some(fresh.renew_at()),
            })
        }
        Err((err, _client)) => Err(err),
    }
}

async fn authenticate(
    client: Client<Box<dyn Io>>,
    method: AuthMethod,
    account: &ImapAccount,
    token: &AccessToken,
) -> Result<Session, (ImapError, Client<Box<dyn Io>>)> {
    let first = sasl::initial_response(
        method,
        &account.username,
        &account.host,
        account.port,
        token.expose(),
    )
    .unwrap_or_default();
    sasl_exchange(client, method.mechanism(), first).await
}

/// AUTHENTICATE `mechanism` with `first` as the client's message; a refusal carries the
/// server's challenge, if it sent one.
async fn sasl_exchange(
    client: Client<Box<dyn Io>>,
    mechanism: &str,
    first: String,
) -> Result<Session, (ImapError, Client<Box<dyn Io>>)> {
    let mut exchange = Exchange {
        first: Some(first),
        challenge: None,
    };
    match client.authenticate(mechanism, &mut exchange).await {
        Ok(session) => Ok(session),
        Err((source, client)) => {
            let source = match (source, exchange.challenge) {
                (ImapProtoError::No(reason), Some(challenge)) => {
                    ImapProtoError::No(format!("{reason} (the server's challenge: {challenge})"))
                }
                (ImapProtoError::Bad(reason), Some(challenge)) => {
                    ImapProtoError::Bad(format!("{reason} (the server's challenge: {challenge})"))
                }
                (source, _) => source,
            };
            Err((
                ImapError::Imap {
                    stage: Stage::Authenticate,
                    source,
                },
                client,
            ))
        }
    }
}

/// The client's side of one exchange: the token first, then an empty answer to any
/// challenge, whose text is kept for the error.
struct Exchange {
    first: Option<String>,
    challenge: Option<String>,
}

impl async_imap::Authenticator for &mut Exchange {
    type Response = String;

    fn process(&mut self, challenge: &[u8]) -> String {
        if let Some(first) = self.first.take() {
            return first;
        }
        // A challenge after the token is the server refusing it.
        self.challenge = Some(sasl::challenge_text(challenge));
        String::new()
    }
}

/// Connects to `account`, signs in and examines its mailbox, as `worker-host mail-auth test`
/// does: what the server said, or why it failed (classified as the poller would).
pub async fn try_sign_in(
    account: &ImapAccount,
    oauth: &worker_mail_auth::TokenSources,
    limit: std::time::Duration,
) -> Result<String, worker_core::Failure> {
    let config = crate::PollerConfig {
        oauth: oauth.clone(),
        ..crate::PollerConfig::default()
    };
    let failed = |err: &ImapError| crate::classify_imap(err);
    let login = config
        .login(0, account)
        .map_err(|e| worker_core::Failure::permanent("imap-config", e))?;
    let tls = crate::imap::tls_config(account.ca_file.as_deref())
        .map_err(|e| worker_core::Failure::permanent("imap-config", e))?;
    let access = Access { tls, login };
    let signed_in = match tokio::time::timeout(limit, connect(account, &access)).await {
        Err(_) => {
            return Err(failed(&ImapError::Timeout {
                stage: Stage::Connect,
                limit,
            }));
        }
        Ok(connected) => connected.map_err(|e| failed(&e))?,
    };
    let mut session = signed_in.session;
    let mailbox = crate::imap::timed(
        Stage::Select,
        limit,
        session.examine(crate::mailbox_name::encode(&account.mailbox)),
    )
    .await
    .map_err(|e| failed(&e))?;
    let _ = crate::imap::timed(Stage::Logout, limit, session.logout()).await;
    let how = match &access.login {
        Login::Password => "LOGIN".to_string(),
        Login::Token { method, .. } => format!("AUTHENTICATE {}", method.mechanism()),
    };
    Ok(format!(
        "signed in as {} with {how}; {} holds {} messages (UIDVALIDITY {})",
        account.username,
        account.mailbox,
        mailbox.exists,
        mailbox
            .uid_validity
            .map_or("none".into(), |v| v.to_string())
    ))
}
