//! # job-inbound-email-poller: mail in IMAP becomes rows and `email.received` events
//!
//! A timer job. Each tick polls every configured IMAP account, fetches the messages newer than
//! the last UID it stored, and for each one writes, in **one transaction**, the inbound email
//! row, an outbox row carrying the `email.received` [`DomainEvent`] (published later by the
//! outbox drain), and the new last UID.
//!
//! ## One tick
//!
//! Accounts are polled side by side (at most [`PollerConfig::account_concurrency`] at once,
//! inside the tick's task: nothing is spawned), so an unreachable account never holds the
//! others back. For each account:
//!
//! 1. connect, secure (plain, STARTTLS or TLS), read the greeting and log in, all within
//!    [`PollerConfig::connect_timeout`];
//! 2. `SELECT` the mailbox and read its UIDVALIDITY. If it differs from the stored one the
//!    mailbox has been rebuilt: start it over from UID 1 (mail recorded before is found by
//!    its identity, below). At the account's first selection, start after its history (see
//!    "The first poll");
//! 3. `UID SEARCH UID <last+1>:*`, keeping only UIDs above the last one (`n:*` matches the
//!    last message even when it is older than `n`), at most
//!    [`PollerConfig::max_messages_per_account`] of them, in UID order;
//! 4. `UID FETCH (UID RFC822.SIZE)` for those: the sizes, before any body is fetched;
//! 5. each message, in order, under its own [`PollerConfig::message_timeout`]
//!    ([`worker_core::run_unit`]): the existence check on (account, mailbox, UIDVALIDITY, UID);
//!    then
//!    * over [`PollerConfig::max_message_size`]: only its header (`BODY.PEEK[HEADER]`, at most
//!      64 KiB) is fetched, and it is recorded `skipped` with the reason; no event;
//!    * otherwise `BODY.PEEK[]` (the mail is not marked seen), pre-scanned against
//!      [`PollerConfig::mail_limits`] (MIME parts, nesting, header fields and bytes; past
//!      one, it is recorded `skipped` unparsed with the reason, no event: see [`limits`]),
//!      parsed with mail-parser, bodies cut at [`PollerConfig::max_body_chars`], stored and
//!      announced. A mail that does not parse is stored with its parse error and announced
//!      all the same;
//! 6. `LOGOUT`.
//!
//! Messages are handled in UID order and the last UID only moves with a committed row, so the
//! first failure ends the account's poll for this tick (the session is dropped, since a
//! command cut short leaves it in an unknown state); the next tick starts at that message.
//! A message that fails [`PollerConfig::max_message_attempts`] times in a row (its timeout,
//! an answer we cannot parse, a row the database refuses) is recorded `skipped` with its last
//! error, so one poison message cannot hold its mailbox back for good. A failure that is not
//! the message's fault (the database or the server away) is not counted against it.
//!
//! ## Failures
//!
//! A FETCH that comes back without what it asked for (a size, a body) is taken as "the
//! message is gone" only once a NOOP's tagged OK was read after it: async-imap ends a
//! FETCH's answer alike at the server's tagged reply and at a dropped connection, and a
//! message taken as gone is skipped past for good.
//!
//! IMAP errors are classified once, in [`classify_imap`]: connection trouble and timeouts are
//! transient, a refused login or a missing mailbox permanent. Either way the account is
//! logged, counted in [`PollerStats`] and listed in the tick's report, and the other accounts
//! go on; the account is tried again at the next tick. The tick itself fails only when every
//! account failed (permanent only when every failure was).
//!
//! ## Idempotency: one mail, one event
//!
//! The row's key is (account, mailbox, UIDVALIDITY, UID): checked before anything is fetched,
//! and enforced by a unique constraint that the insert respects (`ON CONFLICT DO NOTHING`, the
//! event is written only with a new row). A restart, or a tick re-run after a crash, fetches
//! nothing twice. Row and event ids are derived from that key (UUID v5), so they are stable.
//!
//! A UID is not a mail, though: a mail moved out of the folder and back, or a mailbox rebuilt
//! under a new UIDVALIDITY, comes back under a new one. So once read, a mail is looked up by
//! its **identity**: its Message-ID where it has one, else the SHA-256 of its bytes (of its
//! header, for a mail over the size limit); both are recorded on every row. A mail whose
//! identity was recorded before from this mailbox, under any UIDVALIDITY, gets a row of its
//! own, `skipped`, naming the row it duplicates (`duplicate_of`), and no event. A new mail
//! that reuses an older Message-ID is such a duplicate too, and its row says so.
//!
//! ## The first poll
//!
//! Before its first connection to an account the poller writes the account's poll state row
//! with `watching_since`, the time its process started (a later process keeps the earliest,
//! so a host that could not reach the server at first does not lose what arrived since). At
//! the first selection the mailbox starts after the mail that arrived (INTERNALDATE) before
//! `watching_since` less [`HISTORY_MARGIN`]: a new installation does not answer years of mail,
//! and mail sent once the host was up is answered even if it landed before the first poll.
//! An empty or not yet existing mailbox starts at its beginning. [`ImapAccount::backfill`]
//! announces the history instead.
//!
//! ## What the host wires
//!
//! ```text
//! let config = PollerConfig {
//!     accounts: settings.imap.accounts.iter().map(|a| ImapAccount {
//!         name, host, port, security, username, password: resolved_secret, mailbox,
//!         backfill, ca_file }).collect(),
//!     connect_timeout: workers.timeouts.imap_connect,
//!     message_timeout: workers.timeouts.imap_message,
//!     events_exchange: broker.topology.events_exchange.clone(),
//!     max_messages_per_account: jobs.inbound_email_poller.batch_size.unwrap_or(100),
//!     ..PollerConfig::default()
//! };
//! let poller = InboundEmailPoller::new(pool.clone(), config)?;   // validates the config
//! let stats = poller.stats();                                    // for metrics
//! scheduler.add(poller, schedule, tick_timeout, lease);          // with the lease
//! ```
//!
//! The tick's timeout should exceed `connect_timeout` plus the time to handle a batch, or a
//! slow account's batch is cut short at every tick (nothing is lost: it resumes at the next).

