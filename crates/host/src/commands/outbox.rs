//! `worker-host outbox status|retry`: the outbox's counts and failed rows, and putting
//! failed rows back to pending.

use worker_store::outbox;

use super::actor::actor;
use crate::connections;
use crate::exit::Fatal;
use crate::settings::Settings;

#[derive(Debug, clap::Subcommand)]
pub enum OutboxAction {
    /// Pending and failed rows, and the age of the oldest pending one; lists the failed rows.
    Status {
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Make a failed row (or every failed row) pending again, due now, attempts reset.
    Retry {
        /// The outbox row id.
        #[arg(required_unless_present = "all_failed", conflicts_with = "all_failed")]
        id: Option<i64>,
        /// Every failed row.
        #[arg(long)]
        all_failed: bool,
        /// With --all-failed: count and list the failed rows it would put back (the oldest
        /// 20); move nothing. Recorded as a dry run.
        #[arg(long, requires = "all_failed")]
        dry_run: bool,
        /// With --all-failed: the count a dry run showed; put back at most this many, oldest
        /// first, and record it as what was confirmed. Rows that failed since stay failed.
        #[arg(long, requires = "all_failed", conflicts_with = "dry_run")]
        planned: Option<u64>,
        #[command(flatten)]
        actor: crate::commands::actor::ActorArgs,
    },
}

pub async fn run(settings: &Settings, action: OutboxAction) -> Result<(), Fatal> {
    let pool = worker_store::connect(&connections::pool_options(&settings.database))
        .await
        .map_err(Fatal::unavailable)?;
    let failed = |e: worker_core::Failure| Fatal::software(format!("the outbox: {e}"));
    match action {
        OutboxAction::Status { json } => {
            let status = outbox::status(&pool).await.map_err(failed)?;
            let rows = outbox::failed(&pool, 50).await.map_err(failed)?;
            if json {
                let body = serde_json::json!({"status": status, "failed_rows": rows});
                println!(
                    "{}",
                    serde_json::to_string_pretty(&body).unwrap_or_default()
                );
            } else {
                let oldest = status
                    .oldest_pending_age
                    .map(|d| {
                        humantime::format_duration(std::time::Duration::from_secs(d.as_secs()))
                            .to_string()
                    })
                    .unwrap_or_else(|| "-".into());
                println!(
                    "pending {}  (retrying {})  failed {}  oldest pending {oldest}",
                    status.pending, status.retrying, status.failed
                );
                if !rows.is_empty() {
                    println!();
                    print_failed(&rows);
                }
            }
        }
        OutboxAction::Retry {
            id: Some(id),
            actor: given,
            ..
        } => {
            match outbox::retry(&pool, id, &actor(&given))
                .await
                .map_err(failed)?
            {
                outbox::RetryResult::Requeued => println!("outbox row {id} is pending again"),
                outbox::RetryResult::Gone => {
                    return Err(Fatal::usage(outbox::RetryResult::gone_message(id)));
                }
            }
        }
        OutboxAction::Retry {
            id: None,
            dry_run: true,
            actor: given,
            ..
        } => {
            let plan =
                outbox::retry_all_failed_dry_run(&pool, &actor(&given), outbox::RETRY_PREVIEW_ROWS)
                    .await
                    .map_err(failed)?;
            println!(
                "{} failed outbox rows would be pending again; add --planned {} without --dry-run to put them back (dry run recorded as action {})",
                plan.matched, plan.matched, plan.action_id
            );
            print_failed(&plan.rows);
        }
        OutboxAction::Retry {
            id: None,
            planned,
            actor: given,
            ..
        } => {
            let done = outbox::retry_failed(&pool, &actor(&given), planned)
                .await
                .map_err(failed)?;
            println!("{} failed outbox rows are pending again", done.requeued);
            if let Some(more) = done.beyond_planned {
                println!(
                    "stopped at the {} planned: {more} more failed rows stay failed",
                    done.requeued
                );
            }
        }
    }
    pool.close().await;
    Ok(())
}

/// Failed rows as a table, the last error cut at 100 characters.
fn print_failed(rows: &[outbox::FailedRow]) {
    println!(
        "{:>8}  {:<36}  {:<18}  {:>8}  last error",
        "id", "message id", "routing key", "attempts"
    );
    for row in rows {
        let error: String = row
            .last_error
            .as_deref()
            .unwrap_or_default()
            .chars()
            .take(100)
            .collect();
        println!(
            "{:>8}  {:<36}  {:<18}  {:>8}  {error}",
            row.id, row.message_id, row.routing_key, row.attempts
        );
    }
}
