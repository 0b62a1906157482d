//! One mailbox of an account in one tick: its poll state (UIDVALIDITY, the last UID, the
//! first poll's history), which UIDs are new and their sizes, each new message read by
//! [`crate::message`] under its own timeout, and the messages read written together
//! ([`crate::record`]).

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;
use worker_core::{Failure, UnitError, run_unit};

use worker_messages::EMAIL_RECEIVED;

use crate::fetch::{fetch_arrivals, fetch_sizes};
use crate::imap::{Session, timed};
use crate::message::{AttemptKey, Disposition, Prepared, message_span};
use crate::record::{self, Batch, BatchEvent, BatchRow};
use crate::store::PollState;
use crate::*;

/// The most body bytes a batch holds before it is written: a tick of large mails is written
/// in several batches rather than held in memory whole.
pub(crate) const BATCH_BYTES: usize = 8 * 1024 * 1024;

/// The messages of one read: their UIDs in order, under their UIDVALIDITY, with their sizes
/// (a UID without one is gone) and those stored already.
pub(crate) struct Uids<'a> {
    pub(crate) uidvalidity: u32,
    pub(crate) uids: Vec<u32>,
    pub(crate) sizes: &'a HashMap<u32, u32>,
    pub(crate) stored: &'a HashSet<u32>,
}

/// A message read, waiting for its batch's write, with its span (ended by the write).
pub(crate) struct Pending {
    uid: u32,
    key: AttemptKey,
    span: tracing::Span,
    prepared: Prepared,
}

