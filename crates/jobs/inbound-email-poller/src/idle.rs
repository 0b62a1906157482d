//! IMAP IDLE (RFC 2177): news in a mailbox is fetched at once, so that a mail is stored
//! within a few round trips of its arrival instead of at the next scheduled poll.
//!
//! [`Idler::run`] holds one IDLE session per account and, whenever the server reports a
//! change (a new message's `EXISTS`, say), fetches what is new on that session
//! (`idle_fetch.rs`: out of IDLE, `UID FETCH <last+1>:*`, the tick's own read and batch
//! write, back to IDLE), with no new connection or login. What it does not fetch (the first
//! poll, a UIDVALIDITY other than the stored one, a backlog, a failure) wakes the poller's
//! tick, which polls as it always has; so does every (re)connect. The scheduled poll stays as
//! the safety net.
//!
//! * **One replica idles.** The sessions are held by the replica that holds the idle lease
//!   ([`IDLE_LEASE`], beside the tick's own lease), so that replicas do not each hold a
//!   connection per account; the others try for it every [`IdleConfig::lease_retry`], which
//!   bounds how long a killed holder leaves the accounts without IDLE.
//! * **Re-issued well inside the 29-minute limit**: every [`IdleConfig::refresh`] the session
//!   ends its IDLE with `DONE` and starts again; a `DONE` that is not answered within the
//!   message timeout is a dead connection (a server gone silent), and the account is
//!   reconnected, with a doubling wait ([`IdleConfig::reconnect_max`] at most).
//! * **Rechecked, for servers that hold their news back**: Dovecot reports a change 500 ms
//!   after it sees it (`NOTIFY_DELAY_MSECS`, compiled in; its NOTIFY, RFC 5465, goes through
//!   the same delay), and other servers batch too. Every [`IdleConfig::recheck`] the session
//!   has the server look at the mailbox at once and report what is new in its answer, so a
//!   mail is seen within `recheck` whatever the server's own delay (half of it after a
//!   `NOOP` recheck that found mail: [`next_recheck`]). How it asks is
//!   [`IdleConfig::recheck_with`]: by default a `NOOP` on a session that stays out of IDLE
//!   (one command, which cost Dovecot 0.6 of an ended and re-issued IDLE, so it can ask more
//!   often for the same CPU: docs/SCALING.md), or `DONE` and a new IDLE, which keeps the
//!   server's own notices coming in between. Zero leaves it to the server's notifications
//!   (and `refresh`).
//! * News the server sends between two IDLEs (in the answer to `DONE`, or before the next
//!   IDLE's go-ahead) is read from the session's unsolicited responses, so none is missed.
//! * **Falls back to the schedule**: an account whose server does not offer IDLE is polled on
//!   the schedule only (logged once); one whose IDLE keeps failing is too, between its
//!   reconnects.
//! * Every (re)connect wakes the poller once, for mail that came while nobody idled.

use std::sync::Arc;
use std::time::Duration;

use async_imap::extensions::idle::IdleResponse;
use async_imap::types::UnsolicitedResponse;
use serde::{Deserialize, Serialize};
use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use worker_core::{Backoff, Failure, SingletonLease};

use crate::auth::SignedIn;
use crate::circuit::{self, CircuitOpen, NotConnected};
use crate::idle_fetch::IdleFetch;
use crate::imap::{ImapError, Session, Stage, classify_imap, timed};
use crate::stats::PollerStats;
use crate::{ImapAccount, InboundEmailPoller};

/// The lease whose holder idles, beside the poller's tick lease.
pub const IDLE_LEASE: &str = "inbound-email-poller:idle";

/// How the poller idles.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdleConfig {
    /// Idle where the server offers it; off, only the schedule polls.
    pub enabled: bool,
    /// How often an IDLE is ended and issued again (RFC 2177: at least every 29 minutes), which
    /// also bounds how long a silently dead connection goes unnoticed. Unused while rechecking
    /// with `NOOP`: no IDLE is issued, and each `NOOP`'s answer shows the connection alive.
    pub refresh: Duration,
    /// How often the server is asked to look at the mailbox at once, for servers that hold
    /// their notifications back; zero: never. Unset: [`LOCAL_RECHECK`] for an account on this
    /// machine, none for a remote one; an account's own `idle_recheck` comes first
    /// ([`Self::recheck_for`]).
    pub recheck: Option<Duration>,
    /// How the recheck asks.
    pub recheck_with: RecheckWith,
    /// How often a replica without the idle lease tries for it.
    pub lease_retry: Duration,
    /// The longest wait between two reconnects of a failing account.
    pub reconnect_max: Duration,
}

