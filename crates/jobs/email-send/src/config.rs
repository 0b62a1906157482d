//! [`SmtpSettings`] (`[smtp]`): where and how to reach the SMTP server, checked and turned into what the
//! pool connects with (the TLS parameters, with a private CA's certificates, and the
//! credentials).

use std::path::{Path, PathBuf};
use std::time::Duration;

use lettre::transport::smtp::authentication::Credentials;
use lettre::transport::smtp::client::{Certificate, TlsParameters};
use serde::{Deserialize, Serialize};
use worker_core::{Problems, Secret, Section, SettingError, TlsMode, error_chain};

use crate::DEFAULT_POOL_SIZE;
use crate::auth::Login;
use crate::rate::{Limits, RateSettings};
use crate::smtp::{Security, Server};
use worker_mail_auth::{AuthMethod, SendingLimits, TokenSources};

/// `[smtp]`: where and how to reach the SMTP server, as the settings give it and the sender
/// uses it (the host resolves `password_file` into `password` at load).
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct SmtpSettings {
    pub host: String,
    pub port: u16,
    pub security: TlsMode,
    /// Leave unset for a server that takes mail without logging in.
    pub username: Option<String>,
    /// Required with a username and `auth = "password"`; never printed.
    pub password: Option<Secret>,
    pub password_file: Option<PathBuf>,
    /// How to sign in: `password` (AUTH PLAIN or LOGIN, the default), or `xoauth2` /
    /// `oauthbearer` with a token of the `[oauth.NAME]` named by `oauth`; `username` is then
    /// the mailbox the token acts for.
    pub auth: AuthMethod,
    pub oauth: Option<String>,
    /// The CA certificates (PEM) trusted for `starttls` and `tls` (a private CA); unset: the
    /// public web PKI's roots. The certificate must name `host`.
    pub ca_file: Option<PathBuf>,
    /// Lets the login go to a host that is not loopback with `security = "plain"`; refused
    /// otherwise.
    pub allow_plaintext: bool,
    /// The sender of mail that does not name one.
    pub from: String,
    /// Connections open to the server at most (each used by one send at a time).
    pub pool_size: u32,
    /// Bounds connecting: TCP, the greeting, STARTTLS and AUTH together.
    #[serde(with = "humantime_serde")]
    pub connect_timeout: Duration,
    /// `[smtp.rate]`: how much this account may send, all replicas together; unset keys take
    /// the provider's preset.
    pub rate: RateSettings,
}

impl Default for SmtpSettings {
    /// The local SMTP sink of `scripts/services.sh`: 127.0.0.1:2525, plain.
    fn default() -> Self {
        Self {
            host: "127.0.0.1".into(),
            port: 2525,
            security: TlsMode::Plain,
            username: None,
            password: None,
            password_file: None,
            auth: AuthMethod::Password,
            oauth: None,
            ca_file: None,
            allow_plaintext: false,
            from: "worker-host@localhost".into(),
            pool_size: DEFAULT_POOL_SIZE,
            connect_timeout: Duration::from_secs(10),
            rate: RateSettings::default(),
        }
    }
}

impl Section for SmtpSettings {
    /// The section's own checks; whether a login may go in plain text and whether the CA file
    /// reads are the host's, which checks every mail connection alike.
    fn validate(&self) -> Vec<SettingError> {
        let mut problems = Problems::new();
        problems.positive("port", u64::from(self.port));
        problems.positive("pool_size", u64::from(self.pool_size));
        problems.nonzero("connect_timeout", self.connect_timeout);
        problems.nested("rate", self.rate.problems());
        match (self.auth.uses_token(), &self.oauth, &self.username) {
            (true, None, _) => problems.add(
                "oauth",
                "missing: a token sign-in (auth `xoauth2` or `oauthbearer`) names the `[oauth.NAME]` that gives the token",
            ),
            (true, Some(_), None) => problems.add(
                "username",
                "missing: the mailbox the token acts for (the `user=` of XOAUTH2)",
            ),
            (false, Some(_), _) => problems.add(
                "oauth",
                "used only with auth `xoauth2` or `oauthbearer`; with auth `password` (the default) remove it, or set auth",
            ),
            _ => {}
        }
        problems.into_vec()
    }
}

/// Why an [`EmailSender`](crate::EmailSender) could not be built.
#[derive(Debug, thiserror::Error)]
pub enum SmtpConfigError {
    #[error("smtp: a username needs a password")]
    MissingPassword,
    #[error("smtp: `{address}` is not a sender address: {detail}")]
    BadFrom { address: String, detail: String },
    #[error("smtp: cannot use host `{host}` with TLS: {detail}")]
    Tls { host: String, detail: String },
    #[error("smtp: the CA file {}: {detail}", path.display())]
    CaFile { path: PathBuf, detail: String },
    #[error("smtp: pool_size must be at least 1")]
    EmptyPool,
    #[error("smtp.oauth: no `[oauth.{0}]` section gives this token source")]
    UnknownTokenSource(String),
}