impl InboundEmailPoller {
    /// Polls the selected mailbox; returns whether the session is still usable.
    pub(crate) async fn poll_mailbox(
        &self,
        session: &mut Session,
        account: &ImapAccount,
        cancel: &CancellationToken,
        report: &mut AccountReport,
    ) -> bool {
        let limit = self.config.message_timeout;
        let mailbox = match timed(
            Stage::Select,
            limit,
            session.select(crate::mailbox_name::encode(&account.mailbox)),
        )
        .await
        {
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
        if report.rescanned
            && let Some(reopen) = self.reopen_signal(&account.name)
        {
            // The IDLE session may still watch the mailbox that was replaced. A permit kept
            // while no session idles costs one needless reconnect at most.
            reopen.notify_one();
        }
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

        // Only the lease holder ticks, and this process's IDLE session waits for the
        // account's lock, so what is stored now stays so for the tick; an IDLE session on
        // another replica may store one of these meanwhile, and the batch's write refuses a
        // second row (and its event) all the same. Nothing is stored above the last UID unless
        // the poll state was set back or started over (`stored_above`).
        let stored = if state.stored_above {
            match store::stored_among(
                &self.pool,
                &account.name,
                &account.mailbox,
                uidvalidity,
                &uids,
            )
            .await
            {
                Ok(stored) => stored,
                Err(failure) => {
                    report.failure = Some(failure);
                    return true;
                }
            }
        } else {
            HashSet::new()
        };

        self.read_and_write(
            session,
            account,
            Uids {
                uidvalidity,
                uids,
                sizes: &sizes,
                stored: &stored,
            },
            &mut HashMap::new(),
            cancel,
            report,
        )
        .await
    }

    /// Reads `uids` in order, each under its own span and timeout ([`Self::prepare_message`],
    /// taking its body from `bodies` when it was fetched already, by the IDLE session), and
    /// writes them together, a batch (at most BATCH_BYTES of bodies) in one statement; the
    /// first failure ends it, after the messages before it are written. The tick's path and
    /// the IDLE session's alike. Returns whether the session is still usable.
    pub(crate) async fn read_and_write(
        &self,
        session: &mut Session,
        account: &ImapAccount,
        Uids {
            uidvalidity,
            uids,
            sizes,
            stored,
        }: Uids<'_>,
        bodies: &mut HashMap<u32, Vec<u8>>,
        cancel: &CancellationToken,
        report: &mut AccountReport,
    ) -> bool {
        let limit = self.config.message_timeout;
        let mut batch: Vec<Pending> = Vec::new();

        let mut bytes = 0;
        for uid in uids {
            let size = sizes.get(&uid).copied();
            let stored = stored.contains(&uid);
            let body = bodies.remove(&uid);
            let span = message_span(account, uidvalidity, uid);
            let unit = run_unit(JOB_NAME, limit, cancel, |_token| async {
                Ok(self
                    .prepare_message(session, account, uidvalidity, uid, size, stored, body)
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
            let end = |span: &tracing::Span, outcome: &str| {
                if outcome == "failed" {
                    span.record("otel.status_code", "ERROR");
                }
                span.record("outcome", outcome);
            };
            // When this message failed: why, and whether the session can still be used.
            let (failure, session_ok) = match unit {
                Ok(Ok(prepared)) => {
                    if let Prepared::Row(row) = &prepared {
                        bytes += row.bytes();
                    }
                    batch.push(Pending {
                        uid,
                        key,
                        span,
                        prepared,
                    });
                    if bytes >= BATCH_BYTES {
                        bytes = 0;
                        if !self
                            .write_batch(account, uidvalidity, std::mem::take(&mut batch), report)
                            .await
                        {
                            return true;
                        }
                    }
                    continue;
                }
                Ok(Err(failed)) => {
                    end(&span, "failed");
                    if failed.counts_as_attempt {
                        self.count_failed_attempt(&key, &failed.failure);
                    }
                    (
                        failed.failure.context(format!("message UID {uid}")),
                        !failed.session_broken,
                    )
                }
                Err(UnitError::Failed(failure)) => {
                    end(&span, "failed");
                    // Its timeout, or a panic: the message's own fault, as far as we can tell.
                    self.count_failed_attempt(&key, &failure);
                    (failure.context(format!("message UID {uid}")), false)
                }
                Err(UnitError::Cancelled) => {
                    end(&span, "cancelled");
                    // The tick ends; what was read is read again at the next.
                    for pending in &batch {
                        end(&pending.span, "cancelled");
                    }
                    return false;
                }
            };
            // The messages before this one are written all the same, and the poll of this
            // mailbox ends here (the next tick starts at this message). The report names
            // this message's failure, the first, even if that write fails too.
            self.write_batch(account, uidvalidity, batch, report).await;
            report.failure = Some(failure);
            return session_ok;
        }
        self.write_batch(account, uidvalidity, batch, report).await;
        true
    }

    /// Writes a batch of read messages ([`record::record_batch`]), then counts each one and
    /// ends its span with its outcome. A batch the database refuses for good (a row it will
    /// not take) is written again a message at a time, so that the refused one is found,
    /// held against that message only, and the ones before it are recorded. Returns whether
    /// the whole batch was written; on failure `report.failure` says why.
    pub(crate) async fn write_batch(
        &self,
        account: &ImapAccount,
        uidvalidity: u32,
        batch: Vec<Pending>,
        report: &mut AccountReport,
    ) -> bool {
        let Some(last_uid) = batch.iter().map(|p| p.uid).max() else {
            return true;
        };
        let rows: Vec<BatchRow<'_>> = batch
            .iter()
            .filter_map(|p| match &p.prepared {
                Prepared::Row(row) => Some(BatchRow {
                    id: row.id,
                    uid: p.uid,
                    skip_reason: row.skip_reason.as_deref(),
                    parsed: &row.parsed,
                    raw_size: row.raw_size,
                    content_hash: row.content_hash.as_deref(),
                    identity: row.identity(),
                    event: row.event.as_ref().map(|(id, message, headers)| BatchEvent {
                        id: *id,
                        message,
                        headers,
                    }),
                }),
                Prepared::Pass(_) => None,
            })
            .collect();
        let written = db_timed(
            self.config.message_timeout,
            "writing the batch",
            record::record_batch(
                &self.pool,
                &Batch {
                    account: &account.name,
                    mailbox: &account.mailbox,
                    uidvalidity,
                    last_uid,
                    exchange: &self.config.events_exchange,
                    routing_key: EMAIL_RECEIVED,
                    rows: &rows,
                },
            ),
        )
        .await;
        drop(rows);
        let written = match written {
            Ok((written, recorded)) => {
                self.observe_bounces(account, &recorded);
                written
            }
            Err(failure) if failure.is_permanent() && batch.len() > 1 => {
                tracing::warn!(job = JOB_NAME, account = %account.name, messages = batch.len(), error = %failure, "the database refused a batch: writing it a message at a time");
                for pending in batch {
                    let one = vec![pending];
                    if !Box::pin(self.write_batch(account, uidvalidity, one, report)).await {
                        return false;
                    }
                }
                return true;
            }
            Err(failure) => {
                let single = batch.len() == 1;
                for pending in &batch {
                    pending.span.record("otel.status_code", "ERROR");
                    pending.span.record("outcome", "failed");
                    // Only a batch of one names the message at fault.
                    if single && failure.is_permanent() {
                        self.count_failed_attempt(&pending.key, &failure);
                    }
                }
                let what = if single {
                    format!("message UID {last_uid}")
                } else {
                    let first = batch.first().map_or(last_uid, |p| p.uid);
                    format!(
                        "a batch of {} messages, UIDs {first} to {last_uid}",
                        batch.len()
                    )
                };
                report.failure = Some(failure.context(what));
                return false;
            }
        };
        for pending in batch {
            self.forgive(&pending.key);
            let disposition = match pending.prepared {
                Prepared::Pass(disposition) => disposition,
                Prepared::Row(row) => match written.get(&pending.uid) {
                    // Its row was there already: stored before this tick read it.
                    None => Disposition::Duplicate,
                    Some(Some(earlier)) => {
                        pending.span.in_scope(|| {
                            tracing::info!(job = JOB_NAME, account = %account.name, uid = pending.uid, duplicate_of = %earlier.id, earlier_uidvalidity = earlier.uidvalidity, earlier_uid = earlier.uid, "a mail recorded before under another UID: recorded as a duplicate, not announced");
                        });
                        Disposition::Duplicate
                    }
                    Some(None) => row.disposition,
                },
            };
            pending.span.record("outcome", disposition.as_str());
            let counts = &mut report.counts;
            match disposition {
                Disposition::Stored { parse_error } => {
                    counts.stored += 1;
                    counts.parse_errors += u64::from(parse_error);
                }
                Disposition::TooLarge => counts.too_large += 1,
                Disposition::TooComplex => counts.too_complex += 1,
                Disposition::GaveUp => counts.gave_up += 1,
                Disposition::Duplicate => counts.duplicates += 1,
                Disposition::Vanished => counts.vanished += 1,
                Disposition::Report => counts.reports += 1,
            }
        }
        true
    }

    /// Counts what a batch's reports added, and logs the mails they made `bounced`.
    fn observe_bounces(&self, account: &ImapAccount, recorded: &crate::bounce::record::Recorded) {
        if let Some(observe) = &self.on_bounces {
            for (class, matched, rows) in &recorded.counts {
                observe(*class, *matched, *rows);
            }
        }
        for outbound in &recorded.bounced {
            tracing::info!(job = JOB_NAME, account = %account.name, outbound_email.id = %outbound, "a delivery report failed an outbound mail for good: it is now bounced");
        }
    }

    /// Makes sure, once per process, that the account's poll state row is there before its
    /// first connection, so that `watching_since` is the start of the first process that
    /// tried, whether or not its server answered.
    pub(crate) async fn watch(&self, account: &ImapAccount) -> Result<(), Failure> {
        let known = self
            .watched
            .lock()
            .is_ok_and(|watched| watched.contains(&account.name));
        if known {
            return Ok(());
        }
        let watched = store::watch(&self.pool, &account.name, &account.mailbox, self.started_at);
        db_timed(
            self.config.message_timeout,
            "writing the poll state",
            watched,
        )
        .await?;
        if let Ok(mut watched) = self.watched.lock() {
            watched.insert(account.name.clone());
        }
        Ok(())
    }

    /// The poll state under the server's `uidvalidity`: as stored; started over from UID 1
    /// when the UIDVALIDITY changed; or, at the first selection, started after the history
    /// (from UID 1 with `backfill`). On failure, whether the session is still usable.
    pub(crate) async fn current_state(
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
            // Started over: the rows of this UIDVALIDITY, if any, are not counted here.
            stored_above: true,
        })
    }

    /// The UID the history ends at: the mail that arrived (INTERNALDATE) before `cutoff`, up
    /// to the first message that arrived after it; 0 for an empty mailbox.
    pub(crate) async fn history_end(
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
}

/// A database step of the poll under `limit`.
pub(crate) async fn db_timed<T>(
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
