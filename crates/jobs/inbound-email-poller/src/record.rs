//! A tick's batch of mails written in one statement, so one transaction and one round trip:
//! the mailbox's new last UID, each mail's identity looked up among the mail recorded before
//! (and among the batch's earlier mails), the `inbound_emails` rows, and the outbox rows of
//! their `email.received` events (the outbox table's trigger wakes the drain on commit).
//!
//! A statement is atomic: a crash, a lost connection or a refused row leaves none of the
//! batch written, and the next tick reads those mails again.

use std::collections::HashMap;
use std::sync::LazyLock;

use serde_json::Value;
use uuid::Uuid;
use worker_core::Failure;
use worker_store::classify;
use worker_store::outbox::{self, OutboxMessage};

use crate::bounce;
use crate::bounce::record::{Recorded, Reported};
use crate::parse::ParsedEmail;

/// What makes a mail the same mail: its Message-ID, or its content when it has none.
#[derive(Debug, Clone, Copy)]
pub enum Identity<'a> {
    MessageId(&'a str),
    /// Hex SHA-256 of the bytes read.
    Content(&'a str),
}

impl Identity<'_> {
    /// How a duplicate's reason names what it shares with the mail recorded before.
    fn same(&self) -> String {
        match self {
            Self::MessageId(id) => format!("the same Message-ID {id}"),
            Self::Content(hash) => format!("the same content (SHA-256 {hash})"),
        }
    }
}

/// One mail of the batch, to get a row.
#[derive(Debug)]
pub struct BatchRow<'a> {
    pub id: Uuid,
    pub uid: u32,
    /// `None`: stored (and announced when `event` is given); `Some(reason)`: skipped.
    pub skip_reason: Option<&'a str>,
    pub parsed: &'a ParsedEmail,
    pub raw_size: u64,
    /// Hex SHA-256 of the bytes read; `None` when nothing was read.
    pub content_hash: Option<&'a str>,
    /// Looked up among the mail recorded before; `None`: not looked up (nothing was read).
    pub identity: Option<Identity<'a>>,
    /// The `email.received` event, with the headers to store (taken in the mail's own span,
    /// so that its outbox row carries that span's trace context).
    pub event: Option<BatchEvent<'a>>,
}

#[derive(Debug)]
pub struct BatchEvent<'a> {
    pub id: Uuid,
    pub message: &'a OutboxMessage,
    pub headers: &'a Value,
}

/// The batch of one mailbox under one UIDVALIDITY.
#[derive(Debug)]
pub struct Batch<'a> {
    pub account: &'a str,
    pub mailbox: &'a str,
    pub uidvalidity: u32,
    /// The last UID once the batch is written: its highest, whether or not that one got a
    /// row (a UID stored already, a vanished message).
    pub last_uid: u32,
    pub exchange: &'a str,
    pub routing_key: &'a str,
    pub rows: &'a [BatchRow<'a>],
}

/// The mail a duplicate was recorded as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Earlier {
    pub id: Uuid,
    pub uidvalidity: i64,
    pub uid: i64,
}

/// What the batch's statement wrote: each row inserted, by UID, with the mail it duplicates
/// (if it does). A UID of the batch missing here had its row there already.
pub type Written = HashMap<u32, Option<Earlier>>;

