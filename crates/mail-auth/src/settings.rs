//! `[oauth.NAME]`: one token source as the settings give it ([`OAuthSettings`]), its
//! provider presets, its checks, and the `auth` key of a mail account ([`AuthMethod`]).

use std::net::IpAddr;
use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use worker_core::{Problems, Secret, Section, SettingError};

/// How a mail account signs in: `auth` in an IMAP account and in `[smtp]`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum AuthMethod {
    /// LOGIN (IMAP) or AUTH PLAIN/LOGIN (SMTP) with `password`: what every server takes.
    #[default]
    Password,
    /// SASL XOAUTH2 with a token of `oauth = "NAME"`: Microsoft 365 and Google.
    Xoauth2,
    /// SASL OAUTHBEARER (RFC 7628) with a token of `oauth = "NAME"`.
    Oauthbearer,
}

impl AuthMethod {
    /// Whether this method signs in with a token (and so needs `oauth = "NAME"`).
    pub fn uses_token(self) -> bool {
        !matches!(self, Self::Password)
    }

    /// The SASL mechanism's name as servers list it.
    pub fn mechanism(self) -> &'static str {
        match self {
            Self::Password => "PLAIN",
            Self::Xoauth2 => "XOAUTH2",
            Self::Oauthbearer => "OAUTHBEARER",
        }
    }
}

/// A provider whose token URL and scope are known: `provider` in `[oauth.NAME]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Provider {
    /// Microsoft 365 (Entra ID): needs `tenant`.
    Microsoft,
    /// Google Workspace.
    Google,
}

/// How a token is had: `flow` in `[oauth.NAME]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Flow {
    /// App-only (Microsoft's `IMAP.AccessAsApp`, `SMTP.SendAsApp`): `client_id` and
    /// `client_secret`.
    ClientCredentials,
    /// Delegated, either provider: `client_id`, a `refresh_token_file`, and the secret of a
    /// confidential client.
    RefreshToken,
    /// A Google service account with domain-wide delegation: its JSON `key_file` and the
    /// mailbox to act as (`subject`).
    ServiceAccount,
}

impl Flow {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::ClientCredentials => "client_credentials",
            Self::RefreshToken => "refresh_token",
            Self::ServiceAccount => "service_account",
        }
    }
}

/// Microsoft's app-only scope for IMAP and SMTP.
pub const MICROSOFT_APP_SCOPE: &str = "https://outlook.office365.com/.default";
/// Microsoft's delegated scopes for IMAP and SMTP, with a refresh token kept.
pub const MICROSOFT_DELEGATED_SCOPE: &str = "https://outlook.office365.com/IMAP.AccessAsUser.All https://outlook.office365.com/SMTP.Send offline_access";
/// Google's one scope for IMAP and SMTP.
pub const GOOGLE_SCOPE: &str = "https://mail.google.com/";
/// Google's token endpoint.
pub const GOOGLE_TOKEN_URL: &str = "https://oauth2.googleapis.com/token";
/// Microsoft allows this many SMTP connections per mailbox at once.
pub const MICROSOFT_SMTP_CONNECTIONS: u32 = 3;

/// How much one mailbox may send, as its provider limits it; `[smtp.rate]` takes these for
/// the keys it leaves unset. `None`: the provider sets no such limit (or none we know).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SendingLimits {
    pub messages_per_minute: Option<u32>,
    pub messages_per_day: Option<u32>,
    pub recipients_per_day: Option<u32>,
}

impl Provider {
    /// The provider's published sending limits per mailbox: Microsoft 365 takes 30 messages
    /// a minute and 10,000 recipients a day (Exchange Online limits); Google Workspace about
    /// 2,000 messages a day (Gmail sending limits in Google Workspace).
    pub const fn smtp_sending_limits(self) -> SendingLimits {
        match self {
            Self::Microsoft => SendingLimits {
                messages_per_minute: Some(30),
                messages_per_day: None,
                recipients_per_day: Some(10_000),
            },
            Self::Google => SendingLimits {
                messages_per_minute: None,
                messages_per_day: Some(2_000),
                recipients_per_day: None,
            },
        }
    }
}