pub mod imap;
pub mod limits;
pub mod parse;
pub mod stats;
mod store;

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};
use futures::{StreamExt, TryStreamExt};
use sqlx::PgPool;
use tokio_rustls::rustls;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;
use uuid::Uuid;
use worker_core::{Failure, TickReport, TimerJob, UnitError, WorkContext, run_unit};
use worker_messages::{DomainEvent, EMAIL_RECEIVED, EmailReceived};
use worker_store::outbox::OutboxMessage;

pub use imap::{ImapError, Stage, classify_imap};
pub use limits::{MailLimits, OverLimit};
pub use parse::{ParsedEmail, parse_email};
pub use stats::{AccountStatus, PollerStats};

use crate::imap::{Session, timed};
use crate::store::{Identity, NewInbound, PollState};

/// The job's name, in logs, metrics and the attempt log.
pub const JOB_NAME: &str = "inbound-email-poller";

/// At the first poll of an account, mail that arrived up to this long before the poller
/// started watching it is still announced: the IMAP server's clock and ours may differ, and
/// mail sent to a host that is just starting must not be taken for history.
pub const HISTORY_MARGIN: Duration = Duration::from_secs(5 * 60);

/// The most header bytes fetched of a mail over the size limit.
const MAX_HEADER_BYTES: u32 = 64 * 1024;

/// How the connection to an account is secured.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Security {
    /// No encryption: for a server on loopback only.
    Plain,
    /// Plain connect, then STARTTLS; an account whose server refuses it is not polled.
    Starttls,
    /// TLS from the first byte (port 993, usually).
    Tls,
}

/// One IMAP account to poll.
#[derive(Clone, PartialEq, Eq)]
pub struct ImapAccount {
    /// A short, unique name: in logs, metrics, the poll state and the events.
    pub name: String,
    pub host: String,
    pub port: u16,
    pub security: Security,
    pub username: String,
    /// Resolved by the host (from the environment or a file); never printed.
    pub password: String,
    pub mailbox: String,
    /// Announce the mail already in the mailbox at the first poll. Off: the first poll
    /// starts after the mail that arrived before the poller started watching the account
    /// (see the crate docs, "The first poll").
    pub backfill: bool,
    /// CA certificates (PEM) trusted for STARTTLS and TLS besides the public web PKI's roots:
    /// a private CA. The server's certificate must also name `host`.
    pub ca_file: Option<std::path::PathBuf>,
}

impl fmt::Debug for ImapAccount {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ImapAccount")
            .field("name", &self.name)
            .field("host", &self.host)
            .field("port", &self.port)
            .field("security", &self.security)
            .field("username", &self.username)
            .field("password", &"[redacted]")
            .field("mailbox", &self.mailbox)
            .field("backfill", &self.backfill)
            .field("ca_file", &self.ca_file)
            .finish()
    }
}

/// Everything the poller needs from the settings.
#[derive(Debug, Clone, PartialEq)]
pub struct PollerConfig {
    pub accounts: Vec<ImapAccount>,
    /// Connect, TLS, greeting and login of one account.
    pub connect_timeout: Duration,
    /// One message (existence check, fetch, parse, store), and each other command of the
    /// session (SELECT, SEARCH, the size FETCH, LOGOUT).
    pub message_timeout: Duration,
    /// Mail larger than this (RFC822.SIZE, bytes) is recorded as skipped without its body.
    pub max_message_size: u64,
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
}

impl Default for PollerConfig {
    fn default() -> Self {
        Self {
            accounts: Vec::new(),
            connect_timeout: Duration::from_secs(60),
            message_timeout: Duration::from_secs(30),
            max_message_size: 25 * 1024 * 1024,
            max_body_chars: 100_000,
            mail_limits: MailLimits::default(),
            max_messages_per_account: 100,
            max_message_attempts: 3,
            account_concurrency: 4,
            events_exchange: "events".into(),
        }
    }
}

/// A configuration the poller cannot run with; names the field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {problem}")]
pub struct ConfigError {
    /// `accounts[1].name`, `message_timeout`, ...
    pub field: String,
    pub problem: String,
}

impl PollerConfig {
    /// Checks what the poller relies on: unique non-empty account names, non-empty hosts,
    /// user names and mailboxes, non-zero limits.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let err = |field: String, problem: &str| ConfigError {
            field,
            problem: problem.to_string(),
        };
        let mut seen = std::collections::HashSet::new();
        for (i, a) in self.accounts.iter().enumerate() {
            if a.name.trim().is_empty() {
                return Err(err(format!("accounts[{i}].name"), "must not be empty"));
            }
            if !seen.insert(a.name.as_str()) {
                return Err(err(
                    format!("accounts[{i}].name"),
                    "is used by another account; names must be unique",
                ));
            }
            for (field, value) in [
                ("host", &a.host),
                ("username", &a.username),
                ("mailbox", &a.mailbox),
            ] {
                if value.trim().is_empty() {
                    return Err(err(format!("accounts[{i}].{field}"), "must not be empty"));
                }
            }
            if a.port == 0 {
                return Err(err(format!("accounts[{i}].port"), "must not be 0"));
            }
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
            ("max_message_size", self.max_message_size == 0),
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
        Ok(())
    }
}

/// What happened to the messages of one account in one tick.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MessageCounts {
    /// Stored and announced (parse errors included).
    pub stored: u64,
    /// Of `stored`, those that did not parse.
    pub parse_errors: u64,
    /// Recorded as skipped because of their size.
    pub too_large: u64,
    /// Recorded as skipped, unparsed, because their structure passed a [`MailLimits`] bound.
    pub too_complex: u64,
    /// Recorded as skipped after failing `max_message_attempts` times.
    pub gave_up: u64,
    /// Already stored under their UID, or (after a UIDVALIDITY change) their Message-ID.
    pub duplicates: u64,
    /// Gone from the mailbox between the search and the fetch.
    pub vanished: u64,
}