impl Default for IdleConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            refresh: Duration::from_secs(4 * 60),
            recheck: None,
            recheck_with: RecheckWith::Noop,
            lease_retry: Duration::from_secs(5),
            reconnect_max: Duration::from_secs(60),
        }
    }
}

/// The recheck of an account on this machine that sets none: Dovecot holds its notices
/// back by 500 ms, and a NOOP to a server on loopback costs no one's quota.
pub const LOCAL_RECHECK: Duration = Duration::from_millis(150);

impl IdleConfig {
    /// How often `account`'s session asks the server to look: its own `idle_recheck`, else
    /// the job's, else [`LOCAL_RECHECK`] on loopback and none for a remote provider, which
    /// pushes its news in IDLE and throttles a client that asks every 150 ms (576,000 NOOPs a
    /// day).
    pub fn recheck_for(&self, account: &ImapAccount) -> Duration {
        account.idle_recheck.or(self.recheck).unwrap_or_else(|| {
            if is_loopback(&account.host) {
                LOCAL_RECHECK
            } else {
                Duration::ZERO
            }
        })
    }
}

/// `localhost` or a loopback address (a name that merely resolves there does not count).
fn is_loopback(host: &str) -> bool {
    host.eq_ignore_ascii_case("localhost")
        || host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// How a recheck has the server look at the mailbox.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum RecheckWith {
    /// A `NOOP`, on a session that stays out of IDLE between rechecks: one command and one
    /// wake-up of the server each time, where an ended and re-issued IDLE is two, and sets up
    /// the server's change watch again. The server's own notices are not asked for, so with
    /// this a mail is seen at the next recheck, never sooner.
    #[default]
    Noop,
    /// `DONE` and a new IDLE: the server's own notices come in between.
    Idle,
}

/// The first wait before a reconnect; doubles up to [`IdleConfig::reconnect_max`].
const RECONNECT_FIRST: Duration = Duration::from_secs(1);

/// Why one account's IDLE session ended.
#[derive(Debug)]
enum Ended {
    /// The server offers no IDLE: the schedule polls this account.
    Unsupported,
    /// Shut down (or the lease lost): stop.
    Cancelled,
    /// The connection failed or went silent: reconnect after a wait.
    Failed(Failure),
    /// The session's token is about to expire: sign in again now, with a fresh one.
    Renew,
    /// A tick found the mailbox under a new UIDVALIDITY: open it again now.
    Reopen,
    /// The account's circuit is open: wait for its probe, do not reconnect.
    CircuitOpen(CircuitOpen),
}

/// What idles on the poller's behalf; made by
/// [`InboundEmailPoller::idler`](crate::InboundEmailPoller::idler).
#[derive(Debug, Clone)]
pub struct Idler {
    /// The poller whose accounts it idles on, sharing its state: its settings, how each
    /// account is reached, its circuits (a session is not opened while one is open), its
    /// stats, its failed attempts and its accounts' locks, and the path that reads and writes
    /// a mailbox's new mail.
    pub(crate) poller: InboundEmailPoller,
}

impl Idler {
    /// Each account's idle state and counts (with the polls').
    pub fn stats(&self) -> PollerStats {
        self.poller.stats.clone()
    }

    /// Until `shutdown`: holds the idle lease when it can and, while it does, an IDLE session
    /// per account, waking `wake` (the poller's tick) at every change a server reports.
    pub async fn run<L: SingletonLease>(
        self,
        lease: Arc<L>,
        wake: Arc<Notify>,
        shutdown: CancellationToken,
    ) {
        if !self.poller.config.idle.enabled || self.poller.config.accounts.is_empty() {
            return;
        }
        let retry = self.poller.config.idle.lease_retry;
        loop {
            let held = tokio::select! {
                () = shutdown.cancelled() => return,
                held = lease.try_acquire(IDLE_LEASE) => held,
            };
            match held {
                Ok(Some(mut guard)) => {
                    tracing::info!(
                        job = crate::JOB_NAME,
                        accounts = self.poller.config.accounts.len(),
                        "this replica holds the idle lease: idling on every account"
                    );
                    let sessions = CancellationToken::new();
                    let idling = self.idle_accounts(&wake, &sessions);
                    tokio::pin!(idling);
                    tokio::select! {
                        () = shutdown.cancelled() => {
                            sessions.cancel();
                            idling.await;
                            lease.release(guard).await;
                            return;
                        }
                        lost = lease.watch(&mut guard) => {
                            tracing::warn!(job = crate::JOB_NAME, error = %lost, "the idle lease was lost: IDLE stops here, and another replica (or this one, again) takes it");
                            sessions.cancel();
                            idling.await;
                        }
                        () = &mut idling => {
                            // Every account ended for good (none offers IDLE): keep the lease
                            // given back for another replica to try.
                            lease.release(guard).await;
                            return;
                        }
                    }
                }
                Ok(None) => {}
                Err(failure) => {
                    tracing::debug!(job = crate::JOB_NAME, error = %failure, "the idle lease could not be asked for; trying again")
                }
            }
            tokio::select! {
                () = shutdown.cancelled() => return,
                () = tokio::time::sleep(retry) => {}
            }
        }
    }