impl SmtpSettings {
    /// How many connections the pool may open: `pool_size`, which must be at least 1 (a pool
    /// of none could never send). The one check of `pool_size` in this crate.
    pub fn connections(&self) -> Result<usize, SmtpConfigError> {
        if self.pool_size == 0 {
            return Err(SmtpConfigError::EmptyPool);
        }
        Ok(usize::try_from(self.pool_size).unwrap_or(usize::MAX))
    }

    /// [`Self::connections`], at most the limit the token source's provider sets per mailbox
    /// (Microsoft allows 3; more are refused with `421 4.3.2`).
    pub fn connections_with(&self, oauth: &TokenSources) -> Result<usize, SmtpConfigError> {
        let wanted = self.connections()?;
        Ok(match self.provider_limit(oauth) {
            Some(limit) if limit < wanted => {
                tracing::warn!(
                    pool_size = wanted,
                    limit,
                    "smtp: pool_size is more than the provider allows one mailbox: {limit} connections are used"
                );
                limit
            }
            _ => wanted,
        })
    }

    /// The sending rate in force: `[smtp.rate]`'s keys, the unset ones from the provider of
    /// `[smtp]`'s token source.
    pub fn rate_limits(&self, oauth: &TokenSources) -> Limits {
        let preset = if self.auth.uses_token() {
            self.oauth
                .as_deref()
                .and_then(|name| oauth.get(name))
                .map(|source| source.smtp_sending_limits())
                .unwrap_or_default()
        } else {
            SendingLimits::default()
        };
        self.rate.limits(preset)
    }

    /// The account whose sends the rate counts: `host:port/username` (no username: the host
    /// alone), so that every replica sending as one mailbox shares one budget.
    pub fn rate_account(&self) -> String {
        format!(
            "{}:{}/{}",
            self.host.to_ascii_lowercase(),
            self.port,
            self.username.as_deref().unwrap_or_default().to_lowercase()
        )
    }

    /// The connections the provider of `[smtp]`'s token source allows one mailbox.
    pub fn provider_limit(&self, oauth: &TokenSources) -> Option<usize> {
        if !self.auth.uses_token() {
            return None;
        }
        let limit = oauth.get(self.oauth.as_deref()?)?.smtp_connection_limit()?;
        usize::try_from(limit).ok()
    }

    /// The server as the pool reaches it: its TLS parameters (read from `ca_file` now, so
    /// that a bad file stops the start rather than the first send) and its credentials.
    pub(crate) fn server(&self, oauth: &TokenSources) -> Result<Server, SmtpConfigError> {
        let roots = match &self.ca_file {
            Some(path) => Some(read_ca_file(path)?),
            None => None,
        };
        let tls = || {
            let mut builder = TlsParameters::builder(self.host.clone());
            if let Some(roots) = &roots {
                builder = builder.add_root_certificate(roots.clone());
            }
            builder.build().map_err(|err| SmtpConfigError::Tls {
                host: self.host.clone(),
                detail: error_chain(&err),
            })
        };
        let security = match self.security {
            TlsMode::Plain => Security::Plain,
            TlsMode::Starttls => Security::Starttls(tls()?),
            TlsMode::Tls => Security::Tls(tls()?),
        };
        Ok(Server {
            host: self.host.clone(),
            port: self.port,
            security,
            login: self.login(oauth)?,
            connect_timeout: self.connect_timeout,
        })
    }
}

impl SmtpSettings {
    fn login(&self, oauth: &TokenSources) -> Result<Login, SmtpConfigError> {
        if self.auth.uses_token() {
            let name = self.oauth.clone().unwrap_or_default();
            let source = oauth
                .get(&name)
                .ok_or(SmtpConfigError::UnknownTokenSource(name))?;
            return Ok(Login::Token {
                method: self.auth,
                user: self.username.clone().unwrap_or_default(),
                source,
            });
        }
        Ok(match (&self.username, &self.password) {
            (Some(user), Some(password)) => Login::Password(Credentials::new(
                user.clone(),
                password.expose().to_string(),
            )),
            (Some(_), None) => return Err(SmtpConfigError::MissingPassword),
            (None, _) => Login::None,
        })
    }
}

