//! `privacy erase` (GDPR Art. 17): in one transaction, the subjects, bodies, names and
//! addresses of and to one person, in every table of the map ([`super::tables`]), replaced by
//! `[erased]` (addresses by the person's pseudonym, [`HashKey::pseudonym`], so that counts by
//! address, the reply limit's among them, still add up). Ids, counts, times and statuses stay.
//! The erasure is an audit entry of its own, naming the address only by its keyed hash; a dry
//! run changes nothing and records what it would have changed.

use serde_json::{Value as Json, json};
use sqlx::{PgConnection, PgPool};
use worker_core::Failure;

use super::find::{self, Found, Value};
use super::tables::{Column, Kind, Table, Treat, WHOLE_KEYS};
use super::{Address, ERASED, HashKey};
use crate::audit::{self, Actor, EntryKind, NewEntry};
use crate::classify;

/// What an erasure changed (or, dry, would change): rows per table, and its audit entry.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Erasure {
    pub dry_run: bool,
    /// Every table of the map, with the rows that concern the person.
    pub tables: Vec<TableCount>,
    /// The audit entry that records it.
    pub action_id: i64,
    /// The address's keyed hash, as the audit entry records it.
    pub address_hash: String,
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct TableCount {
    pub table: &'static str,
    pub rows: usize,
    /// Configuration an operator must change: counted, never erased.
    pub read_only: bool,
}

impl Erasure {
    /// Rows erased (or to erase) over every table, configuration left out.
    pub fn erased(&self) -> usize {
        self.tables
            .iter()
            .filter(|t| !t.read_only)
            .map(|t| t.rows)
            .sum()
    }
}

/// Erases (or, with `dry_run`, counts) what the host holds about `address`, in one
/// transaction, audited as `actor`'s.
pub async fn erase(
    pool: &PgPool,
    address: &Address,
    key: &HashKey,
    actor: &Actor,
    dry_run: bool,
) -> Result<Erasure, Failure> {
    let mut tx = pool.begin().await.map_err(classify)?;
    let holdings = find::find(&mut tx, address, !dry_run).await?;
    let pseudonym = key.pseudonym(address);
    let tables: Vec<TableCount> = holdings
        .tables
        .iter()
        .map(|(table, rows)| TableCount {
            table: table.name,
            rows: rows.len(),
            read_only: table.read_only,
        })
        .collect();
    if !dry_run {
        for (table, rows) in &holdings.tables {
            if table.read_only {
                continue;
            }
            for row in rows {
                update(&mut tx, table, row, address, &pseudonym).await?;
            }
        }
    }
    let address_hash = key.hash(address);
    let counts: serde_json::Map<String, Json> = tables
        .iter()
        .map(|t| (t.table.to_string(), json!(t.rows)))
        .collect();
    let mut entry = NewEntry::new(
        EntryKind::PrivacyErase,
        actor,
        json!({ "address_hmac": address_hash, "tables": counts }),
    );
    entry.dry_run = dry_run;
    let erasure_rows = tables
        .iter()
        .filter(|t| !t.read_only)
        .map(|t| t.rows as u64)
        .sum();
    let action_id = if dry_run {
        let id = audit::begin(&mut tx, &entry).await?;
        audit::finish(&mut tx, id, Some(note(&tables, true)), Some(erasure_rows)).await?;
        id
    } else {
        audit::record(&mut tx, &entry, erasure_rows, 0, Some(note(&tables, false))).await?
    };
    tx.commit().await.map_err(classify)?;
    Ok(Erasure {
        dry_run,
        tables,
        action_id,
        address_hash,
    })
}

fn note(tables: &[TableCount], dry_run: bool) -> String {
    let listed = tables
        .iter()
        .filter(|t| t.rows > 0)
        .map(|t| format!("{} {}", t.rows, t.table))
        .collect::<Vec<_>>()
        .join(", ");
    let verb = if dry_run { "would erase" } else { "erased" };
    if listed.is_empty() {
        format!("{verb} nothing: no row holds the address")
    } else {
        format!("{verb} one person's data: {listed}")
    }
}