impl MessageCounts {
    /// Messages that got a row this tick.
    pub fn recorded(&self) -> u64 {
        self.stored + self.too_large + self.too_complex + self.gave_up
    }
}

/// One account's part of a tick.
#[derive(Debug, Clone, PartialEq)]
pub struct AccountReport {
    pub account: String,
    pub counts: MessageCounts,
    /// Why the account's poll ended early; the counts say what was done before.
    pub failure: Option<Failure>,
    /// More new messages were waiting than one tick handles.
    pub more_waiting: bool,
    /// The UIDVALIDITY changed and the mailbox was started over.
    pub rescanned: bool,
}

/// What one tick did, account by account.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct PollReport {
    pub accounts: Vec<AccountReport>,
    /// The tick's token fired before every account was done.
    pub cancelled: bool,
}

impl PollReport {
    /// The accounts whose poll failed, with why.
    pub fn failed(&self) -> impl Iterator<Item = (&str, &Failure)> {
        self.accounts
            .iter()
            .filter_map(|a| a.failure.as_ref().map(|f| (a.account.as_str(), f)))
    }

    /// The counts of all accounts together.
    pub fn totals(&self) -> MessageCounts {
        self.accounts
            .iter()
            .fold(MessageCounts::default(), |mut t, a| {
                t.stored += a.counts.stored;
                t.parse_errors += a.counts.parse_errors;
                t.too_large += a.counts.too_large;
                t.too_complex += a.counts.too_complex;
                t.gave_up += a.counts.gave_up;
                t.duplicates += a.counts.duplicates;
                t.vanished += a.counts.vanished;
                t
            })
    }

    /// One line for the tick's log: the counts and each failed account.
    pub fn summary(&self) -> String {
        let t = self.totals();
        let failed: Vec<String> = self
            .failed()
            .map(|(name, f)| format!("{name} ({}: {f})", f.class()))
            .collect();
        let mut line = format!(
            "{} accounts: stored {} ({} unparsed), skipped {} too large, {} too complex and {} failing, {} duplicates",
            self.accounts.len(),
            t.stored,
            t.parse_errors,
            t.too_large,
            t.too_complex,
            t.gave_up,
            t.duplicates
        );
        if !failed.is_empty() {
            line.push_str(&format!("; {} failed: {}", failed.len(), failed.join(", ")));
        }
        line
    }
}

/// How one message went.
enum Handled {
    Stored { parse_error: bool },
    TooLarge,
    TooComplex,
    GaveUp,
    Duplicate,
    Vanished,
}

impl Handled {
    /// The `outcome` of the message's `poll` span.
    fn as_str(&self) -> &'static str {
        match self {
            Self::Stored { .. } => "stored",
            Self::TooLarge => "too-large",
            Self::TooComplex => "too-complex",
            Self::GaveUp => "gave-up",
            Self::Duplicate => "duplicate",
            Self::Vanished => "vanished",
        }
    }
}

/// The span of one message's poll, `poll <account>`: the root of the mail's trace (the
/// outbox row of its `email.received` event stores this span's context, and every later hop
/// continues it), linked to the account's poll in the tick. Its `email.message_id` is
/// recorded once the mail is read, its `outcome` when the message is done.
fn message_span(account: &ImapAccount, uidvalidity: u32, uid: u32) -> tracing::Span {
    let span = tracing::info_span!(
        parent: None,
        "poll",
        otel.name = %format_args!("poll {}", account.name),
        otel.kind = "consumer",
        otel.status_code = tracing::field::Empty,
        job = JOB_NAME,
        account = %account.name,
        mailbox = %account.mailbox,
        imap.uidvalidity = uidvalidity,
        imap.uid = uid,
        inbound_email.id = %inbound_email_id(&account.name, &account.mailbox, uidvalidity, uid),
        email.message_id = tracing::field::Empty,
        outcome = tracing::field::Empty,
    );
    span.follows_from(tracing::Span::current());
    span
}

/// Records the mail's Message-ID on the current (the message's `poll`) span.
fn record_message_id(parsed: &ParsedEmail) {
    if let Some(id) = &parsed.message_id {
        tracing::Span::current().record("email.message_id", id.as_str());
    }
}

/// Why one message failed, and whether the failure is the message's own fault.
struct MessageFailure {
    failure: Failure,
    /// Counts as one of the message's `max_message_attempts`.
    strike: bool,
    /// The IMAP session is in an unknown state and must not be used again.
    session_broken: bool,
}

impl MessageFailure {
    fn imap(err: &ImapError) -> Self {
        use async_imap::error::Error as E;
        let failure = classify_imap(err);
        // What the server says about this message (a NO, an answer we cannot parse, no
        // answer in time) counts against it; a lost connection does not.
        let strike = match err {
            ImapError::Timeout { .. } | ImapError::Protocol { .. } => true,
            ImapError::Io { .. } | ImapError::Handshake { .. } => false,
            ImapError::Imap { source, .. } => !matches!(source, E::Io(_) | E::ConnectionLost),
        };
        Self {
            failure,
            strike,
            session_broken: true,
        }
    }

    fn db(failure: Failure) -> Self {
        Self {
            strike: failure.is_permanent(),
            failure,
            session_broken: false,
        }
    }
}

/// A message's failures in a row, kept in memory (a restart forgives them).
#[derive(Debug, Clone)]
struct Strikes {
    count: u32,
    last_error: String,
}

type StrikeKey = (String, String, u32, u32);

/// The inbound email poller. See the crate docs.
pub struct InboundEmailPoller {
    pool: PgPool,
    config: Arc<PollerConfig>,
    /// Each account's TLS client (its own CA file, if any), by account name.
    tls: HashMap<String, Arc<rustls::ClientConfig>>,
    stats: PollerStats,
    strikes: Mutex<HashMap<StrikeKey, Strikes>>,
    /// When this poller was made: the `watching_since` of an account it is the first to poll.
    started_at: DateTime<Utc>,
    /// The accounts whose poll state row this process has made sure of.
    watched: Mutex<HashSet<String>>,
}