/// `[oauth.NAME]`: where a token comes from. Secrets come inline, from the environment, or
/// from `client_secret_file` and `refresh_token_file` (the host reads those at load); none is
/// ever printed.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct OAuthSettings {
    pub provider: Option<Provider>,
    /// The Entra tenant (its id or a verified domain), with `provider = "microsoft"`.
    pub tenant: Option<String>,
    pub flow: Option<Flow>,
    /// The token endpoint; the provider's preset when unset. https, or http to loopback.
    pub token_url: Option<String>,
    pub client_id: Option<String>,
    pub client_secret: Option<Secret>,
    pub client_secret_file: Option<PathBuf>,
    /// Space-separated; the provider's preset when unset.
    pub scope: Option<String>,
    pub refresh_token: Option<Secret>,
    pub refresh_token_file: Option<PathBuf>,
    /// A Google service account's JSON key.
    pub key_file: Option<PathBuf>,
    /// The mailbox a service account acts as.
    pub subject: Option<String>,
    /// Bounds one token request.
    #[serde(with = "humantime_serde")]
    pub timeout: Duration,
    /// A token is renewed this long before it expires (at most a third of its lifetime).
    #[serde(with = "humantime_serde")]
    pub refresh_margin: Duration,
}

impl Default for OAuthSettings {
    fn default() -> Self {
        Self {
            provider: None,
            tenant: None,
            flow: None,
            token_url: None,
            client_id: None,
            client_secret: None,
            client_secret_file: None,
            scope: None,
            refresh_token: None,
            refresh_token_file: None,
            key_file: None,
            subject: None,
            timeout: Duration::from_secs(20),
            refresh_margin: Duration::from_secs(5 * 60),
        }
    }
}

impl OAuthSettings {
    /// The token URL: as given, or the provider's.
    pub fn resolved_token_url(&self) -> Option<String> {
        if let Some(url) = &self.token_url {
            return Some(url.clone());
        }
        match self.provider? {
            Provider::Microsoft => self.tenant.as_ref().map(|tenant| {
                format!("https://login.microsoftonline.com/{tenant}/oauth2/v2.0/token")
            }),
            Provider::Google => Some(GOOGLE_TOKEN_URL.into()),
        }
    }

    /// The scope: as given, or the provider's for this flow.
    pub fn resolved_scope(&self) -> Option<String> {
        if let Some(scope) = &self.scope {
            return Some(scope.clone());
        }
        match (self.provider?, self.flow?) {
            (Provider::Microsoft, Flow::ClientCredentials) => Some(MICROSOFT_APP_SCOPE.into()),
            (Provider::Microsoft, _) => Some(MICROSOFT_DELEGATED_SCOPE.into()),
            (Provider::Google, _) => Some(GOOGLE_SCOPE.into()),
        }
    }

    /// The most SMTP connections the provider allows one mailbox, if it limits them.
    pub fn smtp_connection_limit(&self) -> Option<u32> {
        (self.provider == Some(Provider::Microsoft)).then_some(MICROSOFT_SMTP_CONNECTIONS)
    }

    /// The provider's sending limits per mailbox (none without a provider).
    pub fn smtp_sending_limits(&self) -> SendingLimits {
        self.provider
            .map(Provider::smtp_sending_limits)
            .unwrap_or_default()
    }
}

impl Section for OAuthSettings {
    fn validate(&self) -> Vec<SettingError> {
        let mut problems = Problems::new();
        problems.nonzero("timeout", self.timeout);
        self.check_provider(&mut problems);
        match self.resolved_token_url() {
            // A provider without what it needs (the tenant) is said above.
            None if self.provider.is_some() => {}
            None => problems.add(
                "token_url",
                "missing: give it, or a provider (`microsoft` with a `tenant`, or `google`)",
            ),
            Some(url) => {
                if let Err(problem) = check_token_url(&url) {
                    problems.add("token_url", problem);
                }
            }
        }
        if self.resolved_scope().is_none() {
            problems.add("scope", "missing: give it, or a provider");
        }
        let Some(flow) = self.flow else {
            problems.add(
                "flow",
                "missing: `client_credentials`, `refresh_token` or `service_account`",
            );
            return problems.into_vec();
        };
        self.check_flow(flow, &mut problems);
        problems.into_vec()
    }
}

