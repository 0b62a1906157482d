//! Signing in to the SMTP server: AUTH PLAIN or LOGIN with a password (lettre's own), or
//! XOAUTH2 / OAUTHBEARER with a token of `[oauth.NAME]`, driven here over the connection's
//! `command` API: lettre's `Mechanism::Xoauth2` always puts the token on the AUTH line and
//! fails on a challenge.
//!
//! * A real token (1.5–2.5 KB) makes the AUTH line longer than SMTP allows (RFC 4954 §4:
//!   no initial response that would pass the 512-octet line of RFC 5321), so it goes after
//!   the server's `334` whenever the line would pass that. Dovecot's submission answers
//!   `500 Line too long` to a long AUTH line, and Postfix cuts it at 2,048 and answers 535.
//! * A server that refuses the token answers a `334` holding base64 JSON; the client sends
//!   an empty line and the server's final 535 or 454 is what gets recorded, with the JSON.
//! * A refused token is dropped and the sign-in tried once more with a fresh one.

use std::sync::Arc;

use lettre::transport::smtp::authentication::{Credentials, DEFAULT_MECHANISMS};
use lettre::transport::smtp::client::AsyncSmtpConnection;
use lettre::transport::smtp::response::Response;
use tokio::time::Instant;
use worker_core::error_chain;
use worker_mail_auth::{AccessToken, AuthMethod, TokenSource, sasl};

use crate::error::{SendError, server_answer};

/// The longest command line SMTP allows, CRLF included (RFC 5321 §4.5.3.1.4).
pub(crate) const LINE_MAX: usize = 512;

/// How the pool signs in on each new connection.
pub(crate) enum Login {
    /// A server that takes mail without a login.
    None,
    Password(Credentials),
    Token {
        method: AuthMethod,
        /// The mailbox the token acts for (`user=` of XOAUTH2).
        user: String,
        source: Arc<TokenSource>,
    },
}

/// Where the server is, for OAUTHBEARER's `host` and `port`.
pub(crate) struct Peer<'a> {
    pub host: &'a str,
    pub port: u16,
}

/// Signs in on a new connection; with a token, says when the source renews it (the
/// connection is not used after that).
pub(crate) async fn sign_in(
    connection: &mut AsyncSmtpConnection,
    login: &Login,
    peer: Peer<'_>,
) -> Result<Option<Instant>, SendError> {
    match login {
        Login::None => Ok(None),
        Login::Password(credentials) => connection
            .auth(DEFAULT_MECHANISMS, credentials)
            .await
            .map(|_| None)
            .map_err(SendError::Smtp),
        Login::Token {
            method,
            user,
            source,
        } => {
            let token = source.token().await.map_err(SendError::Token)?;
            match exchange(connection, *method, user, &peer, &token).await {
                Ok(()) => Ok(Some(token.renew_at())),
                Err(Refused::Token(first)) => {
                    tracing::info!(source = %source.name(), refusal = %first, "the SMTP server refused the token: trying once with a fresh one");
                    source.invalidate(&token);
                    let fresh = source.token().await.map_err(SendError::Token)?;
                    exchange(connection, *method, user, &peer, &fresh)
                        .await
                        .map(|()| Some(fresh.renew_at()))
                        .map_err(Refused::into_error)
                }
                Err(other) => Err(other.into_error()),
            }
        }
    }
}

/// Why an exchange failed: the server refused the token (worth one more try with a fresh
/// one), or something else went wrong.
enum Refused {
    Token(String),
    Other(SendError),
}

impl Refused {
    fn into_error(self) -> SendError {
        match self {
            Self::Token(answer) => SendError::Auth(answer),
            Self::Other(err) => err,
        }
    }
}

async fn exchange(
    connection: &mut AsyncSmtpConnection,
    method: AuthMethod,
    user: &str,
    peer: &Peer<'_>,
    token: &AccessToken,
) -> Result<(), Refused> {
    let first = sasl::initial_response(method, user, peer.host, peer.port, token.expose())
        .unwrap_or_default();
    let encoded = sasl::base64(&first);
    let mechanism = method.mechanism();
    let line = format!("AUTH {mechanism} {encoded}\r\n");
    let answer = if line.len() <= LINE_MAX {
        connection.command(line).await
    } else {
        match connection.command(format!("AUTH {mechanism}\r\n")).await {
            Ok(go_ahead) if go_ahead.has_code(334) => {
                connection.command(format!("{encoded}\r\n")).await
            }
            Ok(other) => {
                return Err(Refused::Other(SendError::Connection(format!(
                    "AUTH {mechanism}: the server answered {} instead of 334",
                    text(&other)
                ))));
            }
            Err(err) => return Err(refusal(err, None)),
        }
    };
    match answer {
        Ok(done) if done.has_code(334) => {
            // An error challenge: answer it empty, so that the server ends with its reason.
            let challenge = sasl::challenge_text(done.message().collect::<String>().as_bytes());
            match connection.command("\r\n").await {
                Ok(end) => Err(Refused::Token(format!(
                    "{} (the server's challenge: {challenge})",
                    text(&end)
                ))),
                Err(err) => Err(refusal(err, Some(challenge))),
            }
        }
        Ok(_) => Ok(()),
        Err(err) => Err(refusal(err, None)),
    }
}

/// A 535 (or 534) to AUTH is the server refusing the token: worth one try with a fresh one.
/// Any other answer (a 454 or a 421: the server's trouble) and a broken connection are
/// classified as any SMTP failure is.
fn refusal(err: lettre::transport::smtp::Error, challenge: Option<String>) -> Refused {
    let refused = err
        .status()
        .is_some_and(|code| matches!(u16::from(code), 534 | 535));
    match server_answer(&err) {
        Some(answer) if refused => Refused::Token(match challenge {
            Some(challenge) => format!("{answer} (the server's challenge: {challenge})"),
            None => answer,
        }),
        Some(_) => Refused::Other(SendError::Smtp(err)),
        None => Refused::Other(SendError::Connection(format!(
            "the connection failed during AUTH: {}",
            error_chain(&err)
        ))),
    }
}

fn text(response: &Response) -> String {
    format!(
        "{} {}",
        response.code(),
        response.message().collect::<Vec<_>>().join(" ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_real_tokens_auth_line_passes_the_smtp_line_limit() {
        let token = "t".repeat(1500);
        let line = format!(
            "AUTH XOAUTH2 {}\r\n",
            sasl::base64(&sasl::xoauth2("ops@example.com", &token))
        );
        assert!(line.len() > LINE_MAX, "{}", line.len());
        let short = format!(
            "AUTH XOAUTH2 {}\r\n",
            sasl::base64(&sasl::xoauth2("ops@example.com", "ya29.short"))
        );
        assert!(short.len() <= LINE_MAX);
    }
}
