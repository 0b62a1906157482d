//! The poller's tables: `imap_poll_state` and `inbound_emails` (migration
//! `20261129000300_inbound_email.sql`), written together with the outbox row.

use std::collections::HashSet;

use chrono::{DateTime, Utc};
use sqlx::{PgConnection, PgPool};
use uuid::Uuid;
use worker_core::Failure;
use worker_store::classify;
use worker_store::outbox::{self, OutboxMessage};

use crate::parse::ParsedEmail;

/// Where the poller is in one mailbox.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PollState {
    /// 0 until the mailbox was first selected (no server gives 0: RFC 3501).
    pub uidvalidity: u32,
    pub last_uid: u32,
    /// Mail that arrived before this (less a margin) is history at the first selection.
    pub watching_since: DateTime<Utc>,
}

pub async fn load_state(
    pool: &PgPool,
    account: &str,
    mailbox: &str,
) -> Result<Option<PollState>, Failure> {
    let row: Option<(i64, i64, DateTime<Utc>)> = sqlx::query_as(
        "SELECT uidvalidity, last_uid, watching_since FROM imap_poll_state \
         WHERE account = $1 AND mailbox = $2",
    )
    .bind(account)
    .bind(mailbox)
    .fetch_optional(pool)
    .await
    .map_err(classify)?;
    Ok(
        row.map(|(uidvalidity, last_uid, watching_since)| PollState {
            // Written from u32 values only; anything else reads as "start over".
            uidvalidity: u32::try_from(uidvalidity).unwrap_or(0),
            last_uid: u32::try_from(last_uid).unwrap_or(0),
            watching_since,
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

/// What makes a mail the same mail: its Message-ID, or its content when it has none.
#[derive(Debug, Clone, Copy)]
pub enum Identity<'a> {
    MessageId(&'a str),
    /// Hex SHA-256 of the bytes read.
    Content(&'a str),
}

/// A mail recorded earlier.
#[derive(Debug, Clone, Copy, PartialEq, Eq, sqlx::FromRow)]
pub struct Earlier {
    pub id: Uuid,
    pub uidvalidity: i64,
    pub uid: i64,
}

/// The first row recorded from this mailbox, under any UIDVALIDITY and any other UID, with
/// the same identity.
pub async fn earlier(
    pool: &PgPool,
    account: &str,
    mailbox: &str,
    uidvalidity: u32,
    uid: u32,
    identity: Identity<'_>,
) -> Result<Option<Earlier>, Failure> {
    let (column, value) = match identity {
        Identity::MessageId(id) => ("message_id", id),
        Identity::Content(hash) => ("content_hash", hash),
    };
    // Two fixed statements (not one with an OR), so that each uses its index.
    let sql = format!(
        "SELECT id, uidvalidity, uid FROM inbound_emails \
         WHERE account = $1 AND mailbox = $2 AND {column} = $3 \
           AND NOT (uidvalidity = $4 AND uid = $5) \
         ORDER BY received_at, uidvalidity, uid LIMIT 1"
    );
    sqlx::query_as(&sql)
        .bind(account)
        .bind(mailbox)
        .bind(value)
        .bind(i64::from(uidvalidity))
        .bind(i64::from(uid))
        .fetch_optional(pool)
        .await
        .map_err(classify)
}

/// Moves the last UID up to `uid` (never down), inside the caller's transaction. Fails if
/// the poll state no longer has this UIDVALIDITY (reset underneath us).
async fn advance(
    conn: &mut PgConnection,
    account: &str,
    mailbox: &str,
    uidvalidity: u32,
    uid: u32,
) -> Result<(), Failure> {
    let done = sqlx::query(
        "UPDATE imap_poll_state SET last_uid = GREATEST(last_uid, $4), updated_at = now() \
         WHERE account = $1 AND mailbox = $2 AND uidvalidity = $3",
    )
    .bind(account)
    .bind(mailbox)
    .bind(i64::from(uidvalidity))
    .bind(i64::from(uid))
    .execute(conn)
    .await
    .map_err(classify)?;
    if done.rows_affected() == 1 {
        Ok(())
    } else {
        Err(Failure::transient(format!(
            "the poll state of {account}/{mailbox} changed under this tick (UIDVALIDITY {uidvalidity} is gone)"
        )))
    }
}

/// Moves the last UID past a message that is not stored (a duplicate, a vanished message).
pub async fn skip_past(
    pool: &PgPool,
    account: &str,
    mailbox: &str,
    uidvalidity: u32,
    uid: u32,
) -> Result<(), Failure> {
    let mut conn = pool.acquire().await.map_err(classify)?;
    advance(&mut conn, account, mailbox, uidvalidity, uid).await
}

/// One inbound email row.
#[derive(Debug)]
pub struct NewInbound<'a> {
    pub id: Uuid,
    pub account: &'a str,
    pub mailbox: &'a str,
    pub uidvalidity: u32,
    pub uid: u32,
    /// `None`: stored; `Some(reason)`: skipped.
    pub skip_reason: Option<String>,
    pub parsed: &'a ParsedEmail,
    pub raw_size: u64,
    /// Hex SHA-256 of the bytes read; `None` when nothing was read.
    pub content_hash: Option<&'a str>,
    /// For a duplicate: the row it duplicates.
    pub duplicate_of: Option<Uuid>,
}

/// In one transaction: the inbound email row, its `email.received` outbox row when there is
/// one, and the new last UID. Returns `false` when the row was there already (nothing else
/// is written then but the last UID).
pub async fn record(
    pool: &PgPool,
    row: &NewInbound<'_>,
    event: Option<(&str, &str, &OutboxMessage, Uuid)>,
) -> Result<bool, Failure> {
    let mut tx = pool.begin().await.map_err(classify)?;
    let p = row.parsed;
    let inserted = sqlx::query(
        "INSERT INTO inbound_emails ( \
             id, account, mailbox, uidvalidity, uid, status, skip_reason, \
             message_id, from_address, from_name, to_addresses, cc_addresses, subject, sent_at, \
             in_reply_to, reference_ids, text_body, html_body, text_truncated, html_truncated, \
             raw_size, parse_error, event_id, content_hash, duplicate_of) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, \
                 $18, $19, $20, $21, $22, $23, $24, $25) \
         ON CONFLICT (account, mailbox, uidvalidity, uid) DO NOTHING",
    )
    .bind(row.id)
    .bind(row.account)
    .bind(row.mailbox)
    .bind(i64::from(row.uidvalidity))
    .bind(i64::from(row.uid))
    .bind(if row.skip_reason.is_some() {
        "skipped"
    } else {
        "stored"
    })
    .bind(&row.skip_reason)
    .bind(&p.message_id)
    .bind(&p.from_address)
    .bind(&p.from_name)
    .bind(&p.to)
    .bind(&p.cc)
    .bind(&p.subject)
    .bind(p.sent_at)
    .bind(&p.in_reply_to)
    .bind(&p.references)
    .bind(&p.text_body)
    .bind(&p.html_body)
    .bind(p.text_truncated)
    .bind(p.html_truncated)
    .bind(i64::try_from(row.raw_size).unwrap_or(i64::MAX))
    .bind(&p.parse_error)
    .bind(event.map(|(_, _, _, id)| id))
    .bind(row.content_hash)
    .bind(row.duplicate_of)
    .execute(&mut *tx)
    .await
    .map_err(classify)?
    .rows_affected()
        == 1;
    if inserted && let Some((exchange, routing_key, message, _)) = event {
        outbox::enqueue(&mut tx, exchange, routing_key, message).await?;
    }
    advance(&mut tx, row.account, row.mailbox, row.uidvalidity, row.uid).await?;
    tx.commit().await.map_err(classify)?;
    Ok(inserted)
}
