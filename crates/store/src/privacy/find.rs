//! Which rows of each table concern one person: those whose columns hold the address (a
//! regular expression PostgreSQL runs, [`Address::pattern`]), and those tied by id to the
//! person's rows in the tables before ([`Table::link`]).

use sqlx::postgres::PgRow;
use sqlx::{PgConnection, Row};
use worker_core::Failure;

use super::Address;
use super::tables::{Column, Kind, TABLES, Table};
use crate::classify;

/// One column's value, as read.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    Text(Option<String>),
    TextArray(Option<Vec<String>>),
    Json(Option<serde_json::Value>),
    Bytes(Option<Vec<u8>>),
}

/// A row that concerns the person: where it is (its `ctid`, stable in the transaction that
/// locked it) and its personal columns, in the table's order.
#[derive(Debug, Clone)]
pub struct Found {
    pub ctid: String,
    pub values: Vec<Value>,
    /// The row's id, for the export.
    pub key: String,
}

/// The rows of each table that concern the person.
#[derive(Debug, Clone)]
pub struct Holdings {
    pub tables: Vec<(&'static Table, Vec<Found>)>,
}

impl Holdings {
    /// Rows per table, every table listed.
    pub fn counts(&self) -> Vec<(&'static str, usize)> {
        self.tables
            .iter()
            .map(|(t, rows)| (t.name, rows.len()))
            .collect()
    }

    pub fn total(&self) -> usize {
        self.tables.iter().map(|(_, rows)| rows.len()).sum()
    }
}

/// How a column is matched as text.
fn as_text(column: &Column) -> String {
    let name = column.name;
    match column.kind {
        Kind::Text => name.to_string(),
        Kind::TextArray => format!("array_to_string({name}, ' ')"),
        Kind::Json => format!("{name}::text"),
        Kind::Bytes => format!("encode({name}, 'escape')"),
    }
}

/// The rows of every table that concern `address`; `lock` takes them `FOR UPDATE` (an
/// erasure's transaction).
pub async fn find(
    conn: &mut PgConnection,
    address: &Address,
    lock: bool,
) -> Result<Holdings, Failure> {
    let pattern = address.pattern();
    let mut ids: Vec<String> = Vec::new();
    let mut tables = Vec::new();
    for table in TABLES {
        let matched = table
            .columns
            .iter()
            .map(|c| format!("{} ~* $1", as_text(c)))
            .chain(table.link.map(str::to_string))
            .collect::<Vec<_>>()
            .join(" OR ");
        let only = table
            .only
            .map(|only| format!("({only}) AND "))
            .unwrap_or_default();
        let columns = table
            .columns
            .iter()
            .map(|c| c.name)
            .collect::<Vec<_>>()
            .join(", ");
        let id_columns = table
            .ids
            .iter()
            .map(|c| format!(", {c}::text AS \"id:{c}\""))
            .collect::<String>();
        let sql = format!(
            "SELECT ctid::text AS row_ctid, to_jsonb(t) ->> {key} AS row_key{id_columns}, \
                    {columns} \
             FROM {name} t WHERE {only}({matched}) ORDER BY ctid{lock}",
            key = key_expression(table),
            name = table.name,
            lock = if lock { " FOR UPDATE" } else { "" },
        );
        let rows = sqlx::query(&sql)
            .bind(&pattern)
            .bind(&ids)
            .fetch_all(&mut *conn)
            .await
            .map_err(classify)?;
        let mut found = Vec::with_capacity(rows.len());
        for row in rows {
            for column in table.ids {
                let id: Option<String> = row
                    .try_get(format!("id:{column}").as_str())
                    .map_err(classify)?;
                ids.extend(id);
            }
            found.push(read(table, &row)?);
        }
        tables.push((table, found));
    }
    Ok(Holdings { tables })
}

/// The column that names a row in the export (`id`, or the recipient row's mail).
fn key_expression(table: &Table) -> &'static str {
    match table.name {
        "outbound_email_recipients" => "'outbound_email_id'",
        "automations" => "'name'",
        _ => "'id'",
    }
}

fn read(table: &Table, row: &PgRow) -> Result<Found, Failure> {
    let mut values = Vec::with_capacity(table.columns.len());
    for column in table.columns {
        let name = column.name;
        values.push(match column.kind {
            Kind::Text => Value::Text(row.try_get(name).map_err(classify)?),
            Kind::TextArray => Value::TextArray(row.try_get(name).map_err(classify)?),
            Kind::Json => Value::Json(row.try_get(name).map_err(classify)?),
            Kind::Bytes => Value::Bytes(row.try_get(name).map_err(classify)?),
        });
    }
    Ok(Found {
        ctid: row.try_get("row_ctid").map_err(classify)?,
        key: row
            .try_get::<Option<String>, _>("row_key")
            .map_err(classify)?
            .unwrap_or_default(),
        values,
    })
}

/// Whether the table's name is one of the map's (for callers that name tables).
pub fn is_mapped(name: &str) -> bool {
    TABLES.iter().any(|t| t.name == name)
}