impl fmt::Debug for InboundEmailPoller {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("InboundEmailPoller")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

/// The namespace of the row and event ids derived here.
const ID_NAMESPACE: Uuid = Uuid::from_u128(0x8c0f_3d2a_61b4_4f57_a9e2_1d7c_5b30_f4a6);

/// The inbound email row's id: derived from (account, mailbox, UIDVALIDITY, UID).
pub fn inbound_email_id(account: &str, mailbox: &str, uidvalidity: u32, uid: u32) -> Uuid {
    let name = format!("{account}\u{0}{mailbox}\u{0}{uidvalidity}\u{0}{uid}");
    Uuid::new_v5(&ID_NAMESPACE, name.as_bytes())
}

/// The `email.received` event's id for an inbound email row.
pub fn event_id(inbound_email_id: Uuid) -> Uuid {
    let mut name = b"email.received:".to_vec();
    name.extend_from_slice(inbound_email_id.as_bytes());
    Uuid::new_v5(&ID_NAMESPACE, &name)
}

impl InboundEmailPoller {
    /// A poller over `pool` (which must hold the migrations) for the accounts in `config`.
    pub fn new(pool: PgPool, config: PollerConfig) -> Result<Self, ConfigError> {
        config.validate()?;
        let mut tls = HashMap::new();
        for (i, account) in config.accounts.iter().enumerate() {
            let client =
                imap::tls_config(account.ca_file.as_deref()).map_err(|problem| ConfigError {
                    field: format!("accounts[{i}].ca_file"),
                    problem,
                })?;
            tls.insert(account.name.clone(), client);
        }
        let stats = PollerStats::default();
        for account in &config.accounts {
            stats.register(&account.name);
        }
        Ok(Self {
            pool,
            config: Arc::new(config),
            tls,
            stats,
            strikes: Mutex::new(HashMap::new()),
            started_at: Utc::now(),
            watched: Mutex::new(HashSet::new()),
        })
    }

    /// The per-account counters and last errors, for metrics and operators.
    pub fn stats(&self) -> PollerStats {
        self.stats.clone()
    }

    pub fn config(&self) -> &PollerConfig {
        &self.config
    }

    /// One tick's work, account by account (the [`TimerJob::tick`] is this, summarised).
    pub async fn poll(&self, ctx: &WorkContext) -> PollReport {
        let cancel = &ctx.cancel;
        // The futures are built first (they do nothing until polled), so that the stream's
        // type names no closure: that keeps the tick's future `Send`.
        let polls: Vec<_> = self
            .config
            .accounts
            .iter()
            .map(|account| {
                let span = tracing::info_span!(
                    "imap_account",
                    job = JOB_NAME,
                    account = %account.name,
                    mailbox = %account.mailbox
                );
                self.poll_account(account, cancel).instrument(span)
            })
            .collect();
        let accounts: Vec<AccountReport> = futures::stream::iter(polls)
            .buffered(self.config.account_concurrency.max(1))
            .collect()
            .await;
        for report in &accounts {
            self.stats.record(report);
            match &report.failure {
                Some(failure) => tracing::warn!(
                    job = JOB_NAME,
                    account = %report.account,
                    class = %failure.class(),
                    reason = failure.reason(),
                    error = %failure,
                    stored = report.counts.stored,
                    "polling the account failed; the other accounts go on, and this one is tried again at the next tick"
                ),
                None if report.counts.recorded() > 0 => tracing::info!(
                    job = JOB_NAME,
                    account = %report.account,
                    stored = report.counts.stored,
                    unparsed = report.counts.parse_errors,
                    too_large = report.counts.too_large,
                    gave_up = report.counts.gave_up,
                    more_waiting = report.more_waiting,
                    "new mail recorded"
                ),
                None => {}
            }
        }
        PollReport {
            accounts,
            cancelled: cancel.is_cancelled(),
        }
    }

    async fn poll_account(
        &self,
        account: &ImapAccount,
        cancel: &CancellationToken,
    ) -> AccountReport {
        let mut report = AccountReport {
            account: account.name.clone(),
            counts: MessageCounts::default(),
            failure: None,
            more_waiting: false,
            rescanned: false,
        };
        {
            // Everything below is bounded by its own timeouts; the token ends it sooner.
            let work = self.poll_account_until_done(account, cancel, &mut report);
            tokio::pin!(work);
            tokio::select! {
                biased;
                () = cancel.cancelled() => {}
                () = &mut work => {}
            }
        }
        report
    }

    async fn poll_account_until_done(
        &self,
        account: &ImapAccount,
        cancel: &CancellationToken,
        report: &mut AccountReport,
    ) {
        if let Err(failure) = self.watch(account).await {
            report.failure = Some(failure);
            return;
        }
        let limit = self.config.connect_timeout;
        let Some(tls) = self.tls.get(&account.name) else {
            // `new` builds one per configured account; only a foreign account can miss it.
            report.failure = Some(Failure::permanent(
                "imap-config",
                format!("no TLS client for account `{}`", account.name),
            ));
            return;
        };
        let connected = match tokio::time::timeout(limit, imap::connect(account, tls)).await {
            Err(_) => Err(ImapError::Timeout {
                stage: Stage::Connect,
                limit,
            }),
            Ok(connected) => connected,
        };
        let mut session = match connected {
            Ok(session) => session,
            Err(err) => {
                report.failure = Some(classify_imap(&err));
                return;
            }
        };
        let session_ok = self
            .poll_mailbox(&mut session, account, cancel, report)
            .await;
        if session_ok {
            // A polite goodbye, bounded; its failure changes nothing.
            let limit = self.config.message_timeout.min(Duration::from_secs(5));
            if let Err(err) = timed(Stage::Logout, limit, session.logout()).await {
                tracing::debug!(account = %account.name, error = %err, "LOGOUT failed");
            }
        }
    }

