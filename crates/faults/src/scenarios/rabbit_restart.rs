//! `rabbit-restart`: the shared RabbitMQ's application stopped and started (disruptive).

use std::time::{Duration, Instant};

use super::{Fault, Load, Scenario};
use crate::run::Run;
use crate::services;

/// How long the broker's application stays stopped.
const DOWN: Duration = Duration::from_secs(5);

pub fn scenario() -> Scenario {
    Scenario {
        name: "rabbit-restart",
        about: "At a random moment of each repetition, `rabbitmqctl stop_app`, 5 s down, then \
                `rabbitmqctl start_app`: a graceful restart of the broker (every connection \
                closed; quorum queues kept). Disruptive (the broker is shared): run only when \
                named or with `--disruptive`. \"Ready again\" is from `start_app`'s return.",
        fault: Some(|| Box::new(RabbitRestart)),
        full: Load {
            repetitions: 5,
            per_repetition: 30,
        },
        quick: Load {
            repetitions: 1,
            per_repetition: 20,
        },
        rate_per_sec: 10.0,
        settle: Duration::from_secs(180),
        disruptive: true,
    }
}

/// The fault: see [`scenario`]'s description.
struct RabbitRestart;

#[async_trait::async_trait]
impl Fault for RabbitRestart {
    async fn apply(&mut self, run: &mut Run) -> anyhow::Result<()> {
        apply(run).await
    }
}

async fn apply(run: &mut Run) -> anyhow::Result<()> {
    services::command("rabbitmqctl", &["stop_app"]).await?;
    tokio::time::sleep(DOWN).await;
    services::command("rabbitmqctl", &["start_app"]).await?;
    run.record_ready_after(Instant::now()).await
}
