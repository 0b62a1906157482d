//! `worker-host jobs list|pause|resume`: the timer jobs and their pauses, which every replica
//! obeys (the console's pause and resume buttons do the same, through the same library).

use worker_store::pauses;

use super::actor::actor;
use crate::cli::JobsAction;
use crate::connections;
use crate::exit::Fatal;
use crate::jobs::{pausable, pause_of, timer_names};
use crate::settings::Settings;

pub async fn run(settings: &Settings, action: JobsAction) -> Result<(), Fatal> {
    let pool = worker_store::connect(&connections::pool_options(&settings.database))
        .await
        .map_err(Fatal::unavailable)?;
    let result = dispatch(&pool, action).await;
    pool.close().await;
    result
}

async fn dispatch(pool: &sqlx::PgPool, action: JobsAction) -> Result<(), Fatal> {
    match action {
        JobsAction::List { json } => {
            let paused = pauses::list(pool).await.map_err(Fatal::from_failure)?;
            if json {
                let jobs: Vec<_> = timer_names()
                    .into_iter()
                    .map(|job| {
                        let pause = pause_of(&paused, job);
                        serde_json::json!({"job": job, "pausable": pausable(job).is_ok(), "paused": pause})
                    })
                    .collect();
                println!(
                    "{}",
                    serde_json::to_string_pretty(&jobs).unwrap_or_default()
                );
                return Ok(());
            }
            for job in timer_names() {
                match pause_of(&paused, job) {
                    Some(p) => println!(
                        "{job:<22} paused since {} by {} (action {})",
                        p.paused_at.format("%Y-%m-%d %H:%M:%S"),
                        p.actor_label(),
                        p.action_id
                    ),
                    None => println!("{job:<22} running on its schedule"),
                }
            }
        }
        JobsAction::Pause { job, actor: given } => {
            let spec = pausable(&job).map_err(Fatal::usage)?;
            let job = spec.name;
            let change = pauses::pause(pool, spec, &actor(&given))
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
        JobsAction::Resume { job, actor: given } => {
            let spec = pausable(&job).map_err(Fatal::usage)?;
            let job = spec.name;
            let change = pauses::resume(pool, spec, &actor(&given))
                .await
                .map_err(Fatal::from_failure)?;
            if change.changed {
                println!(
                    "{job} runs on its schedule again (action {})",
                    change.action_id
                );
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
