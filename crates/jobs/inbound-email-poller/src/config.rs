//! What the poller runs with: its accounts ([`ImapAccount`]) and limits ([`PollerConfig`]),
//! and the one check of an account list ([`validate_accounts`]), which the host's settings
//! validation calls too.

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use worker_core::{Secret, SettingError, TlsMode};
use worker_mail_auth::{AuthMethod, TokenSources};

use crate::MailLimits;
use crate::auth::Login;

/// One IMAP account to poll: `[[imap.accounts]]` in the settings, as the poller runs it.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ImapAccount {
    /// A short, unique name: in logs, metrics, the poll state and the events.
    pub name: String,
    #[serde(default = "default_host")]
    pub host: String,
    #[serde(default = "default_port")]
    pub port: u16,
    #[serde(default)]
    pub security: TlsMode,
    pub username: String,
    /// Given here, in the environment or in `password_file` (the host resolves it at load).
    #[serde(default)]
    pub password: Option<Secret>,
    #[serde(default)]
    pub password_file: Option<PathBuf>,
    /// How the account signs in: `password` (LOGIN), or `xoauth2` / `oauthbearer` with a
    /// token of the `[oauth.NAME]` named by `oauth`; `username` is then the mailbox the token
    /// acts for.
    #[serde(default)]
    pub auth: AuthMethod,
    #[serde(default)]
    pub oauth: Option<String>,
    /// How often this account's IDLE session asks the server to look at the mailbox (`0s`:
    /// never, the server's notifications only). Unset: the job's `idle_recheck`, else 150 ms
    /// on this machine and none for a remote provider.
    #[serde(
        default,
        with = "humantime_serde",
        skip_serializing_if = "Option::is_none"
    )]
    pub idle_recheck: Option<Duration>,
    #[serde(default = "default_mailbox")]
    pub mailbox: String,
    /// Announce the mail already in the mailbox at the account's first poll. Off (the
    /// default), the first poll starts after the mail that arrived before the host first
    /// watched the account, so that a new installation does not answer years of mail (see
    /// the crate docs, "The first poll").
    #[serde(default)]
    pub backfill: bool,
    /// The CA certificates (PEM) trusted for `starttls` and `tls` (a private CA); unset: the
    /// public web PKI's roots. The certificate must name `host`.
    #[serde(default)]
    pub ca_file: Option<PathBuf>,
    /// Lets the login go to a host that is not loopback with `security = "plain"`; refused
    /// otherwise.
    #[serde(default)]
    pub allow_plaintext: bool,
}

impl ImapAccount {
    /// The password as the client library takes it; empty when none was given.
    pub fn password(&self) -> &str {
        self.password.as_ref().map_or("", Secret::expose)
    }
}

fn default_host() -> String {
    "127.0.0.1".into()
}
fn default_port() -> u16 {
    10143
}
fn default_mailbox() -> String {
    "INBOX".into()
}

/// Everything the poller needs from the settings.
#[derive(Debug, Clone)]
pub struct PollerConfig {
    pub accounts: Vec<ImapAccount>,
    /// Connect, TLS, greeting and login of one account.
    pub connect_timeout: Duration,
    /// One message (existence check, fetch, parse, store), and each other command of the
    /// session (SELECT, SEARCH, the size FETCH, LOGOUT).
    pub message_timeout: Duration,
    /// Mail larger than this (RFC822.SIZE, bytes) is recorded as skipped without its body.
    pub max_message_bytes: u64,
    /// The text and the HTML body are each cut at this many characters.
    pub max_body_chars: usize,
    /// Mail past any of these (parts, nesting, header fields, header bytes) is recorded as
    /// skipped without being parsed; see [`limits`].
    pub mail_limits: MailLimits,
    /// Messages handled per account per tick; the rest waits for the next tick.
    pub max_messages_per_account: u32,
    /// A message that fails this many times in a row is recorded as skipped.
    pub max_message_attempts: u32,
    /// Accounts polled at once.
    pub account_concurrency: usize,
    /// The exchange the `email.received` events go to.
    pub events_exchange: String,
    /// How the poller idles (IMAP IDLE), between the scheduled polls.
    pub idle: crate::IdleConfig,
    /// The token sources the accounts name in `oauth`.
    pub oauth: TokenSources,
}

impl Default for PollerConfig {
    fn default() -> Self {
        Self {
            accounts: Vec::new(),
            connect_timeout: Duration::from_secs(60),
            message_timeout: Duration::from_secs(30),
            max_message_bytes: 25 * 1024 * 1024,
            max_body_chars: 100_000,
            mail_limits: MailLimits::default(),
            max_messages_per_account: 100,
            max_message_attempts: 3,
            account_concurrency: 4,
            events_exchange: "events".into(),
            idle: crate::IdleConfig::default(),
            oauth: TokenSources::default(),
        }
    }
}

/// The longest an IDLE may last before it is issued again: well inside RFC 2177's 29 minutes.
pub const IDLE_REFRESH_MAX: Duration = Duration::from_secs(25 * 60);