    /// Every account's IDLE loop, side by side, until `cancel` (or until every account has
    /// ended for good).
    async fn idle_accounts(&self, wake: &Arc<Notify>, cancel: &CancellationToken) {
        let loops = self
            .poller
            .config
            .accounts
            .iter()
            .map(|account| self.idle_account(account, wake, cancel));
        futures::future::join_all(loops).await;
    }

    /// One account: an IDLE session, reconnected with a doubling wait after a failure,
    /// until cancelled or the server is found to offer no IDLE.
    async fn idle_account(
        &self,
        account: &ImapAccount,
        wake: &Arc<Notify>,
        cancel: &CancellationToken,
    ) {
        let mut backoff = Backoff::doubling(RECONNECT_FIRST, self.poller.config.idle.reconnect_max);
        loop {
            match self.session(account, wake, cancel, &mut backoff).await {
                Ended::Cancelled => return,
                Ended::Reopen => {
                    tracing::info!(job = crate::JOB_NAME, account = %account.name, "the mailbox has a new UIDVALIDITY: the IDLE session opens it again");
                }
                Ended::Renew => {
                    tracing::debug!(job = crate::JOB_NAME, account = %account.name, "the IDLE session's token expires soon: signing in again");
                }
                Ended::Unsupported => {
                    tracing::info!(job = crate::JOB_NAME, account = %account.name, "the server offers no IMAP IDLE: the account is polled on the schedule only");
                    self.poller.stats.set_idle(
                        &account.name,
                        "not offered by the server: polled on the schedule",
                    );
                    return;
                }
                Ended::CircuitOpen(open) => {
                    tracing::debug!(job = crate::JOB_NAME, account = %account.name, reason = %open.reason, probe_in = ?open.probe_in, "the account's circuit is open: IDLE waits for its probe");
                    self.poller.stats.set_idle(
                        &account.name,
                        &format!("waiting: its circuit is open ({})", open.reason),
                    );
                    let Some(circuits) = &self.poller.circuits else {
                        return;
                    };
                    if circuit::wait_for_probe(circuits.subscribe(), open.probe_in, cancel).await {
                        return;
                    }
                }
                Ended::Failed(failure) => {
                    let wait = backoff.next_wait();
                    tracing::warn!(job = crate::JOB_NAME, account = %account.name, error = %failure, retry_in = ?wait, "the IDLE session failed; the schedule polls the account until it is back");
                    self.poller
                        .stats
                        .set_idle(&account.name, &format!("reconnecting: {failure}"));
                    tokio::select! {
                        () = cancel.cancelled() => return,
                        () = tokio::time::sleep(wait) => {}
                    }
                }
            }
        }
    }