impl OAuthSettings {
    fn check_provider(&self, problems: &mut Problems) {
        match (self.provider, &self.tenant) {
            (Some(Provider::Microsoft), None) if self.token_url.is_none() => problems.add(
                "tenant",
                "missing: provider `microsoft` needs the Entra tenant (its id or domain)",
            ),
            (Some(Provider::Google) | None, Some(_)) => problems.add(
                "tenant",
                "only provider `microsoft` takes a tenant; remove it",
            ),
            _ => {}
        }
        match (self.provider, self.flow) {
            (Some(Provider::Google), Some(Flow::ClientCredentials)) => problems.add(
                "flow",
                "Google has no app-only token for mail: use `service_account` (domain-wide delegation) or `refresh_token`",
            ),
            (Some(Provider::Microsoft), Some(Flow::ServiceAccount)) => problems.add(
                "flow",
                "`service_account` is Google's: Microsoft's app-only flow is `client_credentials`",
            ),
            _ => {}
        }
    }

    fn check_flow(&self, flow: Flow, problems: &mut Problems) {
        let has_secret = self.client_secret.is_some() || self.client_secret_file.is_some();
        let has_refresh = self.refresh_token.is_some() || self.refresh_token_file.is_some();
        let needs_client_id = !matches!(flow, Flow::ServiceAccount);
        if needs_client_id && self.client_id.as_deref().is_none_or(str::is_empty) {
            problems.add(
                "client_id",
                format!("missing: flow `{}` needs it", flow.as_str()),
            );
        }
        match flow {
            Flow::ClientCredentials if !has_secret => problems.add(
                "client_secret",
                "missing: flow `client_credentials` needs `client_secret` or `client_secret_file`",
            ),
            Flow::RefreshToken if !has_refresh => problems.add(
                "refresh_token_file",
                "missing: flow `refresh_token` needs the refresh token (`refresh_token_file`)",
            ),
            Flow::ServiceAccount => {
                if self.key_file.is_none() {
                    problems.add(
                        "key_file",
                        "missing: flow `service_account` needs the account's JSON key",
                    );
                }
                if self.subject.as_deref().is_none_or(str::is_empty) {
                    problems.add(
                        "subject",
                        "missing: flow `service_account` needs the mailbox to act as",
                    );
                }
            }
            _ => {}
        }
        let unused = |key: &str, set: bool, problems: &mut Problems| {
            if set {
                problems.add(key, format!("flow `{}` does not use it", flow.as_str()));
            }
        };
        if flow != Flow::RefreshToken {
            unused("refresh_token_file", has_refresh, problems);
        }
        if flow != Flow::ServiceAccount {
            unused("key_file", self.key_file.is_some(), problems);
            unused("subject", self.subject.is_some(), problems);
        } else {
            unused("client_secret", has_secret, problems);
        }
    }
}

/// A token URL must be https, or http to a loopback address (tests, a local proxy): a token
/// request carries the client's secret.
pub fn check_token_url(url: &str) -> Result<url::Url, String> {
    let parsed = url::Url::parse(url).map_err(|e| format!("`{url}` is not a URL: {e}"))?;
    match parsed.scheme() {
        "https" => Ok(parsed),
        "http" if is_loopback(&parsed) => Ok(parsed),
        "http" => Err(format!(
            "`{url}` is plain http to a host that is not loopback: the request carries the client's secret, use https"
        )),
        other => Err(format!("`{url}`: the scheme `{other}` is not http(s)")),
    }
}

