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

/// What `worker-host audit-log find` and the console's `/audit-log` search by; every field
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
    /// Only entries older than this one, in the search's order (a page's "older" link): keyset
    /// paging, so that a page never repeats or skips an entry stored meanwhile.
    pub before: Option<Cursor>,
}

/// Where a page of a search ended: its last entry's time and id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cursor {
    pub occurred_at: DateTime<Utc>,
    pub id: Uuid,
}

impl Cursor {
    /// The cursor after `entry`.
    pub fn after(entry: &StoredEntry) -> Self {
        Self {
            occurred_at: entry.occurred_at,
            id: entry.id,
        }
    }
}

impl std::fmt::Display for Cursor {
    /// `2026-12-04T10:00:00.123456Z_<uuid>`, as a page's link carries it.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let at = self
            .occurred_at
            .to_rfc3339_opts(chrono::SecondsFormat::Micros, true);
        write!(f, "{at}_{}", self.id)
    }
}

impl std::str::FromStr for Cursor {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let expected = || format!("expected a page's cursor (time_id), found `{text}`");
        let (at, id) = text.rsplit_once('_').ok_or_else(expected)?;
        Ok(Self {
            occurred_at: DateTime::parse_from_rfc3339(at)
                .map_err(|_| expected())?
                .with_timezone(&Utc),
            id: id.parse().map_err(|_| expected())?,
        })
    }
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
           AND ($7::timestamptz IS NULL OR (occurred_at, id) < ($7, $8)) \
         ORDER BY occurred_at DESC, id DESC \
         LIMIT $6",
    )
    .bind(&search.actor)
    .bind(&search.entity_type)
    .bind(&search.entity_id)
    .bind(search.since)
    .bind(search.until)
    .bind(limit)
    .bind(search.before.map(|c| c.occurred_at))
    .bind(search.before.map(|c| c.id))
    .fetch_all(pool)
    .await
    .map_err(classify)
}