    /// One IDLE session, from connect to its end.
    async fn session(
        &self,
        account: &ImapAccount,
        wake: &Arc<Notify>,
        cancel: &CancellationToken,
        backoff: &mut Backoff,
    ) -> Ended {
        let connected = tokio::select! {
            () = cancel.cancelled() => return Ended::Cancelled,
            connected = self.open(account) => connected,
        };
        // Microsoft ends a session when its token expires (`* BYE ... AccessTokenExpired`):
        // this one signs in again when the source renews the token, a margin before that.
        let (signed_in, uidvalidity) = match connected {
            Ok(Some(opened)) => opened,
            Ok(None) => return Ended::Unsupported,
            Err(NotConnected::CircuitOpen(open)) => return Ended::CircuitOpen(open),
            Err(NotConnected::Failed(err)) => return failed(&err),
        };
        let (mut session, renew_at) = (signed_in.session, signed_in.renew_at);
        let reopen = self.poller.reopen_signal(&account.name);
        let news = News {
            account,
            uidvalidity,
            wake,
            cancel,
        };
        // What arrived while nobody idled.
        wake.notify_one();
        self.poller.stats.set_idle(&account.name, "idling");
        let command = self.poller.config.message_timeout;
        let idle = &self.poller.config.idle;
        let recheck = idle.recheck_for(account);
        if idle.recheck_with == RecheckWith::Noop && !recheck.is_zero() {
            let rechecks = Rechecks {
                every: recheck,
                renew_at,
            };
            return self
                .noop_rechecks(session, &news, backoff, rechecks, reopen)
                .await;
        }
        let each = if recheck.is_zero() {
            idle.refresh
        } else {
            recheck.min(idle.refresh)
        };
        loop {
            let mut handle = session.idle();
            if let Err(err) = timed(Stage::Idle, command, handle.init()).await {
                return failed(&err);
            }
            // The server's answer to DONE is the liveness check: it comes with the next
            // refresh at the latest.
            backoff.reset();
            let mut reopening = false;
            let outcome = {
                let (news, _stop) = handle.wait_with_timeout(idle.refresh * 2);
                tokio::select! {
                    () = cancel.cancelled() => None,
                    () = tokio::time::sleep(until_renewal(each, renew_at)) => Some(Ok(IdleResponse::Timeout)),
                    () = reopened(reopen.as_deref()) => {
                        reopening = true;
                        Some(Ok(IdleResponse::ManualInterrupt))
                    }
                    news = news => Some(news),
                }
            };
            let mut heard = false;
            match outcome {
                None => {
                    // Shutting down: a polite DONE and LOGOUT, bounded; failures change nothing.
                    if let Ok(mut session) = timed(
                        Stage::Idle,
                        command.min(Duration::from_secs(2)),
                        handle.done(),
                    )
                    .await
                    {
                        let _ = timed(
                            Stage::Logout,
                            command.min(Duration::from_secs(2)),
                            session.logout(),
                        )
                        .await;
                    }
                    return Ended::Cancelled;
                }
                Some(Ok(IdleResponse::NewData(_))) => heard = true,
                Some(Ok(IdleResponse::Timeout | IdleResponse::ManualInterrupt)) => {}
                Some(Err(source)) => {
                    return failed(&ImapError::Imap {
                        stage: Stage::Idle,
                        source,
                    });
                }
            }
            // The news is fetched out of IDLE, on this session: DONE first.
            session = match timed(Stage::Idle, command, handle.done()).await {
                Ok(session) => session,
                Err(err) => return failed(&err),
            };
            if reopening {
                return reopen_now(session, command).await;
            }
            // Read even when the IDLE's own news came: what is left would be taken for news
            // after the fetch, and fetched for again.
            let between = news_between(&session);
            if (heard || between)
                && let Some(ended) = self.on_news(&mut session, &news).await
            {
                return ended;
            }
            if due(renew_at) {
                return renew(session, command).await;
            }
        }
    }

    /// The session's life when it rechecks with `NOOP`: one every [`IdleConfig::recheck`],
    /// whose answer carries what is new (and, answered in time, shows the connection alive).
    async fn noop_rechecks(
        &self,
        mut session: Session,
        news: &News<'_>,
        backoff: &mut Backoff,
        Rechecks { every, renew_at }: Rechecks,
        reopen: Option<Arc<Notify>>,
    ) -> Ended {
        let cancel = news.cancel;
        let command = self.poller.config.message_timeout;
        let mut next = Instant::now();
        loop {
            tokio::select! {
                () = cancel.cancelled() => {
                    let polite = command.min(Duration::from_secs(2));
                    let _ = timed(Stage::Logout, polite, session.logout()).await;
                    return Ended::Cancelled;
                }
                () = tokio::time::sleep_until(next) => {}
                () = reopened(reopen.as_deref()) => {
                    return reopen_now(session, command).await;
                }
            }
            let started = Instant::now();
            let answered = tokio::select! {
                // Shutting down mid-command: the connection is dropped, not logged out.
                () = cancel.cancelled() => return Ended::Cancelled,
                answered = timed(Stage::Idle, command, session.noop()) => answered,
            };
            if let Err(err) = answered {
                return failed(&err);
            }
            backoff.reset();
            let found = news_between(&session);
            if found && let Some(ended) = self.on_news(&mut session, news).await {
                return ended;
            }
            if due(renew_at) {
                return renew(session, command).await;
            }
            next = next_recheck(started, Instant::now(), every, found);
        }
    }

