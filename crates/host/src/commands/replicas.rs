//! `worker-host replicas list|forget`: the replicas that report to the shared database, and
//! forgetting one that is gone for good, so that the silent-replica alert clears.

use worker_store::replicas;

use crate::connections;
use crate::exit::Fatal;
use crate::settings::Settings;

#[derive(Debug, clap::Subcommand)]
pub enum ReplicasAction {
    /// Every replica that reported in the last week: live, silent (stopped reporting without
    /// a clean stop) or stopped.
    List {
        #[arg(long)]
        json: bool,
    },
    /// Forget a replica that is gone for good without a clean stop (killed, its machine
    /// removed), so that it no longer counts as silent.
    Forget {
        /// The replica's name, as `replicas list` shows it.
        name: String,
    },
}

pub async fn run(settings: &Settings, action: ReplicasAction) -> Result<(), Fatal> {
    let pool = worker_store::connect(&connections::pool_options(&settings.database))
        .await
        .map_err(Fatal::unavailable)?;
    let result = dispatch(&pool, settings, action).await;
    pool.close().await;
    result
}

async fn dispatch(
    pool: &sqlx::PgPool,
    settings: &Settings,
    action: ReplicasAction,
) -> Result<(), Fatal> {
    match action {
        ReplicasAction::List { json } => {
            let standings = replicas::standings(pool, settings.alerts.replica_silent_after)
                .await
                .map_err(Fatal::from_failure)?;
            if json {
                println!(
                    "{}",
                    serde_json::to_string_pretty(&standings).unwrap_or_default()
                );
                return Ok(());
            }
            if standings.is_empty() {
                println!("no replica has reported");
            }
            for s in standings {
                let r = &s.replica;
                println!(
                    "{:<24} {:<8} last seen {} on {} (pid {}), version {}",
                    r.name,
                    s.state,
                    r.last_seen.format("%Y-%m-%d %H:%M:%S"),
                    r.host,
                    r.pid,
                    r.version
                );
            }
            Ok(())
        }
        ReplicasAction::Forget { name } => {
            if replicas::forget(pool, &name)
                .await
                .map_err(Fatal::from_failure)?
            {
                println!("forgot replica {name}");
                Ok(())
            } else {
                Err(Fatal::usage(format!(
                    "no replica is called `{name}`; `worker-host replicas list` names them"
                )))
            }
        }
    }
}
