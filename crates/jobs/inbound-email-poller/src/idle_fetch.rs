//! The IDLE session's own fetch: when the server reports news, the session that heard it
//! fetches what is new over the connection it holds, where the tick would connect, log in,
//! select and search anew (6 + N round trips, and two processes forked by Dovecot).
//!
//! 1. Under the account's lock (the one a tick's poll of the account holds in this process),
//!    the poll state is read ([`store::load_state`]); the fetch goes on only in the steady
//!    state: the stored UIDVALIDITY is the session's (not the first poll, not a mailbox
//!    started over) and no row is stored above the last UID (no existence check needed).
//! 2. `UID FETCH <last+1>:* (UID RFC822.SIZE)`: what is new, with the sizes, in one round
//!    trip; more than [`PollerConfig::max_messages_per_account`] is a backlog, left to the tick.
//! 3. `UID FETCH <uids> (UID BODY.PEEK[])` for the messages within the size limit, at most
//!    a batch's bytes of them ([`BATCH_BYTES`]), in one round trip. A message over the limit,
//!    one that failed before, or one past those bytes is read as the tick reads it, on its own.
//! 4. The messages are read and written by the tick's own path ([`read_and_write`]): the same
//!    spans, timeouts, size limit and mail limits, failed-attempt counts, and the one batch
//!    statement that writes the rows, their events and the last UID together.
//!
//! What it leaves (step 1's other cases, a backlog, a message that failed, the database away)
//! it hands to the tick, by waking it: the full poll stays the tick's, on its own connection.
//!
//! ## No mail twice
//!
//! In this process the account's lock keeps a tick's poll of the account and this fetch
//! apart, so they never read the same mail side by side; each reads the last UID the other
//! left. Across replicas (the idle lease and the tick's lease can be held by two) they may
//! race, and the batch statement is the guard, as it already is for a tick that lost its
//! lease: a row is inserted `ON CONFLICT DO NOTHING` on (account, mailbox, UIDVALIDITY, UID)
//! and an event is written only with a row inserted, so the second writer of a mail stores
//! nothing and counts it a duplicate; the last UID only moves up (`GREATEST`), and only under
//! the batch's UIDVALIDITY.
//!
//! [`read_and_write`]: InboundEmailPoller::read_and_write

use std::collections::{HashMap, HashSet};

use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::fetch::{fetch_bodies, fetch_new_sizes};
use crate::imap::{Session, timed};
use crate::mailbox::{BATCH_BYTES, Uids, db_timed};
use crate::*;

/// How a fetch on the IDLE session went.
#[derive(Debug)]
pub(crate) enum IdleFetch {
    /// What was new is written (or nothing was new).
    Done,
    /// Not this session's to fetch (why, for the log): the tick is to be woken.
    ToTick(&'static str),
    /// The session failed or is in an unknown state: it is to be dropped, and the tick woken.
    Broken(Failure),
    /// Shutting down, or the idle lease lost.
    Cancelled,
}

impl InboundEmailPoller {
    /// Fetches what is new in `account`'s mailbox over its IDLE session, which has it
    /// examined under `uidvalidity`. See the module docs.
    pub(crate) async fn fetch_on_idle(
        &self,
        session: &mut Session,
        account: &ImapAccount,
        uidvalidity: u32,
        cancel: &CancellationToken,
    ) -> IdleFetch {
        let span = tracing::info_span!(
            "imap_idle_fetch",
            job = JOB_NAME,
            account = %account.name,
            mailbox = %account.mailbox
        );
        let fetched = async {
            // A tick polling the account ends within its timeouts.
            let held = tokio::select! {
                () = cancel.cancelled() => return IdleFetch::Cancelled,
                held = self.lock_account(&account.name) => held,
            };
            let fetched = self
                .fetch_locked(session, account, uidvalidity, cancel)
                .await;
            drop(held);
            fetched
        }
        .instrument(span)
        .await;
        if let IdleFetch::ToTick(why) = &fetched {
            tracing::debug!(job = JOB_NAME, account = %account.name, why, "left to the tick");
        }
        fetched
    }

