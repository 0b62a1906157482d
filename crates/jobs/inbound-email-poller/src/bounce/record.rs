//! Recording what reports say, in the transaction that stores the reports themselves: a row
//! of `outbound_bounces` per report and recipient, linked to the outbound mail whose
//! Message-ID the report names (the first of [`Report::link_candidates`] the host sent), and
//! that mail made `bounced` by a permanent failure. One statement for a whole batch.

use sqlx::PgConnection;
use uuid::Uuid;
use worker_core::Failure;
use worker_store::classify;

use super::{Class, Report};

/// One report of the batch, and the row it was stored as.
#[derive(Debug, Clone, Copy)]
pub struct Reported<'a> {
    pub inbound_email_id: Uuid,
    pub report: &'a Report,
}

/// What a batch's reports added: each recipient's row once (a report read again adds none).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Recorded {
    /// Rows added, by class and by whether they were tied to a mail the host sent.
    pub counts: Vec<(Class, bool, u64)>,
    /// The outbound mails made `bounced`.
    pub bounced: Vec<Uuid>,
}

/// `linked` takes, per row, the first candidate Message-ID that an outbound mail has (a key
/// lookup each, on `outbound_emails`' unique Message-ID). Only the rows inserted move a mail
/// to `bounced`, and only from `sent` or `unknown` (a bounce proves the relay took it): a mail
/// still queued or already refused is left as it is.
const RECORD_SQL: &str = r#"
WITH b AS (
    SELECT * FROM unnest($1::uuid[], $2::text[], $3::text[], $4::text[], $5::text[],
                         $6::text[], $7::timestamptz[], $8::jsonb[])
        AS b(inbound_email_id, recipient, action, status, class, diagnostic, reported_at,
             candidates)
),
linked AS (
    SELECT b.*, (
        SELECT o.id FROM jsonb_array_elements_text(b.candidates) WITH ORDINALITY AS c(id, n)
        JOIN outbound_emails o ON o.message_id = c.id
        ORDER BY c.n LIMIT 1) AS outbound_email_id
    FROM b
),
ins AS (
    INSERT INTO outbound_bounces (inbound_email_id, outbound_email_id, recipient, action,
                                  status, class, diagnostic, reported_at)
    SELECT inbound_email_id, outbound_email_id, recipient, action, status, class, diagnostic,
           reported_at
    FROM linked
    ON CONFLICT (inbound_email_id, recipient) DO NOTHING
    RETURNING outbound_email_id, class
),
bounced AS (
    UPDATE outbound_emails o SET status = 'bounced', updated_at = now()
    WHERE o.id IN (SELECT outbound_email_id FROM ins WHERE class = 'permanent')
      AND o.status IN ('sent', 'unknown')
    RETURNING o.id
)
SELECT
    coalesce((SELECT array_agg(class) FROM ins), '{}') AS classes,
    coalesce((SELECT array_agg(outbound_email_id IS NOT NULL) FROM ins), '{}') AS matched,
    coalesce((SELECT array_agg(id) FROM bounced), '{}') AS bounced
"#;

/// Records `reports` on `conn` (the batch's transaction).
pub async fn record_reports(
    conn: &mut PgConnection,
    reports: &[Reported<'_>],
) -> Result<Recorded, Failure> {
    let rows: Vec<(Uuid, &super::RecipientReport, serde_json::Value)> = reports
        .iter()
        .flat_map(|r| {
            let candidates = serde_json::Value::from(r.report.link_candidates());
            r.report
                .recipients
                .iter()
                .map(move |recipient| (r.inbound_email_id, recipient, candidates.clone()))
        })
        .collect();
    if rows.is_empty() {
        return Ok(Recorded::default());
    }
    let (classes, matched, bounced): (Vec<String>, Vec<bool>, Vec<Uuid>) =
        sqlx::query_as(RECORD_SQL)
            .bind(rows.iter().map(|(id, _, _)| *id).collect::<Vec<_>>())
            .bind(
                rows.iter()
                    .map(|(_, r, _)| r.recipient.as_str())
                    .collect::<Vec<_>>(),
            )
            .bind(
                rows.iter()
                    .map(|(_, r, _)| r.action.as_str())
                    .collect::<Vec<_>>(),
            )
            .bind(
                rows.iter()
                    .map(|(_, r, _)| r.status.as_deref())
                    .collect::<Vec<_>>(),
            )
            .bind(
                rows.iter()
                    .map(|(_, r, _)| r.class().as_str())
                    .collect::<Vec<_>>(),
            )
            .bind(
                rows.iter()
                    .map(|(_, r, _)| r.diagnostic.as_deref())
                    .collect::<Vec<_>>(),
            )
            .bind(rows.iter().map(|(_, r, _)| r.at).collect::<Vec<_>>())
            .bind(rows.iter().map(|(_, _, c)| c.clone()).collect::<Vec<_>>())
            .fetch_one(conn)
            .await
            .map_err(classify)?;
    let mut counts: Vec<(Class, bool, u64)> = Vec::new();
    for (class, matched) in classes.iter().zip(matched) {
        let Some(class) = Class::parse(class) else {
            continue;
        };
        match counts
            .iter_mut()
            .find(|(c, m, _)| *c == class && *m == matched)
        {
            Some((_, _, n)) => *n += 1,
            None => counts.push((class, matched, 1)),
        }
    }
    Ok(Recorded { counts, bounced })
}