/// One statement. `state` moves the last UID, and only under the batch's UIDVALIDITY: if the
/// poll state was reset underneath the tick, nothing is written. `earlier` finds each
/// mail's first row under another UID (two index lookups joined by UNION ALL, one per kind
/// of identity: the NULL of the other kind matches nothing); `first` the batch's first mail
/// of each identity, which the later ones of the batch duplicate when nothing earlier was
/// recorded (a statement does not see its own rows). The outbox rows are written only for
/// the rows inserted and not found duplicates (`ON CONFLICT DO NOTHING` and the existence
/// check keep a mail to one row and one event). The foreign key of `duplicate_of` is checked
/// at the statement's end, when the rows of the batch it names are there.
const RECORD_BATCH_TEMPLATE: &str = r#"
WITH m AS (
    SELECT * FROM unnest(
        $7::uuid[], $8::bigint[], $9::text[], $10::text[], $11::text[], $12::text[],
        $13::jsonb[], $14::jsonb[], $15::text[], $16::timestamptz[], $17::text[], $18::jsonb[],
        $19::text[], $20::text[], $21::bool[], $22::bool[], $23::bigint[], $24::text[],
        $25::text[], $26::text[], $27::text[], $28::text[], $29::uuid[],
        $30::text[], $31::text[], $32::text[], $33::text[], $34::jsonb[], $35::bytea[])
        WITH ORDINALITY AS m(id, uid, skip_reason, message_id, from_address, from_name,
            to_j, cc_j, subject, sent_at, in_reply_to, refs_j,
            text_body, html_body, text_truncated, html_truncated, raw_size, parse_error,
            content_hash, by_message_id, by_content, same, event_id,
            ob_message_id, ob_type, ob_content_type, ob_correlation, ob_headers, ob_body, n)
),
state AS (
    UPDATE imap_poll_state SET last_uid = GREATEST(last_uid, $4), updated_at = now()
    WHERE account = $1 AND mailbox = $2 AND uidvalidity = $3
    RETURNING 1
),
earlier AS (
    SELECT m.n, e.id, e.uidvalidity, e.uid
    FROM m CROSS JOIN LATERAL (
        SELECT f.id, f.uidvalidity, f.uid FROM (
            (SELECT i.id, i.uidvalidity, i.uid, i.received_at FROM inbound_emails i
             WHERE i.account = $1 AND i.mailbox = $2 AND i.message_id = m.by_message_id
               AND NOT (i.uidvalidity = $3 AND i.uid = m.uid)
             ORDER BY i.received_at, i.uidvalidity, i.uid LIMIT 1)
            UNION ALL
            (SELECT i.id, i.uidvalidity, i.uid, i.received_at FROM inbound_emails i
             WHERE i.account = $1 AND i.mailbox = $2 AND i.content_hash = m.by_content
               AND NOT (i.uidvalidity = $3 AND i.uid = m.uid)
             ORDER BY i.received_at, i.uidvalidity, i.uid LIMIT 1)
        ) f
        ORDER BY f.received_at, f.uidvalidity, f.uid LIMIT 1
    ) e
),
first AS (
    SELECT DISTINCT ON (by_message_id, by_content) n, id, uid, by_message_id, by_content
    FROM m WHERE by_message_id IS NOT NULL OR by_content IS NOT NULL
    ORDER BY by_message_id, by_content, n
),
decided AS (
    SELECT m.*, coalesce(e.id, b.id) AS dup_id,
           coalesce(e.uidvalidity, $3) AS dup_uidvalidity, coalesce(e.uid, b.uid) AS dup_uid
    FROM m
    LEFT JOIN earlier e ON e.n = m.n
    LEFT JOIN first b ON b.n < m.n
        AND b.by_message_id IS NOT DISTINCT FROM m.by_message_id
        AND b.by_content IS NOT DISTINCT FROM m.by_content
    WHERE EXISTS (SELECT 1 FROM state)
),
ins AS (
    INSERT INTO inbound_emails (
        id, account, mailbox, uidvalidity, uid, status, skip_reason,
        message_id, from_address, from_name, to_addresses, cc_addresses, subject, sent_at,
        in_reply_to, reference_ids, text_body, html_body, text_truncated, html_truncated,
        raw_size, parse_error, event_id, content_hash, duplicate_of)
    SELECT id, $1, $2, $3, uid,
        CASE WHEN dup_id IS NULL AND skip_reason IS NULL THEN 'stored' ELSE 'skipped' END,
        CASE WHEN dup_id IS NULL THEN skip_reason
             ELSE format('a duplicate of the mail recorded as %s (UIDVALIDITY %s, UID %s): %s; not announced again',
                         dup_id, dup_uidvalidity, dup_uid, same) END,
        message_id, from_address, from_name,
        ARRAY(SELECT jsonb_array_elements_text(to_j)), ARRAY(SELECT jsonb_array_elements_text(cc_j)),
        subject, sent_at, in_reply_to, ARRAY(SELECT jsonb_array_elements_text(refs_j)),
        text_body, html_body, text_truncated, html_truncated, raw_size, parse_error,
        CASE WHEN dup_id IS NULL THEN event_id END, content_hash, dup_id
    FROM decided ORDER BY n
    ON CONFLICT (account, mailbox, uidvalidity, uid) DO NOTHING
    RETURNING id, uid, event_id, duplicate_of
),
ob AS (
    <outbox insert>
    SELECT m.ob_message_id, m.ob_type, m.ob_content_type, m.ob_correlation,
           $5, $6, m.ob_headers, m.ob_body
    FROM ins JOIN m ON m.id = ins.id
    WHERE ins.event_id IS NOT NULL
    ORDER BY m.n
    RETURNING id
)
SELECT (SELECT count(*) FROM state) AS state_rows, (SELECT count(*) FROM ob) AS announced,
    coalesce(array_agg(ins.uid ORDER BY ins.uid), '{}') AS uids,
    coalesce(array_agg(ins.duplicate_of ORDER BY ins.uid), '{}') AS duplicates_of,
    coalesce(array_agg(d.dup_uidvalidity ORDER BY ins.uid), '{}') AS dup_uidvalidities,
    coalesce(array_agg(d.dup_uid ORDER BY ins.uid), '{}') AS dup_uids
