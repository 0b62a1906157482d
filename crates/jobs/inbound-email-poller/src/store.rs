//! The poller's tables: `imap_poll_state` and `inbound_emails` (migration
//! `20261129000300_inbound_email.sql`), written together with the outbox rows, a tick's
//! batch at a time ([`record_batch`]).

use std::collections::HashSet;

use chrono::{DateTime, Utc};
use sqlx::PgPool;
use worker_core::Failure;
use worker_store::classify;

/// Where the poller is in one mailbox.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PollState {
    /// 0 until the mailbox was first selected (no server gives 0: RFC 3501).
    pub uidvalidity: u32,
    pub last_uid: u32,
    /// Mail that arrived before this (less a margin) is history at the first selection.
    pub watching_since: DateTime<Utc>,
    /// Whether a row may be stored above `last_uid` under `uidvalidity`, so that the tick's
    /// new UIDs need their existence check ([`stored_among`]). The last UID moves in the
    /// transaction that writes the rows, so this is only so when the poll state was set
    /// back (an operator, a restored backup) or the mailbox started over.
    pub stored_above: bool,
}

/// The poll state, and whether a row is stored above its last UID: the highest UID stored
/// under its UIDVALIDITY (a backward scan of the unique key's index), read in the same
/// statement so that a tick's usual case costs no existence check of its own.
pub async fn load_state(
    pool: &PgPool,
    account: &str,
    mailbox: &str,
) -> Result<Option<PollState>, Failure> {
    let row: Option<(i64, i64, DateTime<Utc>, Option<i64>)> = sqlx::query_as(
        "SELECT s.uidvalidity, s.last_uid, s.watching_since, \
                (SELECT max(i.uid) FROM inbound_emails i \
                 WHERE i.account = s.account AND i.mailbox = s.mailbox \
                   AND i.uidvalidity = s.uidvalidity) \
         FROM imap_poll_state s WHERE s.account = $1 AND s.mailbox = $2",
    )
    .bind(account)
    .bind(mailbox)
    .fetch_optional(pool)
    .await
    .map_err(classify)?;
    Ok(
        row.map(|(uidvalidity, last_uid, watching_since, max_stored)| {
            PollState {
                // Written from u32 values only; anything else reads as "start over".
                uidvalidity: u32::try_from(uidvalidity).unwrap_or(0),
                last_uid: u32::try_from(last_uid).unwrap_or(0),
                watching_since,
                stored_above: max_stored.is_some_and(|max| max > last_uid),
            }
        }),
    )
}

/// Notes that the poller watches this mailbox since `since`, before its first connection; a
/// row already there (an earlier process's) is kept, with its earlier time.
pub async fn watch(
    pool: &PgPool,
    account: &str,
    mailbox: &str,
    since: DateTime<Utc>,
) -> Result<(), Failure> {
    sqlx::query(
        "INSERT INTO imap_poll_state (account, mailbox, uidvalidity, last_uid, watching_since) \
         VALUES ($1, $2, 0, 0, $3) ON CONFLICT (account, mailbox) DO NOTHING",
    )
    .bind(account)
    .bind(mailbox)
    .bind(since)
    .execute(pool)
    .await
    .map_err(classify)?;
    Ok(())
}

/// Starts the mailbox under `uidvalidity` after `last_uid` (0: from its first message).
pub async fn start_at(
    pool: &PgPool,
    account: &str,
    mailbox: &str,
    uidvalidity: u32,
    last_uid: u32,
) -> Result<(), Failure> {
    sqlx::query(
        "INSERT INTO imap_poll_state (account, mailbox, uidvalidity, last_uid) \
         VALUES ($1, $2, $3, $4) \
         ON CONFLICT (account, mailbox) DO UPDATE \
         SET uidvalidity = EXCLUDED.uidvalidity, last_uid = EXCLUDED.last_uid, updated_at = now()",
    )
    .bind(account)
    .bind(mailbox)
    .bind(i64::from(uidvalidity))
    .bind(i64::from(last_uid))
    .execute(pool)
    .await
    .map_err(classify)?;
    Ok(())
}

/// The existence check for a tick's new UIDs, in one statement: which of `uids` (under
/// `uidvalidity`) are stored already.
pub async fn stored_among(
    pool: &PgPool,
    account: &str,
    mailbox: &str,
    uidvalidity: u32,
    uids: &[u32],
) -> Result<HashSet<u32>, Failure> {
    let uids: Vec<i64> = uids.iter().map(|&uid| i64::from(uid)).collect();
    let stored: Vec<i64> = sqlx::query_scalar(
        "SELECT uid FROM inbound_emails \
         WHERE account = $1 AND mailbox = $2 AND uidvalidity = $3 AND uid = ANY($4)",
    )
    .bind(account)
    .bind(mailbox)
    .bind(i64::from(uidvalidity))
    .bind(&uids)
    .fetch_all(pool)
    .await
    .map_err(classify)?;
    Ok(stored
        .into_iter()
        .filter_map(|uid| u32::try_from(uid).ok())
        .collect())
}
