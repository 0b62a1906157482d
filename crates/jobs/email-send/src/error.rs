//! How a send ends badly ([`SendError`]) and the one function that classifies it
//! ([`classify`]; the table is in the crate docs).

use std::fmt;
use std::time::Duration;

use worker_core::{Failure, error_chain};

/// How one send ended badly, before classification.
#[derive(Debug)]
pub enum SendError {
    /// lettre's error before the mail was accepted: the server's negative answer (to any
    /// command, the end of DATA included), or a connection, TLS or client error met before
    /// the final "." of DATA.
    Smtp(lettre::transport::smtp::Error),
    /// The send did not finish within the send timeout, before the final "." of DATA.
    TimedOut(Duration),
    /// No connection could be had (the connect timeout).
    Connection(String),
    /// lettre's client refused to go on (the server lacks an extension the mail needs).
    Client(String),
    /// The final "." of DATA was sent and no answer came: a timeout or a broken connection.
    /// The server may have taken the mail.
    AnswerLost(String),
    /// The server's certificate did not verify (an unknown CA, another name, expired): it will
    /// not until an operator changes the server or `ca_file`.
    Certificate(String),
    /// The token source has no token.
    Token(worker_mail_auth::TokenError),
    /// The server refused our token sign-in, also with a fresh token.
    Auth(String),
}

impl fmt::Display for SendError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Smtp(err) => f.write_str(&error_chain(err)),
            Self::TimedOut(after) => write!(
                f,
                "the SMTP send did not finish within {}",
                humantime::format_duration(*after)
            ),
            Self::Connection(detail)
            | Self::Client(detail)
            | Self::AnswerLost(detail)
            | Self::Certificate(detail) => f.write_str(detail),
            Self::Token(err) => write!(f, "{err}"),
            Self::Auth(answer) => write!(
                f,
                "the SMTP server refused our token sign-in, also with a fresh token: {answer}"
            ),
        }
    }
}

/// The server's answer in an SMTP error (`550 5.1.1 no such user`), when it gave one.
pub fn server_answer(err: &lettre::transport::smtp::Error) -> Option<String> {
    let code = err.status()?;
    let text = std::error::Error::source(err)
        .map(|s| s.to_string())
        .unwrap_or_default();
    Some(format!("{code} {text}").trim().to_string())
}

/// The one classification of a failed send (see the table in the crate docs).
pub fn classify(err: &SendError) -> Failure {
    match err {
        SendError::TimedOut(_) | SendError::Connection(_) => Failure::transient(err),
        SendError::Client(_) => Failure::permanent("smtp-client", err),
        SendError::Certificate(_) => Failure::permanent("smtp-tls", err),
        // The relay's failure, or our settings': never the mail's, so never its dead letter.
        // A token source that refuses its settings asks again only after its pause; the
        // mail waits as long.
        SendError::Token(token) => match (token.retry_after(), token.is_permanent()) {
            (Some(wait), _) => Failure::throttled(wait, err),
            (None, true) => Failure::throttled(worker_mail_auth::PERMANENT_PAUSE, err),
            (None, false) => Failure::transient(err),
        },
        SendError::Auth(_) => Failure::transient(err),
        SendError::AnswerLost(_) => Failure::unknown(format!(
            "{err}: the server may have accepted the mail, so it is not sent again in process"
        )),
        SendError::Smtp(smtp) => match (smtp.status(), server_answer(smtp)) {
            (Some(_), Some(answer)) if smtp.is_permanent() => {
                Failure::permanent("smtp-5xx", answer)
            }
            (Some(_), Some(answer)) => {
                Failure::transient(format!("the SMTP server answered {answer}"))
            }
            _ if smtp.is_client() => Failure::permanent("smtp-client", err),
            _ => Failure::transient(err),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_timeout_is_transient() {
        let f = classify(&SendError::TimedOut(Duration::from_secs(60)));
        assert_eq!(f.class(), worker_core::FailureClass::Transient);
        assert_eq!(f.detail(), "the SMTP send did not finish within 1m");
    }

    #[test]
    fn no_answer_after_the_final_dot_is_unknown_and_no_connection_is_transient() {
        let f = classify(&SendError::AnswerLost(
            "no answer to the end of DATA".into(),
        ));
        assert!(f.is_unknown(), "{f}");
        assert!(!f.retries_in_process());
        let f = classify(&SendError::Connection("could not connect".into()));
        assert_eq!(f.class(), worker_core::FailureClass::Transient);
        assert!(f.retries_in_process());
        let f = classify(&SendError::Client("no 8BITMIME".into()));
        assert_eq!(f.reason(), "smtp-client");
    }
}