FROM ins JOIN decided d ON d.id = ins.id
"#;

/// [`RECORD_BATCH_TEMPLATE`] with the outbox's insert as its owner writes it
/// ([`outbox::INSERT_INTO`]): the store owns the outbox's statements.
static RECORD_BATCH: LazyLock<String> =
    LazyLock::new(|| RECORD_BATCH_TEMPLATE.replace("<outbox insert>", outbox::INSERT_INTO));

/// The columns of [`RECORD_BATCH`]'s one row.
type Answer = (
    i64,
    i64,
    Vec<i64>,
    Vec<Option<Uuid>>,
    Vec<i64>,
    Vec<Option<i64>>,
);

/// Writes the batch in one statement (see [`RECORD_BATCH`]). Fails, with nothing written,
/// when the poll state no longer has the batch's UIDVALIDITY (reset underneath the tick).
/// A batch that holds delivery reports is written in a transaction with what they report
/// ([`bounce::record`]), so that a report is never stored without its bounces; a batch
/// without one costs its one statement, as before.
pub async fn record_batch(
    pool: &sqlx::PgPool,
    batch: &Batch<'_>,
) -> Result<(Written, Recorded), Failure> {
    if !batch.rows.iter().any(|r| r.parsed.report.is_some()) {
        return Ok((write_rows(pool, batch).await?, Recorded::default()));
    }
    let mut tx = pool.begin().await.map_err(classify)?;
    let written = write_rows(&mut *tx, batch).await?;
    // Only the reports stored now: one read again, or a duplicate, was recorded before.
    let reported: Vec<Reported<'_>> = batch
        .rows
        .iter()
        .filter(|r| matches!(written.get(&r.uid), Some(None)))
        .filter_map(|r| {
            r.parsed.report.as_ref().map(|report| Reported {
                inbound_email_id: r.id,
                report,
            })
        })
        .collect();
    let recorded = bounce::record::record_reports(&mut tx, &reported).await?;
    tx.commit().await.map_err(classify)?;
    Ok((written, recorded))
}

