//! What reports said, read back for a mail's story: the bounces of the mails a story sent, and
//! what a report (itself a stored mail) said.

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::PgPool;
use uuid::Uuid;
use worker_core::Failure;
use worker_store::classify;

/// One recipient's row of one report.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, sqlx::FromRow)]
pub struct BounceRecord {
    pub id: i64,
    /// The report, a stored mail.
    pub inbound_email_id: Uuid,
    /// The mail reported on; `None`: not one the host sent.
    pub outbound_email_id: Option<Uuid>,
    pub recipient: String,
    /// `failed`, `delayed`, `delivered`, `relayed` or `expanded`.
    pub action: String,
    /// The RFC 3463 status code (`5.1.1`).
    pub status: Option<String>,
    /// `permanent`, `transient` or `other`.
    pub class: String,
    pub diagnostic: Option<String>,
    /// When the report says it happened.
    pub reported_at: Option<DateTime<Utc>>,
    /// When the poller recorded it.
    pub recorded_at: DateTime<Utc>,
}

const COLUMNS: &str = "id, inbound_email_id, outbound_email_id, recipient, action, status, \
    class, diagnostic, reported_at, recorded_at";

/// The reports on the outbound mails `outbound_ids`, oldest first.
pub async fn bounces_of(
    pool: &PgPool,
    outbound_ids: &[Uuid],
) -> Result<Vec<BounceRecord>, Failure> {
    if outbound_ids.is_empty() {
        return Ok(Vec::new());
    }
    sqlx::query_as(&format!(
        "SELECT {COLUMNS} FROM outbound_bounces WHERE outbound_email_id = ANY($1) \
         ORDER BY recorded_at, id"
    ))
    .bind(outbound_ids)
    .fetch_all(pool)
    .await
    .map_err(classify)
}

/// What the reports among `inbound_ids` said, recipient by recipient; nothing for a mail that
/// is not a report.
pub async fn reported_by(
    pool: &PgPool,
    inbound_ids: &[Uuid],
) -> Result<Vec<BounceRecord>, Failure> {
    if inbound_ids.is_empty() {
        return Ok(Vec::new());
    }
    sqlx::query_as(&format!(
        "SELECT {COLUMNS} FROM outbound_bounces WHERE inbound_email_id = ANY($1) ORDER BY id"
    ))
    .bind(inbound_ids)
    .fetch_all(pool)
    .await
    .map_err(classify)
}