    async fn fetch_locked(
        &self,
        session: &mut Session,
        account: &ImapAccount,
        uidvalidity: u32,
        cancel: &CancellationToken,
    ) -> IdleFetch {
        let limit = self.config.message_timeout;
        let (name, folder) = (account.name.as_str(), account.mailbox.as_str());
        let state = db_timed(
            limit,
            "reading the poll state",
            store::load_state(&self.pool, name, folder),
        )
        .await;
        let state = match state {
            Ok(Some(state)) => state,
            Ok(None) => return IdleFetch::ToTick("the mailbox was never polled"),
            Err(failure) => {
                tracing::debug!(job = JOB_NAME, account = name, error = %failure, "the poll state could not be read");
                return IdleFetch::ToTick("the poll state could not be read");
            }
        };
        if state.uidvalidity != uidvalidity {
            // The first poll (0), a mailbox started over, or a state set by hand: the tick
            // decides where the mailbox starts, as it always has.
            return IdleFetch::ToTick("the stored UIDVALIDITY is not the session's");
        }
        if state.stored_above {
            return IdleFetch::ToTick("rows are stored above the last UID: the existence check");
        }
        let Some(first) = state.last_uid.checked_add(1) else {
            return IdleFetch::Done;
        };

        let new = tokio::select! {
            () = cancel.cancelled() => return IdleFetch::Cancelled,
            new = timed(Stage::Fetch, limit, fetch_new_sizes(session, first)) => new,
        };
        let new = match new {
            Ok(new) => new,
            Err(err) => return IdleFetch::Broken(classify_imap(&err)),
        };
        if new.is_empty() {
            return IdleFetch::Done;
        }
        let max = usize::try_from(self.config.max_messages_per_account).unwrap_or(usize::MAX);
        if new.len() > max {
            return IdleFetch::ToTick("a backlog, more than a tick's messages");
        }

        let wanted = self.bodies_wanted(account, uidvalidity, &new);
        let mut bodies = HashMap::new();
        if !wanted.is_empty() {
            // A message's timeout for each body, as the tick gives each its own.
            let n = u32::try_from(wanted.len()).unwrap_or(u32::MAX);
            let fetched = tokio::select! {
                () = cancel.cancelled() => return IdleFetch::Cancelled,
                fetched = timed(Stage::Fetch, limit.saturating_mul(n), fetch_bodies(session, &wanted)) => fetched,
            };
            // Held against no message: the tick's own path, a message at a time, finds which
            // one (if any) is at fault.
            bodies = match fetched {
                Ok(bodies) => bodies,
                Err(err) => return IdleFetch::Broken(classify_imap(&err)),
            };
        }

        let mut report = AccountReport {
            account: account.name.clone(),
            counts: MessageCounts::default(),
            failure: None,
            more_waiting: false,
            rescanned: false,
            circuit_open: None,
        };
        let sizes: HashMap<u32, u32> = new.iter().copied().collect();
        let uids = Uids {
            uidvalidity,
            uids: new.iter().map(|(uid, _)| *uid).collect(),
            sizes: &sizes,
            stored: &HashSet::new(),
        };
        let session_ok = self
            .read_and_write(session, account, uids, &mut bodies, cancel, &mut report)
            .await;
        self.stats.record_idle_fetch(&report);
        if report.counts.recorded() > 0 {
            let counts = &report.counts;
            tracing::info!(
                job = JOB_NAME,
                account = name,
                stored = counts.stored,
                unparsed = counts.parse_errors,
                too_large = counts.too_large,
                gave_up = counts.gave_up,
                "new mail recorded, fetched on the IDLE session"
            );
        }
        if cancel.is_cancelled() {
            return IdleFetch::Cancelled;
        }
        match report.failure {
            None => IdleFetch::Done,
            Some(failure) if session_ok => {
                tracing::warn!(job = JOB_NAME, account = name, class = %failure.class(), error = %failure, stored = report.counts.stored, "a fetch on the IDLE session stopped at a failure; the tick takes the account over");
                IdleFetch::ToTick("a message or its write failed")
            }
            Some(failure) => IdleFetch::Broken(failure),
        }
    }

    /// The UIDs whose bodies one FETCH asks for: in UID order, those within the size limit
    /// that never failed (one that did is read on its own, under its own timeout, so that it
    /// alone is held responsible), as long as their sizes fit a batch (the first at least).
    fn bodies_wanted(
        &self,
        account: &ImapAccount,
        uidvalidity: u32,
        new: &[(u32, u32)],
    ) -> Vec<u32> {
        let budget = u64::try_from(BATCH_BYTES).unwrap_or(u64::MAX);
        let mut wanted = Vec::new();
        let mut bytes = 0u64;
        for &(uid, size) in new {
            let size = u64::from(size);
            if size > self.config.max_message_bytes {
                continue;
            }
            let key = (
                account.name.clone(),
                account.mailbox.clone(),
                uidvalidity,
                uid,
            );
            if self.failed_attempts_of(&key).is_some() {
                continue;
            }
            if !wanted.is_empty() && bytes + size > budget {
                break;
            }
            bytes += size;
            wanted.push(uid);
        }
        wanted
    }
}