    /// What the server reported: fetched on this session ([`InboundEmailPoller::fetch_on_idle`]),
    /// or left to the tick, woken. Mail that arrives during a fetch is reported in its
    /// answers, and fetched in turn. Returns how the session ends, if it does.
    async fn on_news(&self, session: &mut Session, news: &News<'_>) -> Option<Ended> {
        let account = news.account;
        self.poller.stats.idle_news(&account.name);
        let Some(uidvalidity) = news.uidvalidity else {
            // No UIDVALIDITY to fetch under: the tick's SELECT finds why.
            news.wake.notify_one();
            return None;
        };
        for _ in 0..FETCH_ROUNDS {
            let fetched = self
                .poller
                .fetch_on_idle(session, account, uidvalidity, news.cancel)
                .await;
            match fetched {
                IdleFetch::Done => {}
                IdleFetch::ToTick(_) => {
                    news.wake.notify_one();
                    return None;
                }
                IdleFetch::Broken(failure) => {
                    // What was read before the failure is written; the tick reads the rest.
                    news.wake.notify_one();
                    return Some(Ended::Failed(failure));
                }
                IdleFetch::Cancelled => return Some(Ended::Cancelled),
            }
            if !news_between(session) {
                return None;
            }
        }
        // Mail keeps coming: the tick, on a connection of its own, catches up with it.
        news.wake.notify_one();
        None
    }

    /// Connects and logs in, checks that the server offers IDLE, and opens the mailbox
    /// read-only; `None` when the server offers no IDLE. With the session, the mailbox's
    /// UIDVALIDITY, under which the session fetches (none: the server named none).
    async fn open(
        &self,
        account: &ImapAccount,
    ) -> Result<Option<(SignedIn, Option<u32>)>, NotConnected> {
        let limit = self.poller.config.connect_timeout;
        let access = self.poller.access.get(&account.name).ok_or_else(|| {
            NotConnected::Failed(ImapError::Protocol {
                stage: Stage::Connect,
                detail: format!("no TLS client for account `{}`", account.name),
            })
        })?;
        let mut signed_in =
            circuit::connect(self.poller.circuits.as_ref(), account, access, limit).await?;
        let session = &mut signed_in.session;
        let command = self.poller.config.message_timeout;
        let capabilities = timed(Stage::Idle, command, session.capabilities())
            .await
            .map_err(NotConnected::Failed)?;
        if !capabilities.has_str("IDLE") {
            let _ = timed(Stage::Logout, command, session.logout()).await;
            return Ok(None);
        }
        let mailbox = timed(
            Stage::Select,
            command,
            session.examine(crate::mailbox_name::encode(&account.mailbox)),
        )
        .await
        .map_err(NotConnected::Failed)?;
        Ok(Some((signed_in, mailbox.uid_validity)))
    }
}

/// How many fetches in a row a session makes for news that keeps coming during them, before
/// it leaves the rest to the tick.
const FETCH_ROUNDS: usize = 4;

/// What a session's news is about, and whom to tell of what it leaves.
struct News<'a> {
    account: &'a ImapAccount,
    /// The examined mailbox's UIDVALIDITY.
    uidvalidity: Option<u32>,
    /// The tick's wake.
    wake: &'a Arc<Notify>,
    cancel: &'a CancellationToken,
}

/// An IMAP failure that ends the session.
fn failed(err: &ImapError) -> Ended {
    Ended::Failed(classify_imap(err))
}

/// A NOOP-rechecking session's pace, and when its token is to be renewed.
struct Rechecks {
    every: Duration,
    renew_at: Option<Instant>,
}

/// When the `NOOP` recheck that began at `started` is followed by the next, given `now`, after
/// it and its fetch. One that found mail is followed half of `every` after it began (at once,
/// if its fetch took longer), because more is likely on its way: at 50 mails a second, a
/// recheck every 150 ms finds seven, each of which waited 75 ms on average for it. One that
/// found none is followed `every` after it began, or `every` after `now` when its answer was
/// that late, so that a quiet account, or a slow server, is asked no more often than before.
///
/// Why half (docs/SCALING.md, the reference loop at 50 mails/s, 3 pairs each): a reply's p50
/// went from 112 to 75 ms, for 1.21 times the CPU a mail of the loop and its servers together
/// (the host's 1.25, PostgreSQL's 1.21, Dovecot's 1.73: smaller batches, more of them); a
/// third gave 65 ms for 1.55 times the CPU.
pub fn next_recheck(started: Instant, now: Instant, every: Duration, found: bool) -> Instant {
    if found {
        return started + every / 2;
    }
    let due = started + every;
    if due > now { due } else { now + every }
}

