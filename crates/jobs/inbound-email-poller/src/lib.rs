//! # job-inbound-email-poller: mail in IMAP becomes rows and `email.received` events
//!
//! A timer job. Each tick polls every configured IMAP account, fetches the messages newer than
//! the last UID it stored, and writes them together, in **one statement** (so one
//! transaction): the inbound email rows, an outbox row for each new mail carrying its
//! `email.received` [`DomainEvent`] (published later by the outbox drain), and the new last
//! UID.
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
//! 5. the existence check on (account, mailbox, UIDVALIDITY, UID), for all of them in one
//!    statement, when a row may be stored above the last UID (the poll state set back or
//!    started over: the read of the poll state says so, from the highest UID stored); then
//!    each message, in order, under its own [`PollerConfig::message_timeout`]
//!    ([`worker_core::run_unit`]) and its own span (`poll <account>`, the root of the mail's
//!    trace, whose context its outbox row stores), is read, writing nothing:
//!    * over [`PollerConfig::max_message_bytes`]: only its header (`BODY.PEEK[HEADER]`, at most
//!      64 KiB) is fetched, and it is recorded `skipped` with the reason; no event;
//!    * otherwise `BODY.PEEK[]` (the mail is not marked seen), pre-scanned against
//!      [`PollerConfig::mail_limits`] (MIME parts, nesting, header fields and bytes; past
//!      one, it is recorded `skipped` unparsed with the reason, no event: see [`limits`]),
//!      parsed with mail-parser, bodies cut at [`PollerConfig::max_body_chars`], to be stored
//!      and announced. A mail that does not parse is stored with its parse error and
//!      announced all the same;
//! 6. the messages read are written in one statement (`record.rs`): each mail's identity
//!    looked up (below), the rows, the outbox rows of the new mails, and the last UID, moved
//!    to the highest UID of the batch, under the UIDVALIDITY read at the start (if the poll
//!    state was reset underneath, nothing is written). A tick's batch holds at most 8 MiB of
//!    bodies; past that it is written in several;
//! 7. `LOGOUT`.
//!
//! Messages are read in UID order and the last UID only moves with committed rows, so the
//! first failure ends the account's poll for this tick (the session is dropped, since a
//! command cut short leaves it in an unknown state): the messages read before it are written,
//! and the next tick starts at that message. A batch whose write fails records none of its
//! mails, and the next tick reads them again; a batch the database refuses for good (a row it
//! will not take) is written again a message at a time, so that only the refused mail fails.
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
//! account it tried failed (permanent only when every failure was).
//!
//! An account's own failures to be reached and signed in count toward its circuit
//! (`imap:<account>`, see [`circuit`]; a refused login opens it at once). While it is open the
//! tick skips the account without connecting ([`AccountReport::circuit_open`]), and its IDLE
//! session waits; after the cool-down the next sign-in is the probe that closes it.
//!
//! ## Idempotency: one mail, one event
//!
//! The row's key is (account, mailbox, UIDVALIDITY, UID): checked before anything is fetched,
//! and enforced by a unique constraint that the insert respects (`ON CONFLICT DO NOTHING`, an
//! event is written only with a new row, in the same statement). A restart, or a tick re-run after a crash, fetches
//! nothing twice. Row and event ids are derived from that key (UUID v5), so they are stable.
//!
//! A UID is not a mail, though: a mail moved out of the folder and back, or a mailbox rebuilt
//! under a new UIDVALIDITY, comes back under a new one. So once read, a mail is looked up by
//! its **identity**: its Message-ID where it has one, else the SHA-256 of its bytes (of its
//! header, for a mail over the size limit); both are recorded on every row. A mail whose
//! identity was recorded before from this mailbox, under any UIDVALIDITY, gets a row of its
//! own, `skipped`, naming the row it duplicates (`duplicate_of`), and no event. A new mail
//! that reuses an older Message-ID is such a duplicate too, and its row says so. The look-up
//! is part of the batch's write, and a batch's later mail with the identity of an earlier
//! one in the same batch (two UIDs, one Message-ID) is its duplicate the same way.
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
//! ## Between the ticks: IMAP IDLE
//!
//! Where the server offers IDLE, [`Idler`] holds a session per account on the replica that
//! holds the idle lease. When the server reports news, that session fetches what is new
//! itself (`UID FETCH <last+1>:*`, sizes then bodies) and writes it through the tick's own
//! batch statement, with no new connection or login; what it leaves (a UIDVALIDITY that
//! differs from the stored one, the first poll, a backlog, a failed message) wakes the tick.
//! The schedule stays as the safety net. See [`idle`] and `idle_fetch.rs`.
//!
//! ## How the host runs it
//!
//! From its one line in the host's job list (`crates/host/src/jobs.rs`), built from its
//! settings section; ARCHITECTURE.md ("Adding a job") walks through that wiring.
//!
//! The tick's timeout should exceed `connect_timeout` plus the time to handle a batch, or a
//! slow account's batch is cut short at every tick (nothing is lost: it resumes at the next).

