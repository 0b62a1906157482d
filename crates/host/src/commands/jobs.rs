//! `worker-host jobs list|pause|resume`: the jobs and their pauses, which every replica
//! obeys (the console's pause and resume buttons do the same, through the same library).

use worker_store::pauses;

use super::actor::actor;
use crate::connections;
use crate::exit::Fatal;
use crate::jobs::{find, job_names, pausable, pause_of};
use crate::settings::Settings;

#[derive(Debug, clap::Subcommand)]
pub enum JobsAction {
    /// The jobs, and which of them an operator paused (by whom, since when, why).
    List {
        #[arg(long)]
        json: bool,
    },
    /// Pause a job on every replica until it is resumed: a timer job's scheduled ticks are
    /// held back; a consumer job's consumers stop taking deliveries (what they hold is
    /// finished and acked; the rest waits in the queue).
    Pause {
        /// The job, as `jobs list` names it (`draft-expiry`, `email-send`, say).
        job: String,
        /// Why, recorded in the audit trail and shown with the pause.
        #[arg(long)]
        reason: Option<String>,
        #[command(flatten)]
        actor: crate::commands::actor::ActorArgs,
    },
    /// Let a paused job run again: a timer on its schedule, a consumer on its queue.
    Resume {
        job: String,
        /// Why, recorded in the audit trail.
        #[arg(long)]
        reason: Option<String>,
        #[command(flatten)]
        actor: crate::commands::actor::ActorArgs,
    },
}

pub async fn run(settings: &Settings, action: JobsAction) -> Result<(), Fatal> {
    let pool = worker_store::connect(&connections::pool_options(&settings.database))
        .await
        .map_err(Fatal::unavailable)?;
    let result = dispatch(&pool, action).await;
    pool.close().await;
    result
}

fn kind(job: &str) -> &'static str {
    match find(job) {
        Some(spec) if spec.is_timer() => "timer",
        _ => "consumer",
    }
}

async fn dispatch(pool: &sqlx::PgPool, action: JobsAction) -> Result<(), Fatal> {
    match action {
        JobsAction::List { json } => {
            let paused = pauses::list(pool).await.map_err(Fatal::from_failure)?;
            if json {
                let jobs: Vec<_> = job_names()
                    .into_iter()
                    .map(|job| {
                        let pause = pause_of(&paused, job);
                        serde_json::json!({"job": job, "kind": kind(job), "pausable": pausable(job).is_ok(), "paused": pause})
                    })
                    .collect();
                println!(
                    "{}",
                    serde_json::to_string_pretty(&jobs).unwrap_or_default()
                );
                return Ok(());
            }
            for job in job_names() {
                match pause_of(&paused, job) {
                    Some(p) => println!(
                        "{job:<22} paused since {} by {} (action {}){}",
                        p.paused_at.format("%Y-%m-%d %H:%M:%S"),
                        p.actor_label(),
                        p.action_id,
                        p.reason
                            .as_deref()
                            .map(|why| format!(": {why}"))
                            .unwrap_or_default()
                    ),
                    None if kind(job) == "timer" => println!("{job:<22} running on its schedule"),
                    None => println!("{job:<22} consuming its queue"),
                }
            }
        }
        JobsAction::Pause {
            job,
            reason,
            actor: given,
        } => {
            let spec = pausable(&job).map_err(Fatal::usage)?;
            let job = spec.name;
            let change = pauses::pause(pool, spec, &actor(&given), reason.as_deref())
                .await
                .map_err(Fatal::from_failure)?;
            if change.changed {
                println!(
                    "{job} is paused on every replica (action {})",
                    change.action_id
                );
            } else {
                println!(
                    "{job} was paused already (recorded as action {})",
                    change.action_id
                );
            }
        }
        JobsAction::Resume {
            job,
            reason,
            actor: given,
        } => {
            let spec = pausable(&job).map_err(Fatal::usage)?;
            let job = spec.name;
            let change = pauses::resume(pool, spec, &actor(&given), reason.as_deref())
                .await
                .map_err(Fatal::from_failure)?;
            let again = if spec.is_timer() {
                "runs on its schedule again"
            } else {
                "consumes its queue again"
            };
            if change.changed {
                println!("{job} {again} (action {})", change.action_id);
            } else {
                println!(
                    "{job} was not paused (recorded as action {})",
                    change.action_id
                );
            }
        }
    }
    Ok(())
}