/// A configuration the poller cannot run with; names the field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {problem}")]
pub struct ConfigError {
    /// `accounts[1].name`, `message_timeout`, ...
    pub field: String,
    pub problem: String,
}

impl PollerConfig {
    /// How account `i` signs in: its token source must be among [`Self::oauth`].
    pub(crate) fn login(&self, i: usize, account: &ImapAccount) -> Result<Login, ConfigError> {
        if !account.auth.uses_token() {
            return Ok(Login::Password);
        }
        let name = account.oauth.as_deref().unwrap_or_default();
        let source = self.oauth.get(name).ok_or_else(|| ConfigError {
            field: format!("accounts[{i}].oauth"),
            problem: format!("no `[oauth.{name}]` section gives this token source"),
        })?;
        Ok(Login::Token {
            method: account.auth,
            source,
        })
    }

    /// Checks what the poller relies on: unique non-empty account names, non-empty hosts,
    /// user names and mailboxes, non-zero limits.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let err = |field: String, problem: &str| ConfigError {
            field,
            problem: problem.to_string(),
        };
        if let Some(problem) = validate_accounts(&self.accounts).into_iter().next() {
            return Err(ConfigError {
                field: format!("accounts{}", problem.key),
                problem: problem.problem,
            });
        }
        for (field, value) in [
            ("connect_timeout", self.connect_timeout),
            ("message_timeout", self.message_timeout),
        ] {
            if value.is_zero() {
                return Err(err(field.into(), "must be longer than zero"));
            }
        }
        for (field, zero) in [
            ("max_message_bytes", self.max_message_bytes == 0),
            ("max_body_chars", self.max_body_chars == 0),
            ("mail_limits.max_parts", self.mail_limits.max_parts == 0),
            ("mail_limits.max_depth", self.mail_limits.max_depth == 0),
            (
                "mail_limits.max_header_fields",
                self.mail_limits.max_header_fields == 0,
            ),
            (
                "mail_limits.max_header_bytes",
                self.mail_limits.max_header_bytes == 0,
            ),
            (
                "max_messages_per_account",
                self.max_messages_per_account == 0,
            ),
            ("max_message_attempts", self.max_message_attempts == 0),
            ("account_concurrency", self.account_concurrency == 0),
        ] {
            if zero {
                return Err(err(field.into(), "must be at least 1"));
            }
        }
        if self.events_exchange.trim().is_empty() {
            return Err(err("events_exchange".into(), "must not be empty"));
        }
        let idle = &self.idle;
        for (field, value) in [
            ("idle.refresh", idle.refresh),
            ("idle.lease_retry", idle.lease_retry),
            ("idle.reconnect_max", idle.reconnect_max),
        ] {
            if value.is_zero() {
                return Err(err(field.into(), "must be longer than zero"));
            }
        }
        if idle.refresh > IDLE_REFRESH_MAX {
            return Err(err(
                "idle.refresh".into(),
                "must be at most 25 minutes: servers may log an IDLE out after 29 (RFC 2177)",
            ));
        }
        Ok(())
    }
}

/// Every problem of an account list, keyed relative to the list (`[1].name`): unique,
/// non-empty names; non-empty hosts, user names and mailboxes; a port.
pub fn validate_accounts(accounts: &[ImapAccount]) -> Vec<SettingError> {
    let mut problems = Vec::new();
    let mut fail = |key: String, problem: String| problems.push(SettingError::new(key, problem));
    let mut seen = std::collections::HashSet::new();
    for (i, account) in accounts.iter().enumerate() {
        if account.name.trim().is_empty() {
            fail(
                format!("[{i}].name"),
                "expected a short account name, found an empty string".into(),
            );
        } else if !seen.insert(account.name.as_str()) {
            fail(
                format!("[{i}].name"),
                format!(
                    "expected a unique account name, but `{}` is used twice",
                    account.name
                ),
            );
        }
        for (field, value) in [
            ("host", &account.host),
            ("username", &account.username),
            ("mailbox", &account.mailbox),
        ] {
            if value.trim().is_empty() {
                fail(
                    format!("[{i}].{field}"),
                    format!("expected the account's {field}, found an empty string"),
                );
            }
        }
        if account.port == 0 {
            fail(
                format!("[{i}].port"),
                "expected a port number from 1 to 65535, found 0".into(),
            );
        }
        match (account.auth.uses_token(), &account.oauth) {
            (true, None) => fail(
                format!("[{i}].oauth"),
                format!(
                    "missing: auth `{}` signs in with a token: name the `[oauth.NAME]` section that gives it",
                    account.auth.mechanism().to_ascii_lowercase()
                ),
            ),
            (false, Some(_)) => fail(
                format!("[{i}].oauth"),
                "used only with auth `xoauth2` or `oauthbearer`; with auth `password` (the default) remove it, or set auth".into(),
            ),
            _ => {}
        }
    }
    problems
}