    /// Polls the selected mailbox; returns whether the session is still usable.
    async fn poll_mailbox(
        &self,
        session: &mut Session,
        account: &ImapAccount,
        cancel: &CancellationToken,
        report: &mut AccountReport,
    ) -> bool {
        let limit = self.config.message_timeout;
        let mailbox = match timed(Stage::Select, limit, session.select(&account.mailbox)).await {
            Ok(mailbox) => mailbox,
            Err(err) => {
                report.failure = Some(classify_imap(&err));
                return !matches!(err, ImapError::Timeout { .. });
            }
        };
        let Some(uidvalidity) = mailbox.uid_validity else {
            report.failure = Some(classify_imap(&ImapError::Protocol {
                stage: Stage::Select,
                detail: "the server reported no UIDVALIDITY".into(),
            }));
            return true;
        };
        let state = match self
            .current_state(session, account, &mailbox, uidvalidity, report)
            .await
        {
            Ok(state) => state,
            Err((failure, session_ok)) => {
                report.failure = Some(failure);
                return session_ok;
            }
        };
        let Some(first) = state.last_uid.checked_add(1) else {
            return true;
        };
        if mailbox.exists == 0 || mailbox.uid_next.is_some_and(|next| next <= first) {
            return true;
        }

        let found = match timed(
            Stage::Search,
            limit,
            session.uid_search(format!("UID {first}:*")),
        )
        .await
        {
            Ok(found) => found,
            Err(err) => {
                report.failure = Some(classify_imap(&err));
                return false;
            }
        };
        // `first:*` also matches the last message when none is newer: keep only newer UIDs.
        let mut uids: Vec<u32> = found.into_iter().filter(|uid| *uid >= first).collect();
        uids.sort_unstable();
        let max = usize::try_from(self.config.max_messages_per_account).unwrap_or(usize::MAX);
        if uids.len() > max {
            report.more_waiting = true;
            uids.truncate(max);
        }
        if uids.is_empty() {
            return true;
        }

        let sizes = match timed(Stage::Fetch, limit, fetch_sizes(session, &uids)).await {
            Ok(sizes) => sizes,
            Err(err) => {
                report.failure = Some(classify_imap(&err));
                return false;
            }
        };

        for uid in uids {
            let size = sizes.get(&uid).copied();
            let span = message_span(account, uidvalidity, uid);
            let unit = run_unit(JOB_NAME, limit, cancel, |_token| async {
                Ok(self
                    .handle_message(session, account, uidvalidity, uid, size)
                    .await)
            })
            .instrument(span.clone())
            .await;
            let key = (
                account.name.clone(),
                account.mailbox.clone(),
                uidvalidity,
                uid,
            );
            let outcome = match &unit {
                Ok(Ok(handled)) => handled.as_str(),
                Ok(Err(_)) | Err(UnitError::Failed(_)) => {
                    span.record("otel.status_code", "ERROR");
                    "failed"
                }
                Err(UnitError::Cancelled) => "cancelled",
            };
            span.record("outcome", outcome);
            match unit {
                Ok(Ok(handled)) => {
                    self.forgive(&key);
                    match handled {
                        Handled::Stored { parse_error } => {
                            report.counts.stored += 1;
                            report.counts.parse_errors += u64::from(parse_error);
                        }
                        Handled::TooLarge => report.counts.too_large += 1,
                        Handled::TooComplex => report.counts.too_complex += 1,
                        Handled::GaveUp => report.counts.gave_up += 1,
                        Handled::Duplicate => report.counts.duplicates += 1,
                        Handled::Vanished => report.counts.vanished += 1,
                    }
                }
                Ok(Err(failed)) => {
                    if failed.strike {
                        self.strike(&key, &failed.failure);
                    }
                    report.failure = Some(failed.failure.context(format!("message UID {uid}")));
                    return !failed.session_broken;
                }
                Err(UnitError::Failed(failure)) => {
                    // Its timeout, or a panic: the message's own fault, as far as we can tell.
                    self.strike(&key, &failure);
                    report.failure = Some(failure.context(format!("message UID {uid}")));
                    return false;
                }
                Err(UnitError::Cancelled) => return false,
            }
        }
        true
    }

    /// Makes sure, once per process, that the account's poll state row is there before its
    /// first connection, so that `watching_since` is the start of the first process that
    /// tried, whether or not its server answered.
    async fn watch(&self, account: &ImapAccount) -> Result<(), Failure> {
        let known = self
            .watched
            .lock()
            .is_ok_and(|watched| watched.contains(&account.name));
        if known {
            return Ok(());
        }
        let limit = self.config.message_timeout;
        let watched = store::watch(&self.pool, &account.name, &account.mailbox, self.started_at);
        match tokio::time::timeout(limit, watched).await {
            Ok(Ok(())) => {
                if let Ok(mut watched) = self.watched.lock() {
                    watched.insert(account.name.clone());
                }
                Ok(())
            }
            Ok(Err(failure)) => Err(failure),
            Err(_) => Err(Failure::transient(format!(
                "writing the poll state: no answer from the database within {}ms",
                limit.as_millis()
            ))),
        }
    }

    /// The poll state under the server's `uidvalidity`: as stored; started over from UID 1
    /// when the UIDVALIDITY changed; or, at the first selection, started after the history
    /// (from UID 1 with `backfill`). On failure, whether the session is still usable.
    async fn current_state(
        &self,
        session: &mut Session,
        account: &ImapAccount,
        mailbox: &async_imap::types::Mailbox,
        uidvalidity: u32,
        report: &mut AccountReport,
    ) -> Result<PollState, (Failure, bool)> {
        let (name, folder) = (account.name.as_str(), account.mailbox.as_str());
        let limit = self.config.message_timeout;
        let stored = db_timed(limit, "reading the poll state", async {
            store::load_state(&self.pool, name, folder).await
        })
        .await
        .map_err(|f| (f, true))?;
        let watching_since = stored.map_or(self.started_at, |s| s.watching_since);
        let last_uid = match stored {
            Some(state) if state.uidvalidity == uidvalidity => return Ok(state),
            Some(previous) if previous.uidvalidity != 0 => {
                report.rescanned = true;
                tracing::warn!(
                    job = JOB_NAME,
                    account = name,
                    mailbox = folder,
                    previous = previous.uidvalidity,
                    current = uidvalidity,
                    "the mailbox's UIDVALIDITY changed: starting it over, skipping mail already recorded (by Message-ID, or content)"
                );
                0
            }
            // The first selection of this mailbox.
            _ if account.backfill => {
                tracing::info!(
                    job = JOB_NAME,
                    account = name,
                    mailbox = folder,
                    "first poll of the account with backfill: every message in it is announced"
                );
                0
            }
            _ => {
                let cutoff = watching_since - HISTORY_MARGIN;
                let last = self
                    .history_end(session, mailbox, cutoff)
                    .await
                    .map_err(|err| (classify_imap(&err), false))?;
                tracing::info!(
                    job = JOB_NAME,
                    account = name,
                    mailbox = folder,
                    messages = mailbox.exists,
                    history_up_to_uid = last,
                    cutoff = %cutoff,
                    "first poll of the account: the mail that arrived before the cutoff is history and is not announced (set `backfill = true` on the account to announce it)"
                );
                last
            }
        };
        db_timed(limit, "writing the poll state", async {
            store::start_at(&self.pool, name, folder, uidvalidity, last_uid).await
        })
        .await
        .map_err(|f| (f, true))?;
        Ok(PollState {
            uidvalidity,
            last_uid,
            watching_since,
        })
    }