mod auth;
pub mod bounce;
pub mod circuit;
pub mod config;
mod fetch;
pub mod idle;
mod idle_fetch;
pub mod ids;
pub mod imap;
pub mod limits;
mod mailbox;
pub mod mailbox_name;
mod message;
pub mod parse;
mod record;
pub mod report;
pub mod settings;
pub mod stats;
mod store;
pub mod story;

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};
use futures::StreamExt;
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;
use worker_core::{Failure, TickReport, TimerJob, WorkContext};

pub use auth::{Access, Login, try_sign_in};
pub use circuit::CircuitOpen;
pub use config::{ConfigError, IDLE_REFRESH_MAX, ImapAccount, PollerConfig, validate_accounts};
pub use idle::{IDLE_LEASE, IdleConfig, Idler, RecheckWith, next_recheck};
pub use ids::{event_id, inbound_email_id};
pub use imap::{ImapError, Stage, classify_imap};
pub use limits::{MailLimits, OverLimit};
pub use parse::{ParsedEmail, parse_email};
pub use record::{Batch, BatchEvent, BatchRow, Identity, record_batch};
pub use report::{AccountReport, MessageCounts, PollReport};
pub use settings::InboundEmailPollerSettings;
pub use stats::{AccountStatus, PollerStats};

use crate::imap::timed;
use crate::message::{AttemptKey, FailedAttempts};

/// The job's name, in logs, metrics and the attempt log.
pub const JOB_NAME: &str = "inbound-email-poller";

/// What the host needs to know of this job (its name, kind and lease).
pub const JOB: worker_core::JobSpec =
    worker_core::catalog::JobSpec::timer(JOB_NAME, worker_core::catalog::Lease::OneReplica);

/// At the first poll of an account, mail that arrived up to this long before the poller
/// started watching it is still announced: the IMAP server's clock and ours may differ, and
/// mail sent to a host that is just starting must not be taken for history.
pub const HISTORY_MARGIN: Duration = Duration::from_secs(5 * 60);

/// The inbound email poller. See the crate docs. Its clones share its state (the failed
/// attempts, the accounts' locks, the stats): the [`Idler`] fetches through one.
#[derive(Clone)]
pub struct InboundEmailPoller {
    pool: PgPool,
    config: Arc<PollerConfig>,
    /// How each account is reached (its TLS client, how it signs in), by account name.
    access: HashMap<String, Access>,
    stats: PollerStats,
    failed_attempts: Arc<Mutex<HashMap<AttemptKey, FailedAttempts>>>,
    /// When this poller was made: the `watching_since` of an account it is the first to poll.
    started_at: DateTime<Utc>,
    /// The accounts whose poll state row this process has made sure of.
    watched: Arc<Mutex<HashSet<String>>>,
    /// Each account's lock, held by whatever reads and writes its mailbox in this process (a
    /// tick's poll of it, a fetch on its IDLE session), so that the two never read the same
    /// mail side by side. Across replicas, the batch's statement is the guard (see
    /// `idle_fetch.rs`).
    busy: Arc<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    /// Each account's call to its IDLE session to open its mailbox again: a tick that found
    /// the mailbox under a new UIDVALIDITY rings it, since a server need not tell a session
    /// that its mailbox was deleted and made again (Dovecot often does not), and the session
    /// would go on watching the old one, hearing of no mail.
    reopen: Arc<HashMap<String, Arc<tokio::sync::Notify>>>,
    /// Woken when a tick leaves mail waiting (an account past `max_messages_per_account`), so
    /// that the next tick follows at once instead of on the schedule.
    wake: Option<Arc<tokio::sync::Notify>>,
    /// Each account's circuit ([`InboundEmailPoller::with_circuits`]); none: always tried.
    circuits: Option<worker_store::circuits::Circuits>,
    /// Told what each batch's delivery reports added ([`InboundEmailPoller::on_bounces`]).
    on_bounces: Option<BounceObserver>,
}

/// Called with the rows a batch's delivery reports added: their class, whether they were tied
/// to a mail the host sent, and how many.
pub type BounceObserver = Arc<dyn Fn(bounce::Class, bool, u64) + Send + Sync>;

