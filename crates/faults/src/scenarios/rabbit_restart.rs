//! `rabbit-restart`: the scenario's private RabbitMQ node's application stopped and started.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::Context;

use super::{DEFAULT_HEARTBEAT, Fault, Load, Scenario};
use crate::rabbit_node::{RabbitNode, ScenarioSetup as _};
use crate::run::{Run, Setup};

/// How long the broker's application stays stopped.
const DOWN: Duration = Duration::from_secs(5);

pub fn scenario() -> Scenario {
    Scenario {
        name: "rabbit-restart",
        about: "The host runs against a private RabbitMQ node the scenario starts (its own node \
                name, ports and data under the scenario's folder). At a random moment of each \
                repetition, `rabbitmqctl -n <node> stop_app`, 5 s down, then `rabbitmqctl -n \
                <node> start_app`: a graceful restart of the broker (every connection closed; \
                quorum queues and durable state kept). \"Ready again\" is from `start_app`'s \
                return.",
        fault: Some(|| Box::new(RabbitRestart::default())),
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
        heartbeat: DEFAULT_HEARTBEAT,
    }
}

/// The fault: see [`scenario`]'s description.
#[derive(Default)]
struct RabbitRestart {
    node: Option<RabbitNode>,
}

#[async_trait::async_trait]
impl Fault for RabbitRestart {
    async fn prepare(&mut self, dir: &Path) -> anyhow::Result<Setup> {
        let node = RabbitNode::start(dir).await?;
        let setup = node.setup();
        self.node = Some(node);
        Ok(setup)
    }

    async fn apply(&mut self, run: &mut Run) -> anyhow::Result<()> {
        let node = self
            .node
            .as_ref()
            .context("the private node is not started")?;
        node.ctl(&["stop_app"]).await?;
        tokio::time::sleep(DOWN).await;
        node.ctl(&["start_app"]).await?;
        run.record_ready_after(Instant::now()).await
    }
}