    /// The UID the history ends at: the mail that arrived (INTERNALDATE) before `cutoff`, up
    /// to the first message that arrived after it; 0 for an empty mailbox.
    async fn history_end(
        &self,
        session: &mut Session,
        mailbox: &async_imap::types::Mailbox,
        cutoff: DateTime<Utc>,
    ) -> Result<u32, ImapError> {
        if mailbox.exists == 0 {
            return Ok(0);
        }
        let limit = self.config.message_timeout;
        // SEARCH SINCE compares dates only, in the server's time zone: a day earlier, then
        // each candidate's INTERNALDATE exactly.
        let day = (cutoff - chrono::Duration::days(1)).format("%-d-%b-%Y");
        let candidates = timed(
            Stage::Search,
            limit,
            session.uid_search(format!("SINCE {day}")),
        )
        .await?;
        let mut candidates: Vec<u32> = candidates.into_iter().collect();
        candidates.sort_unstable();
        if !candidates.is_empty() {
            let arrived = timed(Stage::Fetch, limit, fetch_arrivals(session, &candidates)).await?;
            // A message whose arrival is unknown counts as new: better answered than lost.
            let first_new = candidates
                .iter()
                .find(|uid| arrived.get(uid).is_none_or(|at| *at >= cutoff));
            if let Some(first_new) = first_new {
                return Ok(first_new.saturating_sub(1));
            }
        }
        if let Some(next) = mailbox.uid_next {
            return Ok(next.saturating_sub(1));
        }
        let all = timed(Stage::Search, limit, session.uid_search("ALL")).await?;
        Ok(all.into_iter().max().unwrap_or(0))
    }

    async fn handle_message(
        &self,
        session: &mut Session,
        account: &ImapAccount,
        uidvalidity: u32,
        uid: u32,
        size: Option<u32>,
    ) -> Result<Handled, MessageFailure> {
        let (name, mailbox) = (account.name.as_str(), account.mailbox.as_str());
        let pool = &self.pool;
        let limit = self.config.message_timeout;
        if store::exists(pool, name, mailbox, uidvalidity, uid)
            .await
            .map_err(MessageFailure::db)?
        {
            store::skip_past(pool, name, mailbox, uidvalidity, uid)
                .await
                .map_err(MessageFailure::db)?;
            return Ok(Handled::Duplicate);
        }
        let Some(size) = size else {
            store::skip_past(pool, name, mailbox, uidvalidity, uid)
                .await
                .map_err(MessageFailure::db)?;
            return Ok(Handled::Vanished);
        };
        let id = inbound_email_id(name, mailbox, uidvalidity, uid);
        let key = (name.to_string(), mailbox.to_string(), uidvalidity, uid);

        if let Some(strikes) = self.strikes_of(&key)
            && strikes.count >= self.config.max_message_attempts
        {
            let reason = format!(
                "gave up after {} failed attempts; the last: {}",
                strikes.count, strikes.last_error
            );
            tracing::error!(job = JOB_NAME, account = name, uid, %reason, "a message keeps failing: recording it as skipped");
            let row = NewInbound {
                id,
                account: name,
                mailbox,
                uidvalidity,
                uid,
                skip_reason: Some(reason),
                parsed: &ParsedEmail::default(),
                raw_size: u64::from(size),
                content_hash: None,
                duplicate_of: None,
            };
            store::record(pool, &row, None)
                .await
                .map_err(MessageFailure::db)?;
            return Ok(Handled::GaveUp);
        }

        if u64::from(size) > self.config.max_message_size {
            let query = format!("BODY.PEEK[HEADER]<0.{MAX_HEADER_BYTES}>");
            let header = timed(
                Stage::Fetch,
                limit,
                fetch_one(session, uid, &query, Part::Header),
            )
            .await
            .map_err(|e| MessageFailure::imap(&e))?;
            let parsed = header
                .as_deref()
                .map(parse::parse_headers)
                .unwrap_or_default();
            record_message_id(&parsed);
            let hash = content_hash(b"header\0", header.as_deref().unwrap_or_default());
            if self
                .recorded_before(account, uidvalidity, uid, size, &parsed, &hash)
                .await?
            {
                return Ok(Handled::Duplicate);
            }
            let reason = format!(
                "the message is {size} bytes, over the limit of {} bytes; its body was not fetched",
                self.config.max_message_size
            );
            tracing::warn!(
                job = JOB_NAME,
                account = name,
                uid,
                size,
                "a message over the size limit is recorded as skipped"
            );
            let row = NewInbound {
                id,
                account: name,
                mailbox,
                uidvalidity,
                uid,
                skip_reason: Some(reason),
                parsed: &parsed,
                raw_size: u64::from(size),
                content_hash: Some(&hash),
                duplicate_of: None,
            };
            store::record(pool, &row, None)
                .await
                .map_err(MessageFailure::db)?;
            return Ok(Handled::TooLarge);
        }

        let raw = timed(
            Stage::Fetch,
            limit,
            fetch_one(session, uid, "BODY.PEEK[]", Part::Body),
        )
        .await
        .map_err(|e| MessageFailure::imap(&e))?;
        let Some(raw) = raw else {
            store::skip_past(pool, name, mailbox, uidvalidity, uid)
                .await
                .map_err(MessageFailure::db)?;
            return Ok(Handled::Vanished);
        };
        let hash = content_hash(b"mail\0", &raw);
        let parsed =
            match parse::parse_within(&raw, self.config.max_body_chars, &self.config.mail_limits) {
                Ok(parsed) => parsed,
                Err(set_aside) => {
                    return self
                        .set_aside(account, uidvalidity, uid, size, *set_aside, &hash)
                        .await;
                }
            };
        record_message_id(&parsed);
        if self
            .recorded_before(account, uidvalidity, uid, size, &parsed, &hash)
            .await?
        {
            return Ok(Handled::Duplicate);
        }
        if let Some(error) = &parsed.parse_error {
            tracing::warn!(job = JOB_NAME, account = name, uid, %error, "a message did not parse; it is stored and announced with its parse error");
        }

        let event = email_received_event(id, account, &parsed);
        let message = OutboxMessage::json(event.id.to_string(), EMAIL_RECEIVED, &event)
            .map_err(|e| MessageFailure::db(Failure::permanent("event-encoding", e)))?
            .with_correlation_id(id.to_string())
            .with_header("account", account.name.as_str());
        let row = NewInbound {
            id,
            account: name,
            mailbox,
            uidvalidity,
            uid,
            skip_reason: None,
            parsed: &parsed,
            raw_size: u64::from(size),
            content_hash: Some(&hash),
            duplicate_of: None,
        };
        let inserted = store::record(
            pool,
            &row,
            Some((
                &self.config.events_exchange,
                EMAIL_RECEIVED,
                &message,
                event.id,
            )),
        )
        .await
        .map_err(MessageFailure::db)?;
        if inserted {
            Ok(Handled::Stored {
                parse_error: parsed.parse_error.is_some(),
            })
        } else {
            Ok(Handled::Duplicate)
        }
    }