impl fmt::Debug for InboundEmailPoller {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("InboundEmailPoller")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl InboundEmailPoller {
    /// A poller over `pool` (which must hold the migrations) for the accounts in `config`.
    pub fn new(pool: PgPool, config: PollerConfig) -> Result<Self, ConfigError> {
        config.validate()?;
        let mut access = HashMap::new();
        for (i, account) in config.accounts.iter().enumerate() {
            let tls =
                imap::tls_config(account.ca_file.as_deref()).map_err(|problem| ConfigError {
                    field: format!("accounts[{i}].ca_file"),
                    problem,
                })?;
            let login = config.login(i, account)?;
            access.insert(account.name.clone(), Access { tls, login });
        }
        let stats = PollerStats::default();
        for account in &config.accounts {
            stats.register(&account.name);
        }
        let busy = config
            .accounts
            .iter()
            .map(|a| (a.name.clone(), Arc::default()))
            .collect();
        let reopen = config
            .accounts
            .iter()
            .map(|a| (a.name.clone(), Arc::default()))
            .collect();
        Ok(Self {
            pool,
            config: Arc::new(config),
            access,
            stats,
            failed_attempts: Arc::default(),
            started_at: Utc::now(),
            watched: Arc::default(),
            busy: Arc::new(busy),
            reopen: Arc::new(reopen),
            wake: None,
            circuits: None,
            on_bounces: None,
        })
    }

    /// Wakes `wake` when a tick leaves mail waiting, so that the next tick follows at once.
    #[must_use]
    pub fn wake_on_backlog(mut self, wake: Arc<tokio::sync::Notify>) -> Self {
        self.wake = Some(wake);
        self
    }

    /// Calls `observe` with what each batch's delivery reports added (the host counts them).
    #[must_use]
    pub fn on_bounces(mut self, observe: BounceObserver) -> Self {
        self.on_bounces = Some(observe);
        self
    }

    /// The per-account counters and last errors, for metrics and operators.
    pub fn stats(&self) -> PollerStats {
        self.stats.clone()
    }

    pub fn config(&self) -> &PollerConfig {
        &self.config
    }

    /// What idles on this poller's accounts, fetches what its sessions hear of, and wakes
    /// its tick for the rest ([`Idler::run`]). Made after the poller's own settings (its
    /// circuits, its bounce observer), which it shares.
    pub fn idler(&self) -> Idler {
        Idler {
            poller: self.clone(),
        }
    }

    /// `account`'s call to its IDLE session to open its mailbox again (see `reopen`).
    pub(crate) fn reopen_signal(&self, account: &str) -> Option<Arc<tokio::sync::Notify>> {
        self.reopen.get(account).cloned()
    }

    /// `account`'s lock (see `busy`), held while its mailbox is read and written.
    pub(crate) async fn lock_account(
        &self,
        account: &str,
    ) -> Option<tokio::sync::OwnedMutexGuard<()>> {
        let lock = self.busy.get(account)?.clone();
        Some(lock.lock_owned().await)
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
            circuit_open: None,
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
        let Some(access) = self.access.get(&account.name) else {
            // `new` builds one per configured account; only a foreign account can miss it.
            report.failure = Some(Failure::permanent(
                "imap-config",
                format!("no TLS client for account `{}`", account.name),
            ));
            return;
        };
        let connected = circuit::connect(self.circuits.as_ref(), account, access, limit).await;
        let mut session = match connected {
            Ok(signed_in) => signed_in.session,
            Err(circuit::NotConnected::Failed(err)) => {
                report.failure = Some(classify_imap(&err));
                return;
            }
            Err(circuit::NotConnected::CircuitOpen(open)) => {
                tracing::debug!(job = JOB_NAME, account = %account.name, reason = %open.reason, probe_in = ?open.probe_in, "the account's circuit is open: skipped this tick");
                report.circuit_open = Some(open);
                return;
            }
        };
        // Not while this account's IDLE session fetches (it is done within a few round trips).
        let held = self.lock_account(&account.name).await;
        let session_ok = self
            .poll_mailbox(&mut session, account, cancel, report)
            .await;
        drop(held);
        if session_ok {
            // A polite goodbye, bounded; its failure changes nothing.
            let limit = self.config.message_timeout.min(Duration::from_secs(5));
            if let Err(err) = timed(Stage::Logout, limit, session.logout()).await {
                tracing::debug!(account = %account.name, error = %err, "LOGOUT failed");
            }
        }
    }
}

impl TimerJob for InboundEmailPoller {
    fn name(&self) -> &str {
        JOB_NAME
    }

    async fn tick(&self, ctx: &WorkContext) -> Result<TickReport, Failure> {
        let report = self.poll(ctx).await;
        if report
            .accounts
            .iter()
            .any(|a| a.more_waiting && a.failure.is_none())
            && let Some(wake) = &self.wake
        {
            wake.notify_one();
        }
        let summary = report.summary();
        let failed: Vec<&Failure> = report.failed().map(|(_, f)| f).collect();
        // An account skipped for its open circuit was not tried: it neither fails the tick
        // nor lets it pass.
        let tried = report.tried();
        if tried > 0 && failed.len() == tried {
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