fn is_loopback(url: &url::Url) -> bool {
    match url.host() {
        Some(url::Host::Domain(name)) => name.eq_ignore_ascii_case("localhost"),
        Some(url::Host::Ipv4(ip)) => IpAddr::V4(ip).is_loopback(),
        Some(url::Host::Ipv6(ip)) => IpAddr::V6(ip).is_loopback(),
        None => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(settings: &OAuthSettings) -> Vec<String> {
        settings.validate().into_iter().map(|e| e.key).collect()
    }

    fn microsoft() -> OAuthSettings {
        OAuthSettings {
            provider: Some(Provider::Microsoft),
            tenant: Some("contoso.onmicrosoft.com".into()),
            flow: Some(Flow::ClientCredentials),
            client_id: Some("app".into()),
            client_secret: Some(Secret::new("s")),
            ..OAuthSettings::default()
        }
    }

    #[test]
    fn the_microsoft_preset_fills_in_the_tenants_url_and_the_app_scope() {
        let settings = microsoft();
        assert_eq!(
            settings.resolved_token_url().as_deref(),
            Some("https://login.microsoftonline.com/contoso.onmicrosoft.com/oauth2/v2.0/token")
        );
        assert_eq!(
            settings.resolved_scope().as_deref(),
            Some(MICROSOFT_APP_SCOPE)
        );
        assert!(keys(&settings).is_empty(), "{:?}", settings.validate());
        assert_eq!(settings.smtp_connection_limit(), Some(3));
        let limits = settings.smtp_sending_limits();
        assert_eq!(limits.messages_per_minute, Some(30));
        assert_eq!(limits.recipients_per_day, Some(10_000));
    }

    #[test]
    fn the_google_preset_fills_in_googles_url_and_scope() {
        let settings = OAuthSettings {
            provider: Some(Provider::Google),
            flow: Some(Flow::ServiceAccount),
            key_file: Some("/etc/key.json".into()),
            subject: Some("ops@example.com".into()),
            ..OAuthSettings::default()
        };
        assert_eq!(
            settings.resolved_token_url().as_deref(),
            Some(GOOGLE_TOKEN_URL)
        );
        assert_eq!(settings.resolved_scope().as_deref(), Some(GOOGLE_SCOPE));
        assert!(keys(&settings).is_empty(), "{:?}", settings.validate());
        assert_eq!(settings.smtp_connection_limit(), None);
        assert_eq!(settings.smtp_sending_limits().messages_per_day, Some(2_000));
    }

    #[test]
    fn microsoft_without_a_tenant_is_refused_naming_tenant() {
        let settings = OAuthSettings {
            tenant: None,
            ..microsoft()
        };
        assert!(keys(&settings).contains(&"tenant".to_string()));
    }

    #[test]
    fn a_token_url_in_plain_http_is_refused_unless_to_loopback() {
        assert!(check_token_url("http://127.0.0.1:10180/token").is_ok());
        assert!(check_token_url("http://localhost/token").is_ok());
        assert!(check_token_url("http://[::1]:8/token").is_ok());
        assert!(check_token_url("https://login.example.com/token").is_ok());
        let refused = check_token_url("http://idp.example.com/token").unwrap_err();
        assert!(refused.contains("use https"), "{refused}");
        assert!(check_token_url("ftp://x/token").is_err());
        assert!(check_token_url("not a url").is_err());
    }

    #[test]
    fn each_flow_names_what_it_misses() {
        let bare = |flow| OAuthSettings {
            token_url: Some("https://idp.example.com/token".into()),
            scope: Some("mail".into()),
            flow: Some(flow),
            ..OAuthSettings::default()
        };
        assert_eq!(
            keys(&bare(Flow::ClientCredentials)),
            ["client_id", "client_secret"]
        );
        assert_eq!(
            keys(&bare(Flow::RefreshToken)),
            ["client_id", "refresh_token_file"]
        );
        assert_eq!(keys(&bare(Flow::ServiceAccount)), ["key_file", "subject"]);
        let none = OAuthSettings {
            flow: None,
            ..bare(Flow::RefreshToken)
        };
        assert_eq!(keys(&none), ["flow"]);
    }

    #[test]
    fn a_flow_the_provider_lacks_is_refused() {
        let google_app = OAuthSettings {
            provider: Some(Provider::Google),
            tenant: None,
            ..microsoft()
        };
        assert!(keys(&google_app).contains(&"flow".to_string()));
    }

    #[test]
    fn the_auth_key_reads_from_settings_words() {
        #[derive(Deserialize)]
        struct S {
            auth: AuthMethod,
        }
        let read = |w: &str| {
            serde_json::from_str::<S>(&format!(r#"{{"auth": "{w}"}}"#))
                .map(|s| s.auth)
                .ok()
        };
        assert_eq!(read("password"), Some(AuthMethod::Password));
        assert_eq!(read("xoauth2"), Some(AuthMethod::Xoauth2));
        assert_eq!(read("oauthbearer"), Some(AuthMethod::Oauthbearer));
        assert_eq!(read("oauth2"), None);
    }
}
