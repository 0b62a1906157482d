//! `privacy export` (GDPR Art. 15): every row the host holds about one address, whole, table by
//! table, read in one snapshot; the reading itself is an audit entry that names the address
//! only by its keyed hash.

use serde::Serialize;
use serde_json::{Value as Json, json};
use sqlx::PgPool;
use worker_core::Failure;

use super::tables::Kind;
use super::{Address, HashKey, find};
use crate::audit::{self, Actor, EntryKind, NewEntry};
use crate::classify;

/// What the host holds about one address.
#[derive(Debug, Clone, Serialize)]
pub struct Export {
    pub address: String,
    pub exported_at: chrono::DateTime<chrono::Utc>,
    pub tables: Vec<TableRows>,
    /// The audit entry that records the reading.
    pub action_id: i64,
}

/// One table's rows about the person, each whole (every column).
#[derive(Debug, Clone, Serialize)]
pub struct TableRows {
    pub table: &'static str,
    pub what: &'static str,
    pub rows: Vec<Json>,
}

impl Export {
    pub fn total(&self) -> usize {
        self.tables.iter().map(|t| t.rows.len()).sum()
    }
}

/// Reads everything the host holds about `address`, and records that `actor` read it.
pub async fn export(
    pool: &PgPool,
    address: &Address,
    key: &HashKey,
    actor: &Actor,
) -> Result<Export, Failure> {
    let mut tx = pool.begin().await.map_err(classify)?;
    // One snapshot for every table, so the rows tie together as the ids say.
    sqlx::query("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ WRITE")
        .execute(&mut *tx)
        .await
        .map_err(classify)?;
    let holdings = find::find(&mut tx, address, false).await?;
    let mut tables = Vec::new();
    for (table, found) in &holdings.tables {
        let ctids: Vec<String> = found.iter().map(|f| f.ctid.clone()).collect();
        let rows: Vec<Json> = sqlx::query_scalar(&format!(
            "SELECT to_jsonb(t) FROM {} t WHERE ctid = ANY($1::text[]::tid[]) ORDER BY ctid",
            table.name
        ))
        .bind(&ctids)
        .fetch_all(&mut *tx)
        .await
        .map_err(classify)?;
        let bytes: Vec<&str> = table
            .columns
            .iter()
            .filter(|c| c.kind == Kind::Bytes)
            .map(|c| c.name)
            .collect();
        let rows = rows.into_iter().map(|row| readable(row, &bytes)).collect();
        tables.push(TableRows {
            table: table.name,
            what: table.what,
            rows,
        });
    }
    let counts: serde_json::Map<String, Json> = tables
        .iter()
        .map(|t| (t.table.to_string(), json!(t.rows.len())))
        .collect();
    let total: usize = tables.iter().map(|t| t.rows.len()).sum();
    let action_id = audit::record(
        &mut tx,
        &NewEntry::new(
            EntryKind::PrivacyExport,
            actor,
            json!({ "address_hmac": key.hash(address), "tables": counts }),
        ),
        total as u64,
        0,
        Some(format!("exported {total} rows held about one address")),
    )
    .await?;
    tx.commit().await.map_err(classify)?;
    Ok(Export {
        address: address.to_string(),
        exported_at: chrono::Utc::now(),
        tables,
        action_id,
    })
}

/// A row with its byte columns (PostgreSQL's `\x…` hex) as text when they are UTF-8.
fn readable(mut row: Json, bytes: &[&str]) -> Json {
    for name in bytes {
        let Some(Json::String(hex)) = row.get(*name) else {
            continue;
        };
        if let Some(decoded) = unhex(hex.trim_start_matches("\\x"))
            && let Ok(text) = String::from_utf8(decoded)
        {
            row[*name] = Json::String(text);
        }
    }
    row
}

fn unhex(hex: &str) -> Option<Vec<u8>> {
    if !hex.len().is_multiple_of(2) {
        return None;
    }
    (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(hex.get(i..i + 2)?, 16).ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_byte_column_is_shown_as_text_when_it_is_utf8() {
        let row = json!({"id": 1, "body": "\\x7b2261223a317d", "raw": "\\xff"});
        let shown = readable(row, &["body", "raw"]);
        assert_eq!(shown["body"], "{\"a\":1}");
        assert_eq!(
            shown["raw"], "\\xff",
            "not UTF-8: left as PostgreSQL wrote it"
        );
    }
}