/// The CA certificates of a PEM file, refused when it holds none (lettre would take an empty
/// file as no extra CA at all, and the operator would never learn why the server is refused).
fn read_ca_file(path: &Path) -> Result<Certificate, SmtpConfigError> {
    use tokio_rustls::rustls::pki_types::CertificateDer;
    use tokio_rustls::rustls::pki_types::pem::PemObject as _;
    let fail = |detail: String| SmtpConfigError::CaFile {
        path: path.to_path_buf(),
        detail,
    };
    let pem = std::fs::read(path).map_err(|err| fail(format!("cannot be read: {err}")))?;
    let count = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|err| fail(format!("is not PEM: {err}")))?
        .len();
    if count == 0 {
        return Err(fail("holds no PEM certificate".into()));
    }
    Certificate::from_pem(&pem).map_err(|err| fail(error_chain(&err)))
}

#[cfg(test)]
mod tests {
    use serde::Deserialize;

    use super::*;

    #[test]
    fn security_reads_from_settings_words() {
        #[derive(Deserialize)]
        struct S {
            security: TlsMode,
        }
        let read = |w: &str| {
            serde_json::from_str::<S>(&format!(r#"{{"security": "{w}"}}"#))
                .map(|s| s.security)
                .ok()
        };
        assert_eq!(read("plain"), Some(TlsMode::Plain));
        assert_eq!(read("starttls"), Some(TlsMode::Starttls));
        assert_eq!(read("tls"), Some(TlsMode::Tls));
        assert_eq!(read("ssl"), None);
    }

    /// A Microsoft 365 token source named `m365`.
    fn microsoft_sources() -> TokenSources {
        use std::collections::BTreeMap;
        use worker_mail_auth::{Flow, OAuthSettings, Provider};
        let m365 = OAuthSettings {
            provider: Some(Provider::Microsoft),
            tenant: Some("contoso.onmicrosoft.com".into()),
            flow: Some(Flow::ClientCredentials),
            client_id: Some("app".into()),
            client_secret: Some(Secret::new("s")),
            ..OAuthSettings::default()
        };
        TokenSources::build(&BTreeMap::from([("m365".to_string(), m365)]))
            .unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn microsofts_preset_keeps_at_most_three_connections() {
        let sources = microsoft_sources();
        let smtp = SmtpSettings {
            username: Some("support@contoso.com".into()),
            auth: AuthMethod::Xoauth2,
            oauth: Some("m365".into()),
            pool_size: 8,
            ..SmtpSettings::default()
        };
        assert_eq!(smtp.connections_with(&sources).ok(), Some(3));
        let small = SmtpSettings {
            pool_size: 2,
            ..smtp.clone()
        };
        assert_eq!(small.connections_with(&sources).ok(), Some(2));
        let password = SmtpSettings {
            auth: AuthMethod::Password,
            oauth: None,
            ..smtp
        };
        assert_eq!(password.connections_with(&sources).ok(), Some(8));
    }

    #[test]
    fn microsofts_preset_fills_the_unset_rate_keys_and_a_key_given_wins() {
        let sources = microsoft_sources();
        let smtp = SmtpSettings {
            username: Some("Support@Contoso.com".into()),
            auth: AuthMethod::Xoauth2,
            oauth: Some("m365".into()),
            rate: RateSettings {
                messages_per_minute: Some(20),
                ..RateSettings::default()
            },
            ..SmtpSettings::default()
        };
        let limits = smtp.rate_limits(&sources);
        assert_eq!(limits.messages_per_minute, Some(20), "the key given wins");
        assert_eq!(
            limits.recipients_per_day,
            Some(10_000),
            "the preset fills the rest"
        );
        assert_eq!(limits.messages_per_day, None);
        assert_eq!(smtp.rate_account(), "127.0.0.1:2525/support@contoso.com");
        assert!(
            !SmtpSettings::default().rate_limits(&sources).any(),
            "no preset, no limit"
        );
    }

    #[test]
    fn a_rate_of_zero_is_refused_by_name() {
        let zero = SmtpSettings {
            rate: RateSettings {
                recipients_per_day: Some(0),
                ..RateSettings::default()
            },
            ..SmtpSettings::default()
        };
        let keys: Vec<_> = zero.validate().into_iter().map(|e| e.key).collect();
        assert_eq!(keys, ["rate.recipients_per_day"]);
    }

    #[test]
    fn a_pool_of_none_is_refused() {
        let none = SmtpSettings {
            pool_size: 0,
            ..SmtpSettings::default()
        };
        assert!(matches!(
            none.connections(),
            Err(SmtpConfigError::EmptyPool)
        ));
        assert_eq!(SmtpSettings::default().connections().ok(), Some(4));
    }
}
