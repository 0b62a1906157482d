//! `worker-host audit-log find`: the audit entries other teams published (`audit.entry`), as
//! the audit-log job stored them, newest first. Every stored value is printed through
//! [`visible`]: an entry cannot send escapes to the operator's terminal.

use chrono::{DateTime, Utc};
use clap::{Args, Subcommand};
use job_audit_log::{Search, StoredEntry};
use worker_core::text::{visible, visible_json};

use super::dlq::parse_since;
use crate::connections;
use crate::exit::Fatal;
use crate::settings::Settings;

#[derive(Debug, Subcommand)]
pub enum AuditLogAction {
    /// The entries a search finds, newest first.
    Find(FindArgs),
}

#[derive(Debug, Args)]
pub struct FindArgs {
    /// Who did it, exactly as published.
    #[arg(long)]
    pub actor: Option<String>,
    /// The kind of entity it was done to (`shipment`).
    #[arg(long)]
    pub entity_type: Option<String>,
    /// The entity's id, exactly as published.
    #[arg(long)]
    pub entity_id: Option<String>,
    /// Occurred at or after: an RFC 3339 time, 2026-11-29T10:00 (UTC) or an age (2h, 30m).
    #[arg(long, value_parser = parse_since)]
    pub since: Option<DateTime<Utc>>,
    /// Occurred before: an RFC 3339 time or an age.
    #[arg(long, value_parser = parse_since)]
    pub until: Option<DateTime<Utc>>,
    /// At most this many (1 to 500).
    #[arg(long, default_value_t = 50)]
    pub limit: u32,
    #[arg(long)]
    pub json: bool,
}

pub async fn run(settings: &Settings, action: AuditLogAction) -> Result<(), Fatal> {
    let AuditLogAction::Find(args) = action;
    let pool = worker_store::connect(&connections::pool_options(&settings.database))
        .await
        .map_err(Fatal::unavailable)?;
    let search = Search {
        actor: args.actor,
        entity_type: args.entity_type,
        entity_id: args.entity_id,
        since: args.since,
        until: args.until,
        limit: args.limit,
        before: None,
    };
    let found = job_audit_log::find(&pool, &search)
        .await
        .map_err(|e| Fatal::software(format!("searching the audit log: {e}")))?;
    if args.json {
        let json = serde_json::to_string_pretty(&found).unwrap_or_default();
        println!("{}", visible_json(&json));
    } else if found.is_empty() {
        println!("no audit entry matches");
    } else {
        found.iter().for_each(print_line);
    }
    Ok(())
}

fn print_line(entry: &StoredEntry) {
    println!(
        "{}  {}  {:<28}  {:<24}  {}:{}",
        entry.id,
        entry.occurred_at.format("%Y-%m-%d %H:%M:%S"),
        visible(&entry.actor),
        visible(&entry.action),
        visible(&entry.entity_type),
        visible(&entry.entity_id),
    );
}