    /// Records a mail the pre-scan set aside: `skipped` with the limit it passed, the fields
    /// of its own header section when those could be read, no event.
    async fn set_aside(
        &self,
        account: &ImapAccount,
        uidvalidity: u32,
        uid: u32,
        size: u32,
        set_aside: parse::SetAside,
        hash: &str,
    ) -> Result<Handled, MessageFailure> {
        let (name, mailbox) = (account.name.as_str(), account.mailbox.as_str());
        let pool = &self.pool;
        let id = inbound_email_id(name, mailbox, uidvalidity, uid);
        let parsed = set_aside.headers;
        let refused = set_aside.refused;
        record_message_id(&parsed);
        if self
            .recorded_before(account, uidvalidity, uid, size, &parsed, hash)
            .await?
        {
            return Ok(Handled::Duplicate);
        }
        let reason = format!("{refused}, over the poller's mail limits; not parsed");
        tracing::warn!(job = JOB_NAME, account = name, uid, size, %reason, "a message past the mail limits is recorded as skipped");
        let row = NewInbound {
            id,
            account: name,
            mailbox,
            uidvalidity,
            uid,
            skip_reason: Some(reason),
            parsed: &parsed,
            raw_size: u64::from(size),
            content_hash: Some(hash),
            duplicate_of: None,
        };
        store::record(pool, &row, None)
            .await
            .map_err(MessageFailure::db)?;
        Ok(Handled::TooComplex)
    }

    /// Whether this mail was recorded before from this mailbox under another UID (moved out
    /// and back, a mailbox rebuilt, a Message-ID reused): if so, its own row is recorded
    /// `skipped`, naming the earlier one, with no event, and the last UID moves past it.
    async fn recorded_before(
        &self,
        account: &ImapAccount,
        uidvalidity: u32,
        uid: u32,
        size: u32,
        parsed: &ParsedEmail,
        hash: &str,
    ) -> Result<bool, MessageFailure> {
        let (pool, name, mailbox) = (&self.pool, &account.name, &account.mailbox);
        let identity = match &parsed.message_id {
            Some(id) => Identity::MessageId(id),
            None => Identity::Content(hash),
        };
        let Some(earlier) = store::earlier(pool, name, mailbox, uidvalidity, uid, identity)
            .await
            .map_err(MessageFailure::db)?
        else {
            return Ok(false);
        };
        let same = match identity {
            Identity::MessageId(id) => format!("the same Message-ID {id}"),
            Identity::Content(hash) => format!("the same content (SHA-256 {hash})"),
        };
        let reason = format!(
            "a duplicate of the mail recorded as {} (UIDVALIDITY {}, UID {}): {same}; not announced again",
            earlier.id, earlier.uidvalidity, earlier.uid
        );
        tracing::info!(job = JOB_NAME, account = %name, uid, duplicate_of = %earlier.id, "a mail recorded before under another UID: recorded as a duplicate, not announced");
        let row = NewInbound {
            id: inbound_email_id(name, mailbox, uidvalidity, uid),
            account: name,
            mailbox,
            uidvalidity,
            uid,
            skip_reason: Some(reason),
            parsed,
            raw_size: u64::from(size),
            content_hash: Some(hash),
            duplicate_of: Some(earlier.id),
        };
        store::record(pool, &row, None)
            .await
            .map_err(MessageFailure::db)?;
        Ok(true)
    }

    fn strikes_of(&self, key: &StrikeKey) -> Option<Strikes> {
        self.strikes
            .lock()
            .ok()
            .and_then(|strikes| strikes.get(key).cloned())
    }

    fn strike(&self, key: &StrikeKey, failure: &Failure) {
        if let Ok(mut strikes) = self.strikes.lock() {
            let entry = strikes.entry(key.clone()).or_insert(Strikes {
                count: 0,
                last_error: String::new(),
            });
            entry.count += 1;
            entry.last_error = failure.to_string();
        }
    }

