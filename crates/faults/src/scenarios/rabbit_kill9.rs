//! `rabbit-kill9`: the scenario's private RabbitMQ node killed with SIGKILL, then started
//! again on the same data.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::Context;

use super::{DEFAULT_HEARTBEAT, Fault, Load, Scenario};
use crate::rabbit_node::{RabbitNode, ScenarioSetup as _};
use crate::run::{Run, Setup};

pub fn scenario() -> Scenario {
    Scenario {
        name: "rabbit-kill9",
        about: "The host runs against a private RabbitMQ node the scenario starts. At a random \
                moment of each repetition the node's OS process (`beam.smp`) is killed with \
                `kill -9` (no goodbye to any client: the host sees its sockets reset), then \
                the node is started again at once on the same data folder; quorum queues and \
                durable state come back from disk, a boot takes about 10 s here. \"Ready \
                again\" is from the moment the restarted node answers on AMQP and on its \
                management API.",
        fault: Some(|| Box::new(RabbitKill9::default())),
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
struct RabbitKill9 {
    node: Option<RabbitNode>,
}

#[async_trait::async_trait]
impl Fault for RabbitKill9 {
    async fn prepare(&mut self, dir: &Path) -> anyhow::Result<Setup> {
        let node = RabbitNode::start(dir).await?;
        let setup = node.setup();
        self.node = Some(node);
        Ok(setup)
    }

    async fn apply(&mut self, run: &mut Run) -> anyhow::Result<()> {
        let node = self
            .node
            .as_mut()
            .context("the private node is not started")?;
        node.kill9().await?;
        node.restart().await?;
        run.record_ready_after(Instant::now()).await
    }
}
