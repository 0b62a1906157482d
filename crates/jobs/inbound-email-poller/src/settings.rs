//! `[jobs.inbound_email_poller]`: the limits of a tick, a connection, a message and a mail.
//! The accounts are the host's (`[imap]`, with their secrets), checked by
//! [`validate_accounts`](crate::validate_accounts); the host adds the `schedule`.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use worker_core::{Problems, Section, SettingError, TimerSection};

use crate::{ImapAccount, MailLimits, PollerConfig};

#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct InboundEmailPollerSettings {
    /// One tick over every account.
    #[serde(with = "humantime_serde")]
    pub timeout: Duration,
    /// Connect, TLS, greeting and login of one account.
    #[serde(with = "humantime_serde")]
    pub connect_timeout: Duration,
    /// One message (existence check, fetch, parse, store), and each other command of a
    /// session.
    #[serde(with = "humantime_serde")]
    pub message_timeout: Duration,
    /// Mail larger than this many bytes is recorded as skipped, without its body.
    pub max_message_bytes: u64,
    /// The text and the HTML body are each cut at this many characters.
    pub max_body_chars: usize,
    /// Mail past any of these four is recorded as skipped without being parsed (a cheap
    /// pre-scan, before the parser): MIME parts at all levels together,
    pub max_mime_parts: usize,
    /// multiparts and attached messages inside one another,
    pub max_mime_depth: usize,
    /// header fields in all header sections together,
    pub max_header_fields: usize,
    /// and bytes of one header section.
    pub max_header_bytes: usize,
    /// Messages handled per account per tick; the rest waits for the next tick.
    pub max_messages_per_account: u32,
    /// A message that fails this many ticks in a row is recorded as skipped.
    pub max_message_attempts: u32,
    /// Accounts polled at once.
    pub account_concurrency: usize,
    /// Idle (IMAP IDLE) where the server offers it, so that new mail is fetched at once;
    /// the schedule still polls, as a safety net.
    pub idle: bool,
    /// How often an IDLE is ended and issued again (at most 25 minutes), which bounds how long
    /// a silently dead connection goes unnoticed (unused with `idle_recheck_with = "noop"`,
    /// whose every answer shows the connection alive).
    #[serde(with = "humantime_serde")]
    pub idle_refresh: Duration,
    /// How often the server is asked to look at the mailbox at once: for servers that hold
    /// their news back (Dovecot, by 500 ms). `0s`: leave it to the server's notifications.
    /// Unset (the default): 150 ms for an account on this machine, none for a remote
    /// provider; an account's own `idle_recheck` comes first.
    #[serde(with = "humantime_serde", skip_serializing_if = "Option::is_none")]
    pub idle_recheck: Option<Duration>,
    /// How a recheck asks: `noop` (one command, on a session that stays out of IDLE) or
    /// `idle` (`DONE` and a new IDLE, two commands, with the server's notices in between).
    pub idle_recheck_with: crate::RecheckWith,
    /// How soon another replica takes over idling when the one that idles goes away.
    #[serde(with = "humantime_serde")]
    pub idle_lease_retry: Duration,
    /// The longest wait between two reconnects of an account whose IDLE keeps failing.
    #[serde(with = "humantime_serde")]
    pub idle_reconnect_max: Duration,
}

impl Default for InboundEmailPollerSettings {
    fn default() -> Self {
        let config = PollerConfig::default();
        Self {
            timeout: Duration::from_secs(300),
            connect_timeout: config.connect_timeout,
            message_timeout: config.message_timeout,
            max_message_bytes: config.max_message_bytes,
            max_body_chars: config.max_body_chars,
            max_mime_parts: config.mail_limits.max_parts,
            max_mime_depth: config.mail_limits.max_depth,
            max_header_fields: config.mail_limits.max_header_fields,
            max_header_bytes: config.mail_limits.max_header_bytes,
            max_messages_per_account: config.max_messages_per_account,
            max_message_attempts: config.max_message_attempts,
            account_concurrency: config.account_concurrency,
            idle: config.idle.enabled,
            idle_refresh: config.idle.refresh,
            idle_recheck: config.idle.recheck,
            idle_recheck_with: config.idle.recheck_with,
            idle_lease_retry: config.idle.lease_retry,
            idle_reconnect_max: config.idle.reconnect_max,
        }
    }
}

