//! `worker-host queues send-now`: what waits in a queue's retry tiers, moved back to its work
//! queue now (after the relay is fixed, say), instead of when each tier's delay runs out.
//! Without `--planned` it is a dry run: the count per tier, nothing moved, recorded. With
//! `--planned N` (the count the dry run showed) at most N move, recorded with who and why.

use clap::Subcommand;
use worker_core::text::{visible, visible_json};

use super::actor::{ActorArgs, actor};
use super::broker;
use crate::connections;
use crate::exit::Fatal;
use crate::parked::{self, Request};
use crate::settings::Settings;

#[derive(Debug, Subcommand)]
pub enum QueuesAction {
    /// Move what waits in a queue's retry tiers back to the queue now, each keeping its
    /// attempt count. Without --planned, a dry run: the count per tier, nothing moved.
    SendNow {
        /// The work queue, as the console's queue page names it (`email.send`).
        #[arg(long)]
        queue: String,
        /// Count what waits in each tier; move nothing (the default without --planned).
        #[arg(long, conflicts_with = "planned")]
        dry_run: bool,
        /// The count the dry run showed: move at most this many, shortest tier first; what
        /// was parked since waits for its tier.
        #[arg(long)]
        planned: Option<u64>,
        /// Why, recorded in the audit trail.
        #[arg(long)]
        reason: Option<String>,
        #[command(flatten)]
        actor: ActorArgs,
        #[arg(long)]
        json: bool,
    },
}

pub async fn run(settings: &Settings, action: QueuesAction) -> Result<(), Fatal> {
    let QueuesAction::SendNow {
        queue,
        dry_run,
        planned,
        reason,
        actor: given,
        json,
    } = action;
    if planned == Some(0) {
        return Err(Fatal::usage("--planned must be at least 1"));
    }
    let topology = settings
        .topology()
        .map_err(crate::topology::topology_failure)?;
    let Some(queue) = topology.queue(&queue).cloned() else {
        let known: Vec<_> = topology.queues.iter().map(|q| q.name.as_str()).collect();
        return Err(Fatal::usage(format!(
            "--queue {}: no consumer reads it; the queues are {}",
            visible(&queue),
            known.join(", ")
        )));
    };
    let request = Request {
        actor: actor(&given),
        reason,
        dry_run: dry_run || planned.is_none(),
        planned,
    };
    let pool = worker_store::connect(&connections::pool_options(&settings.database))
        .await
        .map_err(Fatal::unavailable)?;
    let (pool_ref, queue_ref, request_ref) = (&pool, &queue, &request);
    let result = broker::with_session(settings, "send-now done", |session| async move {
        let publisher = broker::publisher_on(settings, &session);
        parked::send_now(
            pool_ref,
            &session,
            &publisher,
            &queue_ref.name,
            &queue_ref.tiers,
            request_ref,
        )
        .await
    })
    .await;
    pool.close().await;
    let report = result?.map_err(Fatal::from_failure)?;
    if json {
        println!(
            "{}",
            visible_json(&serde_json::to_string_pretty(&report).unwrap_or_default())
        );
    } else {
        for tier in &report.tiers {
            println!(
                "    {:<40} {}",
                visible(&tier.queue),
                tier.waiting
                    .map_or_else(|| "not declared".to_string(), |n| n.to_string())
            );
        }
        if report.dry_run {
            println!(
                "{} wait in the retry tiers of {} (dry run, action {}); to send them now: worker-host queues send-now --queue {} --planned {}",
                report.waiting,
                visible(&report.queue),
                report.action_id,
                visible(&report.queue),
                report.waiting
            );
        } else {
            println!(
                "moved {} of {} waiting to {} (action {})",
                report.moved,
                report.waiting,
                visible(&report.queue),
                report.action_id
            );
            if let Some(more) = report.beyond_planned {
                println!("stopped at the planned count: {more} more wait for their tier");
            }
        }
    }
    if let Some(why) = &report.stopped {
        return Err(Fatal::unavailable(format!(
            "stopped after {} moved: {}; the rest wait in their tiers",
            report.moved,
            visible(why)
        )));
    }
    Ok(())
}