    fn forgive(&self, key: &StrikeKey) {
        if let Ok(mut strikes) = self.strikes.lock() {
            strikes.remove(key);
        }
    }
}

/// The `email.received` event for a stored mail.
fn email_received_event(id: Uuid, account: &ImapAccount, parsed: &ParsedEmail) -> DomainEvent {
    let data = EmailReceived {
        inbound_email_id: id,
        account: account.name.clone(),
        mailbox: account.mailbox.clone(),
        message_id: parsed.message_id.clone(),
        from: parsed.from_address.clone(),
        from_name: parsed.from_name.clone(),
        to: parsed.to.clone(),
        subject: parsed.subject.clone(),
        text: parsed.text_body.clone(),
        references: parsed.references.clone(),
        parse_error: parsed.parse_error.clone(),
        in_reply_to: parsed.in_reply_to.clone(),
        cc: parsed.cc.clone(),
        date: parsed.sent_at,
        text_truncated: parsed.text_truncated,
        auto_submitted: parsed.auto_submitted.clone(),
        precedence: parsed.precedence.clone(),
        list_id: parsed.list_id.clone(),
        return_path: parsed.return_path.clone(),
        null_sender: parsed.return_path.as_deref() == Some(""),
    };
    DomainEvent {
        id: event_id(id),
        event_type: EMAIL_RECEIVED.into(),
        occurred_at: Utc::now(),
        // A struct of strings, lists and options always serializes.
        data: serde_json::to_value(&data).unwrap_or(serde_json::Value::Null),
    }
}

/// The hex SHA-256 of `bytes`, under a label that keeps a header's hash apart from a whole
/// mail's.
fn content_hash(label: &[u8], bytes: &[u8]) -> String {
    use sha2::{Digest, Sha256};
    let digest = Sha256::new()
        .chain_update(label)
        .chain_update(bytes)
        .finalize();
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

/// A database step of the poll under `limit`.
async fn db_timed<T>(
    limit: Duration,
    what: &str,
    step: impl Future<Output = Result<T, Failure>>,
) -> Result<T, Failure> {
    tokio::time::timeout(limit, step).await.unwrap_or_else(|_| {
        Err(Failure::transient(format!(
            "{what}: no answer from the database within {}ms",
            limit.as_millis()
        )))
    })
}

/// `UID FETCH <uids> (UID INTERNALDATE)`: when each message still there arrived.
async fn fetch_arrivals(
    session: &mut Session,
    uids: &[u32],
) -> Result<HashMap<u32, DateTime<Utc>>, async_imap::error::Error> {
    let fetches: Vec<_> = session
        .uid_fetch(imap::uid_set(uids), "(UID INTERNALDATE)")
        .await?
        .try_collect()
        .await?;
    let arrived: HashMap<u32, DateTime<Utc>> = fetches
        .iter()
        .filter_map(|f| Some((f.uid?, f.internal_date()?.with_timezone(&Utc))))
        .collect();
    if arrived.len() < uids.len() {
        // Missing ones count as new; make sure the answer was the server's (see
        // `confirm_answered`), not a connection that closed in the middle of it.
        confirm_answered(session).await?;
    }
    Ok(arrived)
}

/// `UID FETCH <uids> (UID RFC822.SIZE)`: the size of each message still there.
async fn fetch_sizes(
    session: &mut Session,
    uids: &[u32],
) -> Result<HashMap<u32, u32>, async_imap::error::Error> {
    let fetches: Vec<_> = session
        .uid_fetch(imap::uid_set(uids), "(UID RFC822.SIZE)")
        .await?
        .try_collect()
        .await?;
    let sizes: HashMap<u32, u32> = fetches
        .iter()
        .filter_map(|f| Some((f.uid?, f.size?)))
        .collect();
    if sizes.len() < uids.len() {
        // A message without its size is taken as gone (and skipped past): make sure the
        // answer was the server's, not a connection that closed in the middle of it.
        confirm_answered(session).await?;
    }
    Ok(sizes)
}

/// After a FETCH that came back without what was asked: async-imap ends a FETCH's stream
/// alike at the server's tagged answer and at the connection's end (EOF, a BYE before it),
/// so a dropped connection reads as "no such message", and the poller would skip past mail
/// it never read. A NOOP whose tagged OK must be read tells the two apart: on a connection
/// that is gone it fails (`ConnectionLost` or an I/O error, not held against the message).
async fn confirm_answered(session: &mut Session) -> Result<(), async_imap::error::Error> {
    session.run_command_and_check_ok("NOOP").await
}

#[derive(Clone, Copy)]
enum Part {
    Header,
    Body,
}

/// Fetches one part of one message by UID; `None` when the message is gone.
async fn fetch_one(
    session: &mut Session,
    uid: u32,
    query: &str,
    part: Part,
) -> Result<Option<Vec<u8>>, async_imap::error::Error> {
    let fetches: Vec<_> = session
        .uid_fetch(uid.to_string(), format!("(UID {query})"))
        .await?
        .try_collect()
        .await?;
    let found = fetches
        .iter()
        .filter(|f| f.uid == Some(uid))
        .find_map(|f| match part {
            Part::Header => f.header(),
            Part::Body => f.body(),
        })
        .map(<[u8]>::to_vec);
    if found.is_none() {
        confirm_answered(session).await?;
    }
    Ok(found)
}

impl TimerJob for InboundEmailPoller {
    fn name(&self) -> &str {
        JOB_NAME
    }

    async fn tick(&self, ctx: &WorkContext) -> Result<TickReport, Failure> {
        let report = self.poll(ctx).await;
        let summary = report.summary();
        let failed: Vec<&Failure> = report.failed().map(|(_, f)| f).collect();
        if !report.accounts.is_empty() && failed.len() == report.accounts.len() {
            let all_permanent = failed.iter().all(|f| f.is_permanent());
            return Err(if all_permanent {
                Failure::permanent("imap-accounts", summary)
            } else {
                Failure::transient(summary)
            });
        }
        Ok(TickReport::items(report.totals().recorded()).with_detail(summary))
    }
}