async fn write_rows<'e>(
    executor: impl sqlx::PgExecutor<'e>,
    batch: &Batch<'_>,
) -> Result<Written, Failure> {
    let rows = batch.rows;
    let list = |f: fn(&ParsedEmail) -> &Vec<String>| -> Vec<Value> {
        rows.iter()
            .map(|r| Value::from(f(r.parsed).clone()))
            .collect()
    };
    let text = |f: for<'r> fn(&'r BatchRow<'r>) -> Option<&'r str>| -> Vec<Option<&str>> {
        rows.iter().map(|r| f(r)).collect()
    };
    let by_message_id = text(|r| match r.identity {
        Some(Identity::MessageId(id)) => Some(id),
        _ => None,
    });
    let by_content = text(|r| match r.identity {
        Some(Identity::Content(hash)) => Some(hash),
        _ => None,
    });
    let same: Vec<Option<String>> = rows
        .iter()
        .map(|r| r.identity.as_ref().map(Identity::same))
        .collect();
    let event = |f: for<'r> fn(&'r BatchEvent<'r>) -> Option<&'r str>| -> Vec<Option<&str>> {
        rows.iter()
            .map(|r| r.event.as_ref().and_then(|e| f(e)))
            .collect()
    };
    let answer: Answer = sqlx::query_as(RECORD_BATCH.as_str())
        .bind(batch.account)
        .bind(batch.mailbox)
        .bind(i64::from(batch.uidvalidity))
        .bind(i64::from(batch.last_uid))
        .bind(batch.exchange)
        .bind(batch.routing_key)
        .bind(rows.iter().map(|r| r.id).collect::<Vec<_>>())
        .bind(rows.iter().map(|r| i64::from(r.uid)).collect::<Vec<_>>())
        .bind(text(|r| r.skip_reason))
        .bind(text(|r| r.parsed.message_id.as_deref()))
        .bind(text(|r| r.parsed.from_address.as_deref()))
        .bind(text(|r| r.parsed.from_name.as_deref()))
        .bind(list(|p| &p.to))
        .bind(list(|p| &p.cc))
        .bind(text(|r| r.parsed.subject.as_deref()))
        .bind(rows.iter().map(|r| r.parsed.sent_at).collect::<Vec<_>>())
        .bind(text(|r| r.parsed.in_reply_to.as_deref()))
        .bind(list(|p| &p.references))
        .bind(text(|r| r.parsed.text_body.as_deref()))
        .bind(text(|r| r.parsed.html_body.as_deref()))
        .bind(
            rows.iter()
                .map(|r| r.parsed.text_truncated)
                .collect::<Vec<_>>(),
        )
        .bind(
            rows.iter()
                .map(|r| r.parsed.html_truncated)
                .collect::<Vec<_>>(),
        )
        .bind(
            rows.iter()
                .map(|r| i64::try_from(r.raw_size).unwrap_or(i64::MAX))
                .collect::<Vec<_>>(),
        )
        .bind(text(|r| r.parsed.parse_error.as_deref()))
        .bind(text(|r| r.content_hash))
        .bind(by_message_id)
        .bind(by_content)
        .bind(same)
        .bind(
            rows.iter()
                .map(|r| r.event.as_ref().map(|e| e.id))
                .collect::<Vec<_>>(),
        )
        .bind(event(|e| Some(e.message.message_id.as_str())))
        .bind(event(|e| e.message.message_type.as_deref()))
        .bind(event(|e| e.message.content_type.as_deref()))
        .bind(event(|e| e.message.correlation_id.as_deref()))
        .bind(
            rows.iter()
                .map(|r| r.event.as_ref().map(|e| e.headers))
                .collect::<Vec<_>>(),
        )
        .bind(
            rows.iter()
                .map(|r| r.event.as_ref().map(|e| e.message.body.as_slice()))
                .collect::<Vec<_>>(),
        )
        .fetch_one(executor)
        .await
        .map_err(classify)?;
    let (state_rows, _announced, uids, duplicates_of, dup_uidvalidities, dup_uids) = answer;
    if state_rows != 1 {
        return Err(Failure::transient(format!(
            "the poll state of {}/{} changed under this tick (UIDVALIDITY {} is gone)",
            batch.account, batch.mailbox, batch.uidvalidity
        )));
    }
    let mut written = Written::with_capacity(uids.len());
    for (i, uid) in uids.into_iter().enumerate() {
        let Ok(uid) = u32::try_from(uid) else {
            continue;
        };
        let earlier = duplicates_of.get(i).copied().flatten().map(|id| Earlier {
            id,
            uidvalidity: dup_uidvalidities.get(i).copied().unwrap_or_default(),
            uid: dup_uids.get(i).copied().flatten().unwrap_or_default(),
        });
        written.insert(uid, earlier);
    }
    Ok(written)
}
