//! Every statement on `audit_log_entries`: the append and the search.

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::PgPool;
use uuid::Uuid;
use worker_core::Failure;
use worker_messages::AuditEntry;
use worker_store::classify;

/// The most entries one search returns, whatever it asks for.
pub const MAX_LIMIT: u32 = 500;

/// Stores `entry` unless an entry with its id is already there; `true` when it was new.
/// `ON CONFLICT DO NOTHING` rather than a read first: two replicas handed the same entry at
/// once both try, and one of them writes.
pub async fn append(pool: &PgPool, entry: &AuditEntry) -> Result<bool, Failure> {
    let inserted = sqlx::query(
        "INSERT INTO audit_log_entries \
             (id, occurred_at, actor, action, entity_type, entity_id, data) \
         VALUES ($1, $2, $3, $4, $5, $6, $7) \
         ON CONFLICT (id) DO NOTHING",
    )
    .bind(entry.id)
    .bind(entry.occurred_at)
    .bind(&entry.actor)
    .bind(&entry.action)
    .bind(&entry.entity_type)
    .bind(&entry.entity_id)
    .bind(serde_json::Value::Object(entry.data.clone()))
    .execute(pool)
    .await
    .map_err(classify)?
    .rows_affected();
    Ok(inserted == 1)
}

/// What `worker-host audit-log find` (and a console page, later) searches by; every field
/// that is set must hold.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Search {
    pub actor: Option<String>,
    pub entity_type: Option<String>,
    pub entity_id: Option<String>,
    /// Occurred at or after.
    pub since: Option<DateTime<Utc>>,
    /// Occurred before.
    pub until: Option<DateTime<Utc>>,
    /// At most this many, newest first (1 to [`MAX_LIMIT`]).
    pub limit: u32,
}

/// One stored entry, as the search returns it.
#[derive(Debug, Clone, PartialEq, Serialize, sqlx::FromRow)]
pub struct StoredEntry {
    pub id: Uuid,
    pub occurred_at: DateTime<Utc>,
    pub actor: String,
    pub action: String,
    pub entity_type: String,
    pub entity_id: String,
    pub data: serde_json::Value,
    pub recorded_at: DateTime<Utc>,
}

/// The entries `search` finds, newest first.
pub async fn find(pool: &PgPool, search: &Search) -> Result<Vec<StoredEntry>, Failure> {
    let limit = i64::from(search.limit.clamp(1, MAX_LIMIT));
    sqlx::query_as(
        "SELECT id, occurred_at, actor, action, entity_type, entity_id, data, recorded_at \
         FROM audit_log_entries \
         WHERE ($1::text IS NULL OR actor = $1) \
           AND ($2::text IS NULL OR entity_type = $2) \
           AND ($3::text IS NULL OR entity_id = $3) \
           AND ($4::timestamptz IS NULL OR occurred_at >= $4) \
           AND ($5::timestamptz IS NULL OR occurred_at < $5) \
         ORDER BY occurred_at DESC, id DESC \
         LIMIT $6",
    )
    .bind(&search.actor)
    .bind(&search.entity_type)
    .bind(&search.entity_id)
    .bind(search.since)
    .bind(search.until)
    .bind(limit)
    .fetch_all(pool)
    .await
    .map_err(classify)
}