impl InboundEmailPollerSettings {
    /// The poller's configuration: these limits, the accounts, and the exchange its events go
    /// to.
    pub fn config(&self, accounts: Vec<ImapAccount>, events_exchange: &str) -> PollerConfig {
        PollerConfig {
            accounts,
            connect_timeout: self.connect_timeout,
            message_timeout: self.message_timeout,
            max_message_bytes: self.max_message_bytes,
            max_body_chars: self.max_body_chars,
            mail_limits: MailLimits {
                max_parts: self.max_mime_parts,
                max_depth: self.max_mime_depth,
                max_header_fields: self.max_header_fields,
                max_header_bytes: self.max_header_bytes,
            },
            max_messages_per_account: self.max_messages_per_account,
            max_message_attempts: self.max_message_attempts,
            account_concurrency: self.account_concurrency,
            events_exchange: events_exchange.to_string(),
            idle: crate::IdleConfig {
                enabled: self.idle,
                refresh: self.idle_refresh,
                recheck: self.idle_recheck,
                recheck_with: self.idle_recheck_with,
                lease_retry: self.idle_lease_retry,
                reconnect_max: self.idle_reconnect_max,
            },
            // The host's: it builds the `[oauth.NAME]` sources the accounts share with SMTP.
            oauth: worker_mail_auth::TokenSources::default(),
        }
    }
}

impl Section for InboundEmailPollerSettings {
    fn validate(&self) -> Vec<SettingError> {
        let mut problems = Problems::new();
        for (key, value) in [
            ("timeout", self.timeout),
            ("connect_timeout", self.connect_timeout),
            ("message_timeout", self.message_timeout),
            ("idle_refresh", self.idle_refresh),
            ("idle_lease_retry", self.idle_lease_retry),
            ("idle_reconnect_max", self.idle_reconnect_max),
        ] {
            problems.nonzero(key, value);
        }
        if let Some(recheck) = self.idle_recheck
            && recheck > self.idle_refresh
        {
            problems.add(
                "idle_recheck",
                format!(
                    "expected at most idle_refresh ({}), found {}",
                    humantime::format_duration(self.idle_refresh),
                    humantime::format_duration(recheck)
                ),
            );
        }
        if self.idle_refresh > crate::IDLE_REFRESH_MAX {
            problems.add(
                "idle_refresh",
                format!(
                    "expected at most 25m (servers may log an IDLE out after 29 minutes, RFC 2177), found {}",
                    humantime::format_duration(self.idle_refresh)
                ),
            );
        }
        for (key, value) in [
            ("max_message_bytes", self.max_message_bytes),
            ("max_body_chars", self.max_body_chars as u64),
            ("max_mime_parts", self.max_mime_parts as u64),
            ("max_mime_depth", self.max_mime_depth as u64),
            ("max_header_fields", self.max_header_fields as u64),
            ("max_header_bytes", self.max_header_bytes as u64),
            (
                "max_messages_per_account",
                u64::from(self.max_messages_per_account),
            ),
            ("max_message_attempts", u64::from(self.max_message_attempts)),
            ("account_concurrency", self.account_concurrency as u64),
        ] {
            problems.positive(key, value);
        }
        problems.into_vec()
    }
}

impl TimerSection for InboundEmailPollerSettings {
    const EVERY: Duration = Duration::from_secs(10);

    fn timeout(&self) -> Duration {
        self.timeout
    }

    /// One per account polled at once, and the idle lease that the replica keeping the IMAP
    /// IDLE sessions holds for as long as it does.
    fn pool_need(&self) -> worker_core::PoolNeed {
        let accounts = u32::try_from(self.account_concurrency)
            .unwrap_or(u32::MAX)
            .max(1);
        worker_core::PoolNeed::keyed(
            accounts.saturating_add(1),
            format!("account_concurrency {accounts} + 1 for its idle lease"),
        )
    }
}
