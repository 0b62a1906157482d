//! One mailbox of an account in one tick: its poll state (UIDVALIDITY, the last UID, the
//! first poll's history), which UIDs are new and their sizes, and each new message handed to
//! [`crate::message`] under its own timeout.

use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;
use worker_core::{Failure, UnitError, run_unit};

use crate::fetch::{fetch_arrivals, fetch_sizes};
use crate::imap::{Session, timed};
use crate::message::{Disposition, message_span};
use crate::store::PollState;
use crate::*;

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

        // Only the lease holder polls this mailbox, so what is stored now stays so for the
        // tick; `store::record` refuses a second row all the same.
        let stored = match store::stored_among(
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
        };

        for uid in uids {
            let size = sizes.get(&uid).copied();
            let stored = stored.contains(&uid);
            let span = message_span(account, uidvalidity, uid);
            let unit = run_unit(JOB_NAME, limit, cancel, |_token| async {
                Ok(self
                    .handle_message(session, account, uidvalidity, uid, size, stored)
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
                        Disposition::Stored { parse_error } => {
                            report.counts.stored += 1;
                            report.counts.parse_errors += u64::from(parse_error);
                        }
                        Disposition::TooLarge => report.counts.too_large += 1,
                        Disposition::TooComplex => report.counts.too_complex += 1,
                        Disposition::GaveUp => report.counts.gave_up += 1,
                        Disposition::Duplicate => report.counts.duplicates += 1,
                        Disposition::Vanished => report.counts.vanished += 1,
                    }
                }
                Ok(Err(failed)) => {
                    if failed.counts_as_attempt {
                        self.count_failed_attempt(&key, &failed.failure);
                    }
                    report.failure = Some(failed.failure.context(format!("message UID {uid}")));
                    return !failed.session_broken;
                }
                Err(UnitError::Failed(failure)) => {
                    // Its timeout, or a panic: the message's own fault, as far as we can tell.
                    self.count_failed_attempt(&key, &failure);
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