/// Rewrites one row's personal columns; an audit entry is also marked redacted, which the
/// trail's rule requires of any change to a finished entry.
async fn update(
    conn: &mut PgConnection,
    table: &Table,
    row: &Found,
    address: &Address,
    pseudonym: &str,
) -> Result<(), Failure> {
    let mut erased: Vec<Value> = table
        .columns
        .iter()
        .zip(&row.values)
        .map(|(column, value)| erase_value(column, value, address, pseudonym))
        .collect();
    let changed = |erased: &[Value]| erased.iter().zip(&row.values).any(|(e, v)| e != v);
    if !changed(&erased) {
        return Ok(());
    }
    if table.name == AUDIT_TABLE {
        for (column, value) in table.columns.iter().zip(erased.iter_mut()) {
            if column.name == "filter" {
                *value = mark_redacted(value.clone());
            }
        }
    }
    let mut sets = Vec::new();
    let mut values = Vec::new();
    for ((column, new), old) in table.columns.iter().zip(erased).zip(&row.values) {
        if &new != old {
            values.push(new);
            sets.push(format!("{} = ${}", column.name, values.len() + 1));
        }
    }
    let sql = format!(
        "UPDATE {} SET {} WHERE ctid = $1::tid",
        table.name,
        sets.join(", ")
    );
    let mut query = sqlx::query(&sql).bind(&row.ctid);
    for value in values {
        query = match value {
            Value::Text(v) => query.bind(v),
            Value::TextArray(v) => query.bind(v),
            Value::Json(v) => query.bind(v),
            Value::Bytes(v) => query.bind(v),
        };
    }
    query.execute(conn).await.map_err(classify)?;
    Ok(())
}

/// The audit trail's table, whose changed rows carry the redaction's mark.
const AUDIT_TABLE: &str = "dead_letter_actions";

fn mark_redacted(value: Value) -> Value {
    match value {
        Value::Json(Some(Json::Object(mut target))) => {
            let mut redacted = match target.remove("redacted") {
                Some(Json::Object(map)) => map,
                _ => serde_json::Map::new(),
            };
            redacted.insert("erased_at".into(), json!(chrono::Utc::now()));
            target.insert("redacted".into(), Json::Object(redacted));
            Value::Json(Some(Json::Object(target)))
        }
        other => other,
    }
}

/// One column's value with the person erased from it.
pub fn erase_value(column: &Column, value: &Value, address: &Address, pseudonym: &str) -> Value {
    let text = |t: &String| -> String {
        match column.treat {
            Treat::Whole => ERASED.to_string(),
            Treat::Address => address.replace_in(t, pseudonym),
            Treat::Scrub => address.replace_in(t, ERASED),
        }
    };
    match (column.kind, value) {
        (Kind::Text, Value::Text(v)) => Value::Text(v.as_ref().map(text)),
        (Kind::TextArray, Value::TextArray(v)) => Value::TextArray(v.as_ref().map(|items| {
            items
                .iter()
                .map(|item| match column.treat {
                    // An address list keeps its other people; the person's entry, with its
                    // display name, becomes the pseudonym.
                    Treat::Address if address.is_in(item) => pseudonym.to_string(),
                    _ => text(item),
                })
                .collect()
        })),
        (Kind::Json, Value::Json(v)) => {
            Value::Json(v.as_ref().map(|j| erase_json(j, address, false)))
        }
        (Kind::Bytes, Value::Bytes(v)) => {
            Value::Bytes(v.as_ref().map(|_| ERASED.as_bytes().to_vec()))
        }
        (_, other) => other.clone(),
    }
}

/// A JSON value with every string that holds the address, and every string under a key of
/// [`WHOLE_KEYS`], replaced by `[erased]`; its shape (keys, lengths, numbers) kept, as the audit
/// trail's rule requires of a redaction.
pub fn erase_json(value: &Json, address: &Address, whole: bool) -> Json {
    match value {
        Json::String(s) if whole || address.is_in(s) => Json::String(ERASED.into()),
        Json::Array(items) => Json::Array(
            items
                .iter()
                .map(|i| erase_json(i, address, whole))
                .collect(),
        ),
        Json::Object(map) => Json::Object(
            map.iter()
                .map(|(k, v)| {
                    let whole = whole || WHOLE_KEYS.contains(&k.as_str());
                    (k.clone(), erase_json(v, address, whole))
                })
                .collect(),
        ),
        other => other.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ann() -> Address {
        Address::parse("ann@example.com").unwrap()
    }

    #[test]
    fn an_address_list_keeps_its_other_people() {
        let column = Column {
            name: "to_addresses",
            kind: Kind::TextArray,
            treat: Treat::Address,
        };
        let value = Value::TextArray(Some(vec![
            "Ann <ANN@example.com>".into(),
            "bob@example.com".into(),
        ]));
        assert_eq!(
            erase_value(&column, &value, &ann(), "erased-1@invalid"),
            Value::TextArray(Some(vec![
                "erased-1@invalid".into(),
                "bob@example.com".into()
            ]))
        );
    }

    #[test]
    fn json_keeps_its_shape_and_loses_the_content() {
        let event = json!({"id": 7, "data": {"from": "ann@example.com", "subject": "ping",
                            "to": ["desk@host"], "text": {"nested": "x"}, "n": 3}});
        assert_eq!(
            erase_json(&event, &ann(), false),
            json!({"id": 7, "data": {"from": "[erased]", "subject": "[erased]",
                   "to": ["desk@host"], "text": {"nested": "[erased]"}, "n": 3}})
        );
    }
}
