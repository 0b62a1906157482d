//! [`TokenError`]: why a token source has no token, classified once.

use std::time::Duration;

/// Why a token source has no token now.
///
/// `Settings` is permanent for the source: the endpoint refused the client, the grant or
/// the scope, and only an operator can change that (the source asks again only after
/// [`PERMANENT_PAUSE`](crate::PERMANENT_PAUSE)). `Unavailable` is transient: a 5xx, a 429,
/// a timeout, a connection that failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TokenError {
    #[error("oauth `{source_name}`: the token endpoint refused the settings ({code}{}){}", describe(.description), hint(.code))]
    Settings {
        source_name: String,
        /// The RFC 6749 error code (`invalid_client`, ...), or the HTTP status.
        code: String,
        description: Option<String>,
    },
    #[error("oauth `{source_name}`: no token now: {detail}")]
    Unavailable {
        source_name: String,
        detail: String,
        /// The endpoint's Retry-After, when it sent one.
        retry_after: Option<Duration>,
    },
    /// The source cannot be set up (a key file that does not read): said at start.
    #[error("oauth `{source_name}`: {detail}")]
    Setup { source_name: String, detail: String },
}

impl TokenError {
    /// Whether only an operator can fix it (the settings, the app's consent, a revoked grant).
    pub fn is_permanent(&self) -> bool {
        !matches!(self, Self::Unavailable { .. })
    }

    /// How long the endpoint asked us to wait, if it did.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            Self::Unavailable { retry_after, .. } => *retry_after,
            _ => None,
        }
    }

    /// The failure reason a job records for a permanent one.
    pub const REASON: &'static str = "oauth-settings";
}

fn describe(description: &Option<String>) -> String {
    description
        .as_deref()
        .map(|d| format!(": {d}"))
        .unwrap_or_default()
}

/// What an operator should look at for each refusal.
fn hint(code: &str) -> &'static str {
    match code {
        "invalid_client" => {
            "; check client_id and client_secret (a Microsoft secret expires: see its app registration)"
        }
        "invalid_grant" => {
            "; the refresh token was revoked or expired, or the service account is not delegated for this subject and scope"
        }
        "unauthorized_client" => {
            "; the app may not use this flow: Microsoft needs admin consent for IMAP.AccessAsApp and SMTP.SendAsApp, Google domain-wide delegation of the scope"
        }
        "invalid_scope" => "; check scope",
        "unsupported_grant_type" => "; the endpoint does not offer this flow",
        _ => "",
    }
}

/// The RFC 6749 error codes that mean the settings are wrong; any other code (such as
/// `temporarily_unavailable`) is transient.
pub(crate) fn is_settings_code(code: &str) -> bool {
    matches!(
        code,
        "invalid_client"
            | "invalid_grant"
            | "unauthorized_client"
            | "invalid_scope"
            | "unsupported_grant_type"
            | "invalid_request"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refused_client_is_permanent_and_says_what_to_check() {
        let err = TokenError::Settings {
            source_name: "m365".into(),
            code: "invalid_client".into(),
            description: Some("AADSTS7000215: Invalid client secret provided.".into()),
        };
        assert!(err.is_permanent());
        let text = err.to_string();
        assert!(text.contains("oauth `m365`"), "{text}");
        assert!(text.contains("AADSTS7000215"), "{text}");
        assert!(text.contains("check client_id and client_secret"), "{text}");
    }

    #[test]
    fn an_endpoint_that_is_away_is_transient() {
        let err = TokenError::Unavailable {
            source_name: "g".into(),
            detail: "HTTP 503".into(),
            retry_after: Some(Duration::from_secs(7)),
        };
        assert!(!err.is_permanent());
        assert_eq!(err.retry_after(), Some(Duration::from_secs(7)));
    }

    #[test]
    fn only_the_settings_codes_are_permanent() {
        for code in ["invalid_client", "invalid_grant", "unauthorized_client"] {
            assert!(is_settings_code(code), "{code}");
        }
        assert!(!is_settings_code("temporarily_unavailable"));
        assert!(!is_settings_code("server_error"));
    }
}
