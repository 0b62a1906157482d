//! `worker-host privacy export|erase`: what the host holds about one person's address, read out
//! (GDPR Art. 15) or erased (Art. 17), through [`worker_store::privacy`]. Both are audit
//! entries naming the address only by its keyed hash ([`hash_key`]). An erasure first empties
//! the broker's dead queues into the archive ([`archive_dead_queues`], the archiver's own
//! step), so that a dead letter still in a queue is erased with the rest.

use clap::Subcommand;
use worker_core::text::visible;
use worker_store::privacy::erase::Erasure;
use worker_store::privacy::export::Export;
use worker_store::privacy::{self, Address};

use super::actor::{ActorArgs, actor};
use crate::connections;
use crate::exit::Fatal;
use crate::privacy::{archive_dead_queues, hash_key};
use crate::settings::Settings;

#[derive(Debug, Subcommand)]
pub enum PrivacyAction {
    /// Print everything the host holds about one address: inbound and outbound mails (with
    /// their recipients), drafts, the actions run for them, outbox rows, dead letters, attempt
    /// rows, audit entries, and automations that name it.
    Export {
        /// The address (`ann@example.com` or `Ann <ann@example.com>`; any case).
        #[arg(long)]
        address: String,
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        actor: ActorArgs,
    },
    /// Erase the subjects, bodies, names and addresses of and to one address in every table
    /// that holds them (ids, counts, times and statuses stay). Run it with --dry-run first: it
    /// prints the rows per table and changes nothing.
    Erase {
        #[arg(long)]
        address: String,
        #[arg(long)]
        dry_run: bool,
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        actor: ActorArgs,
    },
}

pub async fn run(settings: &Settings, action: PrivacyAction) -> Result<(), Fatal> {
    let pool = worker_store::connect(&connections::pool_options(&settings.database))
        .await
        .map_err(Fatal::unavailable)?;
    let key = hash_key(settings)?;
    match action {
        PrivacyAction::Export {
            address,
            json,
            actor: given,
        } => {
            let address = Address::parse(&address).map_err(Fatal::usage)?;
            let export = privacy::export::export(&pool, &address, &key, &actor(&given))
                .await
                .map_err(|e| Fatal::software(format!("exporting: {e}")))?;
            if json {
                print_json(&export);
            } else {
                print_export(&export);
            }
        }
        PrivacyAction::Erase {
            address,
            dry_run,
            json,
            actor: given,
        } => {
            let address = Address::parse(&address).map_err(Fatal::usage)?;
            if !dry_run {
                let archived = archive_dead_queues(settings, &pool).await?;
                if archived > 0 && !json {
                    println!(
                        "archived {archived} dead letters from the broker's dead queues first"
                    );
                }
            }
            let erasure = privacy::erase::erase(&pool, &address, &key, &actor(&given), dry_run)
                .await
                .map_err(|e| Fatal::software(format!("erasing: {e}")))?;
            if json {
                print_json(&erasure);
            } else {
                print_erasure(&erasure);
            }
        }
    }
    Ok(())
}

fn print_json(value: &impl serde::Serialize) {
    println!(
        "{}",
        serde_json::to_string_pretty(value).unwrap_or_else(|e| format!("{{\"error\": \"{e}\"}}"))
    );
}

fn print_export(export: &Export) {
    println!(
        "what the host holds about {} ({} rows; audit entry {})",
        visible(&export.address),
        export.total(),
        export.action_id
    );
    for table in &export.tables {
        println!();
        println!(
            "{} ({}): {} rows",
            table.table,
            table.what,
            table.rows.len()
        );
        for row in &table.rows {
            let Some(fields) = row.as_object() else {
                continue;
            };
            println!("  -");
            for (name, value) in fields {
                if value.is_null() {
                    continue;
                }
                let shown = match value {
                    serde_json::Value::String(text) => text.clone(),
                    other => other.to_string(),
                };
                println!("    {name}: {}", visible(&shown));
            }
        }
    }
}

fn print_erasure(erasure: &Erasure) {
    let verb = if erasure.dry_run {
        "would erase (dry run: nothing changed)"
    } else {
        "erased"
    };
    println!(
        "{verb} {} rows; audit entry {} (the address recorded as its keyed hash {})",
        erasure.erased(),
        erasure.action_id,
        erasure.address_hash
    );
    for table in &erasure.tables {
        let note = if table.read_only {
            "  (configuration: shown, not erased; change it by hand)"
        } else {
            ""
        };
        println!("  {:<28} {:>6}{note}", table.table, table.rows);
    }
}

#[cfg(test)]
mod tests {
    use worker_core::Secret;
    use worker_store::privacy::Address;

    use super::*;

    fn settings(database_password: &str, privacy_key: Option<&str>) -> Settings {
        let mut settings = Settings::default();
        settings.database.password = Some(Secret::new(database_password));
        settings.admin.privacy_key = privacy_key.map(Secret::new);
        settings
    }

    #[test]
    fn the_privacy_key_keeps_an_addresss_hash_across_a_database_password_rotation() {
        let ann = Address::parse("ann@example.com").unwrap();
        let hash = |s: &Settings| hash_key(s).unwrap().hash(&ann);
        let own = "a-privacy-key-of-its-own";
        assert_eq!(
            hash(&settings("before-rotation", Some(own))),
            hash(&settings("after-rotation", Some(own)))
        );
        assert_ne!(
            hash(&settings("before-rotation", None)),
            hash(&settings("after-rotation", None)),
            "without a key of its own, the hash follows the database password"
        );
    }
}
