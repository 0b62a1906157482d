//! `worker-host circuits list|close`: the dependencies' open circuits as the shared table has
//! them, and an operator's close, recorded in the audit trail (`circuit-close`) with who and
//! why. The console's Close circuit button does the same, through the same library.

use clap::Subcommand;
use worker_core::text::visible;
use worker_store::circuits;

use super::actor::{ActorArgs, actor};
use crate::connections;
use crate::exit::Fatal;
use crate::open_circuits::ShownCircuit;
use crate::settings::Settings;

#[derive(Debug, Subcommand)]
pub enum CircuitsAction {
    /// The open circuits: each dependency (`smtp-relay`, `imap:<account>`, `webhook:<host>`)
    /// with why it opened, since when, its failed probes and when the next probe runs.
    List {
        #[arg(long)]
        json: bool,
    },
    /// Close a dependency's open circuit on every replica: its calls start again at once, its
    /// next failures counting from zero.
    Close {
        /// The dependency, as `circuits list` names it.
        dependency: String,
        /// Why, recorded in the audit trail.
        #[arg(long)]
        reason: Option<String>,
        #[command(flatten)]
        actor: ActorArgs,
        #[arg(long)]
        json: bool,
    },
}

pub async fn run(settings: &Settings, action: CircuitsAction) -> Result<(), Fatal> {
    let pool = worker_store::connect(&connections::pool_options(&settings.database))
        .await
        .map_err(Fatal::unavailable)?;
    let result = dispatch(&pool, action).await;
    pool.close().await;
    result
}

async fn dispatch(pool: &sqlx::PgPool, action: CircuitsAction) -> Result<(), Fatal> {
    match action {
        CircuitsAction::List { json } => {
            let open = circuits::list(pool).await.map_err(Fatal::from_failure)?;
            let shown = ShownCircuit::all(&open, chrono::Utc::now());
            if json {
                print_json(&shown);
                return Ok(());
            }
            if shown.is_empty() {
                println!("no circuit is open: every dependency is called");
            }
            for c in &shown {
                println!("{}", line(c));
            }
        }
        CircuitsAction::Close {
            dependency,
            reason,
            actor: given,
            json,
        } => {
            let change =
                circuits::close_by_hand(pool, &dependency, &actor(&given), reason.as_deref())
                    .await
                    .map_err(Fatal::from_failure)?;
            let dependency = visible(&dependency);
            if json {
                print_json(&serde_json::json!({
                    "dependency": dependency,
                    "closed": change.changed,
                    "action_id": change.action_id,
                }));
            } else if change.changed {
                println!(
                    "{dependency}'s circuit is closed on every replica (action {})",
                    change.action_id
                );
            } else {
                println!(
                    "{dependency}'s circuit was not open (recorded as action {})",
                    change.action_id
                );
            }
        }
    }
    Ok(())
}

/// One open circuit on one line; the reason last, as the dependency gave it (made visible:
/// a relay's answer may hold control characters).
fn line(c: &ShownCircuit) -> String {
    let probes = match c.failed_probes {
        0 => String::new(),
        1 => ", 1 failed probe".to_string(),
        n => format!(", {n} failed probes"),
    };
    let stops = c
        .job
        .map(|job| format!(", stops {job}"))
        .unwrap_or_default();
    format!(
        "{:<24} open since {} by {}{probes}, next probe in {}s{stops}: {}",
        visible(&c.dependency),
        c.opened_at.format("%Y-%m-%d %H:%M:%S"),
        visible(&c.opened_by),
        c.next_probe_in_secs,
        visible(&c.reason)
    )
}

fn print_json(value: &impl serde::Serialize) {
    println!(
        "{}",
        serde_json::to_string_pretty(value).unwrap_or_default()
    );
}