/// How long to wait for news before the next recheck: `each`, or less when the session's
/// token is to be renewed sooner.
fn until_renewal(each: Duration, renew_at: Option<Instant>) -> Duration {
    renew_at.map_or(each, |at| {
        each.min(at.saturating_duration_since(Instant::now()))
    })
}

fn due(renew_at: Option<Instant>) -> bool {
    renew_at.is_some_and(|at| Instant::now() >= at)
}

/// Resolves when a tick calls for the mailbox to be opened again; never without a signal.
async fn reopened(signal: Option<&Notify>) {
    match signal {
        Some(signal) => signal.notified().await,
        None => std::future::pending().await,
    }
}

/// Ends a session whose mailbox is to be opened again, politely and bounded.
async fn reopen_now(mut session: Session, command: Duration) -> Ended {
    let _ = timed(
        Stage::Logout,
        command.min(Duration::from_secs(2)),
        session.logout(),
    )
    .await;
    Ended::Reopen
}

/// Ends a session whose token is about to expire, politely and bounded.
async fn renew(mut session: Session, command: Duration) -> Ended {
    let _ = timed(
        Stage::Logout,
        command.min(Duration::from_secs(2)),
        session.logout(),
    )
    .await;
    Ended::Renew
}

/// Whether the server reported new mail outside an IDLE's wait (in the answer to `DONE` or to
/// a `NOOP`, or before the next IDLE's go-ahead): async-imap keeps such responses aside,
/// unread.
fn news_between(session: &Session) -> bool {
    let mut news = false;
    while let Ok(response) = session.unsolicited_responses.try_recv() {
        news |= matches!(
            response,
            UnsolicitedResponse::Exists(_) | UnsolicitedResponse::Recent(_)
        );
    }
    news
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_recheck_that_found_mail_is_followed_sooner() {
        let started = Instant::now();
        let every = Duration::from_millis(150);
        let fetched = started + Duration::from_millis(20);
        assert_eq!(
            next_recheck(started, fetched, every, true),
            started + Duration::from_millis(75)
        );
        let slow_fetch = started + Duration::from_millis(100);
        assert!(next_recheck(started, slow_fetch, every, true) <= slow_fetch);
    }

    #[test]
    fn a_recheck_that_found_nothing_keeps_the_interval() {
        let started = Instant::now();
        let every = Duration::from_millis(150);
        let answered = started + Duration::from_millis(2);
        assert_eq!(
            next_recheck(started, answered, every, false),
            started + every
        );
        let late = started + Duration::from_millis(400);
        assert_eq!(next_recheck(started, late, every, false), late + every);
    }

    fn account(host: &str, own: Option<Duration>) -> ImapAccount {
        ImapAccount {
            name: "a".into(),
            host: host.into(),
            port: 993,
            security: worker_core::TlsMode::Tls,
            username: "ops@example.com".into(),
            password: None,
            password_file: None,
            auth: worker_mail_auth::AuthMethod::Xoauth2,
            oauth: Some("m365".into()),
            idle_recheck: own,
            mailbox: "INBOX".into(),
            backfill: false,
            ca_file: None,
            allow_plaintext: false,
        }
    }

    #[test]
    fn a_remote_provider_is_not_rechecked_and_this_machines_server_is() {
        let idle = IdleConfig::default();
        assert_eq!(
            idle.recheck_for(&account("outlook.office365.com", None)),
            Duration::ZERO
        );
        assert_eq!(idle.recheck_for(&account("127.0.0.1", None)), LOCAL_RECHECK);
        assert_eq!(idle.recheck_for(&account("localhost", None)), LOCAL_RECHECK);
        assert_eq!(idle.recheck_for(&account("[::1]", None)), LOCAL_RECHECK);
    }

    #[test]
    fn an_accounts_own_recheck_comes_before_the_jobs() {
        let idle = IdleConfig {
            recheck: Some(Duration::from_secs(2)),
            ..IdleConfig::default()
        };
        let own = Some(Duration::from_secs(30));
        assert_eq!(
            idle.recheck_for(&account("imap.gmail.com", own)),
            Duration::from_secs(30)
        );
        assert_eq!(
            idle.recheck_for(&account("imap.gmail.com", None)),
            Duration::from_secs(2),
            "a job-wide recheck set explicitly still applies to every account, as before"
        );
    }
}
